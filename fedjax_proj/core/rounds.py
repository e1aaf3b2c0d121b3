"""The round driver and the aggregate forms that execution strategies run.

Execution machinery shared by every parallel-FL round, below the algorithm contract
(docs/design.md, "The algorithm contract"): :func:`drive_round` is the one round driver (broadcast
-> per-client keys -> clients -> server update), :func:`host_pieces` its jitted pieces for
host-looped strategies, :func:`make_parallel_round` the ordinary round built from it, and
:class:`StreamingAggregate` the aggregate written as a sum over
clients that :mod:`fedjax_proj.core.chunked` runs in chunks (as
:class:`~fedjax_proj.core.engine.TwoForms` is the aggregate with a host-loop form). Everything here
takes plain functions, never an algorithm type, so core imports nothing from
``fedjax_proj.algorithms``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import jax

from fedjax_proj.core import random as random_lib
from fedjax_proj.core import tree as tree_lib
from fedjax_proj.core.engine import ClientEngine, host_form
from fedjax_proj.core.types import Array, PyTree, RoundData

# broadcast(state, round_data, key) -> (shared, client_inputs)
BroadcastFn = Callable[[PyTree, RoundData, Array], tuple[PyTree, PyTree]]
# aggregate(state, round_data, client_outputs, key) -> (state, metrics)
AggregateFn = Callable[[PyTree, RoundData, PyTree, Array], tuple[PyTree, dict]]


@dataclasses.dataclass(frozen=True)
class StreamingAggregate:
  """An aggregate written as a sum over clients (``reduce``) and a server update (``finish``).

  It is itself the method's ``aggregate``: calling it aggregates all clients at once, and
  :func:`fedjax_proj.core.chunked.make_chunked_round` runs a large cohort in chunks instead:
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


def drive_host_round(pieces: dict, run_clients, finish, state: PyTree, rd: RoundData, key: Array):
  """:func:`drive_round` with the jitted :func:`host_pieces` of a host-looped driver."""
  return drive_round(
    pieces["broadcast"],
    run_clients,
    finish,
    state,
    rd,
    key,
    split_keys=pieces["split_keys"],
    client_keys=pieces["client_keys"],
  )


def make_parallel_round(algorithm, engine: ClientEngine) -> Callable:
  """The ordinary parallel round: ``round_fn(state, round_data, key) -> (state, metrics)``.

  ``algorithm`` is read by attribute (``broadcast``, ``aggregate``), so core needs no algorithm
  type; ``engine`` runs its client program. The one-program strategy jits the whole round;
  host-looped ones jit ``broadcast`` and ``aggregate`` separately around the engine's loop and run
  the host-loop form of an aggregate that has one (:class:`~fedjax_proj.core.engine.TwoForms`).
  The input server state is donated.
  """
  if engine.traceable:

    def traced(state, rd, key):
      return drive_round(algorithm.broadcast, engine.run, algorithm.aggregate, state, rd, key)

    return jax.jit(traced, donate_argnums=0)

  aggregate = host_form(algorithm.aggregate) or jax.jit(algorithm.aggregate, donate_argnums=0)
  pieces = host_pieces(algorithm.broadcast)
  streamed = _streamed_clients(algorithm, engine)

  def host_round(state, rd: RoundData, key):
    if streamed is not None and rd.idx.shape[0] >= STREAM_MIN_CLIENTS:
      run, finish = streamed
      return drive_host_round(pieces, lambda *a: run(state, rd, *a), finish, state, rd, key)
    return drive_host_round(pieces, engine.run, aggregate, state, rd, key)

  return host_round


# Cohorts from this size on run ``sequential`` with streaming aggregation (below, each client's
# output is kept and the stacked outputs aggregated at once). Streaming sums in another order
# (Σ_k n_k θ_k client by client, then / N, instead of the stacked weighted mean), which moves the
# last bits (and the streamed round trims partial batches, ClientProgram.trim_padding); no claim
# has more than 16 clients a round (fedjax_proj/reproduce/claims/) and no behaviour-fingerprint
# run more than 3, and at 128 clients the kept outputs of the FedAvg CNN (8.6 MB each) are
# already 1.1 GB, so below it results stay bit for bit as they were.
STREAM_MIN_CLIENTS = 128


def _streamed_clients(algorithm, engine: ClientEngine):
  """``(run, finish)`` streaming the clients of a ``sequential`` round into the method's
  :class:`StreamingAggregate` sums, one client at a time, or None when the strategy is another or
  the aggregate has no streaming form.

  ``run(state, rd, shared, client_inputs, images, labels, idx, mask, keys)`` returns the sums:
  each finished client's ``final`` and ``reduce`` (over a chunk of one) and the add to the
  accumulator are one jitted call, the accumulator donated, so host memory holds one model-sized
  accumulator instead of the cohort's outputs (memory O(model), not O(cohort)).
  """
  streaming = streaming_of(algorithm)
  if streaming is None or engine.strategy != "sequential":
    return None
  final, reduce = engine.program.final, streaming.reduce

  def client_sums(state, rd: RoundData, client_state, c):
    one = lambda x: jax.lax.dynamic_slice_in_dim(x, c, 1)  # noqa: E731
    rd_one = rd._replace(
      client_ids=one(rd.client_ids), idx=one(rd.idx), mask=one(rd.mask),
      num_examples=one(rd.num_examples),
    )  # fmt: skip
    output = jax.tree.map(lambda x: x[None], final(client_state))
    return reduce(state, rd_one, output)

  first = jax.jit(client_sums)
  add = jax.jit(
    lambda acc, state, rd, client_state, c: tree_lib.tree_add(
      acc, client_sums(state, rd, client_state, c)
    ),
    donate_argnums=0,
  )

  def run(state, rd, shared, client_inputs, images, labels, idx, mask, keys):
    def fold(acc, client_state, c):
      if acc is None:
        return first(state, rd, client_state, c)
      return add(acc, state, rd, client_state, c)

    return engine.run_folded(shared, client_inputs, images, labels, idx, mask, keys, fold, None)

  return run, jax.jit(streaming.finish, donate_argnums=0)
