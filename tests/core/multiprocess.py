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


def cpu_env() -> dict:
  """The environment of a one-CPU-device process that can import the repository."""
  env = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": str(ROOT)}
  env.pop("XLA_FLAGS", None)  # One CPU device per process.
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
