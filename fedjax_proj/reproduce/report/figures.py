"""The report's figures (matplotlib): ``accuracy.png`` and, where FedProj logged its memory loss,
``lmem_vs_accuracy.png`` (paper 001, Figure 4)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from fedjax_proj.reproduce.claims.common import Claim
from fedjax_proj.reproduce.report.results import CURVE_METRIC, accuracy_matrices


def plot_curves(claim: Claim, found: dict, directory: Path) -> list[str]:
  """Writes the curve PNGs; returns their file names."""
  if claim.kind == "continual" and found:
    return plot_task_accuracy(claim, found, directory)
  key = CURVE_METRIC[claim.kind]
  if key is None or not found:
    return []
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  written = []
  fig, ax = plt.subplots(figsize=(7, 4.5))
  for m in claim.runnable:
    curves = [
      [(c["round"], c[key]) for c in r["curve"] if key in c] for r in found.get(m, {}).values()
    ]
    curves = [c for c in curves if c]
    if not curves:
      continue
    rounds = [x for x, _ in curves[0]]
    n = min(len(c) for c in curves)
    ys = 100 * np.array([[y for _, y in c[:n]] for c in curves])  # fractions -> %
    ax.plot(rounds[:n], ys.mean(0), label=f"{m} ({len(curves)} seeds)")
    if len(curves) > 1:
      ax.fill_between(rounds[:n], ys.min(0), ys.max(0), alpha=0.15)
  ax.set_xlabel("round")
  ax.set_ylabel(f"{key} (%)")
  ax.set_title(f"{claim.name}: mean over seeds (band: min-max)")
  ax.legend()
  fig.tight_layout()
  fig.savefig(directory / "accuracy.png", dpi=90)
  plt.close(fig)
  written.append("accuracy.png")
  proj = list(found.get("fedproj", {}).values())
  lkey = next(
    (k for k in ("lmem_global", "lmem_before") if proj and k in proj[0]["curve"][0]), None
  )
  if lkey is not None and key == "test_accuracy":
    fig, ax = plt.subplots(figsize=(7, 4.5))
    r0 = proj[0]["curve"]
    # null where not computed (lmem_before outside the projection window): a gap in the line.
    values = [np.nan if c.get(lkey) is None else c[lkey] for c in r0]
    ax.plot([c["round"] for c in r0], values, "C0", label=lkey)
    ax.set_xlabel("round")
    ax.set_ylabel(f"{lkey} (memory KL)", color="C0")
    ax2 = ax.twinx()
    pts = [(c["round"], 100 * c[key]) for c in r0 if key in c]
    ax2.plot([x for x, _ in pts], [y for _, y in pts], "C1o-", label=key)
    ax2.set_ylabel("test accuracy (%)", color="C1")
    ax.set_title(
      f"{claim.name}: FedProj {lkey} vs test accuracy (seed {proj[0]['seed']}; 001 Fig. 4)"
    )
    fig.tight_layout()
    fig.savefig(directory / "lmem_vs_accuracy.png", dpi=90)
    plt.close(fig)
    written.append("lmem_vs_accuracy.png")
  return written


def plot_task_accuracy(claim: Claim, found: dict, directory: Path) -> list[str]:
  """A continual claim's figure, ``accuracy.png``: after each task t, the mean test accuracy over
  tasks 0..t (ACC, fedjax_proj/training/task_rounds.acc_fgt, had the run stopped there) per method,
  mean over seeds with a min-max band, from each result's accuracy matrix a[i, t] (row: the task
  evaluated, column: after which task). Results without the matrix are left out."""
  curves = {}
  for m in claim.runnable:
    # ACC had the run stopped after task t: the mean of column t over the tasks seen.
    mats = accuracy_matrices(found, m)
    runs = [[100 * a[: t + 1, t].mean() for t in range(len(a))] for a in mats]
    if runs:
      n = min(len(r) for r in runs)
      curves[m] = np.array([r[:n] for r in runs])
  if not curves:
    return []
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  fig, ax = plt.subplots(figsize=(7, 4.5))
  for m, ys in curves.items():
    tasks = np.arange(1, ys.shape[1] + 1)
    ax.plot(tasks, ys.mean(0), marker="o", ms=3, label=f"{m} ({len(ys)} seeds)")
    if len(ys) > 1:
      ax.fill_between(tasks, ys.min(0), ys.max(0), alpha=0.15)
  ax.set_xlabel("after task")
  ax.set_ylabel("mean accuracy over the tasks seen (%)")
  ax.set_title(f"{claim.name}: mean over seeds (band: min-max)")
  ax.legend()
  fig.tight_layout()
  fig.savefig(directory / "accuracy.png", dpi=90)
  plt.close(fig)
  return ["accuracy.png"]
