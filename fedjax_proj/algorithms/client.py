"""The standard local-training client shared by FedAvg and the methods that only change the loss.

A method supplies ``loss_fn(params, batch, ctx) -> (loss, LossAux)``; this module turns it into a
:class:`ClientProgram` that runs the client optimiser on the masked batch, keeps BatchNorm
statistics as model state (updated only by private training batches) and reports loss and
accuracy. :class:`PerClientState` is the gather/scatter of one pytree per client that the server
keeps for stateful clients (SCAFFOLD, FedDyn, MOON; docs/design.md, "The algorithm contract").
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from fedjax_proj.algorithms import losses
from fedjax_proj.core import tree as tree_lib
from fedjax_proj.core.engine import ClientProgram
from fedjax_proj.core.types import Array, Batch, Model, ModelOutput, PyTree, RoundData


class StepContext(NamedTuple):
  """What a loss function may read besides params and batch.

  Attributes:
    model_state: non-parameter collections of the local model (e.g. batch_stats).
    shared: the round's broadcast (``shared["variables"]`` is the global model).
    extra: the client's method-specific state (from ``init_extra``).
    key: PRNG key for this step's forward pass (dropout).
  """

  model_state: dict
  shared: dict
  extra: PyTree
  key: Array


class LossAux(NamedTuple):
  logits: Array
  model_state: dict


class LocalState(NamedTuple):
  params: PyTree
  model_state: dict
  opt_state: PyTree
  extra: PyTree
  num_steps: Array
  loss_sum: Array
  correct: Array
  seen: Array
  round_steps: Array  # this client's active steps this round, E·ceil(n_k/B) (engine-provided)


# The extra argument :func:`local_training_client` passes to ``optimizer.update``.
ROUND_STEPS_ARG = "local_round_steps"


def epoch_step_lr(
  optimizer: optax.GradientTransformation, local_epochs: int, step_epochs: int, gamma: float
) -> optax.GradientTransformationExtraArgs:
  """``optimizer`` with its learning rate stepped per local epoch: torch's ``StepLR``.

  At a client's local step c (0-based, counting only its real steps) of a round the update is
  multiplied by ``gamma ** floor(e / step_epochs)``, where ``e = floor(c / ceil(n_k / B))`` is the
  client's own epoch, computed as ``floor(c · E / T_k)`` from its real step count this round
  ``T_k = E · ceil(n_k / B)``, which the engine hands to :func:`local_training_client` (clients
  of different sizes share the padded step axis, so a step index alone is not an epoch). Scaling
  the update is scaling the learning rate for SGD (with momentum) and Adam, whose update is
  linear in lr, with weight decay added to the gradient before them (torch's ``weight_decay``).
  The optimiser state, and so the schedule, is re-initialised every round (every client's
  ``init``), as the FedProj authors' client builds a new ``StepLR`` per round (docs/reproduction.md,
  "FedProj (papers 000 and 001)").

  Args:
    optimizer: the client optimiser at its base learning rate.
    local_epochs: E, local epochs per round.
    step_epochs: epochs between decays (torch ``step_size``), >= 1.
    gamma: the decay factor per step (torch ``gamma``).

  Returns:
    A transformation whose ``update`` needs ``local_round_steps=T_k`` (int32 scalar).
  """
  if local_epochs < 1 or step_epochs < 1:
    raise ValueError(
      f"epoch_step_lr needs local_epochs >= 1 and step_epochs >= 1, got {local_epochs} and "
      f"{step_epochs}; with --lr_schedule=step set --lr_step_epochs to a positive number of epochs "
      "(the FedProj code uses local_epochs // 2, so local_epochs must be >= 2)."
    )

  def init(params):
    return (optimizer.init(params), jnp.zeros((), jnp.int32))

  def update(updates, state, params=None, **extra_args):
    if ROUND_STEPS_ARG not in extra_args:
      raise ValueError(
        f"epoch_step_lr's update needs {ROUND_STEPS_ARG}=<the client's real steps this round>; "
        "it runs only inside local_training_client (drop --lr_schedule=step for this method)."
      )
    inner, count = state
    round_steps = jnp.maximum(jnp.asarray(extra_args[ROUND_STEPS_ARG], jnp.int32), 1)
    epoch = count * local_epochs // round_steps
    scale = jnp.asarray(gamma, jnp.float32) ** (epoch // step_epochs)
    updates, inner = optimizer.update(updates, inner, params)
    updates = jax.tree.map(lambda u: (u * scale).astype(u.dtype), updates)
    return updates, (inner, count + 1)

  return optax.GradientTransformationExtraArgs(init, update)


def split_variables(variables: dict) -> tuple[PyTree, dict]:
  """Splits Flax variables into (params, other collections)."""
  return variables["params"], {k: v for k, v in variables.items() if k != "params"}


def merge_variables(params: PyTree, model_state: dict) -> dict:
  return {"params": params, **model_state}


def forward(model: Model, params, model_state, x, *, train: bool, key=None, mask=None):
  """Runs the model and returns its :class:`ModelOutput`."""
  return model.apply(merge_variables(params, model_state), x, train=train, rng=key, mask=mask)


def train_forward(
  model: Model, params, batch: Batch, ctx: StepContext
) -> tuple[ModelOutput, Array]:
  """The opening of every local loss: the private batch's training forward and its masked CE.

  Returns:
    (the model output, the masked mean cross-entropy of the batch).
  """
  out = forward(model, params, ctx.model_state, batch.x, train=True, key=ctx.key, mask=batch.mask)
  return out, losses.cross_entropy(out.logits, batch.y, batch.mask)


def cross_entropy_loss(model: Model) -> Callable:
  """The plain local objective: masked cross-entropy on the private batch."""

  def loss_fn(params, batch: Batch, ctx: StepContext):
    out, ce = train_forward(model, params, batch, ctx)
    return ce, LossAux(out.logits, out.state)

  return loss_fn


def local_training_client(
  model: Model,
  optimizer: optax.GradientTransformation,
  loss_fn: Callable,
  *,
  init_extra: Callable[[dict, PyTree, Array], PyTree] | None = None,
  transform_grads: Callable[[PyTree, PyTree, Batch, StepContext], tuple[PyTree, PyTree]]
  | None = None,
  finalize: Callable[[LocalState], dict[str, Any]] | None = None,
) -> ClientProgram:
  """Builds the :class:`ClientProgram` of a local-SGD client.

  Args:
    model: the model.
    optimizer: the client optimiser (re-initialised every round, as in FedAvg).
    loss_fn: ``loss_fn(params, batch, ctx) -> (loss, LossAux)``.
    init_extra: ``init_extra(shared, client_input, key) -> extra`` method state for the client.
    transform_grads: ``transform_grads(grads, params, batch, ctx) -> (grads, extra)`` applied
      before the optimiser (e.g. SCAFFOLD's control-variate correction, FedProj's projection);
      it returns the client's updated ``extra`` state (return ``ctx.extra`` if unchanged).
    finalize: ``finalize(state) -> dict`` of extra outputs merged into the client output.

  Returns:
    A program whose output is a dict with ``variables`` (the local model), ``num_steps`` and
    per-client metrics ``loss`` and ``accuracy`` (means over local steps/examples).
  """

  # Per-epoch schedules (epoch_step_lr) read the client's step count; plain optax transforms
  # accept and ignore extra arguments, a bare GradientTransformation takes none.
  takes_extra = isinstance(optimizer, optax.GradientTransformationExtraArgs)
  update_args = lambda state: {ROUND_STEPS_ARG: state.round_steps} if takes_extra else {}

  def init(shared, client_input, key, round_steps):
    params, model_state = split_variables(shared["variables"])
    extra = init_extra(shared, client_input, key) if init_extra is not None else ()
    zero = jnp.zeros((), jnp.float32)
    steps = jnp.zeros((), jnp.int32)
    # A fresh optimiser state every round: local momentum/Adam moments and any local lr schedule
    # restart (FedAvg's client; the FedProj code builds a new Adam and StepLR per round).
    opt_state = optimizer.init(params)
    return LocalState(
      params, model_state, opt_state, extra, steps, zero, zero, zero, jnp.asarray(round_steps)
    )

  def step(shared, state: LocalState, batch: Batch, key):
    ctx = StepContext(state.model_state, shared, state.extra, key)
    (loss, aux), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params, batch, ctx)
    extra = state.extra
    if transform_grads is not None:
      grads, extra = transform_grads(grads, state.params, batch, ctx)
    updates, opt_state = optimizer.update(
      grads, state.opt_state, state.params, **update_args(state)
    )
    params = optax.apply_updates(state.params, updates)
    return state._replace(
      params=params,
      model_state=aux.model_state,
      opt_state=opt_state,
      extra=extra,
      num_steps=state.num_steps + 1,
      loss_sum=state.loss_sum + loss,
      correct=state.correct + losses.accuracy_count(aux.logits, batch.y, batch.mask),
      seen=state.seen + jnp.sum(batch.mask),
    )

  def final(state: LocalState):
    steps = jnp.maximum(state.num_steps, 1).astype(jnp.float32)
    out = {
      "variables": merge_variables(state.params, state.model_state),
      "num_steps": state.num_steps,
      "metrics": {
        "train_loss": state.loss_sum / steps,
        "train_accuracy": state.correct / jnp.maximum(state.seen, 1.0),
      },
    }
    if finalize is not None:
      out.update(finalize(state))
    return out

  return ClientProgram(init, step, final, round_steps=True)


class PerClientState(NamedTuple):
  """One pytree per client, stacked [num_clients, ...] in the server state.

  The round gathers the sampled clients' rows by ``round_data.client_ids``: :meth:`client_input`
  in ``broadcast`` hands each client its row as ``client_input[name]``, :meth:`init_extra` makes
  that row the client's ``extra`` state, and ``aggregate`` writes the new rows back with
  :meth:`scatter`. Clients that were not sampled keep their rows.

  Attributes:
    name: the key of the row in ``client_input``.
  """

  name: str

  def init_extra(self, shared, client_input, key) -> PyTree:
    """``init_extra`` for :func:`local_training_client`: the client's own row."""
    del shared, key
    return client_input[self.name]

  def gather(self, stacked: PyTree, rd: RoundData) -> PyTree:
    """The sampled clients' rows, [clients, ...]."""
    return tree_lib.index_clients(stacked, rd.client_ids)

  def client_input(self, stacked: PyTree, rd: RoundData) -> dict:
    """``client_inputs`` for ``broadcast``: ``{name: the sampled clients' rows}``."""
    return {self.name: self.gather(stacked, rd)}

  def scatter(self, stacked: PyTree, rd: RoundData, rows: PyTree) -> PyTree:
    """``stacked`` with the sampled clients' rows replaced by ``rows``."""
    return tree_lib.scatter_clients(stacked, rd.client_ids, rows)


def zeros_per_client(params: PyTree, num_clients: int) -> tuple[PyTree, PyTree]:
  """(float32 zeros shaped like ``params``, the same stacked [num_clients, ...]).

  The start of a server variate and of its per-client copies (SCAFFOLD's c and c_k, FedDyn's h
  and h_k).
  """
  zeros = jax.tree.map(lambda x: jnp.zeros_like(x, jnp.float32), params)
  return zeros, tree_lib.broadcast_clients(zeros, num_clients)
