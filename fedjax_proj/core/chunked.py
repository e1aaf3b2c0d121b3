"""Large cohorts in bounded memory: a round's clients run in chunks with streaming aggregation.

The ordinary round (:func:`fedjax_proj.algorithms.base.make_round`) materialises every sampled
client's outputs at once ([C, num_params] local models), so memory grows with the cohort C. Here
the cohort is cut into chunks of ``client_chunk`` clients; each chunk's outputs are reduced to sums
(for FedAvg: Σ n_k θ_k, Σ n_k and Σ n_k m_k) right where they are produced, the sums are added over
chunks, and the server update runs once (:class:`~fedjax_proj.core.rounds.StreamingAggregate`,
the method's aggregate).
Peak memory therefore grows with the chunk, not with the cohort (measured in
``benchmarks/perf/scaling.py``, docs/performance.md). FedAvg's weighted mean is associative, so any
chunking gives the ordinary round's result up to float summation order; every client keeps the PRNG
key it has in the ordinary round.

* ``vmap_scan``: one jitted program, a ``lax.scan`` over chunks whose body is the vmapped client
  computation of one chunk plus its reduction. A cohort that is not a multiple of the chunk is
  padded with clients that have an all-False mask and ``num_examples`` 0 (no-op steps, zero weight).
* ``vmap_stepwise`` / ``sequential``: a host loop over chunks around the engine, the reduction and
  accumulation jitted (the last chunk may be smaller).

Sharded client axis (``mesh``, ``vmap_scan`` only): each chunk is spread over all devices of the
mesh. Device ``d`` holds the contiguous block of clients ``[d*L, (d+1)*L)`` (``L = C / D``, the
layout of :func:`fedjax_proj.core.sharding.shard_round_data`); chunk ``j`` takes the ``j``-th
``ceil(client_chunk / D)`` clients of every device's block, so cutting the cohort into chunks moves
no client between devices, and the per-chunk sums become one cross-device reduction each. Padding
is added per device block. The client order inside a chunk differs from the unsharded chunking,
which again changes results only by float summation order.

The ``auto`` chunk size rule is :func:`auto_client_chunk`: all clients in one chunk when
``C * per_client_bytes`` fits the budget, else the fewest equal chunks that fit, where
``per_client_bytes = 8 * param_bytes`` (local params, gradients, optimiser state, the output copy
and its float32 sum, with slack) and the budget is 1 GiB, or a quarter of the device memory when the
backend reports it (GPU/TPU). A run applies it in one place, when it decides its execution
(:func:`fedjax_proj.training.placement.plan_execution`); the round here takes a number.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from fedjax_proj.core import tree as tree_lib
from fedjax_proj.core.engine import BatchFn, ClientEngine, run_vmap_scan
from fedjax_proj.core.rounds import drive_host_round, drive_round, host_pieces, streaming_of
from fedjax_proj.core.sharding import CLIENT_AXIS
from fedjax_proj.core.types import PyTree, RoundData

DEFAULT_BUDGET_BYTES = 1 << 30
PER_CLIENT_PARAM_COPIES = 8


def memory_budget_bytes(device=None) -> int:
  """A quarter of the device memory when the backend reports it (GPU/TPU), else 1 GiB."""
  device = device or jax.local_devices()[0]
  try:
    stats = device.memory_stats() or {}
  except Exception:  # Some backends do not implement memory_stats.
    stats = {}
  limit = stats.get("bytes_limit")
  return int(limit) // 4 if limit else DEFAULT_BUDGET_BYTES


def auto_client_chunk(num_clients: int, param_bytes: int, budget_bytes: int | None = None) -> int:
  """The chunk size rule of ``client_chunk="auto"`` (see the module docstring).

  Args:
    num_clients: clients per round C.
    param_bytes: bytes of one model's variables.
    budget_bytes: memory allowed for per-client state; default :func:`memory_budget_bytes`.

  Returns:
    ``C`` if everything fits, else ``ceil(C / n)`` for the smallest chunk count ``n`` that fits.
  """
  budget = memory_budget_bytes() if budget_bytes is None else budget_bytes
  per_client = max(1, PER_CLIENT_PARAM_COPIES * int(param_bytes))
  max_chunk = max(1, budget // per_client)
  if num_clients <= max_chunk:
    return num_clients
  num_chunks = math.ceil(num_clients / max_chunk)
  return math.ceil(num_clients / num_chunks)


def tree_bytes(tree: PyTree) -> int:
  return sum(int(np.prod(x.shape)) * x.dtype.itemsize for x in jax.tree.leaves(tree))


def _per_device_chunk(client_chunk: int, num_clients: int, shards: int) -> int:
  """Clients per chunk on each of ``shards`` devices (the whole chunk when ``shards=1``)."""
  return min(math.ceil(client_chunk / shards), max(1, num_clients // shards))


def check_client_chunk(client_chunk) -> int:
  """``client_chunk`` if it is a positive int; a ValueError naming the fix otherwise."""
  if isinstance(client_chunk, bool) or not isinstance(client_chunk, int) or client_chunk < 1:
    raise ValueError(
      f"client_chunk={client_chunk!r} must be a positive int (clients per chunk). 'auto' is "
      "decided once per run by fedjax_proj.training.placement.plan_execution (the rule: "
      "auto_client_chunk)."
    )
  return client_chunk


def require_streaming(algorithm):
  """The method's :class:`StreamingAggregate`; a ValueError if its clients cannot run in chunks."""
  streaming = streaming_of(algorithm)
  if streaming is None:
    raise ValueError(
      f"Method {algorithm.name!r} has no streaming aggregate (its aggregate is not a "
      "StreamingAggregate, e.g. a method that replaced its aggregate with a plain function), so "
      "its clients cannot run in chunks; use make_round, or give the method a "
      "StreamingAggregate(reduce, finish) (possible when its aggregate is a weighted mean over "
      "clients)."
    )
  return streaming


