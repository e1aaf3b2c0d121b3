"""Explicit PRNG derivation.

Every random draw of a run is a pure function of (seed, round, purpose, client): the key of round r
is ``fold_in(key(seed), r)``, and each round key is split into named streams and per-client keys.
Resumed runs therefore draw exactly what an uninterrupted run draws.
"""

from __future__ import annotations

import zlib

import jax
import numpy as np

from fedjax_proj.core.types import Array


def round_key(seed_key: Array, round_idx: int | Array) -> Array:
  """The key of round ``round_idx``: ``fold_in(seed_key, round_idx)``."""
  return jax.random.fold_in(seed_key, round_idx)


def stream_key(key: Array, name: str) -> Array:
  """A named, independent sub-stream of ``key`` (stable across Python runs, unlike ``hash``)."""
  return jax.random.fold_in(key, zlib.crc32(name.encode()) & 0x7FFFFFFF)


def client_keys(key: Array, num_clients: int) -> Array:
  """One key per sampled client, [num_clients] keys."""
  return jax.random.split(key, num_clients)


def numpy_rng(seed: int, round_idx: int, name: str) -> np.random.Generator:
  """A host-side generator for (seed, round, purpose): client sampling and batch shuffling."""
  return np.random.default_rng([seed, round_idx, zlib.crc32(name.encode())])
