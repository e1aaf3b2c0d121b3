"""The FederatedAlgorithm interface and the round builder.

An algorithm is a factory (closing over the model, optimisers and hyperparameters, like optax)
returning a :class:`FederatedAlgorithm`: ``init(variables, key) -> state`` and three pure round
pieces, ``broadcast`` (server -> clients), ``client`` (a :class:`ClientProgram` for ONE client) and
``aggregate`` (clients -> server). ``apply(state, round_data, key)`` is their pure composition with
the ``vmap_scan`` engine, to be jitted whole; :func:`make_round` builds the same round for any
execution strategy.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import jax

from fedjax_proj.core import random as random_lib
from fedjax_proj.core.engine import BatchFn, ClientEngine, ClientProgram, run_vmap_scan
from fedjax_proj.core.types import Array, PyTree, RoundData

# broadcast(state, round_data, key) -> (shared, client_inputs)
BroadcastFn = Callable[[PyTree, RoundData, Array], tuple[PyTree, PyTree]]
# aggregate(state, round_data, client_outputs, key) -> (state, metrics)
AggregateFn = Callable[[PyTree, RoundData, PyTree, Array], tuple[PyTree, dict]]


class StreamingAggregate(NamedTuple):
  """An aggregate written as a sum over clients, for cohorts processed in chunks.

  Used by :func:`fedjax_proj.algorithms.chunked.make_chunked_round`: each chunk's client outputs
  are reduced to sums inside the jitted chunk, the sums are added over chunks, and the server
  update runs once, so peak memory grows with the chunk, not the cohort.

  Attributes:
    reduce: ``reduce(state, round_data_chunk, outputs_chunk) -> sums``, a pytree of sums over the
      chunk's clients (e.g. Σ n_k θ_k, Σ n_k). Padding clients have ``num_examples`` 0 and an
      all-False mask, so a reduction weighted by ``num_examples`` ignores them.
    finish: ``finish(state, round_data, sums, key) -> (state, metrics)``; must equal
      ``aggregate`` given the sums over all clients.
    aggregate: the ``aggregate`` function this streaming form equals. A method derived with
      ``alg._replace(aggregate=...)`` keeps the old ``streaming``; the chunked round refuses it
      unless ``streaming.aggregate is alg.aggregate``.
  """

  reduce: Callable[[PyTree, RoundData, PyTree], PyTree]
  finish: Callable[[PyTree, RoundData, PyTree, Array], tuple[PyTree, dict]]
  aggregate: AggregateFn | None = None


class FederatedAlgorithm(NamedTuple):
  """A federated algorithm as pure functions.

  Attributes:
    name: method name, e.g. ``"fedavg"``.
    init: ``init(variables, key) -> server_state``.
    broadcast: ``broadcast(state, round_data, key) -> (shared, client_inputs)``.
    client: the per-client :class:`ClientProgram`.
    aggregate: ``aggregate(state, round_data, client_outputs, key) -> (state, metrics)``.
    batch_fn: builds each local step's :class:`Batch` from device data and indices.
    global_variables: ``global_variables(state) -> variables`` of the global model (evaluation).
    aggregate_host: optional host-level ``aggregate`` with identical results, used by host-looped
      strategies when the server itself trains a conv model (server distillation on XLA:CPU).
    streaming: optional :class:`StreamingAggregate` equal to ``aggregate`` but computed from sums
      over clients; methods whose aggregate is a weighted mean provide it to support chunked
      cohorts (:mod:`fedjax_proj.algorithms.chunked`).
  """

  name: str
  init: Callable[[dict, Array], PyTree]
  broadcast: BroadcastFn
  client: ClientProgram
  aggregate: AggregateFn
  batch_fn: BatchFn
  global_variables: Callable[[PyTree], dict]
  aggregate_host: AggregateFn | None = None
  streaming: StreamingAggregate | None = None

  def apply(self, state: PyTree, round_data: RoundData, key: Array) -> tuple[PyTree, dict]:
    """One round, pure and traceable (``vmap_scan``); jit it whole."""
    return _apply(
      self, state, round_data, key, lambda *a: run_vmap_scan(self.client, self.batch_fn, *a)
    )


def _round_keys(key: Array) -> tuple[Array, Array, Array]:
  return (
    random_lib.stream_key(key, "broadcast"),
    random_lib.stream_key(key, "clients"),
    random_lib.stream_key(key, "aggregate"),
  )


def _apply(alg: FederatedAlgorithm, state, rd: RoundData, key, run_clients) -> tuple[PyTree, dict]:
  b_key, c_key, a_key = _round_keys(key)
  shared, client_inputs = alg.broadcast(state, rd, b_key)
  keys = random_lib.client_keys(c_key, rd.idx.shape[0])
  outputs = run_clients(shared, client_inputs, rd.images, rd.labels, rd.idx, rd.mask, keys)
  return alg.aggregate(state, rd, outputs, a_key)


def make_round(
  algorithm: FederatedAlgorithm, strategy: str, unroll: int = 1
) -> Callable[[PyTree, RoundData, Array], tuple[PyTree, dict]]:
  """Builds ``round_fn(state, round_data, key) -> (state, metrics)`` for an execution strategy.

  ``vmap_scan`` compiles the whole round into one program. Host-looped strategies jit
  ``broadcast`` and ``aggregate`` separately around the engine's loop. The input server state is
  donated (its buffers are reused for the new state): copy any leaf you keep across rounds
  (``tree.tree_copy``).
  Algorithms whose round is not broadcast/vmap/aggregate (sequential FL:
  :class:`fedjax_proj.algorithms.sequential.SequentialAlgorithm`) bring their own ``make_round``.
  """
  if hasattr(algorithm, "make_round"):
    return algorithm.make_round(strategy, unroll)
  engine = ClientEngine(algorithm.client, algorithm.batch_fn, strategy, unroll=unroll)
  if engine.traceable:

    def traced(state, rd, key):
      return _apply(algorithm, state, rd, key, engine.run)

    return jax.jit(traced, donate_argnums=0)

  broadcast = jax.jit(algorithm.broadcast)
  aggregate = algorithm.aggregate_host or jax.jit(algorithm.aggregate, donate_argnums=0)
  split_keys = jax.jit(_round_keys)
  make_client_keys = jax.jit(random_lib.client_keys, static_argnums=1)

  def host_round(state, rd: RoundData, key):
    b_key, c_key, a_key = split_keys(key)
    shared, client_inputs = broadcast(state, rd, b_key)
    keys = make_client_keys(c_key, rd.idx.shape[0])
    outputs = engine.run(shared, client_inputs, rd.images, rd.labels, rd.idx, rd.mask, keys)
    return aggregate(state, rd, outputs, a_key)

  return host_round