def _client_fields(rd: RoundData) -> dict:
  return {
    "client_ids": rd.client_ids,
    "idx": rd.idx,
    "mask": rd.mask,
    "num_examples": rd.num_examples,
  }


def _chunk_layout(tree: PyTree, shards: int, per_device: int, zero: bool, constrain) -> PyTree:
  """``[C, ...] -> [num_chunks, shards * per_device, ...]`` without moving a client between shards.

  Each shard's block ``[C / shards, ...]`` is padded to a multiple of ``per_device`` (with copies of
  its first clients, or zeros) and cut into ``num_chunks`` pieces; chunk ``j`` is the ``j``-th piece
  of every block, shard-major. With ``shards=1`` this is the plain contiguous chunking.
  """

  def layout(x):
    rest = x.shape[1:]
    local = x.shape[0] // shards
    num_chunks = math.ceil(local / per_device)
    pad = num_chunks * per_device - local
    x = x.reshape(shards, local, *rest)
    if pad:  # pad < per_device <= local, so the first ``pad`` clients exist
      fill = jnp.zeros_like(x[:, :pad]) if zero else x[:, :pad]
      x = jnp.concatenate([x, fill], axis=1)
    x = x.reshape(shards, num_chunks, per_device, *rest)
    x = jnp.swapaxes(x, 0, 1).reshape(num_chunks, shards * per_device, *rest)
    return constrain(x, 1)

  return jax.tree.map(layout, tree)


