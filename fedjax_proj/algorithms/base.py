"""The FederatedAlgorithm interface and the round builder.

An algorithm is a factory (closing over the model, optimisers and hyperparameters, like optax)
returning a :class:`FederatedAlgorithm`: ``init(variables, key) -> state`` and three pure round
pieces, ``broadcast`` (server -> clients), ``client`` (a :class:`ClientProgram` for ONE client) and
``aggregate`` (clients -> server). :func:`fedjax_proj.core.rounds.drive_round` is the one round
driver composing them, and :func:`make_round` builds that round on the run's
:class:`~fedjax_proj.core.executor.Executor` (strategy, batch builder, mesh, chunk; docs/design.md,
"The algorithm contract" and "Execution"). The batch builder is not part of the algorithm: how each
step's batch is made from the device data (normalisation, augmentation) is an input-pipeline
choice of the run, so it travels with the execution side. The execution machinery (the executor,
the driver, the aggregate forms :class:`~fedjax_proj.core.rounds.StreamingAggregate` and
:class:`~fedjax_proj.core.engine.TwoForms`, the chunked and chain rounds) lives in
fedjax_proj.core.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

from fedjax_proj.algorithms.families import FLFamily, SequentialFamily, server_variables
from fedjax_proj.core.engine import BatchFn, ClientProgram
from fedjax_proj.core.executor import Executor
from fedjax_proj.core.rounds import AggregateFn, BroadcastFn
from fedjax_proj.core.types import Array, PyTree, RoundData


class FederatedAlgorithm(NamedTuple):
  """A federated algorithm as pure functions; meets :class:`~.families.FLFamily` (``"fl"``).

  Attributes:
    name: method name, e.g. ``"fedavg"``.
    init: ``init(variables, key) -> server_state``.
    broadcast: ``broadcast(state, round_data, key) -> (shared, client_inputs)``.
    client: the per-client :class:`ClientProgram`.
    aggregate: ``aggregate(state, round_data, client_outputs, key) -> (state, metrics)``. A
      :class:`StreamingAggregate` (e.g. FedAvg's weighted mean) also lets a large cohort run in
      chunks; an :class:`~fedjax_proj.core.engine.TwoForms` (server distillation) also has a host
      loop form that host-looped strategies run.
    global_variables: ``global_variables(state) -> variables`` of the global model (evaluation);
      by default the state's ``variables`` field.
  """

  name: str
  init: Callable[[dict, Array], PyTree]
  broadcast: BroadcastFn
  client: ClientProgram
  aggregate: AggregateFn
  global_variables: Callable[[PyTree], dict] = server_variables


def make_round(
  algorithm: FLFamily | SequentialFamily,
  executor: Executor | str,
  batch_fn: BatchFn | None = None,
  unroll: int = 1,
) -> Callable[[PyTree, RoundData, Array], tuple[PyTree, dict]]:
  """Builds ``round_fn(state, round_data, key) -> (state, metrics)`` of ``algorithm``.

  ``executor`` is the run's :class:`~fedjax_proj.core.executor.Executor` (strategy, batch builder,
  unroll, mesh, chunk), or, as a shorthand, a resolved strategy name with the batch builder
  (``make_round(alg, "vmap_scan", batch_fn)`` is ``make_round(alg, Executor("vmap_scan",
  batch_fn))``). ``batch_fn`` builds each local step's :class:`~fedjax_proj.core.types.Batch`
  from the device-resident data and the step's indices (the run's input pipeline, e.g.
  :func:`fedjax_proj.data.pipeline.make_batch_fn`). The family's Protocol picks the round: a
  :class:`~.families.SequentialFamily` value (a chain of clients rather than broadcast/aggregate)
  gets the executor's chain round, every other one its parallel round (``vmap_scan`` compiles it
  into one program; host-looped strategies jit ``broadcast`` and ``aggregate`` separately around
  the engine's loop and run the host-loop form of a :class:`~fedjax_proj.core.engine.TwoForms`
  aggregate; with a chunk, clients run in chunks with streaming aggregation). The input server
  state is donated (its buffers are reused for the new state): copy any leaf you keep across
  rounds (``tree.tree_copy``).
  """
  if isinstance(executor, Executor):
    if batch_fn is not None or unroll != 1:
      raise ValueError(
        "make_round(algorithm, executor) takes the batch builder and unroll from the executor; "
        "pass batch_fn and unroll only with a strategy name."
      )
  else:
    if batch_fn is None:
      raise ValueError(
        f"make_round(algorithm, {executor!r}) needs the run's batch_fn (or pass an Executor)."
      )
    executor = Executor(executor, batch_fn, unroll)
  if isinstance(algorithm, SequentialFamily):
    return executor.chain_round(algorithm)
  return executor.parallel_round(algorithm)
