"""Stress the oneDNN handlers (``conv_impl="onednn"``: forward, input and kernel gradient) from
several threads.

Why: the handler ended processes in segmentation faults (docs/performance.md, "The CPU
convolution kernel gradient"). Its cached oneDNN primitives had library-managed scratchpads,
which oneDNN keeps per thread: a primitive may only run on the thread that created it, while XLA
calls the handler from whichever thread runs the program (the caller's, or one of PJRT's). This
script creates some shapes' primitives on the main thread and the others on worker threads, then
runs every shape from several threads at once, and checks each result (the convolution and both
gradients, ``conv_impl="onednn"``'s vjp) against XLA's convolution with ``gemm_grad``'s kernel
gradient (before 2026-11-28 the kernel gradient alone, ``onednn_grad``'s).
The shapes include convolutions for which oneDNN picks its GEMM-based backward weights (the
ResNet-18 layers on 1x1 and 2x2 inputs), whose scratchpad holds the im2col matrix: a call on a
thread without it wrote through a null pointer.

One stress run (``--threads``, ``--rounds``) prints ``ok: <calls> calls ...`` and exits 0, or
exits 1 naming the first wrong result; a memory fault ends the process with a signal.
``--fresh_cache`` first builds the handler into a new cache folder (the build and its first use in
one process, as in the first run after the handler's source changes). ``--repeat=N`` runs N such
processes, each with a fresh cache, and writes their exit statuses to
``results/onednn_stress.json``.

Usage: ``python -m benchmarks.perf.onednn_stress [--threads 4] [--rounds 5] [--fresh_cache]
[--repeat N]``.
"""

from __future__ import annotations

import argparse
import atexit
import functools
import os
import random
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

from benchmarks import flag_checks
from benchmarks.results_io import REPO_ROOT, write_results

# (input NHWC, kernel HWIO, strides, padding): the GEMM-based ones first (scratchpad: im2col).
SHAPES = [
  ((3, 1, 1, 256), (3, 3, 256, 256), (1, 1), ((1, 1), (1, 1))),
  ((3, 2, 2, 128), (3, 3, 128, 256), (2, 2), ((1, 1), (1, 1))),
  ((2, 9, 8, 3), (3, 3, 3, 5), (1, 1), ((1, 1), (1, 1))),
  ((2, 9, 8, 3), (4, 4, 3, 5), (2, 2), ((1, 2), (1, 2))),
  ((3, 28, 28, 1), (5, 5, 1, 6), (1, 1), ((0, 0), (0, 0))),
  ((3, 14, 14, 32), (5, 5, 32, 64), (1, 1), ((2, 2), (2, 2))),
  ((3, 16, 16, 16), (1, 1, 16, 32), (2, 2), ((0, 0), (0, 0))),
]
CLIENTS = 2  # every shape also runs under vmap over this many clients


def _cases(shapes):
  """[(name, compiled oneDNN gradient, operands, reference)]: each shape alone and vmapped."""
  import jax
  import jax.numpy as jnp

  from fedjax_proj.models import conv as conv_lib
  from fedjax_proj.models import onednn

  if reason := onednn.unavailable_reason():
    sys.exit(f"error: {reason}")
  rng = np.random.default_rng(0)
  cases = []
  for xs, ks, strides, padding in shapes:
    conv = lambda x, k, s=strides, p=padding: conv_lib.conv2d(x, k, s, p)  # noqa: E731
    gs = jax.eval_shape(conv, jnp.zeros(xs), jnp.zeros(ks)).shape

    def vjp(impl, x, k, g, strides=strides, padding=padding):
      """(output, input gradient, kernel gradient) of the convolution with ``impl``."""
      y, back = jax.vjp(lambda x, k: conv_lib.conv2d(x, k, strides, padding, impl), x, k)
      return (y, *back(g))

    # conv_impl="onednn": all three of oneDNN's handlers (forward, backward-data, backward-weights)
    # against XLA's convolution with gemm_grad's kernel gradient.
    grad, ref = functools.partial(vjp, "onednn"), functools.partial(vjp, "gemm_grad")
    for batched in (False, True):
      lead = (CLIENTS,) if batched else ()
      x = jnp.asarray(rng.standard_normal(lead + xs), jnp.float32)
      k = jnp.asarray(rng.standard_normal(lead + ks) * 0.3, jnp.float32)
      g = jnp.asarray(rng.standard_normal(lead + gs), jnp.float32)
      f, r = (jax.vmap(grad), jax.vmap(ref)) if batched else (grad, ref)
      # Compiled here, run later: compiling never calls the handler, so no primitive exists yet.
      compiled = jax.jit(f).lower(x, k, g).compile()
      name = f"x{xs} k{ks} s{strides} p{padding}" + (f" vmap{CLIENTS}" if batched else "")
      want = tuple(np.asarray(w) for w in jax.jit(r)(x, k, g))
      cases.append((name, compiled, (x, k, g), want))
  return cases