def make_chunked_round(
  algorithm: Any,
  strategy: str,
  batch_fn: BatchFn,
  client_chunk: int,
  unroll: int = 1,
  mesh: Mesh | None = None,
) -> Callable[[PyTree, RoundData, jax.Array], tuple[PyTree, dict]]:
  """Builds ``round_fn(state, round_data, key) -> (state, metrics)`` processing clients in chunks.

  Same contract as :func:`~fedjax_proj.algorithms.base.make_round` (the input state is donated);
  with ``client_chunk >= C`` it computes the ordinary round (up to float summation order). A run
  gets it from its :class:`~fedjax_proj.core.executor.Executor` when that has a chunk.

  Args:
    algorithm: a method whose aggregate is a ``StreamingAggregate`` (e.g. FedAvg): any value with
      a ``FederatedAlgorithm``'s fields (``name``, ``broadcast``, ``client``, ``aggregate``),
      read by attribute, so core needs no algorithm type.
    strategy: ``vmap_scan``, ``vmap_stepwise`` or ``sequential`` (resolve ``auto`` first).
    batch_fn: builds each local step's batch from the device data and indices (the run's input
      pipeline, as for ``make_round``).
    client_chunk: clients per chunk (:func:`auto_client_chunk` is the rule of a run's ``auto``).
      With a ``mesh`` of D devices each chunk holds ``ceil(client_chunk / D)`` clients per device.
    unroll: ``lax.scan`` unroll factor over local steps (``vmap_scan``).
    mesh: a ``"clients"`` mesh (:func:`fedjax_proj.core.sharding.client_mesh` or
      :func:`fedjax_proj.core.distributed.global_client_mesh`) over which every chunk's client axis
      is sharded (``vmap_scan`` only). Place the round data on it
      (``shard_round_data``) so no client moves between devices.

  Raises:
    ValueError: the method has no streaming aggregate, ``client_chunk`` is invalid, or a mesh
      was given for a host-looped strategy. At call time: the cohort is not a multiple of the
      mesh size.
  """
  streaming = require_streaming(algorithm)
  check_client_chunk(client_chunk)
  engine = ClientEngine(algorithm.client, batch_fn, strategy, unroll=unroll)
  if mesh is not None and not engine.traceable:
    raise ValueError(
      f"A sharded (mesh) chunked round needs strategy='vmap_scan', got {strategy!r}; drop the "
      "mesh or use vmap_scan."
    )
  shards = 1 if mesh is None else int(mesh.devices.size)
  reduce, finish = streaming.reduce, streaming.finish
  resolved: dict[int, int] = {}

  def chunk_of(rd) -> int:
    c = int(rd.idx.shape[0])
    if c % shards:
      raise ValueError(
        f"{c} clients per round cannot be split evenly over {shards} devices; use a multiple of "
        f"{shards} clients per round."
      )
    if c not in resolved:
      resolved[c] = _per_device_chunk(client_chunk, c, shards)
    return resolved[c]

  def constrain(x, axis: int):
    """Pins the client axis of ``x`` to the mesh, so XLA keeps every client on its device."""
    if mesh is None:
      return x
    spec = P(*([None] * axis), CLIENT_AXIS)
    return jax.lax.with_sharding_constraint(x, NamedSharding(mesh, spec))

  if engine.traceable:

    def traced(state, rd: RoundData, key, per_device: int):
      def run_chunks(shared, client_inputs, images, labels, idx, mask, keys):
        del images, labels, idx, mask  # taken per chunk from ``rd`` below
        lay = lambda tree, zero=False: _chunk_layout(tree, shards, per_device, zero, constrain)
        fields = lay(_client_fields(rd))
        # Padding clients: all-False mask (every step a no-op) and zero weight.
        fields["mask"] = lay(rd.mask, zero=True)
        fields["num_examples"] = lay(rd.num_examples, zero=True)
        xs = (fields, lay(client_inputs), lay(keys))

        def run_chunk(xs_chunk):
          f, inputs, k = jax.tree.map(lambda x: constrain(x, 0), xs_chunk)
          outputs = run_vmap_scan(
            algorithm.client,
            batch_fn,
            shared,
            inputs,
            rd.images,
            rd.labels,
            f["idx"],
            f["mask"],
            k,
            unroll=unroll,
          )
          return reduce(state, rd._replace(**f), outputs)

        first = jax.tree.map(lambda x: x[0], xs)
        zeros = jax.tree.map(
          lambda s: jnp.zeros(s.shape, s.dtype), jax.eval_shape(run_chunk, first)
        )
        body = lambda acc, xs_chunk: (tree_lib.tree_add(acc, run_chunk(xs_chunk)), None)
        sums, _ = jax.lax.scan(body, zeros, xs)
        return sums

      return drive_round(algorithm.broadcast, run_chunks, finish, state, rd, key)

    jitted = jax.jit(traced, donate_argnums=0, static_argnums=3)

    def round_fn(state, rd, key):
      return jitted(state, rd, key, chunk_of(rd))

    round_fn._cache_size = jitted._cache_size  # For no-recompilation checks.
    # For inspecting the compiled program (e.g. which collectives a sharded round uses).
    round_fn.lower = lambda state, rd, key: jitted.lower(state, rd, key, chunk_of(rd))
    return round_fn

  pieces = host_pieces(algorithm.broadcast)
  # The start is traced, so every chunk of one size shares one compiled slice.
  take = jax.jit(
    lambda tree, start, size: jax.tree.map(
      lambda x: jax.lax.dynamic_slice_in_dim(x, start, size), tree
    ),
    static_argnums=2,
  )

  def reduce_chunk(state, rd_chunk, outputs, acc):
    sums = reduce(state, rd_chunk, outputs)
    return sums if acc is None else tree_lib.tree_add(acc, sums)

  reduce_first = jax.jit(lambda s, r, o: reduce_chunk(s, r, o, None))
  reduce_add = jax.jit(reduce_chunk, donate_argnums=3)
  finish_jit = jax.jit(finish, donate_argnums=0)

  def host_round(state, rd: RoundData, key):
    chunk = chunk_of(rd)
    c = int(rd.idx.shape[0])

    def run_chunks(shared, client_inputs, images, labels, idx, mask, keys):
      acc = None
      for start in range(0, c, chunk):
        size = min(chunk, c - start)
        f = take(_client_fields(rd), start, size)
        outputs = engine.run(
          shared,
          take(client_inputs, start, size),
          images,
          labels,
          f["idx"],
          f["mask"],
          take(keys, start, size),
        )
        rd_chunk = rd._replace(**f)
        acc = (
          reduce_first(state, rd_chunk, outputs)
          if acc is None
          else reduce_add(state, rd_chunk, outputs, acc)
        )
        del outputs  # Free the chunk's client outputs before the next chunk runs.
      return acc

    return drive_host_round(pieces, run_chunks, finish_jit, state, rd, key)

  return host_round
