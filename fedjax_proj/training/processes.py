"""Process start-up: check the multi-process flags and join the job before any JAX computation.

Every process runs the same command with its own ``process_id`` and the same
``coordinator_address``, ``num_processes`` and ``output_dir`` (docs/performance.md, "Several
hosts").
"""

from __future__ import annotations

import jax
import ml_collections

from fedjax_proj.core import distributed
from fedjax_proj.core import engine as engine_lib

CPU_COLLECTIVES = ("", "gloo", "mpi")


def validate_processes(c: ml_collections.ConfigDict) -> None:
  """Checks the process-layout flags (device-count checks run after jax.distributed starts)."""
  n, pid, address = int(c.num_processes), int(c.process_id), c.coordinator_address
  if c.cpu_collectives not in CPU_COLLECTIVES:
    raise ValueError(
      f"--cpu_collectives must be one of {CPU_COLLECTIVES} ('' = JAX's default), got "
      f"{c.cpu_collectives!r}."
    )
  if n < 0:
    raise ValueError(f"--num_processes must be >= 1 (or 0 to auto-detect a cluster), got {n}.")
  if n == 1:
    if pid != 0:
      raise ValueError(f"--process_id={pid} needs --num_processes > {pid}; a single process is 0.")
    return
  if n == 0 and (address or pid):
    raise ValueError(
      "--num_processes=0 lets JAX detect the cluster (Cloud TPU, Slurm, Open MPI): leave "
      "--coordinator_address and --process_id unset, or pass all three explicitly."
    )
  if n > 1:
    if not 0 <= pid < n:
      raise ValueError(
        f"--process_id={pid} is out of range for --num_processes={n}; give each process a "
        f"distinct id in 0..{n - 1}."
      )
    if ":" not in address:
      raise ValueError(
        f"--num_processes={n} needs --coordinator_address=<host:port> of process 0 (the same on "
        f"every process), e.g. 10.0.0.1:1234; got {address!r}."
      )
  if not c.output_dir:
    raise ValueError(
      "A multi-process run needs an explicit --output_dir on a filesystem every process sees "
      "(the default name is timestamped per process)."
    )
  if not c.shard_clients:
    raise ValueError(
      "--num_processes > 1 shards the clients over all processes' devices; drop "
      "--shard_clients=false."
    )
  if not engine_lib.can_shard(c.strategy):
    raise ValueError(
      f"A multi-process run needs --strategy=vmap_scan (the sharded round), got {c.strategy!r}."
    )


def init_processes(c: ml_collections.ConfigDict) -> bool:
  """Joins the multi-process job the config describes (no-op for one process).

  Must run before any JAX computation. Returns True when several processes run.
  """
  n = int(c.num_processes)
  if n == 1:
    return False
  distributed.initialize(
    c.coordinator_address or None,
    n or None,
    int(c.process_id) if n else None,
    cpu_collectives=c.cpu_collectives or None,
  )
  return jax.process_count() > 1
