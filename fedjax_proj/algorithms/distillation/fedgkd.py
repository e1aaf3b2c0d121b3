"""FedGKD, FedGKD-VOTE and FedGKD+ (Yao et al., "Local-Global Knowledge Distillation in
Heterogeneous Federated Learning with Non-IID Data"; paper 002, code CGCL-codes/FedGKD).

The server keeps a FIFO buffer of the last M global models (M = 5, the current one included).
FedGKD sends their parameter average θ̄ and clients minimise
CE + (γ/2)·T²·KL(σ(f(x; θ̄)/T) ‖ σ(f(x; θ)/T)) on the private batch (γ = 0.2, T = 1); distillation
is skipped in round 0, when the buffer holds only the initial model. FedGKD-VOTE sends the M models
and uses one KD term per teacher with weight γ_m/2 = λ·softmax_m(−L_m/β), β = 1/M, λ = 0.1
(002, "Parameter Setting"). L_m is "the validation loss of the m-th global model in the buffer";
002 trains on 90% of the data ("Implementation Details"). Two readings (``vote_validation``):

* ``"server"`` (the paper's): after each aggregation the server computes every buffered model's
  mean CE L_m on a held-out validation split (``RoundData.extra["validation_images"]`` /
  ``["validation_labels"]``; the experiments pass the training examples ``train_subset`` leaves
  out, e.g. CIFAR-10's other 5,000 at ``train_subset=45000``) and broadcasts the weights
  γ_m/2, fixed for the next round's local training (the newest model's L_m is logged as
  ``vote_val_loss_newest``);
* ``"client_batch"`` (the default, needing no held-out data): L_m is teacher m's CE on the
  client's current private batch (a stop-gradient weight, recomputed every step).

Only the buffer's valid entries count (empty slots get weight 0). Teachers run in inference mode.
Server: FedAvg. docs/methods.md ("FedGKD") and docs/reproduction.md ("FedGKD (paper 002)").

Whether the initial model w_0 is a buffered global model (``buffer_initial``): 002 defines
w̄_t = (1/M) Σ_{m=1}^{M} w_{t−m+1} with "initial global weight w_0" (Algorithm 1) and says nothing
of rounds t < M, where the sum reaches past w_0. ``True`` (the default) counts w_0 as the buffer's
first entry, so after r < M aggregations the teacher is the mean of w_0..w_r; ``False`` is the
authors' code (``MasterFedGKD.ensemble_historical_models`` buffers aggregated models only): the mean
of w_1..w_r. From r ≥ M on both are the mean of the last M; docs/parity.md measures the two.

The regulariser (``distill_loss``, 002 "Choice of Regularizer", Table 9): ``"kl"`` (the default,
the KL above), ``"mse"``, (γ/2)·mean over the batch's real examples and the K classes of
(f(x; θ) − f(x; θ̄))², the logits compared directly with no temperature (the authors' code,
``F.mse_loss`` of the raw logits times the same coefficient γ/2), or ``"none"``, no KD term: the
client objective is FedAvg's CE (Table 9's "None" row is FedAvg's column of Table 3). FedGKD only:
FedGKD-VOTE's weighted teachers are defined with the KL.

FedGKD+ (``fedgkd_plus``; 002 "Evaluation Methods": "we add the projection layer for FedGKD";
Tables 3-6) is FedGKD, loss and server unchanged, on MOON's network: encoder, a 2-layer MLP
projection head of output dimension 256 (002 "Parameter Setting", as SimCLR), then the output
layer, so the distilled logits are computed from the projection. Its spec declares
``moon.MODEL_KWARGS``, which the run merges into the model options (docs/design.md, "The method
registry"), exactly as for MOON; the authors' code turns the same head on with ``--projection``.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import optax

from fedjax_proj.algorithms import client as client_lib
from fedjax_proj.algorithms import losses, moon
from fedjax_proj.algorithms.base import FederatedAlgorithm
from fedjax_proj.algorithms.distillation import distill
from fedjax_proj.algorithms.fedavg import FedAvgState, fedavg
from fedjax_proj.algorithms.registry import MethodSpec, factory_hparams
from fedjax_proj.core import tree as tree_lib
from fedjax_proj.core.engine import TwoForms
from fedjax_proj.core.types import Array, Model

VOTE_VALIDATION = ("client_batch", "server")
# 002 Table 9's regularisers, in its row order (the default, KL, last).
DISTILL_LOSSES = ("none", "mse", "kl")


class FedGKDState(NamedTuple):
  fedavg: FedAvgState
  buffer: dict  # stacked [M, ...] global variables, newest first
  count: Array  # number of valid entries in the buffer
  vote_weights: Array  # [M] γ_m/2 from the server's validation losses (vote_validation="server")


def vote_weights(losses_m: Array, valid: Array, lam: float) -> Array:
  """γ_m/2 = λ·softmax_m(−L_m/β) over the valid buffer entries, β = 1/M (M = buffer size)."""
  scores = jnp.where(valid, -losses_m * valid.shape[0], -jnp.inf)
  return lam * jax.nn.softmax(scores)


def validation_losses(logits: Array, labels: Array) -> Array:
  """Each model's mean CE on the validation split: logits [M, N, K], labels [N] -> [M]."""
  return jax.vmap(lambda z: losses.cross_entropy(z, labels))(logits)