def stress(threads: int, rounds: int, shapes=SHAPES, seed: int = 0) -> int:
  """Runs every case ``rounds`` times on each of ``threads`` threads at once; returns the calls."""
  cases = _cases(shapes)
  errors: list[str] = []

  def call(name, compiled, args, wants):
    for part, got, want in zip(("output", "dx", "dk"), compiled(*args), wants, strict=True):
      got, scale = np.asarray(got), float(np.max(np.abs(want)))
      if not np.allclose(got, want, rtol=0, atol=1e-5 * scale):
        diff = float(np.max(np.abs(got - want)))
        errors.append(f"{name} {part}: largest difference {diff:.3g} (scale {scale:.3g})")

  # Half the cases get their primitives on this thread, the rest on whichever worker runs first.
  for case in cases[::2]:
    call(*case)
  start = threading.Barrier(threads)

  def worker(i):
    order = random.Random(seed + i)
    start.wait()
    for _ in range(rounds):
      for case in order.sample(cases, len(cases)):
        call(*case)

  pool = [threading.Thread(target=worker, args=(i,)) for i in range(threads)]
  for t in pool:
    t.start()
  for t in pool:
    t.join()
  if errors:
    sys.exit(f"error: {len(errors)} wrong results, first: {errors[0]}")
  return len(cases[::2]) + threads * rounds * len(cases)


def repeat(n: int, args: list[str]) -> dict:
  """Runs ``n`` stress processes, each building the handler into a fresh cache first."""
  runs = []
  for i in range(n):
    t0 = time.time()
    cmd = [sys.executable, "-m", "benchmarks.perf.onednn_stress", "--fresh_cache", *args]
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO_ROOT)
    tail = (done.stdout + done.stderr).strip().splitlines()[-1:] or [""]
    runs.append({"returncode": done.returncode, "seconds": round(time.time() - t0, 1)})
    print(f"run {i + 1}/{n}: exit {done.returncode} in {runs[-1]['seconds']} s: {tail[0]}")
  return {
    "runs": runs,
    "crashes": sum(r["returncode"] < 0 for r in runs),
    "failures": sum(r["returncode"] != 0 for r in runs),
  }


def main(argv=None) -> dict:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--threads", type=int, default=4)
  p.add_argument("--rounds", type=int, default=5)
  p.add_argument("--shapes", type=int, default=len(SHAPES), help="the first this many of SHAPES")
  p.add_argument("--fresh_cache", action="store_true", help="build the handler into a new cache")
  p.add_argument("--repeat", type=int, default=0, help="run this many fresh-cache processes")
  p.add_argument("--out", default="results/onednn_stress.json")
  a = p.parse_args(argv)
  # Each refusal names its flag and value (benchmarks/flag_checks.py), before JAX loads.
  flag_checks.at_least(p, a, 1, "threads", "rounds", "shapes")
  flag_checks.at_least(p, a, 0, "repeat")
  if a.shapes > len(SHAPES):
    p.error(f"--shapes={a.shapes} exceeds the {len(SHAPES)} shapes; choose 1..{len(SHAPES)}")
  if a.repeat:
    child_args = [f"--threads={a.threads}", f"--rounds={a.rounds}", f"--shapes={a.shapes}"]
    result = {
      "command": " ".join(["python -m benchmarks.perf.onednn_stress", *(argv or sys.argv[1:])]),
      "threads": a.threads,
      "rounds": a.rounds,
      "shapes": SHAPES[: a.shapes],
      "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
      **repeat(a.repeat, child_args),
    }
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    write_results(a.out, result, indent=2)
    print(f"{result['crashes']} crashes, {result['failures']} failures in {a.repeat} runs: {a.out}")
    return result
  if a.fresh_cache:
    # A cache setting for this process only (the handler's loader reads it on first use).
    os.environ["XDG_CACHE_HOME"] = tempfile.mkdtemp(prefix="onednn_stress_")
    atexit.register(shutil.rmtree, os.environ["XDG_CACHE_HOME"], ignore_errors=True)
  t0 = time.time()
  calls = stress(a.threads, a.rounds, SHAPES[: a.shapes])
  print(f"ok: {calls} calls on {a.threads} threads, {time.time() - t0:.1f} s")
  return {"calls": calls}


if __name__ == "__main__":
  main()
