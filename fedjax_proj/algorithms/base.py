"""The FederatedAlgorithm interface and the round builder.

An algorithm is a factory (closing over the model, optimisers and hyperparameters, like optax)
returning a :class:`FederatedAlgorithm`: ``init(variables, key) -> state`` and three pure round
pieces, ``broadcast`` (server -> clients), ``client`` (a :class:`ClientProgram` for ONE client) and
``aggregate`` (clients -> server). :func:`fedjax_proj.core.rounds.drive_round` is the one round
driver composing them, and :func:`make_round` builds that round for an execution strategy and the
run's batch builder (docs/design.md, "The algorithm contract"). The batch builder is not part of
the algorithm: how each step's batch is made from the device data (normalisation, augmentation)
is an input-pipeline choice of the run, so the caller gives it to the execution side. The
execution machinery (the driver, the aggregate forms
:class:`~fedjax_proj.core.rounds.StreamingAggregate` and :class:`~fedjax_proj.core.engine.TwoForms`,
the chunked round) lives in fedjax_proj.core.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import jax

from fedjax_proj.algorithms.families import FLFamily, SequentialFamily, server_variables
from fedjax_proj.algorithms.sequential.base import make_sequential_round
from fedjax_proj.core.engine import BatchFn, ClientEngine, ClientProgram, host_form
from fedjax_proj.core.rounds import AggregateFn, BroadcastFn, drive_round, host_pieces
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
  algorithm: FLFamily | SequentialFamily, strategy: str, batch_fn: BatchFn, unroll: int = 1
) -> Callable[[PyTree, RoundData, Array], tuple[PyTree, dict]]:
  """Builds ``round_fn(state, round_data, key) -> (state, metrics)`` for an execution strategy.

  ``batch_fn`` builds each local step's :class:`~fedjax_proj.core.types.Batch` from the
  device-resident data and the step's indices (the run's input pipeline, e.g.
  :func:`fedjax_proj.data.pipeline.make_batch_fn`). ``vmap_scan`` compiles the whole round into
  one program. Host-looped strategies jit ``broadcast`` and ``aggregate`` separately around the
  engine's loop, and run the host-loop form of an aggregate that has one
  (:class:`~fedjax_proj.core.engine.TwoForms`). The input server state is donated (its buffers
  are reused for the new state): copy any leaf you keep across rounds (``tree.tree_copy``). A
  :class:`fedjax_proj.algorithms.sequential.base.SequentialAlgorithm` (the ``"sequential"``
  family, a chain of clients rather than broadcast/aggregate) gets its chain round.
  """
  if isinstance(algorithm, SequentialFamily):
    return make_sequential_round(algorithm, strategy, batch_fn, unroll)
  engine = ClientEngine(algorithm.client, batch_fn, strategy, unroll=unroll)
  if engine.traceable:

    def traced(state, rd, key):
      return drive_round(algorithm.broadcast, engine.run, algorithm.aggregate, state, rd, key)

    return jax.jit(traced, donate_argnums=0)

  aggregate = host_form(algorithm.aggregate) or jax.jit(algorithm.aggregate, donate_argnums=0)
  pieces = host_pieces(algorithm.broadcast)

  def host_round(state, rd: RoundData, key):
    return drive_round(
      pieces["broadcast"],
      engine.run,
      aggregate,
      state,
      rd,
      key,
      split_keys=pieces["split_keys"],
      client_keys=pieces["client_keys"],
    )

  return host_round
