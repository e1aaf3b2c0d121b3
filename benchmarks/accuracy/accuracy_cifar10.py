"""Accuracy benchmark on real CIFAR-10 at a reduced CPU budget, for every registered FL method.

    python -m benchmarks.accuracy.accuracy_cifar10                                 # drift baselines
    python -m benchmarks.accuracy.accuracy_cifar10 --methods=fedavg,scaffold --seeds=0,1,2 \
        --rounds=30
    python -m benchmarks.accuracy.accuracy_cifar10 --methods=fedavg,fedproj,feddf  # public data
    python -m benchmarks.accuracy.accuracy_cifar10 --setting=sequential             # sequential FL
    python -m benchmarks.accuracy.accuracy_cifar10 --setting=sequential --seeds=0,1,2 --rounds=30

``--setting`` picks the comparison and its defaults (:data:`SETTINGS`); every flag overrides them.

- ``drift`` (default): FedAvg and the drift-correction baselines (FedProx, FedNova, FedDyn,
  SCAFFOLD, MOON, FedRCL) under Dirichlet 0.3 label skew. The FedProj paper's CIFAR-10 setting
  (papers/001; 100 clients, 10% per round, 20 local epochs, 100 rounds, ResNet-8) takes hours on
  the shared 2-core CPU, so the defaults are a 10k training subset over 20 clients, 5 per round,
  10 rounds, 1 local epoch, the FedAvg CNN, SGD 0.01 with momentum 0.9.
- ``sequential``: FedAvg vs FedSeq vs CWC vs SFedKD under ExDir(2, 0.5). The SFedKD paper
  (papers/004, Table 1; 100 clients, 10 per round, 1000 rounds, 5 local epochs, 8-layer AlexNet)
  reports FedAvg 32.48, FedSeq 54.66, CWC 55.16, SFedKD 61.56; the defaults here are a 6k
  training subset over 20 clients, 10 per round, K = 5 teachers, 8 rounds, 1 local epoch, the
  FedAvg CNN and the paper's optimiser (SGD 0.01, no momentum, weight decay 1e-4), so what it can
  show is the ordering at equal client compute.

Methods that need a public set (``registry.needs_public``) get ``--public_data`` (default:
../shared/data/cifar100/public_20k.npz) through
:func:`fedjax_proj.training.experiment.run_experiment`; if that cannot supply it, the method is
reported as skipped with the reason. Absolute numbers are far below the papers' and the ordering at
these budgets is noisy; use several seeds before reading differences of a point or two. Every
method sees the same partition, client samples and batches (same seed).

Prints a mean ± std table (std over seeds; 0 with one seed) with the paper's number where it has
one, each run's wall time and the first seed's accuracy curve, and writes JSON to the setting's
``--out`` (``results/accuracy_cifar10.json`` or ``accuracy_sequential.json``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import sys
import time
from pathlib import Path

import jax
import numpy as np

from benchmarks import flag_checks
from benchmarks.results_io import write_results
from fedjax_proj.algorithms import registry
from fedjax_proj.data.sources import find_shared_data
from fedjax_proj.training.config import base_config
from fedjax_proj.training.experiment import run_experiment

# The comparisons this benchmark runs: their methods, the flags whose defaults differ, per-method
# hyperparameters that differ from the module defaults (overridden by --method_kwargs) and the
# paper's numbers at its full budget, for orientation.
SETTINGS = {
  "drift": {
    "methods": "fedavg,fedprox,fednova,feddyn,scaffold,moon,fedrcl",
    "rounds": 10,
    "clients_per_round": 5,
    "partition": "dirichlet:0.3",
    "momentum": 0.9,
    "train_subset": 10000,
    "eval_every": 5,
    # MOON's paper uses mu = 5 on CIFAR-10.
    "method_kwargs": {"moon": {"mu": 5.0}},
    "paper": {"fedavg": 63.19, "feddf": 61.32, "fedproj": 65.52},
    "paper_setting": "FedProj paper (papers/001), CIFAR-10 Dir 0.3, full budget",
    "out": "results/accuracy_cifar10.json",
  },
  "sequential": {
    "methods": "fedavg,fedseq,cwc,sfedkd",
    "rounds": 8,
    "clients_per_round": 10,
    "partition": "exdir:2:0.5",
    "momentum": 0.0,
    "train_subset": 6000,
    "eval_every": 4,
    "method_kwargs": {"sfedkd": {"num_teachers": 5}},
    "paper": {"fedavg": 32.48, "fedseq": 54.66, "cwc": 55.16, "sfedkd": 61.56},
    "paper_setting": "SFedKD paper (papers/004) Table 1, CIFAR-10 ExDir(2, 0.5), full budget",
    "out": "results/accuracy_sequential.json",
  },
}
# The flags --setting fills when they are not given.
_SETTING_FLAGS = (
  "methods",
  "rounds",
  "clients_per_round",
  "partition",
  "momentum",
  "train_subset",
  "eval_every",
  "out",
)


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
  for k, v in method_kwargs.get(method, {}).items():
    c.method_kwargs[k] = v
  return c


def parse_args(argv=None) -> tuple[argparse.ArgumentParser, argparse.Namespace]:
  """The flags, with those ``--setting`` decides filled from :data:`SETTINGS` where not given."""
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--setting", default="drift", choices=tuple(SETTINGS))
  p.add_argument("--methods", help="comma-separated registry names (default: the setting's)")
  p.add_argument("--seeds", default="0")
  p.add_argument("--rounds", type=int)
  p.add_argument("--local_epochs", type=int, default=1)
  p.add_argument("--num_clients", type=int, default=20)
  p.add_argument("--clients_per_round", type=int)
  p.add_argument("--partition")
  p.add_argument("--model", default="cnn")
  p.add_argument("--batch_size", type=int, default=64)
  p.add_argument("--optimizer", default="sgd", choices=("sgd", "adam"))
  p.add_argument("--lr", type=float, default=0.01)
  p.add_argument("--momentum", type=float)
  p.add_argument("--weight_decay", type=float, default=1e-4)
  p.add_argument("--augment", action="store_true")
  p.add_argument("--strategy", default="auto")
  p.add_argument("--train_subset", type=int)
  p.add_argument("--test_subset", type=int, default=2000)
  p.add_argument("--eval_every", type=int)
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
    help='per-method hyperparameters over the setting\'s, e.g. "moon:mu=1;fedprox:mu=0.1"',
  )
  p.add_argument("--out", help="JSON result path (default: the setting's)")
  args = p.parse_args(argv)
  setting = SETTINGS[args.setting]
  for flag in _SETTING_FLAGS:
    if getattr(args, flag) is None:
      setattr(args, flag, setting[flag])
  return p, args


def main(argv=None) -> int:
  p, args = parse_args(argv)

  # The lists first (flag_checks): a seed or method twice would be run and averaged twice.
  methods = flag_checks.names(p, "--methods", args.methods, registry.methods())
  seeds = flag_checks.seeds(p, "--seeds", args.seeds)
  setting = SETTINGS[args.setting]
  shared = find_shared_data()
  if not args.data_dir:
    if shared is None or not (shared / "cifar10").is_dir():
      print("skipped: ../shared/data/cifar10 not found (set FEDJAX_PROJ_SHARED_DATA or --data_dir)")
      return 0
    args.data_dir = str(shared / "cifar10")
  if not args.public_data and shared is not None:
    candidate = shared / "cifar100" / "public_20k.npz"
    args.public_data = str(candidate) if candidate.exists() else ""
  try:
    given = parse_method_kwargs(args.method_kwargs)
  except ValueError as e:
    p.error(str(e))
  method_kwargs = {m: {**setting["method_kwargs"].get(m, {}), **given.get(m, {})} for m in methods}

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
          "accuracy_curve": accuracy_curve(out_dir),
        }
      )
      print(
        f"{method} seed={seed}: {summary['final_test_accuracy']:.4f} "
        f"({time.perf_counter() - t0:.0f} s)"
      )
      sys.stdout.flush()

  table = {}
  paper = setting["paper"]
  print(
    f"\nCIFAR-10 {args.partition}, {args.model}, {args.num_clients} clients "
    f"({args.clients_per_round}/round), {args.rounds} rounds x {args.local_epochs} local epoch(s), "
    f"train_subset={args.train_subset}, {len(seeds)} seed(s); paper: {setting['paper_setting']}"
  )
  print(f"{'method':10s} {'accuracy % (mean ± std)':>24s} {'paper %':>8s} {'wall s/run':>11s}")
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
    curve = " ".join(f"r{r}:{a:.2f}" for r, a in finished[0]["accuracy_curve"])
    print(
      f"{method:10s} {acc.mean():16.2f} ± {acc.std():5.2f} {paper.get(method, float('nan')):8.2f} "
      f"{wall:11.0f}{note}   seed {finished[0]['seed']} curve: {curve}"
    )
  result = {
    "benchmark": Path(setting["out"]).stem,
    "settings": {k: v for k, v in vars(args).items() if k != "out"},
    "default_method_kwargs": setting["method_kwargs"],
    "paper": paper,
    "paper_setting": setting["paper_setting"],
    "table": table,
    "runs": runs,
    "skipped": skipped,
    "machine": {
      "platform": platform.platform(),
      "cpus": os.cpu_count(),
      "jax": jax.__version__,
      "backend": jax.default_backend(),
    },
    "command": shlex.join(
      ["python", "-m", "benchmarks.accuracy.accuracy_cifar10", *(argv or sys.argv[1:])]
    ),
  }
  write_results(args.out, result, indent=2)
  print(f"wrote {args.out}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
