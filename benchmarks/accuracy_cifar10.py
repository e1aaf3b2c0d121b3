"""Accuracy benchmark on real CIFAR-10 under Dirichlet label skew: FedAvg and the drift-correction
baselines (FedProx, FedNova, FedDyn, SCAFFOLD, MOON, FedRCL), plus any other registered method.

    python benchmarks/accuracy_cifar10.py                                  # reduced CPU budget
    python benchmarks/accuracy_cifar10.py --methods=fedavg,scaffold --seeds=0,1,2 --rounds=30
    python benchmarks/accuracy_cifar10.py --methods=fedavg,fedproj,feddf   # public-data methods

The method list is a flag; methods that need a public set (``registry.needs_public``) get
``--public_data`` (default: ../shared/data/cifar100/public_20k.npz) through
:func:`fedjax_proj.training.experiment.run_experiment`; if that cannot supply it, the method is
reported as skipped with the reason. The FedProj paper's CIFAR-10 setting (100 clients, 10% per
round, 20 local epochs, 100 rounds, ResNet-8) takes hours on the shared 2-core CPU, so the defaults
are a reduced budget (a 10k training subset over 20 clients, 5 per round, 10 rounds, 1 local epoch,
the FedAvg CNN, SGD 0.01 with momentum 0.9): absolute numbers are far below the paper's and the
ordering at this budget is noisy; use several seeds before reading differences of a point or two.
Every method sees the same partition, client samples and batches (same seed).

Prints a mean ± std table (std over seeds; 0 with one seed) with each run's wall time, and writes
JSON to ``benchmarks/results/accuracy_cifar10.json`` (``--out``).
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

from fedjax_proj.algorithms import registry
from fedjax_proj.data.sources import find_shared_data
from fedjax_proj.training.config import base_config
from fedjax_proj.training.experiment import run_experiment

DEFAULT_METHODS = "fedavg,fedprox,fednova,feddyn,scaffold,moon,fedrcl"
# Per-method hyperparameters that differ from the module defaults on CIFAR-10 (MOON's paper uses
# μ = 5 there). Overridden by --method_kwargs.
CIFAR10_KWARGS = {"moon": {"mu": 5.0}}
# FedAvg / FedProj numbers of the FedProj paper (CIFAR-10, Dir 0.3, full budget), for orientation.
PAPER_DIR03 = {"fedavg": 63.19, "feddf": 61.32, "fedproj": 65.52}


def parse_method_kwargs(text: str) -> dict[str, dict]:
  """``"moon:mu=5,temperature=0.5;fedprox:mu=0.1"`` -> {method: {key: value}}."""
  out: dict[str, dict] = {}
  for block in filter(None, (b.strip() for b in text.split(";"))):
    if ":" not in block:
      raise ValueError(f"--method_kwargs block {block!r} must look like method:key=value,...")
    method, pairs = block.split(":", 1)
    kwargs = out.setdefault(method.strip(), {})
    for pair in filter(None, (p.strip() for p in pairs.split(","))):
      if "=" not in pair:
        raise ValueError(f"--method_kwargs expects key=value, got {pair!r}")
      k, v = pair.split("=", 1)
      try:
        value = int(v) if v.strip().lstrip("-").isdigit() else float(v)
      except ValueError:
        value = {"true": True, "false": False}.get(v.strip().lower(), v.strip())
      kwargs[k.strip()] = value
  return out


def make_config(args, method: str, seed: int, output_dir: str, method_kwargs: dict):
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
    batch_size=args.batch_size,
    partition=args.partition,
    seed=seed,
    strategy=args.strategy,
    optimizer=args.optimizer,
    lr=args.lr,
    momentum=args.momentum,
    weight_decay=args.weight_decay,
    augment=args.augment,
    eval_every=args.eval_every,
    train_subset=args.train_subset,
    test_subset=args.test_subset,
    progress=False,
    output_dir=output_dir,
    overwrite=True,  # a benchmark re-run replaces its own previous run of the same folder
  )
  if registry.needs_public(method):
    c.public_data = args.public_data
    if "public_size" in c:
      c.public_size = args.public_size
  for k, v in {**CIFAR10_KWARGS.get(method, {}), **method_kwargs.get(method, {})}.items():
    c.method_kwargs[k] = v
  return c


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--methods", default=DEFAULT_METHODS, help="comma-separated registry names")
  p.add_argument("--seeds", default="0")
  p.add_argument("--rounds", type=int, default=10)
  p.add_argument("--local_epochs", type=int, default=1)
  p.add_argument("--num_clients", type=int, default=20)
  p.add_argument("--clients_per_round", type=int, default=5)
  p.add_argument("--partition", default="dirichlet:0.3")
  p.add_argument("--model", default="cnn")
  p.add_argument("--batch_size", type=int, default=64)
  p.add_argument("--optimizer", default="sgd", choices=("sgd", "adam"))
  p.add_argument("--lr", type=float, default=0.01)
  p.add_argument("--momentum", type=float, default=0.9)
  p.add_argument("--weight_decay", type=float, default=1e-4)
  p.add_argument("--augment", action="store_true")
  p.add_argument("--strategy", default="auto")
  p.add_argument("--train_subset", type=int, default=10000)
  p.add_argument("--test_subset", type=int, default=2000)
  p.add_argument("--eval_every", type=int, default=5)
  p.add_argument("--data_dir", default="", help="CIFAR-10 root (default ../shared/data/cifar10)")
  p.add_argument(
    "--public_data",
    default="",
    help="public set for methods that need one (default ../shared/data/cifar100/public_20k.npz)",
  )
  p.add_argument("--public_size", type=int, default=0, help="0 = the whole public set")
  p.add_argument(
    "--method_kwargs",
    default="",
    help='per-method hyperparameters, e.g. "moon:mu=1;fedprox:mu=0.1"',
  )
  p.add_argument("--out", default="benchmarks/results/accuracy_cifar10.json")
  args = p.parse_args(argv)

  shared = find_shared_data()
  if not args.data_dir:
    if shared is None or not (shared / "cifar10").is_dir():
      print("skipped: ../shared/data/cifar10 not found (set FEDJAX_PROJ_SHARED_DATA or --data_dir)")
      return 0
    args.data_dir = str(shared / "cifar10")
  if not args.public_data and shared is not None:
    candidate = shared / "cifar100" / "public_20k.npz"
    args.public_data = str(candidate) if candidate.exists() else ""
  methods = [m.strip() for m in args.methods.split(",") if m.strip()]
  unknown = [m for m in methods if m not in registry.methods()]
  if unknown:
    p.error(f"unknown method(s) {unknown}; valid: {', '.join(registry.methods())}")
  try:
    method_kwargs = parse_method_kwargs(args.method_kwargs)
  except ValueError as e:
    p.error(str(e))
  seeds = [int(s) for s in args.seeds.split(",")]

  runs: dict[str, list[dict]] = {m: [] for m in methods}
  skipped: dict[str, str] = {}
  for method in methods:
    for seed in seeds:
      # Per-invocation folder (named after --out), so concurrent invocations never share files.
      out_dir = f"runs/bench_{Path(args.out).stem}/{method}-seed{seed}"
      config = make_config(args, method, seed, out_dir, method_kwargs)
      t0 = time.perf_counter()
      try:
        summary = run_experiment(config)
      except FloatingPointError as e:  # the loop's NonFiniteError: record it, run the rest
        runs[method].append({"seed": seed, "diverged": str(e), "output_dir": out_dir})
        print(f"{method} seed={seed}: diverged ({e})")
        continue
      except ValueError as e:
        if registry.needs_public(method):  # e.g. a runner without public-data support
          skipped[method] = str(e)
          print(f"skipped {method}: {e}")
          break
        raise
      runs[method].append(
        {
          "seed": seed,
          "final_test_accuracy": summary["final_test_accuracy"],
          "wall_seconds": time.perf_counter() - t0,
          "train_seconds": summary["wall_seconds"],
          "strategy": summary["strategy"],
          "method_kwargs": dict(config.method_kwargs),
          "output_dir": out_dir,
        }
      )
      print(
        f"{method} seed={seed}: {summary['final_test_accuracy']:.4f} "
        f"({time.perf_counter() - t0:.0f} s)"
      )
      sys.stdout.flush()

  table = {}
  print(
    f"\nCIFAR-10 {args.partition}, {args.model}, {args.num_clients} clients "
    f"({args.clients_per_round}/round), {args.rounds} rounds x {args.local_epochs} local epoch(s), "
    f"train_subset={args.train_subset}, {len(seeds)} seed(s)"
  )
  print(f"{'method':10s} {'accuracy % (mean ± std)':>24s} {'wall s/run':>11s}")
  for method in methods:
    finished = [r for r in runs[method] if "diverged" not in r]
    diverged = len(runs[method]) - len(finished)
    if not finished:
      status = f"diverged ({diverged} seed(s))" if diverged else "skipped"
      print(f"{method:10s} {status:>24s}")
      table[method] = {"diverged_seeds": diverged}
      continue
    acc = np.array([r["final_test_accuracy"] * 100 for r in finished])
    wall = float(np.mean([r["wall_seconds"] for r in finished]))
    table[method] = {
      "mean": float(acc.mean()),
      "std": float(acc.std()),
      "seeds": len(acc),
      "diverged_seeds": diverged,
      "wall_seconds_per_run": wall,
    }
    note = f"  ({diverged} seed(s) diverged)" if diverged else ""
    print(f"{method:10s} {acc.mean():16.2f} ± {acc.std():5.2f} {wall:11.0f}{note}")
  result = {
    "benchmark": "accuracy_cifar10",
    "settings": {k: v for k, v in vars(args).items() if k != "out"},
    "default_method_kwargs": CIFAR10_KWARGS,
    "paper_full_budget_dir0.3": PAPER_DIR03,
    "table": table,
    "runs": runs,
    "skipped": skipped,
    "machine": {
      "platform": platform.platform(),
      "cpus": os.cpu_count(),
      "jax": jax.__version__,
      "backend": jax.default_backend(),
    },
    "command": " ".join(["python", "benchmarks/accuracy_cifar10.py", *(argv or sys.argv[1:])]),
  }
  Path(args.out).parent.mkdir(parents=True, exist_ok=True)
  Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
  print(f"wrote {args.out}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
