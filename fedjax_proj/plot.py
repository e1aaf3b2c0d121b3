"""Plot accuracy and diagnostic curves of one or many runs.

    python -m fedjax_proj.plot runs/fedavg-... runs/fedproj-... --out curves.png

Reads each run directory's ``metrics.jsonl`` (and ``summary.json`` for its label) and draws one
panel per metric: test accuracy, train loss and every method diagnostic present in any run
(e.g. FedProj's ``lmem_global`` drift metric and ``projected_fraction``). Only numeric per-round
metrics are drawn: list-valued ones (SFedKD's ``teacher_clients``) and the continual runner's
end-of-task rows are skipped, and a torn last line (a crash mid-write) is skipped with a note. An
unfinished run (no summary) is labelled from its newest checkpoint.

``--out`` is the PNG's file path (default ``curves.png``). An existing folder is refused with the
fix (``--out=<folder>/curves.png``), never written into under another name; folders of the path
that do not exist yet are created, and the command says so; a path under a file or under a folder
that cannot be written is refused, naming it. ``--metrics`` names metrics the runs hold; one that
none holds is refused with the list of those they do.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from fedjax_proj.training.metrics import read_metrics_lines

# The checkpoint manifest's file name (fedjax_proj.training.checkpoint.MANIFEST; not imported
# from there so that plotting does not import JAX).
MANIFEST = "fedjax_manifest.json"

PREFERRED = ("test_accuracy", "train_loss", "lmem_global", "projected_fraction", "mean_cos")
SKIP = {"round", "round_seconds", "test_loss", "task", "task_round"}


# Axis labels of the metrics the library writes; others are labelled with their own name.
# Panel titles are the same words, capitalised (:func:`title`).
YLABELS = {
  "test_accuracy": "test accuracy",
  "train_loss": "training loss",
  "test_loss": "test loss",
  "lmem_global": "L_mem of the global model",
  "projected_fraction": "fraction of steps projected",
  "mean_cos": "mean cosine",
  "lmem_before": "L_mem before local training",
  "lmem_after": "L_mem after local training",
  "distill_loss": "server distillation loss",
  "train_accuracy": "training accuracy",
}


def ylabel(metric: str) -> str:
  """The y-axis label of ``metric``: its description, else its name in words."""
  return YLABELS.get(metric, metric.replace("_", " "))


def panel_title(metric: str) -> str:
  """A panel title: the metric's description, capitalised."""
  text = ylabel(metric)
  return text[0].upper() + text[1:]


def _is_scalar(value) -> bool:
  """Numbers are plotted; lists (e.g. SFedKD's ``teacher_clients``), text and flags are not."""
  return isinstance(value, int | float) and not isinstance(value, bool)


def _newest_checkpoint_meta(run: Path) -> dict:
  """The manifest record of ``run``'s newest checkpoint ({} if none; see training/checkpoint.py)."""
  steps = sorted(
    (int(p.name) for p in (run / "checkpoints").glob("*") if p.name.isdigit()), reverse=True
  )
  for step in steps:
    try:
      return json.loads((run / "checkpoints" / str(step) / MANIFEST).read_text())["meta"]
    except (OSError, ValueError, KeyError):
      continue
  return {}


def _describe(run: Path) -> tuple[str, str]:
  """(method, seed text) of a run from its summary.json.

  An unfinished run (no summary) is named from its newest checkpoint's config, marked
  "unfinished" with the rounds it reached; without a checkpoint, by its directory.
  """
  summary = run / "summary.json"
  if summary.exists():
    try:
      s = json.loads(summary.read_text())
    except ValueError as e:  # cut short by a crash or a full disk: named, not a bare JSON error
      raise ValueError(
        f"{summary} is not valid JSON ({e}); it was cut short or edited. Delete it to label the "
        "run from its newest checkpoint, or rerun the run to write it again."
      ) from None
    return str(s.get("method", run.name)), f"seed {s.get('seed', '?')}"
  meta = _newest_checkpoint_meta(run)
  config = meta.get("config") or {}
  total = meta.get("rounds") or config.get("rounds")
  reached = f"round {meta.get('round', '?')}" + (f" of {total}" if total else "")
  if "method" in config:
    return str(config["method"]), f"seed {config.get('seed', '?')}, unfinished: {reached}"
  return run.name, "unfinished"


