"""Runs an entry point in this process and prints what compiling cost it, at exit.

    python -m benchmarks.perf.compile_seconds experiments/cifar10.py --method=fedproj \
        --preset=smoke ...

The line ``PROBE ...`` on stderr gives the CPU and wall seconds spent in JAX's compile-or-load
step (``jax._src.compiler.compile_or_get_cached``, wrapped here: it compiles a program or loads it
from the persistent compilation cache), the number of programs it handled, how many came from the
cache, and the process's CPU and wall seconds with the load average. CPU seconds are the number
to compare on a shared machine, where the load inflates wall time (docs/performance.md,
"Compilation cache").
"""

from __future__ import annotations

import argparse
import atexit
import os
import resource
import runpy
import sys
import time

_START = time.perf_counter()  # reset once JAX has loaded (main): the entry point's wall time
_TOTAL = {"cpu": 0.0, "wall": 0.0, "programs": 0, "hits": 0}


def _cpu() -> float:
  r = resource.getrusage(resource.RUSAGE_SELF)
  return r.ru_utime + r.ru_stime


def _timed(fn):
  def wrapper(*args, **kwargs):
    cpu, wall = _cpu(), time.perf_counter()
    try:
      return fn(*args, **kwargs)
    finally:
      _TOTAL["cpu"] += _cpu() - cpu
      _TOTAL["wall"] += time.perf_counter() - wall
      _TOTAL["programs"] += 1

  return wrapper


def _on_event(event: str, **kwargs) -> None:
  if event == "/jax/compilation_cache/cache_hits":
    _TOTAL["hits"] += 1


def _report() -> None:
  print(
    f"PROBE compile_or_load_cpu_s={_TOTAL['cpu']:.1f} "
    f"compile_or_load_wall_s={_TOTAL['wall']:.1f} programs={_TOTAL['programs']} "
    f"cache_hits={_TOTAL['hits']} process_cpu_s={_cpu():.1f} "
    f"process_wall_s={time.perf_counter() - _START:.1f} load={os.getloadavg()[0]:.1f}",
    file=sys.stderr,
  )


def main(argv=None) -> None:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("script", help="the entry point to run, e.g. experiments/cifar10.py")
  p.add_argument("script_args", nargs=argparse.REMAINDER, help="its flags, passed on unchanged")
  argv = sys.argv[1:] if argv is None else argv
  if not argv:  # argparse would also ask for script_args, which may be empty
    p.error("name the entry point to run, e.g. experiments/cifar10.py --preset=smoke")
  args = p.parse_args(argv)
  # Before JAX loads: a mistyped path would otherwise be runpy's traceback after the import.
  if not os.path.isfile(args.script):
    p.error(f"{args.script} is not a file; name the entry point, e.g. experiments/cifar10.py")
  global _START
  import jax.monitoring
  from jax._src import compiler  # the function the compile path calls through this module

  _START = time.perf_counter()
  compiler.compile_or_get_cached = _timed(compiler.compile_or_get_cached)
  jax.monitoring.register_event_listener(_on_event)
  atexit.register(_report)
  sys.argv = [args.script, *args.script_args]
  # The entry points import only the package (experiments/*.py import no sibling file), so
  # the script's own folder need not be importable as ``python script.py`` would make it.
  runpy.run_path(args.script, run_name="__main__")


if __name__ == "__main__":
  main()
