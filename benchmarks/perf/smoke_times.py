"""Wall time of ``experiments/cifar10.py --preset=smoke`` for every method, on real data.

    python -m benchmarks.perf.smoke_times            # all methods, table + results/smoke_times.json
    python -m benchmarks.perf.smoke_times --methods=fedavg,fedproj

Each method runs as its own process, exactly as a user types it (interpreter start, imports, data
loading, compilation and the two smoke rounds all count), with CIFAR-10 from ``../shared/data``
(``--data_dir``) and, for the distillation methods, the CIFAR-100 public subset
(``public_20k.npz``; the smoke preset uses 1000 of its examples). The README promises under a
minute on 2 CPU cores; this script is how that claim is measured. Report the machine's
load (``uptime``) with the numbers: the timings scale with it.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks import flag_checks
from benchmarks.results_io import REPO_ROOT, RESULTS_DIR, write_results
from fedjax_proj.algorithms import registry
from fedjax_proj.data.sources import find_shared_data

REPO = REPO_ROOT
RESULTS = RESULTS_DIR

BUDGET_SECONDS = 60.0


def _load() -> str:
  return " ".join(f"{x:.2f}" for x in os.getloadavg())


def time_method(method: str, data_dir: Path, public: Path, timeout: float) -> dict:
  """Runs the smoke preset of ``method`` in a fresh process; returns its wall time and status."""
  with tempfile.TemporaryDirectory() as tmp:
    cmd = [
      sys.executable,
      str(REPO / "experiments" / "cifar10.py"),
      "--preset=smoke",
      f"--method={method}",
      f"--data_dir={data_dir}",
      f"--output_dir={tmp}/run",
      "--progress=false",
    ]
    if registry.needs_public(method):
      cmd.append(f"--public_data={public}")
    env = {**os.environ, "PYTHONPATH": str(REPO), "JAX_PLATFORMS": "cpu"}
    load_before = _load()
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    try:
      proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
      rc, tail = proc.returncode, proc.stderr.strip().splitlines()[-1:] or [""]
    except subprocess.TimeoutExpired:
      rc, tail = "timeout", [f"over {timeout:.0f} s"]
    seconds = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    # CPU seconds barely depend on how many other jobs share the cores; wall time does.
    cpu = (after.ru_utime - usage.ru_utime) + (after.ru_stime - usage.ru_stime)
    summary = Path(tmp) / "run" / "summary.json"
    accuracy = json.loads(summary.read_text())["final_test_accuracy"] if summary.exists() else None
  return {
    "method": method,
    "seconds": round(seconds, 1),
    "cpu_seconds": round(cpu, 1),
    "rc": rc,
    "final_test_accuracy": accuracy,
    "load_before": load_before,
    "error": tail[0] if rc != 0 else "",
  }


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
  p.add_argument("--methods", default="", help="comma-separated methods (default: all)")
  p.add_argument("--timeout", type=float, default=600, help="seconds per method (default: 600)")
  p.add_argument(
    "--out", default=str(RESULTS / "smoke_times.json"), help="JSON file (default: %(default)s)"
  )
  args = p.parse_args(argv)

  # cifar10.py's methods: the sequential ones run through experiments/sequential.py instead.
  cifar10_methods = list(registry.methods(("fl",)))
  methods = cifar10_methods  # the default, empty; a list given names each method once
  if args.methods:
    methods = flag_checks.names(p, "--methods", args.methods, cifar10_methods)
  if args.timeout <= 0:
    p.error(f"--timeout must be > 0 seconds, got {args.timeout}")
  shared = find_shared_data()
  if shared is None:
    print("skipped: ../shared/data not found (set FEDJAX_PROJ_SHARED_DATA)")
    return 0
  rows = []
  print(f"{'method':<12} {'wall s':>8} {'cpu s':>7} {'<60 s':>6} {'acc':>6}  load(1/5/15) before")
  for method in methods:
    row = time_method(
      method, shared / "cifar10", shared / "cifar100" / "public_20k.npz", args.timeout
    )
    rows.append(row)
    ok = "yes" if row["rc"] == 0 and row["seconds"] < BUDGET_SECONDS else "NO"
    acc = f"{row['final_test_accuracy']:.3f}" if row["final_test_accuracy"] is not None else "-"
    print(
      f"{method:<12} {row['seconds']:>8.1f} {row['cpu_seconds']:>7.1f} {ok:>6} {acc:>6}  "
      f"{row['load_before']}",
      flush=True,
    )
    if row["rc"] != 0:
      print(f"  failed (rc={row['rc']}): {row['error']}")
  result = {
    "command": "python -m benchmarks.perf.smoke_times " + " ".join(argv or sys.argv[1:]),
    "cpu_count": os.cpu_count(),
    "load_after": _load(),
    "budget_seconds": BUDGET_SECONDS,
    "runs": rows,
  }
  Path(args.out).parent.mkdir(parents=True, exist_ok=True)
  write_results(args.out, result)
  print(f"wrote {args.out}; load after: {result['load_after']}")
  return 0 if all(r["rc"] == 0 for r in rows) else 1


if __name__ == "__main__":
  sys.exit(main())
