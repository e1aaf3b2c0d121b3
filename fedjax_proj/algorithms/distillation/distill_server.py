"""The server of the distillation family (FedDF, FedET, FedProj): average, distil, refresh memory.

Each round (paper 001, Algorithm 1, lines 4-6 and 31-42):
1. θ_avg = Σ_k p_k θ_k (FedAvg, BatchNorm statistics included);
2. the sampled clients' inference-mode logits on the public set, computed for all clients at once
   (one vmapped program, or a host loop on XLA:CPU), combined into the teacher (mean or FedET's
   uncertainty weighting) and distilled into θ_avg (see :mod:`.distill`);
3. FedProj's memory for the NEXT round: M public indices sampled without replacement and
   Z_ens = the plain mean of this round's client logits on them — the same logits the teacher
   used, so the memory costs no extra forward pass when distillation is on;
4. when asked (``lmem_metric``), the L_mem drift metric (paper 001, C.4): the plain
   KL(σ(Z_ens) ‖ σ(f(·; θ_new))), batchmean, of the new global model on the new memory buffer. It
   is the round's only forward pass that trains nothing, so it is off unless a report reads it
   (docs/fedproj.md, "What runs where").

The weight-divergence term of step 2 pulls towards ``cfg.anchor`` (:data:`distill.ANCHORS`): the
previous global model (Algorithm 1, the default), this round's FedAvg result, or the participating
clients (001, C.1).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp

from fedjax_proj.algorithms import losses
from fedjax_proj.algorithms.client import split_variables
from fedjax_proj.algorithms.distillation import distill
from fedjax_proj.algorithms.fedavg import client_metrics
from fedjax_proj.core import tree as tree_lib
from fedjax_proj.core.engine import TwoForms
from fedjax_proj.core.types import Array, Model, RoundData


class DistillServerState(NamedTuple):
  """Server state of the distillation family.

  Attributes:
    round: rounds completed.
    variables: the global model.
    memory_idx: [M] public indices of the memory buffer for the next round (M may be 0).
    memory_logits: [M, K] Z_ens on those indices from the previous round's clients.
    has_memory: False until one round has produced an ensemble (round 0).
  """

  round: Array
  variables: dict
  memory_idx: Array
  memory_logits: Array
  has_memory: Array


class MemoryBuffer(NamedTuple):
  """FedProj's memory buffer: ``size`` (M) of the server's P public examples, drawn anew every
  round (001, Algorithm 1, lines 31-42). M is at most P (``fedproj.check_memory``); FedDF and
  FedET have no buffer (``memory=None``)."""

  size: int

  def sample(self, key: Array, public_size: int) -> Array:
    """[M] of the ``public_size`` public indices without replacement (all in order when M = P)."""
    if self.size >= public_size:
      return jnp.arange(public_size, dtype=jnp.int32)
    return jax.random.choice(key, public_size, (self.size,), replace=False).astype(jnp.int32)


def distillation_server(
  model: Model,
  normalize: Callable[[Array], Array],
  cfg: distill.DistillConfig,
  *,
  public_size: int,
  teacher: str = "mean",
  memory: MemoryBuffer | None = None,
  lmem_metric: bool = False,
):
  """Builds ``(init, aggregate)`` for the distillation family.

  ``aggregate`` is a :class:`~fedjax_proj.core.engine.TwoForms`: the traced server step and the same
  step as host loops of jitted steps; the round driver picks one from its execution strategy.

  Args:
    model: the model.
    normalize: raw public images -> model inputs.
    cfg: distillation settings (``cfg.epochs == 0`` turns server distillation off).
    public_size: number of public examples P in ``RoundData.extra["public_images"]``.
    teacher: ``"mean"`` (FedDF, FedProj) or ``"uncertainty"`` (FedET).
    memory: FedProj's memory buffer (module docstring, step 3); None: no buffer (FedDF, FedET),
      whose state then holds an empty one ([0] indices, [0, K] logits) that passes through.
    lmem_metric: log ``lmem_global``, the L_mem drift metric (module docstring, step 4), which
      costs a forward pass of the new global model on the M memory examples per round; it needs
      ``memory``.
  """
  if teacher not in distill.TEACHER_COMBINERS:
    raise ValueError(
      f"Unknown teacher {teacher!r}; choose one of {sorted(distill.TEACHER_COMBINERS)}."
    )
  if public_size <= 0:
    raise ValueError("The distillation family needs a public set (public_size > 0).")
  if cfg.anchor not in distill.ANCHORS:
    raise ValueError(f"Unknown divergence anchor {cfg.anchor!r}; choose one of {distill.ANCHORS}.")
  combine = distill.TEACHER_COMBINERS[teacher]
  host_logits = distill.HostClientLogits(model, normalize, cfg.teacher_batch_size)
  host_distill = distill.HostDistiller(model, normalize, cfg)
  # M of the P public indices: drawn in init, in the traced step, and jitted for the host loop.
  sample = None if memory is None else functools.partial(memory.sample, public_size=public_size)
  sample_memory = None if sample is None else jax.jit(sample)

  def init(variables, key):
    idx = jnp.zeros((0,), jnp.int32) if sample is None else sample(key)
    return DistillServerState(
      jnp.zeros((), jnp.int32),
      tree_lib.tree_copy(variables),
      idx,
      jnp.zeros((idx.shape[0], model.num_classes), jnp.float32),
      jnp.zeros((), bool),
    )

  def _divergence_anchor(state, stacked):
    """(anchor parameters or None = the FedAvg start, weight on α) for ``cfg.anchor``."""
    if cfg.anchor == "previous":
      return split_variables(state.variables)[0], 1.0
    if cfg.anchor == "live":
      # The code's aliased anchor: θ − θ = 0, so the term weighs nothing (docs/fedproj.md).
      return None, 0.0
    if cfg.anchor == "clients":
      params = split_variables(stacked)[0]
      num = jax.tree.leaves(params)[0].shape[0]
      return tree_lib.weighted_mean(params, jnp.ones((num,), jnp.float32)), float(num)
    return None, 1.0

  def _aggregate(state, rd: RoundData, outputs, key, logits_fn, distill_fn, memory_fn):
    public = rd.extra["public_images"]
    stacked = outputs["variables"]
    averaged = tree_lib.weighted_mean(stacked, rd.num_examples)
    k_distill, k_memory = jax.random.split(key)
    # Without a buffer (FedDF, FedET) the state's empty one passes through.
    next_idx = state.memory_idx if memory is None else memory_fn(k_memory)
    memory_logits = state.memory_logits
    metrics = client_metrics(outputs, rd)
    if cfg.epochs > 0:
      logits = logits_fn(stacked, public)  # [C, P, K]
      anchor, weight = _divergence_anchor(state, stacked)
      teacher_logits = combine(logits)
      new_vars, metrics["distill_loss"] = distill_fn(
        averaged, teacher_logits, public, k_distill, anchor, weight
      )
      if memory is not None:
        # The plain-mean teacher already holds Z_ens for every public example: take its rows
        # rather than averaging the clients' logits on the memory subset a second time.
        memory_logits = (
          teacher_logits[next_idx]
          if teacher == "mean"
          else distill.mean_teacher(logits[:, next_idx])
        )
    else:
      new_vars = averaged
      if memory is not None:
        memory_logits = distill.mean_teacher(logits_fn(stacked, public[next_idx]))
    if memory is not None and lmem_metric:
      global_logits = logits_fn(tree_lib.broadcast_clients(new_vars, 1), public[next_idx])[0]
      metrics["lmem_global"] = losses.kl_from_logits(memory_logits, global_logits, 1.0)
    new_state = DistillServerState(
      state.round + 1, new_vars, next_idx, memory_logits, jnp.ones((), bool)
    )
    return new_state, metrics

  def traced(state, rd, outputs, key):
    return _aggregate(
      state,
      rd,
      outputs,
      key,
      lambda v, x: distill.client_logits_scan(model, v, normalize, x, cfg.teacher_batch_size),
      lambda s, t, x, k, a, w: distill.distill_scan(model, s, t, x, normalize, k, cfg, a, w),
      sample,
    )

  def host(state, rd, outputs, key):
    return _aggregate(state, rd, outputs, key, host_logits, host_distill, sample_memory)

  return init, TwoForms(traced, host)