def run_labels(runs: list[Path]) -> dict[Path, str]:
  """Legend labels: ``method (seed s)``, plus the directory name where that is ambiguous."""
  described = {run: _describe(run) for run in runs}
  texts = {run: f"{m} ({seed})" if seed else m for run, (m, seed) in described.items()}
  counts: dict[str, int] = {}
  for text in texts.values():
    counts[text] = counts.get(text, 0) + 1
  return {run: f"{t} [{run.name}]" if counts[t] > 1 else t for run, t in texts.items()}


def plot_runs(
  runs: list[Path], out: Path, metrics: list[str] | None = None, title: str | None = None
) -> Path:
  """Draws the curves of ``runs`` into ``out`` (PNG); returns the path (see :func:`figure`)."""
  import matplotlib.pyplot as plt

  fig = figure(runs, metrics, title)
  out.parent.mkdir(parents=True, exist_ok=True)
  fig.savefig(out, dpi=90)
  plt.close(fig)
  return out


def check_runs(runs: list[Path], metrics: list[str] | None = None) -> None:
  """Each of ``runs`` is a run directory holding ``metrics.jsonl``, given once, and each of
  ``metrics`` is named once; the error says which path or name is wrong, and how.

  A run or metric given twice would be drawn twice (a second line over the first, a second panel),
  without a word, so it is refused like every other list of this library's commands
  (docs/design.md, "Input rules").
  """
  for run in runs:
    if not run.exists():
      raise FileNotFoundError(f"{run} does not exist; check the path (a run directory of a run).")
    if not run.is_dir():
      raise FileNotFoundError(
        f"{run} is a file, not a run directory; pass the folder that holds it ({run.parent})."
      )
    if not (run / "metrics.jsonl").exists():
      raise FileNotFoundError(
        f"{run} is a folder without metrics.jsonl, so not a run directory; pass run directories "
        "written by a run (each holds metrics.jsonl)."
      )
  resolved = [run.resolve() for run in runs]
  twice = [str(r) for r in dict.fromkeys(resolved) if resolved.count(r) > 1]
  if twice:
    raise ValueError(f"run directory {', '.join(twice)} is given more than once; pass each once.")
  twice = [m for m in dict.fromkeys(metrics or ()) if metrics.count(m) > 1]
  if twice:
    raise ValueError(f"--metrics lists {', '.join(twice)} more than once; list each once.")


