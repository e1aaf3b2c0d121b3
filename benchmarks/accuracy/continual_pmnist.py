"""Permuted MNIST continual-FL benchmark on real MNIST: FL vs FOT (and EWC/ER/GPM), non-IID.

FOT paper (Bakman et al., ICLR 2024), Table 2, PMNIST non-IID: FL 80.06 / 9.21, FOT 85.21 / 1.97
(ACC / FGT, %), with 125 clients, 64 per round, 200 rounds per task. This benchmark runs a reduced
budget on a shared 2-core CPU (defaults below; every method sees the same clients, partitions and
rounds) and prints a table of ACC and FGT plus each method's wall time, and writes
``results/continual_pmnist.json``.

    python -m benchmarks.accuracy.continual_pmnist --methods=fl,fot --rounds_per_task=10
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from benchmarks import flag_checks
from benchmarks.results_io import REPO_ROOT, RESULTS_DIR, write_results

REPO = REPO_ROOT


PAPER = {"fl": (80.06, 9.21), "fot": (85.21, 1.97)}
_NOT_SETTING = ("out", "methods", "merge")


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--methods", default="fl,fot")
  parser.add_argument("--num_clients", type=int, default=125)
  parser.add_argument("--clients_per_round", type=int, default=64)
  parser.add_argument("--rounds_per_task", type=int, default=10)
  parser.add_argument("--train_per_task", type=int, default=20000)
  parser.add_argument("--test_per_task", type=int, default=2000)
  parser.add_argument("--num_tasks", type=int, default=10)
  parser.add_argument("--lr", type=float, default=0.05)
  parser.add_argument("--batch_size", type=int, default=64)
  parser.add_argument("--local_epochs", type=int, default=1)
  parser.add_argument("--iid", action="store_true")
  parser.add_argument(
    "--method_kwargs",
    default="",
    help="key=value pairs (comma separated) overriding the paper defaults, e.g. eps=0.9",
  )
  parser.add_argument(
    "--merge",
    action="store_true",
    help="add these methods to an existing --out of the same setting",
  )
  parser.add_argument(
    "--heads",
    default="single",
    choices=("single", "multi"),
    help="single: one classifier shared by all tasks (the authors' PMNIST setup)",
  )
  parser.add_argument("--seed", type=int, default=0)
  parser.add_argument("--out", default=str(RESULTS_DIR / "continual_pmnist.json"))
  args = parser.parse_args(argv)

  from fedjax_proj.algorithms.registry import methods as registered

  # Each method once (a repeat would run twice and overwrite its own row), each a continual one.
  methods = flag_checks.names(parser, "--methods", args.methods, registered(("continual",)))
  flag_checks.at_least(parser, args, 1, "num_clients", "clients_per_round", "rounds_per_task")
  flag_checks.at_least(parser, args, 1, "num_tasks", "batch_size", "local_epochs")

  from fedjax_proj.configs import pmnist
  from fedjax_proj.data.continual import permuted_mnist
  from fedjax_proj.data.sources import find_shared_data, load_dataset
  from fedjax_proj.models import mlp, multi_head
  from fedjax_proj.training.config import parse_method_kwargs
  from fedjax_proj.training.continual import run_continual_experiment

  shared = find_shared_data()
  if shared is None or not (shared / "mnist" / "train.npz").exists():
    print("skipped: ../shared/data/mnist (train.npz, test.npz) not found", file=sys.stderr)
    return 1
  train = load_dataset("mnist", "train", shared / "mnist")
  test = load_dataset("mnist", "test", shared / "mnist")
  bench = permuted_mnist(
    train,
    test,
    num_tasks=args.num_tasks,
    seed=args.seed,
    train_per_task=args.train_per_task,
    test_per_task=args.test_per_task,
  )
  out = Path(args.out)
  results = {}
  if args.merge and out.exists():
    previous = json.loads(out.read_text())
    if previous["setting"] != {k: v for k, v in vars(args).items() if k not in _NOT_SETTING}:
      print("error: --merge needs the same setting as the existing results file", file=sys.stderr)
      return 1
    results = previous["results"]
  for method in methods:
    c = pmnist.get_config("paper")
    c.method = method
    c.iid = args.iid
    for field in (
      "num_clients",
      "clients_per_round",
      "rounds_per_task",
      "lr",
      "batch_size",
      "local_epochs",
      "seed",
      "num_tasks",
    ):
      c[field] = getattr(args, field)
    c.train_per_task, c.test_per_task = args.train_per_task, args.test_per_task
    kwargs = dict(pmnist.method_defaults(c))
    kwargs.update(parse_method_kwargs(args.method_kwargs))
    c.method_kwargs = kwargs
    # The --out stem keeps concurrent runs (e.g. two thresholds) out of each other's folders.
    run_name = f"bench_pmnist_{method}_{out.stem}_{time.strftime('%H%M%S')}"
    c.output_dir = str(REPO / "runs" / run_name)
    c.heads = args.heads
    if args.heads == "single":
      model = mlp(10, hidden=(400, 400), dropout=(0.2, 0.2))
    else:
      model = multi_head("mlp", bench.num_tasks, 10, hidden=(400, 400), dropout=(0.2, 0.2))
    try:
      summary = run_continual_experiment(
        c, bench, model, log=lambda s: print(s, flush=True), shared_head=args.heads == "single"
      )
    except FloatingPointError as e:
      print(f"{method} diverged: {e}", flush=True)
      results[method] = {"diverged": str(e), "method_kwargs": dict(c.method_kwargs)}
      continue
    results[method] = {
      k: summary[k]
      for k in ("acc", "fgt", "acc_matrix", "wall_seconds", "train_seconds", "end_task_seconds")
    }
    results[method]["method_kwargs"] = dict(c.method_kwargs)
  setting = {k: v for k, v in vars(args).items() if k not in _NOT_SETTING}
  lines = [
    f"Permuted MNIST, {'IID' if args.iid else 'non-IID (2 shards/client)'}: {setting}",
    "| method | ACC % | FGT % | paper ACC / FGT | wall s |",
    "|---|---|---|---|---|",
  ]
  for m, r in results.items():
    if "diverged" in r:
      lines.append(f"| {m} | diverged | - | - | - |")
      continue
    paper = "{:.2f} / {:.2f}".format(*PAPER[m]) if m in PAPER and not args.iid else "-"
    lines.append(
      f"| {m} | {100 * r['acc']:.2f} | {100 * r['fgt']:.2f} | {paper} | {r['wall_seconds']:.0f} |"
    )
  print("\n".join(lines))
  out.parent.mkdir(parents=True, exist_ok=True)
  write_results(out, {"setting": setting, "results": results, "table": lines}, indent=2)
  print(f"wrote {out}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
