"""Helpers shared by the benchmarks: real data when ../shared/data exists, round data, timing."""

from __future__ import annotations

import time

import jax
import numpy as np

from fedjax_proj.data.sources import find_shared_data, load_dataset


def cifar10(n_train: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
  """A random subset of real CIFAR-10 train images (random uint8 if the data is absent)."""
  shared = find_shared_data()
  rng = np.random.default_rng(seed)
  if shared is None:
    print("note: ../shared/data not found; using random images")
    return rng.integers(0, 255, (n_train, 32, 32, 3), np.uint8), rng.integers(0, 10, n_train)
  ds = load_dataset("cifar10", "train", shared / "cifar10")
  keep = rng.choice(len(ds.labels), n_train, replace=False)
  return ds.images[keep], ds.labels[keep]


def cifar100_public(n: int, seed: int = 0) -> np.ndarray:
  shared = find_shared_data()
  rng = np.random.default_rng(seed)
  if shared is None:
    return rng.integers(0, 255, (n, 32, 32, 3), np.uint8)
  ds = load_dataset(str(shared / "cifar100" / "public_20k.npz"), "train")
  return ds.images[rng.choice(len(ds.labels), n, replace=False)]


def round_data(x, y, parts, batch: int, extra: dict | None = None):
  """One round over clients ``parts`` (index arrays into x, y), one local epoch each.

  Returns:
    (RoundData on the default device, (idx, mask, num_examples) as host arrays).
  """
  import jax.numpy as jnp

  from fedjax_proj.core.types import RoundData
  from fedjax_proj.data.federated import FederatedData

  clients = len(parts)
  idx, mask, n = FederatedData(parts, batch, local_epochs=1).round_layout(np.arange(clients), 0, 0)
  rd = RoundData(
    jnp.asarray(x),
    jnp.asarray(y, jnp.int32),
    jnp.arange(clients, dtype=jnp.int32),
    jnp.asarray(idx),
    jnp.asarray(mask),
    jnp.asarray(n),
    extra or {},
  )
  return rd, (idx, mask, n)


def block(tree):
  jax.block_until_ready(tree)
  return tree


def best_time(fn, repeats: int = 3) -> float:
  """Minimum wall time of ``fn()`` over ``repeats`` runs (after the caller warmed it up)."""
  times = []
  for _ in range(repeats):
    t0 = time.perf_counter()
    block(fn())
    times.append(time.perf_counter() - t0)
  return min(times)


def header() -> str:
  return f"backend={jax.default_backend()} devices={jax.device_count()} jax={jax.__version__}"
