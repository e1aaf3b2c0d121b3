"""An XLA:CPU training step's working memory, kept between steps instead of mapped afresh.

XLA:CPU gives each execution of a program one temporary buffer (the step's activations and
gradients: 46 MB for the CNN's training step at batch 64, 67 MB for ResNet-8's, 134 MB for the
CNN's at batch 256) from ``malloc``, and frees it when the execution ends. glibc's ``malloc``
serves a request above its mmap threshold (by its own dynamic rule at most 32 MB) with a fresh
``mmap`` and gives it back with ``munmap`` on ``free``, so every step faulted in and zeroed every
page of its buffer again: 11,300 page faults and about 30 ms of system time a CNN step at batch 64
(out of 136 CPU ms), 16,500 and 50 ms a ResNet-8 step (docs/performance.md, "The step's page
faults"). PyTorch allocates each tensor on its own, most of them under the threshold and reused
from the heap.

:func:`keep_freed_memory` makes the buffer a reused one:

- ``mallopt`` raises glibc's mmap threshold and trim threshold to :data:`THRESHOLD_BYTES`, so a
  freed buffer stays in the heap and the next step's request takes it back, its pages already
  mapped. It applies to every later allocation of the process.
- The CPU client runs each execution on the calling thread (``jax_cpu_enable_async_dispatch``
  off): asynchronously it ran on a worker thread, whose ``malloc`` arena grows in heaps of at most
  64 MB, so a larger buffer was mapped afresh whatever the threshold; the calling (main) thread's
  heap has no such bound. JAX reads the setting when it creates the CPU client, so this part
  needs the call before the process's first computation. What it costs: the Python of the host
  loop between two steps (a fraction of a millisecond) no longer overlaps the previous step.

Neither changes a result: the same programs run on the same inputs (the tests compare a
training step's outputs bit for bit). What it costs: the process keeps the largest buffers it
freed (up to :data:`THRESHOLD_BYTES` of free heap) instead of returning them, as a reused buffer
must be kept. The entry points call it before anything computes, as they turn the compilation
cache on; the library never calls it by itself (it changes the whole process's ``malloc``).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools

# mallopt's parameter numbers (glibc's malloc.h).
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
# Requests below it come from the heap and free memory at the heap's top up to it is kept: 1 GiB,
# 8x the largest step buffer measured (the CNN's at batch 256, 134 MB), far above glibc's 32 MB;
# mallopt takes an int.
THRESHOLD_BYTES = 1 << 30
# JAX's setting: False runs a single-device CPU computation on the calling thread.
ASYNC_DISPATCH = "jax_cpu_enable_async_dispatch"


@functools.cache
def _glibc() -> ctypes.CDLL | None:
  name = ctypes.util.find_library("c")
  if not name:
    return None
  try:
    libc = ctypes.CDLL(name)
    libc.gnu_get_libc_version  # noqa: B018 (only glibc has it; musl and macOS' libc have not)
  except (OSError, AttributeError):
    return None
  return libc


def _backends_started() -> bool:
  # JAX has no public way to ask; where its private one is gone, the setting is made anyway and
  # takes effect if the backends have not started.
  try:
    from jax._src import xla_bridge  # noqa: PLC0415
  except ImportError:
    return False
  return bool(getattr(xla_bridge, "backends_are_initialized", lambda: False)())


def keep_freed_memory() -> dict[str, str]:
  """Keeps XLA:CPU's per-execution buffers in the heap between steps (the module's docstring).

  Call it first in a process, before its first JAX computation; calling it again is harmless.

  Returns:
    The parts that could not apply, each with one line naming why (empty when both did):
    ``"malloc"`` when it is not glibc's (no ``mallopt``; other ``malloc`` implementations have
    their own rules) or ``mallopt`` refused the threshold; ``"dispatch"`` when JAX's backends had
    already started (the executions stay on JAX's worker threads, where buffers above 64 MB are
    still mapped afresh; those up to 64 MB are kept by the thresholds).
  """
  import jax

  missing = {}
  libc = _glibc()
  if libc is None:
    missing["malloc"] = "not glibc's malloc: its mmap and trim thresholds were left as they are"
  else:
    for name, param in (("mmap", M_MMAP_THRESHOLD), ("trim", M_TRIM_THRESHOLD)):
      if libc.mallopt(param, THRESHOLD_BYTES) != 1:
        missing["malloc"] = (
          f"glibc's mallopt refused the {name} threshold of {THRESHOLD_BYTES} bytes"
        )
  if _backends_started():
    if jax.config.values.get(ASYNC_DISPATCH, True):
      missing["dispatch"] = (
        "JAX's backends had started: the CPU client keeps running executions on its worker "
        "threads (call keep_freed_memory before the process's first computation)"
      )
  else:
    jax.config.update(ASYNC_DISPATCH, False)
  return missing
