"""GPM+FL: local gradient projection memory on every client inside FedAvg.

Compared with FOT in Bakman et al., "Federated Orthogonal Training" (ICLR 2024), section 5
(paper 003; docs/methods.md "FOT"): each centralised continual-learning method runs on every
client inside FedAvg (:mod:`fedjax_proj.algorithms.continual.base`).

* GPM+FL (Saha et al., ICLR 2021): each client keeps its OWN bases (per-client state
  [num_clients, d, d] per layer), projects its local gradients of every Dense/Conv kernel out of
  them (g ← g − U Uᵀ g), and after each task extends them from the SVD of its own residual layer
  inputs on ``gpm_samples`` examples with GPM's energy rule
  (‖X‖² − ‖R‖² + Σ_{j≤k} σ_j²) / ‖X‖² ≥ th.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax

from fedjax_proj.algorithms import client as client_lib
from fedjax_proj.algorithms.continual import gpse
from fedjax_proj.algorithms.continual.base import (
  ContinualMethod,
  task_algorithm,
  task_loss,
)
from fedjax_proj.algorithms.continual.gpse import expand_basis, residual
from fedjax_proj.algorithms.registry import factory_spec
from fedjax_proj.core import ranges
from fedjax_proj.core import tree as tree_lib
from fedjax_proj.core.executor import Executor
from fedjax_proj.core.types import Array, Model


def extend_memory(
  x_rows: np.ndarray, basis: np.ndarray, rank: int, threshold: float
) -> tuple[np.ndarray, int, int]:
  """One layer's GPM memory update from its input rows (Saha et al., ICLR 2021, eqs. 8-9).

  With R = X − X U Uᵀ the part of the inputs ``x_rows`` [N, d] outside the stored basis
  ``basis[:, :rank]`` (zero-padded [d, d]) and σ_j the singular values of R, keeps the smallest k
  with (‖X‖² − ‖R‖² + Σ_{j≤k} σ_j²) / ‖X‖² ≥ ``threshold``; none when the stored basis already
  covers that share (GPM's loop stops before its first direction). At the first task (rank 0)
  this is also the smallest k: GPM's code keeps one fewer there (docs/fot.md, "GPM+FL").

  Returns:
    (the extended basis, its rank, the number of directions added).
  """
  d = basis.shape[0]
  x = np.asarray(x_rows, np.float64)
  r = residual(x, np.asarray(basis, np.float64))
  total, res = float(np.sum(x * x)), float(np.sum(r * r))
  if total <= 0 or rank >= d or total - res >= threshold * total:
    return basis, rank, 0
  u, sv, _ = np.linalg.svd(r.T, full_matrices=False)
  frac = (total - res + np.cumsum(sv**2)) / total
  k = int(np.flatnonzero(frac >= threshold)[0]) + 1 if np.any(frac >= threshold) else len(sv)
  new, new_rank = expand_basis(basis, rank, u[:, :k])
  return new, new_rank, new_rank - rank


def gpm(
  model: Model,
  optimizer: optax.GradientTransformation,
  executor: Executor,
  *,
  variables: dict,
  sample_x: Array,
  num_clients: int,
  threshold: float = 0.97,
  threshold_inc: float = 0.0,
  gpm_samples: int = 125,
) -> ContinualMethod:
  """GPM+FL: local gradient projection memory on every client (see the module docstring)."""
  specs = gpse.find_layers(model, variables, sample_x, task=0)

  def transform_grads(grads, params, batch, ctx):
    return gpse.fed_project(grads, specs, ctx.extra), ctx.extra

  program = client_lib.local_training_client(
    model,
    optimizer,
    task_loss(model),
    init_extra=lambda sh, ci, k: ci,
    transform_grads=transform_grads,
  )

  def init_method(v):
    return {s.key: jnp.zeros((num_clients, s.in_dim, s.in_dim), jnp.float32) for s in specs}

  def broadcast_extra(state, rd, key):
    return {}, tree_lib.index_clients(state.method, rd.client_ids)

  @jax.jit
  def client_rows(variables, images, labels, idx, mask, task):
    b = executor.batch_fn(images, labels, idx, mask, jax.random.key(0))
    _, cap = gpse.capture_inputs(model, variables, b.x, mask=b.mask, task=task)
    return {s.key: gpse.input_rows(s, cap[s.path][1].astype(jnp.float32), b.mask) for s in specs}

  def end_task(state, rd, key, task):  # one jitted forward per client, whatever the strategy
    # Hundreds of small per-client SVDs: single-threaded BLAS (see gpse.blas_threads).
    with gpse.blas_threads(1):
      return _end_task(state, rd, key, task)

  def _end_task(state, rd, key, task):
    th = threshold + threshold_inc * task
    idx = np.asarray(rd.idx).reshape(rd.idx.shape[0], -1)
    mask = np.asarray(rd.mask).reshape(rd.idx.shape[0], -1)
    ids = np.asarray(rd.client_ids)
    bases = {k: np.array(v) for k, v in state.method.items()}
    ranks = {s.key: [] for s in specs}
    for c in range(idx.shape[0]):
      own = idx[c][mask[c]][:gpm_samples]
      sel = np.zeros(gpm_samples, np.int32)
      m = np.zeros(gpm_samples, bool)
      sel[: len(own)], m[: len(own)] = own, True
      rows = client_rows(state.variables, rd.images, rd.labels, sel, m, jnp.int32(task))
      for s in specs:
        x = np.asarray(rows[s.key], np.float64)
        u_old = bases[s.key][ids[c]]
        rank = int(np.sum(np.linalg.norm(u_old, axis=0) > 0.5))
        bases[s.key][ids[c]], new_rank, _ = extend_memory(x, u_old, rank, th)
        ranks[s.key].append(new_rank)
    method = {k: jnp.asarray(v) for k, v in bases.items()}
    metrics = {"threshold": th}
    for k, v in ranks.items():  # per-client ranks differ: GPM+FL keeps one basis per client
      metrics.update({f"mean_rank/{k}": float(np.mean(v)), f"min_rank/{k}": int(np.min(v))})
      metrics[f"max_rank/{k}"] = int(np.max(v))
    return state._replace(method=method), metrics

  algorithm = task_algorithm("gpm", init_method, broadcast_extra, program)
  return ContinualMethod(algorithm, end_task)


SPEC = factory_spec(
  "gpm",
  "continual",
  gpm,
  ctx_args=("model", "client_optimizer", "executor"),
  ctx_kwargs=("variables", "sample_x", "num_clients"),
  ranges={"threshold": ranges.FRACTION},
  requires=("executor", "variables", "sample_x"),
)