def buffer_push(buffer: dict, count: Array, variables: dict) -> tuple[dict, Array]:
  """FIFO push, newest at index 0; the oldest entry falls off once M are stored."""
  rolled = jax.tree.map(lambda b, v: jnp.concatenate([v[None], b[:-1]]), buffer, variables)
  size = jax.tree.leaves(buffer)[0].shape[0]
  return rolled, jnp.minimum(count + 1, size)


def buffer_average(buffer: dict, count: Array) -> dict:
  """Parameter average of the ``count`` valid buffer entries."""
  size = jax.tree.leaves(buffer)[0].shape[0]
  return tree_lib.weighted_mean(buffer, (jnp.arange(size) < count).astype(jnp.float32))


def logit_mse(teacher_logits: Array, student_logits: Array, mask: Array | None = None) -> Array:
  """Mean over real examples and classes of (z_s − z_t)², the teacher a constant (002 Table 9)."""
  t = jax.lax.stop_gradient(teacher_logits.astype(jnp.float32))
  per_example = jnp.mean(jnp.square(student_logits.astype(jnp.float32) - t), axis=-1)
  return losses.masked_mean(per_example, mask)


def gkd_loss(
  model: Model,
  gamma: float,
  temperature: float,
  vote: bool,
  lam: float,
  distill_loss: str = "kl",
):
  def loss_fn(params, batch, ctx: client_lib.StepContext):
    out, ce = client_lib.train_forward(model, params, batch, ctx)
    sh = ctx.shared
    if distill_loss == "none":  # 002 Table 9's "None": FedAvg's objective, no teacher forward
      return ce, client_lib.LossAux(out.logits, out.state)
    if not vote:
      teacher = model.apply(sh["teacher"], batch.x, train=False).logits
      if distill_loss == "mse":
        kd = (gamma / 2) * logit_mse(teacher, out.logits, batch.mask)
      else:
        kd = (gamma / 2) * losses.kl_from_logits(teacher, out.logits, temperature, batch.mask)
    else:
      t_logits = jax.vmap(lambda v: model.apply(v, batch.x, train=False).logits)(sh["teachers"])
      if "vote_weights" in sh:  # the server's validation losses (vote_validation="server")
        weights = sh["vote_weights"]
      else:  # L_m on this private batch (vote_validation="client_batch")
        t_loss = jax.vmap(lambda z: losses.cross_entropy(z, batch.y, batch.mask))(t_logits)
        weights = vote_weights(jax.lax.stop_gradient(t_loss), sh["valid"], lam)
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
  server_optimizer: optax.GradientTransformation | None = None,
  *,
  buffer_size: int = 5,
  gamma: float = 0.2,
  temperature: float = 1.0,
  vote: bool = False,
  lam: float = 0.1,
  vote_validation: str = "client_batch",
  normalize=None,
  validation_batch_size: int = 500,
  buffer_initial: bool = True,
  distill_loss: str = "kl",
) -> FederatedAlgorithm:
  """Builds FedGKD (``vote=False``) or FedGKD-VOTE (``vote=True``).

  Args:
    buffer_initial: whether the initial model is the buffer's first entry (module docstring;
      False: the authors' code, FedGKD only).
    distill_loss: the regulariser, one of :data:`DISTILL_LOSSES` (module docstring; 002 Table 9;
      FedGKD only).
    vote_validation: where FedGKD-VOTE's L_m come from (module docstring): ``"client_batch"``
      or ``"server"``, which reads ``RoundData.extra["validation_images"]`` (raw, normalised with
      ``normalize``) and ``["validation_labels"]``.
    normalize: raw images -> model inputs for the validation split (``"server"`` only).
    validation_batch_size: examples per forward pass of the server's validation losses.
  """
  if buffer_size < 1:
    raise ValueError(f"buffer_size must be >= 1, got {buffer_size}.")
  if vote_validation not in VOTE_VALIDATION:
    raise ValueError(f"vote_validation must be one of {VOTE_VALIDATION}, got {vote_validation!r}.")
  if distill_loss not in DISTILL_LOSSES:
    raise ValueError(
      f"distill_loss must be one of {DISTILL_LOSSES} (002 Table 9), got {distill_loss!r}."
    )
  if vote and distill_loss != "kl":
    raise ValueError(
      f"distill_loss={distill_loss!r} is a setting of fedgkd's averaged teacher (002 Table 9); "
      "FedGKD-VOTE weights one KL term per teacher. Use --method=fedgkd or drop distill_loss."
    )
  server_vote = vote and vote_validation == "server"
  if vote_validation == "server" and not vote:
    raise ValueError(
      "vote_validation='server' sets FedGKD-VOTE's teacher weights; fedgkd has one averaged "
      "teacher. Use --method=fedgkd_vote or drop vote_validation."
    )
  if vote and not buffer_initial:
    raise ValueError(
      "buffer_initial=False (only aggregated models in the buffer) is a setting of fedgkd's "
      "averaged teacher; FedGKD-VOTE needs a valid teacher from round 0. Drop buffer_initial."
    )
  if server_vote and normalize is None:
    raise ValueError("vote_validation='server' needs normalize (raw images -> model inputs).")
  base = fedavg(model, client_optimizer, server_optimizer)
  program = client_lib.local_training_client(
    model, client_optimizer, gkd_loss(model, gamma, temperature, vote, lam, distill_loss)
  )

  def init(variables, key):
    inner = base.init(variables, key)
    buffer = tree_lib.broadcast_clients(inner.variables, buffer_size)
    # buffer_initial=False: the entries still hold the initial model, but none is valid until the
    # first aggregation (round 0 distils nothing, so its teacher is never used).
    count = jnp.asarray(1 if buffer_initial else 0, jnp.int32)
    # The closed form for the one valid entry: λ on the initial model (unused: no KD in round 0).
    valid = jnp.arange(buffer_size) < jnp.maximum(count, 1)
    weights = vote_weights(jnp.zeros(buffer_size), valid, lam)
    return FedGKDState(inner, jax.tree.map(jnp.array, buffer), count, weights)

  def broadcast(state, rd, key):
    shared, inputs = base.broadcast(state.fedavg, rd, key)
    shared["use_kd"] = state.fedavg.round > 0
    if vote:
      shared["teachers"] = state.buffer
      shared["valid"] = jnp.arange(buffer_size) < state.count
      if server_vote:
        shared["vote_weights"] = state.vote_weights
    else:
      # max(count, 1): a finite (unused) teacher in round 0 when the buffer holds no valid entry.
      shared["teacher"] = buffer_average(state.buffer, jnp.maximum(state.count, 1))
    return shared, inputs

  def push(state, rd, outputs, key):
    inner, metrics = base.aggregate(state.fedavg, rd, outputs, key)
    buffer, count = buffer_push(state.buffer, state.count, inner.variables)
    return FedGKDState(inner, buffer, count, state.vote_weights), metrics

  def with_weights(state, logits, labels, metrics):
    """The next round's γ_m/2 from the buffered models' validation logits [M, N, K]."""
    val_losses = validation_losses(logits, labels)
    valid = jnp.arange(buffer_size) < state.count
    weights = vote_weights(val_losses, valid, lam)
    metrics = {**metrics, "vote_val_loss_newest": val_losses[0]}
    return state._replace(vote_weights=weights), metrics

  def aggregate(state, rd, outputs, key):
    state, metrics = push(state, rd, outputs, key)
    if not server_vote:
      return state, metrics
    images, labels = rd.extra["validation_images"], rd.extra["validation_labels"]
    logits = distill.client_logits_scan(
      model, state.buffer, normalize, images, validation_batch_size
    )
    return with_weights(state, logits, labels, metrics)

  server_update = aggregate
  if server_vote:
    # Host-looped strategies: one jitted forward per model and batch (conv inside lax.map is slow
    # on XLA:CPU, docs/design.md); the same numbers as ``aggregate``.
    host_logits = distill.HostClientLogits(model, normalize, validation_batch_size)
    push_jit, weights_jit = jax.jit(push, donate_argnums=0), jax.jit(with_weights)

    def aggregate_host(state, rd, outputs, key):
      state, metrics = push_jit(state, rd, outputs, key)
      logits = host_logits(state.buffer, rd.extra["validation_images"])
      return weights_jit(state, logits, rd.extra["validation_labels"], metrics)

    server_update = TwoForms(aggregate, aggregate_host)

  return FederatedAlgorithm(
    name="fedgkd_vote" if vote else "fedgkd",
    init=init,
    broadcast=broadcast,
    client=program,
    aggregate=server_update,
    global_variables=lambda state: state.fedavg.variables,
  )


