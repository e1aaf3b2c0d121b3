"""FedGKD and FedGKD-VOTE (Yao et al., "Local-Global Knowledge Distillation in Heterogeneous
Federated Learning with Non-IID Data"; paper 002, code CGCL-codes/FedGKD).

The server keeps a FIFO buffer of the last M global models (M = 5, the current one included).
FedGKD sends their parameter average θ̄ and clients minimise
CE + (γ/2)·T²·KL(σ(f(x; θ̄)/T) ‖ σ(f(x; θ)/T)) on the private batch (γ = 0.2, T = 1); distillation
is skipped in round 0, when the buffer holds only the initial model. FedGKD-VOTE sends the M models
and uses one KD term per teacher with weight γ_m/2 = λ·softmax_m(−L_m/β), β = 1/M, λ = 0.1.
L_m is a validation loss; with no server validation split here, it is teacher m's CE on the
client's current private batch (a stop-gradient weight; documented deviation). Teachers run in
inference mode. Server: FedAvg.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import optax

from fedjax_proj.algorithms import client as client_lib
from fedjax_proj.algorithms import losses
from fedjax_proj.algorithms.base import FederatedAlgorithm
from fedjax_proj.algorithms.fedavg import FedAvgState, fedavg
from fedjax_proj.algorithms.registry import MethodSpec
from fedjax_proj.core import tree as tree_lib
from fedjax_proj.core.engine import BatchFn
from fedjax_proj.core.types import Array, Model


class FedGKDState(NamedTuple):
  fedavg: FedAvgState
  buffer: dict  # stacked [M, ...] global variables, newest first
  count: Array  # number of valid entries in the buffer


def buffer_push(buffer: dict, count: Array, variables: dict) -> tuple[dict, Array]:
  """FIFO push, newest at index 0; the oldest entry falls off once M are stored."""
  rolled = jax.tree.map(lambda b, v: jnp.concatenate([v[None], b[:-1]]), buffer, variables)
  size = jax.tree.leaves(buffer)[0].shape[0]
  return rolled, jnp.minimum(count + 1, size)


def buffer_average(buffer: dict, count: Array) -> dict:
  """Parameter average of the ``count`` valid buffer entries."""
  size = jax.tree.leaves(buffer)[0].shape[0]
  return tree_lib.weighted_mean(buffer, (jnp.arange(size) < count).astype(jnp.float32))


def gkd_loss(model: Model, gamma: float, temperature: float, vote: bool, lam: float):
  def loss_fn(params, batch, ctx: client_lib.StepContext):
    out, ce = client_lib.train_forward(model, params, batch, ctx)
    sh = ctx.shared
    if not vote:
      teacher = model.apply(sh["teacher"], batch.x, train=False).logits
      kd = (gamma / 2) * losses.kl_from_logits(teacher, out.logits, temperature, batch.mask)
    else:
      size = sh["valid"].shape[0]
      t_logits = jax.vmap(lambda v: model.apply(v, batch.x, train=False).logits)(sh["teachers"])
      t_loss = jax.vmap(lambda z: losses.cross_entropy(z, batch.y, batch.mask))(t_logits)
      scores = jnp.where(sh["valid"], -t_loss * size, -jnp.inf)  # −L_m/β with β = 1/M
      weights = lam * jax.nn.softmax(jax.lax.stop_gradient(scores))  # = γ_m / 2
      kls = jax.vmap(lambda z: losses.kl_from_logits(z, out.logits, temperature, batch.mask))(
        t_logits
      )
      kd = jnp.sum(jnp.where(sh["valid"], weights * kls, 0.0))
    loss = ce + jnp.where(sh["use_kd"], kd, 0.0)
    return loss, client_lib.LossAux(out.logits, out.state)

  return loss_fn


def fedgkd(
  model: Model,
  client_optimizer: optax.GradientTransformation,
  batch_fn: BatchFn,
  server_optimizer: optax.GradientTransformation | None = None,
  *,
  buffer_size: int = 5,
  gamma: float = 0.2,
  temperature: float = 1.0,
  vote: bool = False,
  lam: float = 0.1,
) -> FederatedAlgorithm:
  """Builds FedGKD (``vote=False``) or FedGKD-VOTE (``vote=True``)."""
  if buffer_size < 1:
    raise ValueError(f"buffer_size must be >= 1, got {buffer_size}.")
  base = fedavg(model, client_optimizer, batch_fn, server_optimizer)
  program = client_lib.local_training_client(
    model, client_optimizer, gkd_loss(model, gamma, temperature, vote, lam)
  )

  def init(variables, key):
    inner = base.init(variables, key)
    buffer = tree_lib.broadcast_clients(inner.variables, buffer_size)
    return FedGKDState(inner, jax.tree.map(jnp.array, buffer), jnp.ones((), jnp.int32))

  def broadcast(state, rd, key):
    shared, inputs = base.broadcast(state.fedavg, rd, key)
    shared["use_kd"] = state.fedavg.round > 0
    if vote:
      shared["teachers"] = state.buffer
      shared["valid"] = jnp.arange(buffer_size) < state.count
    else:
      shared["teacher"] = buffer_average(state.buffer, state.count)
    return shared, inputs

  def aggregate(state, rd, outputs, key):
    inner, metrics = base.aggregate(state.fedavg, rd, outputs, key)
    buffer, count = buffer_push(state.buffer, state.count, inner.variables)
    return FedGKDState(inner, buffer, count), metrics

  return FederatedAlgorithm(
    name="fedgkd_vote" if vote else "fedgkd",
    init=init,
    broadcast=broadcast,
    client=program,
    aggregate=aggregate,
    batch_fn=batch_fn,
    global_variables=lambda state: state.fedavg.variables,
  )


def build(ctx, method: str = "fedgkd", **hp) -> FederatedAlgorithm:
  """Registry entry for ``fedgkd`` and ``fedgkd_vote``."""
  return fedgkd(
    ctx.model,
    ctx.client_optimizer,
    ctx.batch_fn,
    ctx.server_optimizer,
    vote=method == "fedgkd_vote",
    **hp,
  )


SPEC = MethodSpec("fedgkd", "fl", build)
VOTE_SPEC = MethodSpec("fedgkd_vote", "fl", functools.partial(build, method="fedgkd_vote"))
