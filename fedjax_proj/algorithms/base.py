"""The FederatedAlgorithm interface and the round builder.

An algorithm is a factory (closing over the model, optimisers and hyperparameters, like optax)
returning a :class:`FederatedAlgorithm`: ``init(variables, key) -> state`` and three pure round
pieces, ``broadcast`` (server -> clients), ``client`` (a :class:`ClientProgram` for ONE client) and
``aggregate`` (clients -> server). :func:`drive_round` is the one round driver composing them;
``apply(state, round_data, key)`` is that composition with the ``vmap_scan`` engine, to be jitted
whole, and :func:`make_round` builds the same round for any execution strategy
(docs/design.md, "The algorithm contract").
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import NamedTuple

import jax

from fedjax_proj.algorithms.families import FLFamily, SequentialFamily
from fedjax_proj.core import random as random_lib
from fedjax_proj.core.engine import BatchFn, ClientEngine, ClientProgram, host_form, run_vmap_scan
from fedjax_proj.core.types import Array, PyTree, RoundData

# broadcast(state, round_data, key) -> (shared, client_inputs)
BroadcastFn = Callable[[PyTree, RoundData, Array], tuple[PyTree, PyTree]]
# aggregate(state, round_data, client_outputs, key) -> (state, metrics)
AggregateFn = Callable[[PyTree, RoundData, PyTree, Array], tuple[PyTree, dict]]


@dataclasses.dataclass(frozen=True)
class StreamingAggregate:
  """An aggregate written as a sum over clients (``reduce``) and a server update (``finish``).

  It is itself the method's ``aggregate``: calling it aggregates all clients at once, and
  :func:`fedjax_proj.algorithms.chunked.make_chunked_round` runs a large cohort in chunks instead:
  each chunk's client outputs are reduced to sums inside the jitted chunk, the sums are added over
  chunks, and ``finish`` runs once, so peak memory grows with the chunk, not the cohort. Because the
  reduction lives in the aggregate, a method derived with ``alg._replace(aggregate=...)`` can never
  keep a reduction that belongs to another aggregate.

  Attributes:
    reduce: ``reduce(state, round_data_chunk, outputs_chunk) -> sums``, a pytree of sums over the
      chunk's clients (e.g. Σ n_k θ_k, Σ n_k). Padding clients have ``num_examples`` 0 and an
      all-False mask, so a reduction weighted by ``num_examples`` ignores them.
    finish: ``finish(state, round_data, sums, key) -> (state, metrics)``.
    direct: optional ``aggregate(state, round_data, client_outputs, key)`` computing the same from
      the stacked outputs; None derives it as ``finish(reduce(all clients))``. FedAvg gives its
      mean with weights normalised first (Σ_k (n_k/N) θ_k), which equals ``finish∘reduce``
      (Σ_k n_k θ_k / N) up to float round-off and keeps the one-program round's results as they
      were (tests/core/test_chunked.py).
  """

  reduce: Callable[[PyTree, RoundData, PyTree], PyTree]
  finish: Callable[[PyTree, RoundData, PyTree, Array], tuple[PyTree, dict]]
  direct: AggregateFn | None = None

  def __call__(self, state, round_data, outputs, key) -> tuple[PyTree, dict]:
    if self.direct is not None:
      return self.direct(state, round_data, outputs, key)
    return self.finish(state, round_data, self.reduce(state, round_data, outputs), key)


def server_variables(state: PyTree) -> dict:
  """The default ``global_variables``: the server state's ``variables`` field."""
  return state.variables


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
    batch_fn: builds each local step's :class:`Batch` from device data and indices.
    global_variables: ``global_variables(state) -> variables`` of the global model (evaluation);
      by default the state's ``variables`` field.
  """

  name: str
  init: Callable[[dict, Array], PyTree]
  broadcast: BroadcastFn
  client: ClientProgram
  aggregate: AggregateFn
  batch_fn: BatchFn
  global_variables: Callable[[PyTree], dict] = server_variables

  def apply(self, state: PyTree, round_data: RoundData, key: Array) -> tuple[PyTree, dict]:
    """One round, pure and traceable (``vmap_scan``); jit it whole."""
    run = lambda *a: run_vmap_scan(self.client, self.batch_fn, *a)
    return drive_round(self.broadcast, run, self.aggregate, state, round_data, key)


def streaming_of(algorithm) -> StreamingAggregate | None:
  """The algorithm's :class:`StreamingAggregate`, or None when its aggregate is not one."""
  aggregate = getattr(algorithm, "aggregate", None)
  return aggregate if isinstance(aggregate, StreamingAggregate) else None


