"""Launching several local JAX processes on loopback for multi-process tests (not a test file)."""

from __future__ import annotations

import os
import socket
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
  """A TCP port on 127.0.0.1 that was free a moment ago (for the jax.distributed coordinator)."""
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


# XLA flags of the test suite's processes and its child processes. Their runs are tiny and
# compile-bound (an MLP round compiles in about as long as it trains for a round), and what they
# check is that runs agree with each other (processes, placements, resumed runs), with a closed
# form within a tolerance, or that a code path runs, not the speed of the compiled code. Every run
# a test compares is compiled with the same flags.
# - XLA:CPU's backend optimisation level 0: compiles in about two thirds of the CPU time.
# - XLA:CPU's fusions emitted by its classic LLVM IR emitter instead of its newer MLIR fusion
#   emitters: FedProj's two-round program (tests/algorithms/distillation/test_fedproj.py's setup)
#   compiled in 3.7 s CPU instead of 8.0 s under vmap_scan and 4.8 s instead of 10.6 s under
#   sequential, on top of level 0, and ran 20 rounds in the same time (docs/performance.md,
#   "Compilation cache").
FAST_COMPILE = "--xla_backend_optimization_level=0 --xla_cpu_use_fusion_emitters=false"


def cpu_env(xla_flags: str = "") -> dict:
  """The environment of a one-CPU-device process (unless ``xla_flags`` ask for more) that can
  import the repository, compiling with :data:`FAST_COMPILE`."""
  env = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": str(ROOT)}
  env["XLA_FLAGS"] = f"{xla_flags} {FAST_COMPILE}".strip()  # the parent's flags are not kept
  return env


def run_processes(argvs: list[list[str]], timeout: float = 300) -> list[tuple[str, str]]:
  """Starts one process per argv at once, waits for all, and returns their (stdout, stderr).

  Fails (with the output) if any process exits non-zero; kills the others if one hangs, since
  the processes of a jax.distributed job wait for each other.
  """
  procs = [
    subprocess.Popen(
      argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=cpu_env(), cwd=ROOT
    )
    for argv in argvs
  ]
  outputs = []
  try:
    for pid, proc in enumerate(procs):
      out, err = proc.communicate(timeout=timeout)
      assert proc.returncode == 0, f"process {pid}:\n{out[-2000:]}\n{err[-4000:]}"
      outputs.append((out, err))
  finally:
    for proc in procs:
      if proc.poll() is None:
        proc.kill()
        proc.communicate()
  return outputs
