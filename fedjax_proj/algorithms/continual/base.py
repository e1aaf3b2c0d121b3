"""The continual-FL family: :class:`ContinualMethod` and the pieces its methods share.

FOT's task-incremental setting (Bakman et al., "Federated Orthogonal Training", ICLR 2024; paper
003, docs/methods.md "FOT"): a multi-head model, one task at a time, FedAvg rounds on the current
task's head. A :class:`ContinualMethod` is a :class:`FederatedAlgorithm` (one training round; the
current task id arrives as ``RoundData.extra["task"]``) plus an optional host-side ``end_task``
hook run once after each task on a layout of ALL clients' task data. A method whose hook runs a
client pass (EWC's Fisher, FOT's GPSE) or builds batches takes the run's
:class:`~fedjax_proj.core.executor.Executor` when it is built (``BuildContext.executor``), so the
method never chooses how its clients run.

The methods: FL (fl.py), EWC+FL (ewc.py), ER+FL (er.py), RGO+FL (rgo.py), GPM+FL (gpm.py),
GLFC+FL (glfc.py) and FOT (fot.py); the subspace maths of GPM and FOT (and the layer geometry
RGO shares) is gpse.py. :func:`task_algorithm` is the FedAvg-shaped round they share,
:func:`task_loss` the CE on the current task's head.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp

from fedjax_proj.algorithms import client as client_lib
from fedjax_proj.algorithms import losses
from fedjax_proj.algorithms.base import FederatedAlgorithm
from fedjax_proj.algorithms.fedavg import client_metrics, from_weighted_sums, weighted_sums
from fedjax_proj.core import tree as tree_lib
from fedjax_proj.core.engine import ClientEngine
from fedjax_proj.core.rounds import StreamingAggregate
from fedjax_proj.core.types import Array, Model, PyTree, RoundData

# end_task(state, round_data_of_all_clients, key, task) -> (state, metrics); a client pass it runs
# uses the executor the method was built with.
EndTaskFn = Callable[[PyTree, RoundData, Array, int], tuple[PyTree, dict]]


class ContinualMethod(NamedTuple):
  """A continual-FL method: a round algorithm plus an optional end-of-task hook; meets
  :class:`~fedjax_proj.algorithms.families.ContinualFamily` (``"continual"``)."""

  algorithm: FederatedAlgorithm
  end_task: EndTaskFn | None = None


class ContinualState(NamedTuple):
  round: Array
  variables: dict
  method: PyTree  # method-specific server state


def task_forward(model: Model, params, model_state, x, task, *, train, key=None, mask=None):
  variables = client_lib.merge_variables(params, model_state)
  return model.apply(variables, x, train=train, rng=key, mask=mask, task=task)


def task_loss(model: Model, extra_loss: Callable | None = None) -> Callable:
  """CE on the task head ``shared["task"]`` plus an optional ``extra_loss(params, ctx)``."""

  def loss_fn(params, batch, ctx):
    task = ctx.shared["task"]
    out = task_forward(
      model, params, ctx.model_state, batch.x, task, train=True, key=ctx.key, mask=batch.mask
    )
    loss = losses.cross_entropy(out.logits, batch.y, batch.mask)
    if extra_loss is not None:
      loss = loss + extra_loss(params, ctx)
    return loss, client_lib.LossAux(out.logits, out.state)

  return loss_fn


def task_of(rd: RoundData) -> Array:
  return jnp.asarray(rd.extra["task"], jnp.int32)


def mean_aggregate(
  update: Callable[..., PyTree], *, takes_round_data: bool = False
) -> StreamingAggregate:
  """The continual methods' aggregate: the n_k-weighted mean of the clients' variables, then
  ``update(state, averaged) -> state``, with the client metrics' weighted means.

  With ``takes_round_data`` the update is ``update(state, averaged, rd)``: FOT's first-layer
  freeze reads the round's task (``rd.extra["task"]``) there.

  A :class:`~fedjax_proj.core.rounds.StreamingAggregate`, so the run's ``--client_chunk`` runs a
  round's clients in chunks (docs/performance.md); all clients at once it computes the mean as it
  always did (``direct``), and in chunks the same up to float summation order.
  """
  call = update if takes_round_data else (lambda state, averaged, rd: update(state, averaged))

  def direct(state, rd, outputs, key):
    del key
    averaged = tree_lib.weighted_mean(outputs["variables"], rd.num_examples)
    return call(state, averaged, rd), client_metrics(outputs, rd)

  def finish(state, rd, sums, key):
    del key
    averaged, metrics = from_weighted_sums(sums, state.variables)
    return call(state, averaged, rd), metrics

  return StreamingAggregate(lambda state, rd, out: weighted_sums(out, rd), finish, direct=direct)


def task_algorithm(name, init_method, broadcast_extra, program):
  """A FedAvg-shaped algorithm (n_k-weighted average) that carries method state."""

  def init(variables, key):
    del key
    variables = tree_lib.tree_copy(variables)
    return ContinualState(jnp.zeros((), jnp.int32), variables, init_method(variables))

  def broadcast(state, rd, key):
    shared = {"variables": state.variables, "task": task_of(rd)}
    client_inputs = {}
    if broadcast_extra is not None:
      more, client_inputs = broadcast_extra(state, rd, key)
      shared.update(more)
    return shared, client_inputs

  def update(state, averaged):
    return ContinualState(state.round + 1, averaged, state.method)

  return FederatedAlgorithm(name, init, broadcast, program, mean_aggregate(update))


def run_all_clients(engine: ClientEngine, shared, rd: RoundData, key, client_inputs=None):
  keys = jax.random.split(key, rd.idx.shape[0])
  inputs = client_inputs if client_inputs is not None else {}
  return engine.run(shared, inputs, rd.images, rd.labels, rd.idx, rd.mask, keys)
