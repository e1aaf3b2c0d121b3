"""The Iris pilot's regime sweep (paper 000 §3, Figure 1; issue "One command per paper claim").

The paper leaves three things unstated; the sweep crosses them, 5 seeds each, on top of the
pilot claim's ``cpu`` budget (the paper's 20 rounds x 5 local epochs, SGD 1e-3 momentum 0.9):

* public data: ``gaussian`` (1,000 unlabelled points covering the classes' region), ``iris``
  (the 150 Iris points, unlabelled: FedProj's memory loss is the KL to the ensemble) or
  ``iris_labelled`` (the 150 points with labels, FedProj's g_mem is the cross-entropy on them:
  000 Algorithm 1 line 9, 001 Algorithm 1 line 16);
* local batch size: 1, 10 or 50;
* initial model: ``random`` or ``pretrained`` (200 full-batch Adam steps on all of Iris).

A regime "shows the paper's forgetting" when FedProj beats FedAvg both on the clients' accuracy
on all data right after local training (the forgetting Figure 1 draws) and on the final global
accuracy, each ``reproduced`` under the rule of :mod:`fedjax_proj.reproduce.stats`.
Results: ``<results>/fedproj-iris-pilot/sweep/<regime>/``; summary ``sweep/report.md``.
"""

from __future__ import annotations

import itertools
from pathlib import Path

from fedjax_proj.reproduce import resolve, stats
from fedjax_proj.reproduce.claims.common import Claim
from fedjax_proj.reproduce.options import RunOptions
from fedjax_proj.reproduce.report import results as report_results
from fedjax_proj.reproduce.report import verdicts as report_verdicts
from fedjax_proj.reproduce.report import writer as report_writer

PUBLIC = ("gaussian", "iris", "iris_labelled")
BATCHES = (1, 10, 50)
INITS = {"random": 0, "pretrained": 200}


def regimes() -> dict[str, dict]:
  """Regime name -> config overrides."""
  out = {}
  for public, batch, (init, steps) in itertools.product(PUBLIC, BATCHES, INITS.items()):
    out[f"{public}-b{batch}-{init}"] = {
      "public": public,
      "batch_size": batch,
      "pretrain_steps": steps,
    }
  return out


def config_for(claim: Claim, budget: str, method: str, seed: int, data_root=None) -> dict:
  """The resolved config of a claim budget, or of a sweep regime (``sweep/<regime>``)."""
  if not budget.startswith("sweep/"):
    return resolve.resolve_config(claim, budget, method, seed, data_root)
  regime = budget.split("/", 1)[1]
  table = regimes()
  if regime not in table:
    raise ValueError(f"Unknown sweep regime {regime!r}; valid: {', '.join(table)}.")
  return {**resolve.resolve_config(claim, "cpu", method, seed), **table[regime]}


def run_sweep(claim: Claim, root: Path, results: Path, options: RunOptions, run_claim) -> None:
  """Runs every regime (skipping finished runs; ``run_claim`` is the queue's,
  :func:`.claim_queue.run_claim`) and writes ``sweep/report.md``, and with ``options.report``
  each regime's report."""
  rows = []
  for name in regimes():
    budget = f"sweep/{name}"
    expected = run_claim(claim, budget, root, results, options)
    directory = results / claim.name / budget
    found, _, _ = report_results.load_results(directory, expected)
    if options.report and found:
      report_writer.write_report(claim, budget, directory, expected)
    rows.append((name, found))
  text = render_sweep(claim, rows)
  out = results / claim.name / "sweep"
  out.mkdir(parents=True, exist_ok=True)
  (out / "report.md").write_text(text)
  print(text)
  print(f"wrote {out / 'report.md'}")


def shows_forgetting(claim: Claim, found: dict) -> bool:
  verdicts = {
    (b, w, m): v for b, w, m, _, v in report_verdicts.paired_rows(claim, found) if w == "fedavg"
  }
  return all(v == stats.REPRODUCED for v in verdicts.values()) and bool(verdicts)


def render_sweep(claim: Claim, rows) -> str:
  lines = [
    "### fedproj-iris-pilot — regime sweep",
    "",
    "Command: `python -m fedjax_proj.reproduce fedproj-iris-pilot --sweep --seeds=0,1,2,3,4 "
    "--report`. Global = final global accuracy on all 150 points; clients = the clients' "
    "accuracy on all 150 points right after local training, mean over rounds (Figure 1's "
    "forgetting). Mean ± std over seeds, %. Forgetting shown = FedProj > FedAvg reproduced on "
    "both (paired 95% t-interval above 0, fedjax_proj/reproduce/sweep.py).",
    "",
    "| regime | seeds | FedAvg global | FedDF global | FedProj global | FedAvg clients | "
    "FedProj clients | FedProj > FedAvg, clients | FedProj > FedAvg, global | forgetting shown |",
    "|---|---|---|---|---|---|---|---|---|---|",
  ]

  def cell(found, method, metric):
    vals = [r["metrics"][metric] for r in found.get(method, {}).values()]
    if not vals:
      return "—"
    mean, std = stats.mean_std(vals)
    return f"{mean:.1f} ± {std:.1f}"

  for name, found in rows:
    n = min((len(found.get(m, {})) for m in claim.methods), default=0)
    shown = "yes" if shows_forgetting(claim, found) else ("no" if n >= stats.MIN_SEEDS else "—")
    verdicts = {
      m: f"{v} ({p.mean:+.1f})" if p.n else "—"
      for b, w, m, p, v in report_verdicts.paired_rows(claim, found)
      if w == "fedavg"
    }
    lines.append(
      f"| {name} | {n} | {cell(found, 'fedavg', 'global_accuracy')} | "
      f"{cell(found, 'feddf', 'global_accuracy')} | {cell(found, 'fedproj', 'global_accuracy')} | "
      f"{cell(found, 'fedavg', 'client_accuracy')} | {cell(found, 'fedproj', 'client_accuracy')} "
      f"| {verdicts['client_accuracy']} | {verdicts['global_accuracy']} | {shown} |"
    )
  shown = [name for name, found in rows if shows_forgetting(claim, found)]
  lines += ["", f"Regimes showing the paper's forgetting: {', '.join(shown) or 'none'}.", ""]
  return "\n".join(lines)
