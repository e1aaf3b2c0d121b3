"""Federated view of a dataset: client index lists, per-round client sampling and the engine layout.

All host-side randomness is a pure function of (seed, round), so a resumed run samples and shuffles
exactly as an uninterrupted one.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import jax.numpy as jnp
import numpy as np

from fedjax_proj.core.random import numpy_rng
from fedjax_proj.core.types import Array, RoundData


class FederatedData:
  """Clients as index arrays into one training set.

  Args:
    client_indices: one int array per client (e.g. from :mod:`fedjax_proj.data.partition`).
    batch_size: local mini-batch size B.
    local_epochs: local epochs E per round (ignored when ``local_steps`` is set).
    local_steps: fixed number of local steps per round instead of epochs.

  The step axis S is fixed for the whole run (the largest client's step count), so shapes never
  change between rounds and the round is compiled once.
  """

  def __init__(
    self,
    client_indices: Sequence[np.ndarray],
    batch_size: int,
    local_epochs: int = 1,
    local_steps: int | None = None,
  ):
    if not client_indices:
      raise ValueError("FederatedData needs at least one client.")
    sizes = np.array([len(c) for c in client_indices])
    if (sizes == 0).any():
      raise ValueError(
        f"Clients {np.flatnonzero(sizes == 0).tolist()} hold no examples; use a partition with "
        "min_size >= 1 (e.g. dirichlet:<beta>:<min_size>)."
      )
    if batch_size < 1 or local_epochs < 1 or (local_steps is not None and local_steps < 1):
      raise ValueError("batch_size, local_epochs and local_steps must be positive integers.")
    self.client_indices = [np.asarray(c, np.int64) for c in client_indices]
    self.sizes = sizes
    self.batch_size = batch_size
    self.local_epochs = local_epochs
    self.local_steps = local_steps
    self.num_steps = int(max(self.steps_for(n) for n in sizes))

  @property
  def num_clients(self) -> int:
    return len(self.client_indices)

  def steps_for(self, n: int) -> int:
    if self.local_steps is not None:
      return self.local_steps
    return self.local_epochs * math.ceil(n / self.batch_size)

  def sample_clients(self, round_idx: int, clients_per_round: int, seed: int) -> np.ndarray:
    """Samples ``clients_per_round`` distinct clients uniformly, sorted; pure in (seed, round)."""
    if not 1 <= clients_per_round <= self.num_clients:
      raise ValueError(
        f"clients_per_round={clients_per_round} must be in [1, num_clients={self.num_clients}]."
      )
    rng = numpy_rng(seed, round_idx, "sample_clients")
    return np.sort(rng.choice(self.num_clients, clients_per_round, replace=False)).astype(np.int32)

  def client_batches(self, client: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """One client's [S, B] indices and mask: E shuffled epochs, last batch of each epoch partial."""
    data = self.client_indices[client]
    b, n = self.batch_size, len(data)
    idx = np.zeros((self.num_steps, b), np.int32)
    mask = np.zeros((self.num_steps, b), bool)
    if self.local_steps is not None:
      # Fixed step count: cycle through reshuffled passes, always full batches.
      reps = math.ceil(self.local_steps * b / n)
      order = np.concatenate([rng.permutation(data) for _ in range(reps)])
      idx[: self.local_steps] = order[: self.local_steps * b].reshape(self.local_steps, b)
      mask[: self.local_steps] = True
      return idx, mask
    per_epoch = math.ceil(n / b)
    for e in range(self.local_epochs):
      order = rng.permutation(data)
      for j in range(per_epoch):
        chunk = order[j * b : (j + 1) * b]
        s = e * per_epoch + j
        idx[s, : len(chunk)] = chunk
        mask[s, : len(chunk)] = True
    return idx, mask

  def round_layout(
    self, sampled: np.ndarray, round_idx: int, seed: int
  ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Index layout for the sampled clients: idx [C, S, B] int32, mask [C, S, B], n_k [C]."""
    rng = numpy_rng(seed, round_idx, "batches")
    parts = [self.client_batches(int(c), rng) for c in sampled]
    idx = np.stack([p[0] for p in parts])
    mask = np.stack([p[1] for p in parts])
    return idx, mask, self.sizes[sampled].astype(np.float32)

  def round_data(
    self, images: Array, labels: Array, sampled: np.ndarray, round_idx: int, seed: int, extra: dict
  ) -> RoundData:
    """The :class:`RoundData` of round ``round_idx`` for the ``sampled`` clients: their index
    layout (:meth:`round_layout`) over the device-resident ``images``/``labels``, and ``extra``."""
    idx, mask, n = self.round_layout(sampled, round_idx, seed)
    return RoundData(
      images, labels, jnp.asarray(sampled), jnp.asarray(idx), jnp.asarray(mask), jnp.asarray(n),
      extra,
    )  # fmt: skip
