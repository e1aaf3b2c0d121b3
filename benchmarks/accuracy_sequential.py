"""Accuracy benchmark: FedAvg vs FedSeq vs CWC vs SFedKD on real CIFAR-10 under ExDir(2, 0.5).

    python benchmarks/accuracy_sequential.py                 # reduced CPU budget, 1 seed
    python benchmarks/accuracy_sequential.py --seeds=0,1,2 --rounds=30

The paper (SFedKD, papers/004, Table 1; 100 clients, 10 per round, 1000 rounds, 5 local epochs,
8-layer AlexNet) reports on CIFAR-10 ExDir(2, 0.5): FedAvg 32.48, FedSeq 54.66, CWC 55.16,
SFedKD 61.56. On a shared 2-core CPU this script runs a reduced budget (defaults below: a 6k
training subset over 20 clients, 10 per round, K = 5 teachers, 1 local epoch, the FedAvg CNN, a
few rounds; the paper's optimiser: SGD lr 0.01, no momentum, weight decay 1e-4), so its absolute
numbers are far below the paper's; what it can show is the ordering at equal client compute.
Every method sees the same partition, client samples and batches (same seed). Prints a
mean ± std table (std over seeds) and writes JSON to
``benchmarks/results/accuracy_sequential.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

import jax
import numpy as np

from fedjax_proj.data.sources import find_shared_data
from fedjax_proj.training.config import base_config
from fedjax_proj.training.experiment import run_experiment

PAPER = {"fedavg": 32.48, "fedseq": 54.66, "cwc": 55.16, "sfedkd": 61.56}


def accuracy_curve(output_dir: str) -> list[list[float]]:
  """[[round, test accuracy %], ...] from a run's metrics.jsonl (every evaluated round)."""
  path = Path(output_dir) / "metrics.jsonl"
  if not path.exists():
    return []
  records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
  return [
    [r["round"], round(100 * r["test_accuracy"], 2)]
    for r in records
    if r.get("test_accuracy") is not None
  ]


def make_config(args, method: str, seed: int, output_dir: str):
  c = base_config()
  c.update(
    method=method,
    dataset="cifar10",
    data_dir=args.data_dir,
    model=args.model,
    num_clients=args.num_clients,
    clients_per_round=args.clients_per_round,
    rounds=args.rounds,
    local_epochs=args.local_epochs,
    batch_size=64,
    partition=args.partition,
    seed=seed,
    strategy="auto",
    optimizer="sgd",
    lr=args.lr,
    momentum=args.momentum,
    weight_decay=1e-4,
    eval_every=args.eval_every,
    train_subset=args.train_subset,
    test_subset=args.test_subset,
    progress=False,
    output_dir=output_dir,
    overwrite=True,  # a benchmark re-run replaces its own previous run of the same folder
  )
  if method == "sfedkd":
    c.method_kwargs.num_teachers = args.num_teachers
  return c


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--methods", default="fedavg,fedseq,cwc,sfedkd")
  p.add_argument("--seeds", default="0")
  p.add_argument("--rounds", type=int, default=8)
  p.add_argument("--local_epochs", type=int, default=1)
  p.add_argument("--num_clients", type=int, default=20)
  p.add_argument("--clients_per_round", type=int, default=10)
  p.add_argument("--num_teachers", type=int, default=5)
  p.add_argument("--partition", default="exdir:2:0.5")
  p.add_argument("--model", default="cnn")
  p.add_argument("--lr", type=float, default=0.01)
  p.add_argument("--momentum", type=float, default=0.0)
  p.add_argument("--train_subset", type=int, default=6000)
  p.add_argument("--test_subset", type=int, default=2000)
  p.add_argument("--eval_every", type=int, default=4)
  p.add_argument("--data_dir", default="")
  p.add_argument("--out", default="benchmarks/results/accuracy_sequential.json")
  args = p.parse_args(argv)
  if not args.data_dir:
    shared = find_shared_data()
    if shared is None or not (shared / "cifar10").is_dir():
      print("skipped: ../shared/data/cifar10 not found (set FEDJAX_PROJ_SHARED_DATA or --data_dir)")
      return 0
    args.data_dir = str(shared)
  methods = [m.strip() for m in args.methods.split(",") if m.strip()]
  seeds = [int(s) for s in args.seeds.split(",")]
  runs: dict[str, list[dict]] = {m: [] for m in methods}
  for method in methods:
    for seed in seeds:
      out_dir = f"runs/bench_sequential/{method}-seed{seed}"
      t0 = time.perf_counter()
      summary = run_experiment(make_config(args, method, seed, out_dir))
      runs[method].append(
        {
          "seed": seed,
          "final_test_accuracy": summary["final_test_accuracy"],
          "wall_seconds": time.perf_counter() - t0,
          "strategy": summary["strategy"],
          "output_dir": out_dir,
          "accuracy_curve": accuracy_curve(out_dir),
        }
      )
  table = {}
  print(f"\nCIFAR-10 {args.partition}, {args.rounds} rounds, {len(seeds)} seed(s)")
  print(f"{'method':8s} {'accuracy % (mean ± std)':>24s} {'paper %':>8s} {'wall s':>8s}")
  for method in methods:
    acc = np.array([r["final_test_accuracy"] * 100 for r in runs[method]])
    wall = float(np.mean([r["wall_seconds"] for r in runs[method]]))
    table[method] = {"mean": float(acc.mean()), "std": float(acc.std()), "wall_seconds": wall}
    curve = " ".join(f"r{r}:{a:.2f}" for r, a in runs[method][0]["accuracy_curve"])
    print(
      f"{method:8s} {acc.mean():16.2f} ± {acc.std():5.2f} {PAPER.get(method, float('nan')):8.2f} "
      f"{wall:8.0f}   seed {seeds[0]} curve: {curve}"
    )
  result = {
    "benchmark": "accuracy_sequential",
    "settings": {k: v for k, v in vars(args).items() if k != "out"},
    "paper_cifar10_exdir_2_0.5": PAPER,
    "table": table,
    "runs": runs,
    "machine": {
      "platform": platform.platform(),
      "cpus": os.cpu_count(),
      "jax": jax.__version__,
      "backend": jax.default_backend(),
    },
    "command": " ".join(["python", "benchmarks/accuracy_sequential.py", *(argv or sys.argv[1:])]),
  }
  Path(args.out).parent.mkdir(parents=True, exist_ok=True)
  Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
  print(f"wrote {args.out}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