NO_VALIDATION_FIX = (
  "pass --train_subset below the training set's size (002 trains on 90%: --train_subset=45000 "
  "of CIFAR-10's 50,000 leaves 5,000 for validation), or "
  "--method_kwargs=vote_validation=client_batch"
)


def needs_validation(method: str, hparams: dict) -> bool:
  """FedGKD-VOTE with ``vote_validation="server"`` reads a held-out validation split."""
  return method == "fedgkd_vote" and hparams.get("vote_validation") == "server"


def build(ctx, method: str = "fedgkd", **hp) -> FederatedAlgorithm:
  """Registry entry for ``fedgkd``, ``fedgkd_vote`` and ``fedgkd_plus`` (FedGKD on the model its
  spec's ``model_kwargs`` give)."""
  if needs_validation(method, hp) and ctx.validation_size <= 0:
    raise ValueError(
      "fedgkd_vote with vote_validation=server needs held-out validation data and the training "
      f"set leaves none out; {NO_VALIDATION_FIX}."
    )
  built = fedgkd(
    ctx.model,
    ctx.client_optimizer,
    ctx.server_optimizer,
    vote=method == "fedgkd_vote",
    normalize=ctx.normalize,
    **hp,
  )
  return built._replace(name=method)


_CONTEXT = ("server_optimizer", "vote", "normalize")
# lam, vote_validation and validation_batch_size only shape FedGKD-VOTE's weights.
SPEC = MethodSpec(
  "fedgkd",
  "fl",
  build,
  hparams=factory_hparams(
    fedgkd, context=(*_CONTEXT, "lam", "vote_validation", "validation_batch_size")
  ),
  choices={"distill_loss": DISTILL_LOSSES},
)
# FedGKD+ differs from FedGKD by its network only (module docstring): the same hyperparameters.
PLUS_SPEC = dataclasses.replace(
  SPEC,
  name="fedgkd_plus",
  build=functools.partial(build, method="fedgkd_plus"),
  model_kwargs=moon.MODEL_KWARGS,
)
VOTE_SPEC = MethodSpec(
  "fedgkd_vote",
  "fl",
  functools.partial(build, method="fedgkd_vote"),
  needs_validation=functools.partial(needs_validation, "fedgkd_vote"),
  validation_fix=NO_VALIDATION_FIX,
  # buffer_initial=False is refused by FedGKD-VOTE (every teacher must be valid from round 0).
  # distill_loss: 002 Table 9 compares regularisers for FedGKD's averaged teacher only.
  hparams=factory_hparams(fedgkd, context=(*_CONTEXT, "buffer_initial", "distill_loss")),
)
