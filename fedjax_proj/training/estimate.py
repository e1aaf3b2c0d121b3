"""The pre-run time estimate: the method's own local step timed now, times the run's steps."""

from __future__ import annotations

import time

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_proj.algorithms.families import SequentialFamily
from fedjax_proj.core.executor import Executor
from fedjax_proj.core.types import Array
from fedjax_proj.data.federated import FederatedData

# Runs with fewer local steps than this start without a timing probe (seconds to run anyway).
ETA_PROBE_MIN_STEPS = 2000


def time_client_step(
  algorithm,
  executor: Executor,
  variables: dict,
  fed: FederatedData,
  images: Array,
  labels: Array,
  round_inputs: dict,
  clients_per_round: int,
  seed: int,
  max_steps: int = 8,
  repeats: int = 2,
) -> float:
  """Seconds per local step of the method's own client program, measured now.

  Runs round 1's broadcast (``begin`` for sequential FL) and then the sampled client with the most
  steps for up to ``max_steps`` of its steps on the run's ``executor`` host-looped (its batch
  builder, one client at a time, :meth:`~fedjax_proj.core.executor.Executor.host_looped`), once to
  compile and ``repeats`` times timed (the median), divided by the steps run. So a step costs what
  the method's local step costs (FedProj's memory loss and projection, MOON's extra forward passes,
  SFedKD's teachers), and the client's init and final work is spread over the steps. The server side
  (aggregation, FedDF/FedProj's distillation) is not included.
  """
  from fedjax_proj.core import random as random_lib  # noqa: PLC0415
  from fedjax_proj.core import tree as tree_lib  # noqa: PLC0415

  key = jax.random.key(seed)
  sampled = fed.sample_clients(0, clients_per_round, seed)
  rd = fed.round_data(images, labels, sampled, 0, seed, dict(round_inputs))
  idx, mask = np.asarray(rd.idx), np.asarray(rd.mask)
  state = algorithm.init(variables, key)
  if isinstance(algorithm, SequentialFamily):  # the first client of the chain starts from this
    context, carry, inputs = jax.jit(algorithm.begin)(state, rd, key)
    shared = {**context, **carry}
  else:
    shared, inputs = jax.jit(algorithm.broadcast)(state, rd, key)
  active = mask.any(axis=-1)  # [C, S]
  c = int(np.argmax(active.sum(axis=1)))
  k = min(max_steps, int(active[c].sum()))
  steps = np.flatnonzero(active[c])[:k]
  # Round 1's broadcast lies outside FedProj's projection window, whose host-looped step skips the
  # memory pass; without static_shared the step keeps every pass (a select), the in-window cost.
  engine = executor.host_looped().clients(algorithm.client._replace(static_shared=()))
  one = tree_lib.index_clients(inputs, jnp.asarray([c]))
  keys = random_lib.client_keys(key, 1)
  sub_idx, sub_mask = idx[c : c + 1, steps], mask[c : c + 1, steps]

  def run():
    return jax.block_until_ready(engine.run(shared, one, images, labels, sub_idx, sub_mask, keys))

  run()  # compile
  times = []
  for _ in range(repeats):
    t0 = time.perf_counter()
    run()
    times.append(time.perf_counter() - t0)
  return float(np.median(times)) / max(k, 1)


def _format_duration(seconds: float) -> str:
  if seconds < 120:
    return f"{seconds:.0f} s"
  if seconds < 7200:
    return f"{seconds / 60:.0f} min"
  return f"{seconds / 3600:.1f} h"


def run_steps(c, fed: FederatedData, start_round: int = 0, padded: bool = True) -> int:
  """The local steps ``c``'s clients run from ``start_round`` on: rounds x clients per round x
  steps per client (every client the longest client's count when ``padded``, vmap_scan's fixed
  shapes; otherwise the mean client's)."""
  per_client = fed.num_steps if padded else float(np.mean([fed.steps_for(n) for n in fed.sizes]))
  return int(round((c.rounds - start_round) * c.clients_per_round * per_client))


def estimate_run(
  c, fed: FederatedData, step_seconds: float | None, start_round: int = 0, padded: bool = True
) -> str:
  """The pre-round-1 estimate line(s) for ``c`` given a measured time per local step.

  The step timed is the method's own (:func:`time_client_step`), run one client at a time, so the
  server's work (aggregation, server distillation) comes on top; on accelerators, where a round
  runs its clients in parallel, the estimate errs high. The progress bar's ETA, timed from whole
  rounds, includes everything.

  ``padded``: every client runs the longest client's step count (vmap_scan's fixed shapes);
  otherwise each runs its own, and the mean client's count is used.
  """
  steps = run_steps(c, fed, start_round, padded)
  if step_seconds is None:
    return ""
  total = steps * step_seconds
  text = (
    f"estimated time: about {_format_duration(total)} for {c.rounds - start_round} rounds "
    f"({steps:,} local steps of batch {c.batch_size} at {step_seconds * 1e3:.1f} ms each: "
    f"{c.method}'s own step, timed now on {jax.default_backend()}; server work such as "
    "aggregation and distillation comes on top; the progress bar's ETA is timed from whole rounds)"
  )
  if total > 3600 and jax.default_backend() == "cpu":
    text += (
      f"\nwarning: this run needs more than an hour on CPU (about {_format_duration(total)}); "
      "--preset=cpu runs a reduced budget of this experiment in minutes, --preset=smoke in "
      "under one."
    )
  return text


def available_memory() -> int | None:
  """Bytes the first local device can still allocate: its memory stats on an accelerator, the
  host's available RAM on CPU (Linux ``/proc/meminfo``); None when unknown."""
  device = jax.local_devices()[0]
  stats = device.memory_stats() if device.platform != "cpu" else None
  if stats and "bytes_limit" in stats:
    return int(stats["bytes_limit"] - stats.get("bytes_in_use", 0))
  try:
    with open("/proc/meminfo") as f:
      info = dict(line.split(":", 1) for line in f)
    return int(info["MemAvailable"].split()[0]) * 1024
  except (OSError, KeyError, ValueError):
    return None


def estimate_memory(
  param_bytes: int,
  clients_at_once: int,
  optimizer_slots: int,
  data_bytes: int,
  available: int | None,
) -> str:
  """A rough check, before the round is compiled, that the run fits in memory.

  Counts the global model, and per client computed at once a model copy, its gradient and the
  optimiser's slots (Adam 2, SGD with momentum 1), plus the device-resident data. Activations and
  XLA's temporaries come on top, so the estimate is a lower bound: a warning when it alone takes
  more than 80% of what is available, else ''.
  """
  need = param_bytes * (1 + clients_at_once * (2 + optimizer_slots)) + data_bytes
  if available is None or need <= 0.8 * available:
    return ""
  return (
    f"warning: this run needs at least {need / 2**30:.1f} GiB ({clients_at_once} clients at once "
    f"x {param_bytes / 2**20:.1f} MiB of parameters x {2 + optimizer_slots} copies, plus "
    f"{data_bytes / 2**30:.2f} GiB of data) of the {available / 2**30:.1f} GiB available, before "
    "activations; lower --clients_per_round, set --client_chunk, or use a smaller model."
  )
