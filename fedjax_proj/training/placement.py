"""The run's execution, decided in one place: strategy, device placement and chunking.

:func:`plan_execution` builds the run's :class:`~fedjax_proj.core.executor.Executor` once: it
resolves ``auto`` (:func:`~fedjax_proj.core.engine.choose_strategy`), decides whether the client
axis is sharded and over which devices (:func:`client_mesh_for`) and whether clients run in chunks
with streaming aggregation, and how many (``auto``:
:func:`~fedjax_proj.core.chunked.auto_client_chunk`). :func:`build_round` builds a method's round
on it and :func:`placed_round` puts each round's inputs on the mesh (docs/performance.md;
docs/design.md, "Execution"). :func:`conv_impl_choice` picks the convolution implementation of
the run's model for its backend. The models' max pooling picks its own
(:func:`fedjax_proj.models.pool.pool_impl_for`, from the backend at trace time): its two
implementations compute the same numbers bit for bit, so the choice is not the run's to record.
"""

from __future__ import annotations

import math

import jax

from fedjax_proj.algorithms.base import make_round
from fedjax_proj.core import distributed, sharding
from fedjax_proj.core.chunked import auto_client_chunk, tree_bytes
from fedjax_proj.core.engine import BatchFn, can_shard, choose_strategy
from fedjax_proj.core.executor import Executor
from fedjax_proj.training import fields


def conv_impl_choice(backend: str | None = None) -> tuple[str, str | None]:
  """(the ``conv_impl`` a run's model uses on ``backend``, None or the one line saying why the
  CPU falls back); ``backend`` defaults to ``jax.default_backend()``.

  On XLA:CPU, whose own kernel-gradient convolution is 2-9x slower than PyTorch's: ``onednn``
  (the forward convolution, the input gradient and the kernel gradient all by oneDNN's primitives
  through FFI calls, the library PyTorch's CPU convolutions run) where its handler loads, which
  builds it on the first call of a process that has no built copy
  (:func:`fedjax_proj.models.onednn.unavailable_reason`). Where it does not (oneDNN's wheels
  missing, as off Linux x86-64, no compiler, a failed build or load), and where the process sees
  several CPU devices (the client axis may be sharded over them, and XLA cannot partition the FFI
  calls): ``gemm_grad`` (XLA's convolution, the kernel gradient as matmuls, 1.2-6x faster than
  XLA's on all but one of those convolutions) and the handler's one line naming why and the fix,
  which the run logs. ``xla`` elsewhere, where the convolution libraries have fast kernel
  gradients. All compute the same convolution and gradients up to float32 summation order
  (docs/performance.md, "The CPU convolution kernel gradient").

  History: ``gemm_grad`` was the CPU default until 2026-11-28, ``onednn_grad`` (oneDNN's kernel
  gradient only) opt-in until its segmentation faults (fixed) had held off through CI runs with the
  extra installed and its step was measured with the claim runs paused (docs/performance.md, "Steps
  on idle cores"); ``onednn`` then ran the CNN, FedProj and ResNet-8 steps 1.04-1.21x faster than
  ``onednn_grad`` (docs/performance.md, "oneDNN's forward and input gradient too").
  ``--model_kwargs=conv_impl=...`` overrides the choice.
  """
  if (backend or jax.default_backend()) != "cpu":
    return "xla", None
  if (devices := jax.device_count()) > 1:
    # XLA's partitioner has no rule for the FFI calls: sharded over clients, every device would
    # gather the operands and compute every client's convolutions (measured on forced host
    # devices: the result came back replicated).
    return "gemm_grad", (
      f"{devices} CPU devices: oneDNN's convolutions (FFI calls without a partitioning rule) are "
      "not used where clients may be sharded; the convolutions are XLA's with gemm_grad's kernel "
      "gradient (--model_kwargs=conv_impl=onednn to use them anyway)"
    )
  # Imported here: the handler is looked up (and built) only when a run asks for its placement.
  from fedjax_proj.models import onednn  # noqa: PLC0415

  reason = onednn.unavailable_reason()
  if reason is None:
    return "onednn", None
  return "gemm_grad", f"{reason}; the convolutions are XLA's with gemm_grad's kernel gradient"


def conv_impl_for(backend: str | None = None) -> str:
  """The ``conv_impl`` (:data:`fedjax_proj.models.conv.CONV_IMPLS`) a run's model uses on
  ``backend``: :func:`conv_impl_choice`'s."""
  return conv_impl_choice(backend)[0]


def conv_impl_line(model_kwargs: dict) -> str:
  """Sets ``model_kwargs["conv_impl"]`` to the placement's choice unless it names one, and
  returns the run log's line naming the implementation used (and why, where the CPU fell back)."""
  if "conv_impl" in model_kwargs:
    return f"convolutions: conv_impl={model_kwargs['conv_impl']} (--model_kwargs)"
  impl, why = conv_impl_choice()
  model_kwargs["conv_impl"] = impl
  return f"convolutions: conv_impl={impl}" + (f" ({why})" if why else "")


