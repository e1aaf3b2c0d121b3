"""Execution as one value: how a run's clients run, decided once and carried together.

An :class:`Executor` holds what used to travel as five loose arguments: the resolved strategy
(:mod:`fedjax_proj.core.engine`), the run's batch builder, the ``lax.scan`` unroll, the device mesh
the client axis is sharded over and the chunk size of streaming aggregation. A run builds it once
(:func:`fedjax_proj.training.placement.plan_execution` decides ``auto``, the mesh and the chunk)
and hands it to everything that executes clients: the round builders and the continual methods
whose end-of-task hooks run a client pass (docs/design.md, "Execution").

Its operations are the ones the method families need:

* :meth:`Executor.clients`: a :class:`~fedjax_proj.core.engine.ClientEngine` running a client
  program over a round's clients; :meth:`Executor.client_chunks` its reducing form, a chunk of
  clients at a time with each chunk's outputs reduced where they are produced.
* :meth:`Executor.parallel_round`: the parallel-FL round (ordinary, or in chunks with streaming
  aggregation, :mod:`fedjax_proj.core.chunked`).
* :meth:`Executor.chain_round`: the sequential-FL chain round (:mod:`fedjax_proj.core.chain`).

Only core reads the strategy's name; everything above asks the executor (``one_program``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator

import jax
from jax.sharding import Mesh

from fedjax_proj.core.chain import make_chain_round
from fedjax_proj.core.chunked import check_client_chunk, make_chunked_round, require_streaming
from fedjax_proj.core.engine import (
  HOST_LOOP,
  BatchFn,
  ClientEngine,
  ClientProgram,
  one_program,
  validate_strategy,
)
from fedjax_proj.core.rounds import make_parallel_round, streaming_of
from fedjax_proj.core.types import PyTree


@dataclasses.dataclass(frozen=True)
class Executor:
  """How a run executes its clients (see the module docstring).

  Attributes:
    strategy: a resolved strategy of :data:`~fedjax_proj.core.engine.STRATEGIES` (not ``auto``:
      :func:`~fedjax_proj.core.engine.choose_strategy` resolves it).
    batch_fn: builds each local step's :class:`~fedjax_proj.core.types.Batch` from the
      device-resident data and the step's indices (the run's input pipeline,
      :func:`fedjax_proj.data.pipeline.make_batch_fn`).
    unroll: ``lax.scan`` unroll factor over local steps (one-program strategy).
    mesh: the ``"clients"`` mesh the client axis is sharded over (one-program strategy only), or
      None. The chunked round pins each chunk to it; the run places each round's inputs on it.
    client_chunk: clients per chunk of streaming aggregation, or None: all clients at once; it
      also bounds the passes :meth:`client_chunks` runs (FOT's end-of-task GPSE sketches).
    chunk_optional: the chunk is a memory bound the run chose (``auto``), not one the user asked
      for: a method whose aggregate cannot stream runs all clients at once instead of failing.
  """

  strategy: str
  batch_fn: BatchFn
  unroll: int = 1
  mesh: Mesh | None = None
  client_chunk: int | None = None
  chunk_optional: bool = False

  def __post_init__(self):
    validate_strategy(self.strategy)
    if self.strategy == "auto":
      raise ValueError(
        "Resolve strategy='auto' with choose_strategy() before building an Executor (a run's "
        "fedjax_proj.training.placement.plan_execution does)."
      )
    if self.mesh is not None and not self.one_program:
      raise ValueError(
        f"A sharded (mesh) round needs strategy='vmap_scan', got {self.strategy!r}; drop the "
        "mesh or use vmap_scan."
      )
    if self.client_chunk is not None:
      check_client_chunk(self.client_chunk)

  @property
  def one_program(self) -> bool:
    """The strategy compiles a round into one program (pure, traceable, shardable)."""
    return one_program(self.strategy)

  def host_looped(self) -> Executor:
    """This executor's batch builder on the host loop that runs one client at a time."""
    return Executor(HOST_LOOP, self.batch_fn)

  def clients(self, program: ClientProgram) -> ClientEngine:
    """The engine running ``program`` over a round's clients: ``engine.run(shared, client_inputs,
    images, labels, idx, mask, keys)`` -> outputs stacked over clients. Build it once: its jitted
    pieces are built with it."""
    return ClientEngine(program, self.batch_fn, self.strategy, unroll=self.unroll)

  def client_chunks(
    self,
    program: ClientProgram,
    reduce: Callable[[PyTree], PyTree],
    chunk: int | None = None,
  ) -> Callable[..., Iterator[PyTree]]:
    """``run(shared, client_inputs, images, labels, idx, mask, keys)`` yields ``reduce(outputs of
    chunk j)`` for each chunk j in order: ``program`` over the clients ``chunk`` at a time.

    Each chunk's outputs are reduced where they are produced (inside the chunk's jitted program
    for the one-program strategy) and the next chunk runs only when the caller asks for it, so a
    caller that folds the reductions as they come keeps one chunk's outputs alive at a time.
    ``chunk=None``: the executor's :attr:`client_chunk` (the run's ``--client_chunk``, which
    bounds every pass over the clients, the rounds and the continual methods' end-of-task passes
    alike); without one, all clients in one chunk with the one-program strategy, one client per
    chunk with the host loops (which run one client after another anyway).
    """
    if chunk is not None:
      check_client_chunk(chunk)
    chunk = chunk or self.client_chunk
    engine = self.clients(program)

    def run_chunk(shared, client_inputs, images, labels, idx, mask, keys):
      return reduce(engine.run(shared, client_inputs, images, labels, idx, mask, keys))

    run_chunk = jax.jit(run_chunk) if engine.traceable else run_chunk
    default = None if engine.traceable else 1

    def run(shared, client_inputs, images, labels, idx, mask, keys) -> Iterator[PyTree]:
      c = idx.shape[0]
      size = chunk or default or c
      for lo in range(0, c, size):
        hi = min(lo + size, c)
        inputs = jax.tree.map(lambda x, lo=lo, hi=hi: x[lo:hi], client_inputs)
        yield run_chunk(shared, inputs, images, labels, idx[lo:hi], mask[lo:hi], keys[lo:hi])

    return run

  def runs_in_chunks(self, algorithm) -> bool:
    """Whether :meth:`parallel_round` runs ``algorithm``'s clients in chunks."""
    if self.client_chunk is None:
      return False
    return not self.chunk_optional or streaming_of(algorithm) is not None

  def parallel_round(self, algorithm) -> Callable:
    """The parallel-FL round of ``algorithm`` (any value with a ``FederatedAlgorithm``'s fields):
    ``round_fn(state, round_data, key) -> (state, metrics)``, the input state donated.

    In chunks with streaming aggregation when :meth:`runs_in_chunks`
    (:func:`~fedjax_proj.core.chunked.make_chunked_round`; a method without a streaming aggregate
    and a chunk the user asked for is refused), else the ordinary round
    (:func:`~fedjax_proj.core.rounds.make_parallel_round`).
    """
    if self.runs_in_chunks(algorithm):
      return make_chunked_round(
        algorithm, self.strategy, self.batch_fn, self.client_chunk, self.unroll, self.mesh
      )
    return make_parallel_round(algorithm, self.clients(algorithm.client))

  def chain_round(self, algorithm) -> Callable:
    """The sequential-FL chain round of ``algorithm`` (any value with a ``SequentialAlgorithm``'s
    fields; :func:`~fedjax_proj.core.chain.make_chain_round`). A chain has no aggregate to
    stream, so a chunk the user asked for is refused."""
    if self.client_chunk is not None and not self.chunk_optional:
      require_streaming(algorithm)
    return make_chain_round(algorithm, self.clients(algorithm.client))