def figure(runs: list[Path], metrics: list[str] | None = None, title: str | None = None):
  """The matplotlib figure of ``runs``' curves.

  One panel per metric with a labelled y axis and integer round ticks, one legend for the whole
  figure (runs labelled method and seed, plus the directory where that is ambiguous), and a title
  (default: the methods compared).
  """
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  from matplotlib.ticker import MaxNLocator

  check_runs(runs, metrics)
  records = {}
  for run in runs:
    lines, torn = read_metrics_lines(run)
    if torn:  # a crash or a full disk cut its last line short: plot the rounds before it
      print(f"note: {run}/metrics.jsonl ends in a torn line; it is skipped", file=sys.stderr)
    # Per-round records only: the continual runner's end-of-task rows have no "round".
    records[run] = [record for record, _ in lines if _is_scalar(record.get("round"))]
  present = {k for recs in records.values() for r in recs for k, v in r.items() if _is_scalar(v)}
  if metrics is None:
    extra = sorted(k for k in present - SKIP - set(PREFERRED) if not k.startswith("train_acc"))
    metrics = [m for m in PREFERRED if m in present] + extra
  unknown = [m for m in metrics if m not in present - {"round"}]
  if unknown:
    raise ValueError(
      f"no run holds the metric(s) {', '.join(unknown)}; the runs hold: "
      f"{', '.join(sorted(present - {'round'}))}."
    )
  if not metrics:
    raise ValueError("No metrics to plot.")
  labels = run_labels(runs)
  cols = min(3, len(metrics))
  rows = -(-len(metrics) // cols)
  fig, axes = plt.subplots(rows, cols, figsize=(5 * cols, 3.6 * rows + 0.8), squeeze=False)
  handles = {}
  for ax, metric in zip(axes.ravel(), metrics):
    for i, (run, recs) in enumerate(records.items()):
      pts = [(r["round"], r[metric]) for r in recs if _is_scalar(r.get(metric))]
      if pts:  # one colour per run in every panel, even where another run lacks the metric
        (line,) = ax.plot(
          *zip(*pts), marker="o" if len(pts) < 30 else None, ms=3, color=f"C{i}", label=labels[run]
        )
        handles.setdefault(labels[run], line)
    ax.set_title(panel_title(metric))
    ax.set_xlabel("round")
    ax.set_ylabel(ylabel(metric))
    rounds = sorted({r["round"] for recs in records.values() for r in recs if metric in r})
    if 0 < len(rounds) <= 12:  # few points: tick exactly those rounds (never 0.5 or 1.25)
      ax.set_xticks(rounds)
      ax.set_xlim(rounds[0] - 0.5, rounds[-1] + 0.5)
    else:
      ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.grid(alpha=0.3)
  for ax in axes.ravel()[len(metrics) :]:
    ax.axis("off")
  methods = sorted({_describe(run)[0] for run in runs})
  fig.suptitle(title or f"{' vs '.join(methods)}: {len(runs)} run{'s' * (len(runs) > 1)}")
  fig.legend(
    list(handles.values()),
    list(handles),
    loc="lower center",
    ncol=min(4, len(handles)),
    fontsize=8,
    frameon=False,
  )
  fig.tight_layout(rect=(0, 0.06 + 0.03 * ((len(handles) - 1) // 4), 1, 0.95))
  return fig


def main(argv=None) -> int:
  p = argparse.ArgumentParser(
    description="Plot accuracy and diagnostic curves of runs.", allow_abbrev=False
  )
  p.add_argument("runs", nargs="+", type=Path, help="run directories holding metrics.jsonl")
  p.add_argument(
    "--out", type=Path, default=Path("curves.png"), help="PNG to write (default: %(default)s)"
  )
  p.add_argument("--metrics", default="", help="comma-separated metrics (default: all present)")
  p.add_argument("--title", default="", help="figure title (default: the methods compared)")
  args = p.parse_args(argv)
  metrics = [m for m in args.metrics.split(",") if m] or None
  if args.metrics and metrics is None:  # given, yet empty: not "every metric"
    p.error(f"--metrics={args.metrics} lists no metric; list them, or leave the flag out for all")
  problem = out_problem(args.out)
  if problem:
    print(f"error: {problem}", file=sys.stderr)
    return 1
  missing = next((d for d in reversed(args.out.parents) if not d.exists()), None)
  try:
    path = plot_runs(args.runs, args.out, metrics, args.title or None)
  except (FileNotFoundError, ValueError) as e:
    print(f"error: {e}", file=sys.stderr)
    return 1
  if missing is not None:
    print(f"created the folder {args.out.parent} for --out")
  print(f"wrote {path}")
  return 0


def out_problem(out: Path) -> str | None:
  """Why ``--out`` cannot be written, or None. An existing folder is refused (the figure is never
  written into it under a name of our choosing), as is a path under a file or under a folder that
  cannot be written; missing folders are created, and :func:`main` says so."""
  from fedjax_proj.training.rundir import RunDirError, check_writable

  if out.is_dir():
    return f"--out={out} is a folder; pass the PNG's file path, e.g. --out={out / 'curves.png'}."
  existing = next(d for d in (out.parent, *out.parent.parents) if d.exists())
  try:
    check_writable(existing, f"--out={out}: its folder")
  except RunDirError as e:
    return str(e)
  return None


if __name__ == "__main__":
  sys.exit(main())
