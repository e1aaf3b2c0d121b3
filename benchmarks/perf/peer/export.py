"""Writes the peer benchmark's workload to one .npz and a JSON of its settings.

    python -m benchmarks.perf.peer.export --out results/peer/workload.npz

Every system reads the same file (benchmarks/perf/peer/common.py, ``load_export``), so all of them
train on the same train subset, the same clients' examples and the same cohort in every round. The
subset is drawn from real CIFAR-10 (../shared/data, ``fedjax_proj.data.sources``), the split is our
own ``partition`` (Dirichlet over labels, the split of 002 §5.1 and 003 §6), and the cohorts are our
``FederatedData.sample_clients`` (uniform without replacement, sorted). Sizes are flags, so a test
can write a tiny workload (``--synthetic`` draws random images when the data is absent).
"""

from __future__ import annotations

import argparse
import hashlib
import json
from pathlib import Path

import numpy as np

from fedjax_proj.data.federated import FederatedData
from fedjax_proj.data.partition import partition
from fedjax_proj.data.sources import find_shared_data, load_dataset


def _subset(split: str, n: int, seed: int, synthetic: bool) -> tuple[np.ndarray, np.ndarray]:
  rng = np.random.default_rng([seed, 0 if split == "train" else 1])
  shared = None if synthetic else find_shared_data()
  if shared is None:
    if not synthetic:
      raise SystemExit(
        "../shared/data/cifar10 not found (fedjax_proj.data.sources.find_shared_data); point "
        "FEDJAX_PROJ_SHARED_DATA at it, or pass --synthetic for random images (tests only)."
      )
    return rng.integers(0, 256, (n, 32, 32, 3), np.uint8), rng.integers(0, 10, n).astype(np.int64)
  ds = load_dataset("cifar10", split, shared / "cifar10")
  if n > len(ds.labels):
    raise SystemExit(f"--n_{split}={n}: CIFAR-10's {split} split has {len(ds.labels)} images.")
  keep = np.sort(rng.choice(len(ds.labels), n, replace=False))
  return ds.images[keep], ds.labels[keep].astype(np.int64)


def export(
  out: str | Path,
  *,
  n_train: int = 20_000,
  n_test: int = 2_000,
  num_clients: int = 100,
  clients_per_round: int = 10,
  rounds: int = 8,
  alpha: float = 0.3,
  min_size: int | None = None,
  batch_size: int = 32,
  lr: float = 0.05,
  local_epochs: int = 1,
  seed: int = 0,
  synthetic: bool = False,
) -> dict:
  """Writes ``out`` (.npz) and its settings (``out`` with .json); returns the settings.

  Raises:
    ValueError: sizes that cannot make the workload (checked before any data is read).
  """
  out = Path(out)
  if out.suffix != ".npz":
    raise ValueError(f"--out={out}: the export is a .npz (its settings go beside it as .json).")
  if not 1 <= clients_per_round <= num_clients:
    raise ValueError(
      f"clients_per_round={clients_per_round} must be in [1, num_clients={num_clients}]."
    )
  if n_train < num_clients:
    raise ValueError(f"n_train={n_train} < num_clients={num_clients}: some clients would be empty.")
  if min(rounds, n_test, batch_size, local_epochs) < 1 or alpha <= 0 or lr <= 0:
    raise ValueError("rounds, n_test, batch_size and local_epochs must be >= 1; alpha, lr > 0.")
  train_x, train_y = _subset("train", n_train, seed, synthetic)
  test_x, test_y = _subset("test", n_test, seed, synthetic)
  # min_size: the partition's smallest client (its default 10 when None); 500 clients of a 20,000
  # subset at Dirichlet(0.3) need a smaller one (the scaling mode passes 5).
  spec = f"dirichlet:{alpha}" + (f":{min_size}" if min_size is not None else "")
  clients = partition(train_y, spec, num_clients, seed=seed)
  fed = FederatedData(clients, batch_size, local_epochs=local_epochs)
  cohorts = np.stack([fed.sample_clients(r, clients_per_round, seed) for r in range(rounds)])
  sizes = np.array([len(c) for c in clients])
  out.parent.mkdir(parents=True, exist_ok=True)
  np.savez(
    out,
    train_x=train_x,
    train_y=train_y,
    client_offsets=np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64),
    client_index=np.concatenate(clients).astype(np.int64),
    cohorts=cohorts.astype(np.int32),
    test_x=test_x,
    test_y=test_y,
  )
  settings = {
    "dataset": "synthetic" if synthetic else "cifar10 (../shared/data, JPEG re-encodes)",
    "n_train": n_train,
    "n_test": n_test,
    "num_clients": num_clients,
    "clients_per_round": clients_per_round,
    "rounds": rounds,
    "partition": spec,
    "batch_size": batch_size,
    "lr": lr,
    "local_epochs": local_epochs,
    "seed": seed,
    "client_sizes": {
      "min": int(sizes.min()),
      "median": float(np.median(sizes)),
      "max": int(sizes.max()),
    },  # fmt: skip
    "sha256": hashlib.sha256(out.read_bytes()).hexdigest(),
  }
  out.with_suffix(".json").write_text(json.dumps(settings, indent=1) + "\n")
  return settings


def main(argv=None) -> None:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--out", required=True, help="the .npz to write (settings go beside it as .json)")
  p.add_argument("--n_train", type=int, default=20_000)
  p.add_argument("--n_test", type=int, default=2_000)
  p.add_argument("--num_clients", type=int, default=100)
  p.add_argument("--clients_per_round", type=int, default=10)
  p.add_argument("--rounds", type=int, default=8)
  p.add_argument("--alpha", type=float, default=0.3, help="Dirichlet concentration")
  p.add_argument("--min_size", type=int, default=None, help="smallest client (default: 10)")
  p.add_argument("--batch_size", type=int, default=32)
  p.add_argument("--lr", type=float, default=0.05)
  p.add_argument("--local_epochs", type=int, default=1)
  p.add_argument("--seed", type=int, default=0)
  p.add_argument("--synthetic", action="store_true", help="random images (tests only)")
  a = p.parse_args(argv)
  try:
    settings = export(
      a.out, n_train=a.n_train, n_test=a.n_test, num_clients=a.num_clients,
      clients_per_round=a.clients_per_round, rounds=a.rounds, alpha=a.alpha, min_size=a.min_size,
      batch_size=a.batch_size, lr=a.lr, local_epochs=a.local_epochs, seed=a.seed,
      synthetic=a.synthetic,
    )  # fmt: skip
  except ValueError as e:
    raise SystemExit(str(e)) from None
  print(json.dumps(settings))


if __name__ == "__main__":
  main()