def client_mesh_for(c, strategy: str, log):
  """The mesh the client axis is sharded over, or None for the plain single-device round."""
  if jax.process_count() > 1:
    devices = jax.device_count()
    if not can_shard(strategy):
      raise ValueError(
        f"A multi-process run needs --strategy=vmap_scan (the sharded round); auto chose "
        f"{strategy!r} for this model and backend."
      )
    if c.clients_per_round % devices:
      raise ValueError(
        f"--clients_per_round={c.clients_per_round} is not a multiple of the {devices} devices of "
        f"the {jax.process_count()} processes; use a multiple of {devices} clients per round."
      )
    log(
      f"sharding the client axis over {devices} devices of {jax.process_count()} processes "
      f"(process {jax.process_index()} holds {jax.local_device_count()})"
    )
    return distributed.global_client_mesh()
  devices = jax.local_device_count()
  if not c.shard_clients or devices == 1 or not can_shard(strategy):
    return None
  if c.clients_per_round % devices:
    log(
      f"note: not sharding clients: clients_per_round={c.clients_per_round} is not a multiple "
      f"of the {devices} local devices"
    )
    return None
  log(f"sharding the client axis over {devices} devices")
  return sharding.client_mesh()


def _client_chunk(c, shards: int, variables) -> tuple[int | None, bool]:
  """(clients per chunk or None, whether the run chose it) from ``--client_chunk``.

  ``auto`` chunks only a cohort whose clients do not fit the memory budget together, and budgets
  one device's share of it when the client axis is sharded over ``shards`` devices.
  """
  chunk = c.client_chunk  # parsed: "auto", None or an int (fields.parse_client_chunk)
  if chunk is None:
    return None, False
  if chunk != "auto":
    # A chunk larger than the round's cohort runs the cohort as one chunk: that is what the run
    # computes and logs (--client_chunk=50 with 2 clients a round is chunks of 2).
    return min(chunk, c.clients_per_round), False
  local = c.clients_per_round // shards
  size = auto_client_chunk(local, tree_bytes(variables))
  if size >= local:  # the whole cohort fits: the ordinary round
    return None, False
  return size * shards, True


def plan_execution(
  c, batch_fn: BatchFn, *, has_conv: bool, variables, log, shard: bool = True
) -> Executor:
  """The run's executor for config ``c`` (``strategy``, ``clients_per_round``, ``shard_clients``,
  ``client_chunk``), decided once.

  Args:
    c: the run's resolved config (:func:`fedjax_proj.training.fields.resolve`), or a config to
      resolve.
    batch_fn: the run's batch builder (:func:`fedjax_proj.data.pipeline.make_batch_fn`).
    has_conv: the model has a convolution (the ``auto`` strategy table's model kind).
    variables: the model's variables (the ``auto`` chunk's memory per client).
    log: progress printer (the sharding decision).
    shard: whether this run may shard its clients over devices (the continual task driver does
      not place its rounds' inputs, so it passes False).
  """
  c = fields.resolve(c)  # the run's resolved config as it is; a ConfigDict resolved here
  sharded = shard and c.shard_clients and jax.local_device_count() > 1
  strategy = choose_strategy(
    c.strategy,
    has_conv=has_conv,
    num_clients=c.clients_per_round,
    # Sharding over local devices needs the one-program round (docs/performance.md).
    sharded=sharded,
  )
  mesh = client_mesh_for(c, strategy, log) if shard else None
  shards = 1 if mesh is None else int(mesh.devices.size)
  chunk, optional = _client_chunk(c, shards, variables)
  return Executor(strategy, batch_fn, mesh=mesh, client_chunk=chunk, chunk_optional=optional)


def build_round(algorithm, executor: Executor, log):
  """``algorithm``'s round on the run's ``executor``, its inputs placed on the executor's mesh."""
  if executor.runs_in_chunks(algorithm):
    shards = 1 if executor.mesh is None else int(executor.mesh.devices.size)
    chunk = executor.client_chunk
    per_device = f" ({math.ceil(chunk / shards)} per device)" if shards > 1 else ""
    auto = " (client_chunk=auto)" if executor.chunk_optional else ""
    log(f"clients run in chunks of {chunk}{per_device} with streaming aggregation{auto}")
  return placed_round(make_round(algorithm, executor), executor.mesh)


def placed_round(round_fn, mesh):
  """Wraps ``round_fn`` to place its inputs on ``mesh`` (clients split, the rest replicated).

  The training set and the other shared inputs are the same objects every round, so they are
  placed once. Several processes: inputs become global arrays (each process fills its own devices
  from the identical host data it computed) and the outputs stay global.
  """
  if mesh is None:
    return round_fn
  if jax.process_count() > 1:
    place_rd, place_tree = distributed.shard_round_data, distributed.replicate
  else:
    place_rd, place_tree = sharding.shard_round_data, sharding.replicate
  shared: dict = {}

  def sharded(state, rd, key):
    source = (rd.images, rd.labels, rd.extra)
    cached = shared.get("source", ())
    # The cache keeps the sources alive, so an identity match cannot be a recycled object.
    if len(cached) != 3 or any(a is not b for a, b in zip(cached, source, strict=True)):
      shared["placed"], shared["source"] = place_rd(rd, mesh), source
    placed = shared["placed"]
    # Only the per-client fields change between rounds.
    rd = place_rd(rd._replace(images=placed.images, labels=placed.labels, extra=placed.extra), mesh)
    return round_fn(place_tree(state, mesh), rd, place_tree(key, mesh))

  return sharded