def _round_keys(key: Array) -> tuple[Array, Array, Array]:
  return (
    random_lib.stream_key(key, "broadcast"),
    random_lib.stream_key(key, "clients"),
    random_lib.stream_key(key, "aggregate"),
  )


def drive_round(
  broadcast: BroadcastFn,
  run_clients: Callable[..., PyTree],
  finish: Callable[[PyTree, RoundData, PyTree, Array], tuple[PyTree, dict]],
  state: PyTree,
  rd: RoundData,
  key: Array,
  *,
  split_keys: Callable[[Array], tuple[Array, Array, Array]] = _round_keys,
  client_keys: Callable[[Array, int], Array] = random_lib.client_keys,
):
  """The one round driver: broadcast -> per-client keys -> clients -> server update.

  Every parallel-FL round (the one-program round, the host-looped one, the chunked ones and the
  pilot's) is this sequence; they differ only in the pieces: ``run_clients(shared, client_inputs,
  images, labels, idx, mask, keys)`` runs the clients (the engine, or chunks of them reduced to
  sums) and ``finish(state, rd, outputs, key)`` updates the server (``aggregate``, or the streaming
  ``finish``). Host-looped drivers pass jitted pieces, traced ones call it inside ``jax.jit``. The
  round key is split into the named streams ``broadcast``, ``clients`` and ``aggregate``.
  """
  b_key, c_key, a_key = split_keys(key)
  shared, client_inputs = broadcast(state, rd, b_key)
  keys = client_keys(c_key, rd.idx.shape[0])
  outputs = run_clients(shared, client_inputs, rd.images, rd.labels, rd.idx, rd.mask, keys)
  return finish(state, rd, outputs, a_key)


def host_pieces(broadcast: BroadcastFn) -> dict:
  """Jitted key splitting, client keys and ``broadcast`` for host-looped drivers."""
  return {
    "broadcast": jax.jit(broadcast),
    "split_keys": jax.jit(_round_keys),
    "client_keys": jax.jit(random_lib.client_keys, static_argnums=1),
  }


def make_round(
  algorithm: FLFamily | SequentialFamily, strategy: str, unroll: int = 1
) -> Callable[[PyTree, RoundData, Array], tuple[PyTree, dict]]:
  """Builds ``round_fn(state, round_data, key) -> (state, metrics)`` for an execution strategy.

  ``vmap_scan`` compiles the whole round into one program. Host-looped strategies jit
  ``broadcast`` and ``aggregate`` separately around the engine's loop, and run the host-loop form
  of an aggregate that has one (:class:`~fedjax_proj.core.engine.TwoForms`). The input server state
  is donated (its buffers are reused for the new state): copy any leaf you keep across rounds
  (``tree.tree_copy``). A :class:`fedjax_proj.algorithms.sequential.base.SequentialAlgorithm` (the
  ``"sequential"`` family, a chain of clients rather than broadcast/aggregate) gets its chain round.
  """
  from fedjax_proj.algorithms.sequential import base as sequential  # noqa: PLC0415  (builds on this module)

  if isinstance(algorithm, sequential.SequentialAlgorithm):
    return sequential.make_sequential_round(algorithm, strategy, unroll)
  engine = ClientEngine(algorithm.client, algorithm.batch_fn, strategy, unroll=unroll)
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
