"""Plot accuracy and diagnostic curves of one or many runs.

    python -m fedjax_proj.plot runs/fedavg-... runs/fedproj-... --out curves.png

Reads each run directory's ``metrics.jsonl`` (and ``summary.json`` for its label) and draws one
panel per metric: test accuracy, train loss and every method diagnostic present in any run
(e.g. FedProj's ``lmem_global`` drift metric and ``projected_fraction``).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from fedjax_proj.training.metrics import read_metrics

PREFERRED = ("test_accuracy", "train_loss", "lmem_global", "projected_fraction", "mean_cos")
SKIP = {"round", "round_seconds", "test_loss"}


def _label(run: Path) -> str:
  summary = run / "summary.json"
  if summary.exists():
    s = json.loads(summary.read_text())
    return f"{s.get('method', run.name)} (seed {s.get('seed', '?')})"
  return run.name


def plot_runs(runs: list[Path], out: Path, metrics: list[str] | None = None) -> Path:
  """Draws the curves of ``runs`` into ``out`` (PNG); returns the path."""
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  records = {}
  for run in runs:
    if not (run / "metrics.jsonl").exists():
      raise FileNotFoundError(f"{run} has no metrics.jsonl; pass run directories written by a run.")
    records[run] = read_metrics(run)
  present = {k for recs in records.values() for r in recs for k, v in r.items() if v is not None}
  if metrics is None:
    extra = sorted(k for k in present - SKIP - set(PREFERRED) if not k.startswith("train_acc"))
    metrics = [m for m in PREFERRED if m in present] + extra
  if not metrics:
    raise ValueError("No metrics to plot.")
  cols = min(3, len(metrics))
  rows = -(-len(metrics) // cols)
  fig, axes = plt.subplots(rows, cols, figsize=(5 * cols, 3.6 * rows), squeeze=False)
  for ax, metric in zip(axes.ravel(), metrics):
    for i, (run, recs) in enumerate(records.items()):
      pts = [(r["round"], r[metric]) for r in recs if r.get(metric) is not None]
      if pts:  # one colour per run in every panel, even where another run lacks the metric
        ax.plot(
          *zip(*pts), marker="o" if len(pts) < 30 else None, ms=3, color=f"C{i}", label=_label(run)
        )
    ax.set_title(metric)
    ax.set_xlabel("round")
    ax.grid(alpha=0.3)
  for ax in axes.ravel()[len(metrics) :]:
    ax.axis("off")
  axes[0, 0].legend(fontsize=8)
  fig.tight_layout()
  out.parent.mkdir(parents=True, exist_ok=True)
  fig.savefig(out, dpi=90)
  plt.close(fig)
  return out


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description="Plot accuracy and diagnostic curves of runs.")
  p.add_argument("runs", nargs="+", type=Path, help="run directories holding metrics.jsonl")
  p.add_argument("--out", type=Path, default=Path("curves.png"))
  p.add_argument("--metrics", default="", help="comma-separated metrics (default: all present)")
  args = p.parse_args(argv)
  metrics = [m for m in args.metrics.split(",") if m] or None
  try:
    path = plot_runs(args.runs, args.out, metrics)
  except (FileNotFoundError, ValueError) as e:
    print(f"error: {e}", file=sys.stderr)
    return 1
  print(f"wrote {path}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
