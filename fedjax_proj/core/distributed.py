"""Several hosts: jax.distributed.initialize and global placement of a round.

Architecture: docs/design.md, "Scale-out".

JAX is multi-controller: every process (one per host, or one per GPU) runs this same program, sees
its local devices, and the jitted round spans the *global* devices of all processes; XLA inserts
the cross-process collectives (NCCL on GPU, ICI/DCN on TPU, gloo over TCP on CPU). There is no
RPC layer of our own. What this module adds on top of :mod:`fedjax_proj.core.sharding`:

* :func:`initialize` with explicit arguments (library code never reads flags or the environment);
  a no-op for one process, so the same script runs on a laptop and a cluster.
* :func:`global_client_mesh`: the ``"clients"`` mesh over all devices of all processes.
* :func:`shard_round_data` / :func:`replicate`: build *global* arrays from host data that every
  process holds identically (the round layout is a pure function of (seed, round), so each process
  computes the same indices), each process materialising only its own devices' slices.
* :func:`fetch`: a replicated global array's value on this process (e.g. for evaluation/logging);
  :func:`to_host` for any tree (local, replicated or sharded arrays); :func:`to_local` copies only
  when a tree holds global arrays.
* :func:`max_over_processes` and :func:`barrier`: the few points where processes must agree
  (e.g. stopping on a signal that reached only some of them).

The experiment runner wires all of this behind ``--num_processes`` / ``--coordinator_address`` /
``--process_id`` (docs/performance.md, "Several hosts").

Launching (every process runs the same command with its own ``process_id``)::

  # GPU cluster, one process per host (all local GPUs), host 0 at 10.0.0.1:
  initialize("10.0.0.1:1234", num_processes=NUM_HOSTS, process_id=HOST_RANK)
  # Slurm / Open MPI / Cloud TPU pods detect all three values themselves:
  initialize(None, num_processes=None, process_id=None)  # auto-detect
  # CPU processes on one machine (tests): gloo collectives over TCP loopback.
  initialize("127.0.0.1:12345", num_processes=2, process_id=0, cpu_collectives="gloo")

Then build the round as usual, place its inputs with ``shard_round_data(rd, global_client_mesh())``
and the server state with ``replicate(state, mesh)``; clients per round must be a multiple of
``jax.device_count()`` (global). On TPU pods the auto-detected form is the normal one.
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from fedjax_proj.core.sharding import CLIENT_AXIS, place_round_data
from fedjax_proj.core.types import RoundData


def initialize(
  coordinator_address: str | None,
  num_processes: int | None,
  process_id: int | None,
  *,
  local_device_ids: int | Sequence[int] | None = None,
  cpu_collectives: str | None = None,
  initialization_timeout: int = 300,
) -> bool:
  """Joins this process to a multi-process JAX job; a no-op for a single process.

  Must run before any other JAX computation in the process (JAX's own rule).

  Args:
    coordinator_address: ``"host:port"`` of process 0 (every process passes the same value).
      ``None`` together with ``num_processes=None`` and ``process_id=None`` lets JAX detect the
      cluster (Cloud TPU, Slurm, Open MPI).
    num_processes: total number of processes; ``1`` makes this function do nothing.
    process_id: this process's rank in ``[0, num_processes)``.
    local_device_ids: restrict this process to some local devices (e.g. one process per GPU).
    cpu_collectives: ``"gloo"`` (or ``"mpi"``) to enable cross-process collectives on the CPU
      backend; ``None`` leaves JAX's default. Only needed for CPU-only jobs.
    initialization_timeout: seconds to wait for all processes to connect.

  Returns:
    True if the distributed runtime was initialised, False for the single-process no-op.

  Raises:
    ValueError: inconsistent arguments (explains which).
  """
  if num_processes == 1:
    return False
  auto = coordinator_address is None and num_processes is None and process_id is None
  if not auto:
    if coordinator_address is None or num_processes is None or process_id is None:
      raise ValueError(
        "Pass coordinator_address, num_processes and process_id together (or all three as None "
        "to let JAX detect a TPU/Slurm/MPI cluster)."
      )
    if num_processes < 1 or not 0 <= process_id < num_processes:
      raise ValueError(
        f"process_id={process_id} must be in [0, num_processes={num_processes}) and "
        "num_processes >= 1."
      )
    if ":" not in coordinator_address:
      raise ValueError(
        f"coordinator_address={coordinator_address!r} needs a port, e.g. '10.0.0.1:1234'."
      )
  if cpu_collectives is not None:
    jax.config.update("jax_cpu_collectives_implementation", cpu_collectives)
  jax.distributed.initialize(
    coordinator_address=coordinator_address,
    num_processes=num_processes,
    process_id=process_id,
    local_device_ids=local_device_ids,
    initialization_timeout=initialization_timeout,
  )
  return True


def shutdown() -> None:
  """Leaves the distributed job (safe to call when it was never initialised)."""
  if jax.process_count() > 1:
    jax.distributed.shutdown()


def global_client_mesh() -> Mesh:
  """A 1-D ``"clients"`` mesh over every device of every process (process-major order)."""
  devices = sorted(jax.devices(), key=lambda d: (d.process_index, d.id))
  return Mesh(np.asarray(devices), (CLIENT_AXIS,))


def _global_array(x, sharding: NamedSharding) -> jax.Array:
  if isinstance(x, jax.Array) and not x.is_fully_addressable:
    # Already a global array (e.g. the state a sharded round returned); np.asarray cannot read it
    # and jit accepts it as it is.
    return x
  host = np.asarray(x)
  return jax.make_array_from_callback(host.shape, sharding, lambda index: host[index])


def shard_round_data(rd: RoundData, mesh: Mesh) -> RoundData:
  """Global :class:`RoundData`: client-axis fields split over ``mesh``, the rest replicated.

  Every process must call this with identical ``rd`` (host or device arrays); each one only
  copies the slices its own devices hold. Works for single-process meshes too.

  Raises:
    ValueError: the clients per round are not a multiple of the mesh size.
  """
  return place_round_data(rd, mesh, _global_array)


def replicate(tree, mesh: Mesh):
  """Every leaf of ``tree`` as a global array replicated on ``mesh`` (identical on all processes).

  PRNG key leaves are replicated through their key data.
  """
  rep = NamedSharding(mesh, P())

  def put(x):
    if isinstance(x, jax.Array) and jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
      impl = jax.random.key_impl(x)
      return jax.random.wrap_key_data(_global_array(jax.random.key_data(x), rep), impl=impl)
    return _global_array(x, rep)

  return jax.tree.map(put, tree)


def fetch(tree):
  """Host (numpy) copies of a tree of replicated global arrays, readable on every process."""
  return jax.tree.map(lambda x: np.asarray(x.addressable_data(0)), tree)


def to_host(tree):
  """Host (numpy) copies of any tree: local, replicated global or sharded global arrays.

  Sharded global leaves are gathered from all processes (a collective: every process must call
  this with the same tree); everything else is copied without communication.
  """

  def get(x):
    if not isinstance(x, jax.Array) or x.is_fully_addressable:
      return np.asarray(x)
    if x.is_fully_replicated:
      return np.asarray(x.addressable_data(0))
    from jax.experimental import multihost_utils

    return np.asarray(multihost_utils.process_allgather(x, tiled=True))

  return jax.tree.map(get, tree)


def to_local(tree):
  """``tree`` readable on this process: global (multi-process) arrays become host copies
  (:func:`to_host`, a collective when any leaf is sharded over processes).

  A single process keeps its device arrays (no host round trip).
  """
  leaves = jax.tree.leaves(tree)
  if all(not isinstance(x, jax.Array) or x.is_fully_addressable for x in leaves):
    return tree
  return to_host(tree)


def max_over_processes(value: int) -> int:
  """The maximum of an integer over all processes (every process must call it; 1 process: as is)."""
  if jax.process_count() == 1:
    return int(value)
  from jax.experimental import multihost_utils

  return int(np.max(multihost_utils.process_allgather(np.asarray(value, np.int32))))


def barrier(name: str) -> None:
  """Waits until every process reaches ``barrier(name)`` (no-op for one process)."""
  if jax.process_count() > 1:
    from jax.experimental import multihost_utils

    multihost_utils.sync_global_devices(name)
