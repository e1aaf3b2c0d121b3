"""``--jobs N``: a claim's queue in N worker processes, each pinned to its own share of the cores.

Pinned workers run N runs at once without competing for a core (docs/reproduction.md, "Results":
how well one unpinned process would use N cores instead was not measured).
Each worker is the same command on the same plan, in the same order (seed by seed); the run lock
(``run.run_one``) makes a worker leave a run that another holds or has finished, so every run
runs once (a run that fails in one worker is not retried by another: the workers share the
parent's attempt name, ``run.run_one``) and an interrupted queue still completes seed by seed.
The parent relays the workers'
lines (prefixed ``[job k]``), counts the finished runs against the queue's recorded-time estimate,
forwards SIGINT/SIGTERM once to every worker (each finishes its round, as a single runner does),
and afterwards reports like a single runner: failures, stop requests, then the report.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path

from fedjax_proj.reproduce.options import RunOptions


def usable_cores() -> list[int] | None:
  """The cores this process may run on (None where the OS does not say: no pinning)."""
  if not hasattr(os, "sched_getaffinity"):
    return None
  return sorted(os.sched_getaffinity(0))


def check_jobs(jobs: int) -> None:
  """Refuses a job count below 1 or above the usable cores, naming the fix."""
  if jobs < 1:
    raise ValueError(f"--jobs must be >= 1, got {jobs}.")
  cores = usable_cores()
  if cores is not None and jobs > len(cores):
    raise ValueError(
      f"--jobs={jobs} but this process may use {len(cores)} core(s) ({cores}); each job needs "
      f"one: use --jobs={len(cores)} or fewer."
    )


def core_shares(jobs: int) -> list[list[int] | None]:
  """Disjoint, contiguous shares of the usable cores, one per job (None: no pinning)."""
  cores = usable_cores()
  if cores is None:
    return [None] * jobs
  size, extra = divmod(len(cores), jobs)
  shares, start = [], 0
  for k in range(jobs):
    end = start + size + (k < extra)
    shares.append(cores[start:end])
    start = end
  return shares


def worker_argv(
  options: RunOptions, claim_name: str, budget: str, root: Path, results: Path, attempt: str
) -> list[str]:
  """The command of one worker: the parent's claim, budget, seeds, methods and protocol, without
  ``--jobs``/``--report``/``--update_docs`` (the parent reports once, at the end), and the
  parent's ``attempt`` name (a run that fails in one worker is not retried by another)."""
  argv = [
    sys.executable,
    "-m",
    "fedjax_proj.reproduce",
    claim_name,
    f"--budget={budget}",
    f"--seeds={','.join(map(str, options.seeds))}",
    f"--protocol={options.protocol}",
    f"--methods={','.join(options.methods)}",
    f"--results={results}",
    f"--data={root}",
    "--job_worker",
    f"--job_attempt={attempt}",
  ]
  if options.compilation_cache is not None:  # else each worker resolves its own default
    argv.append(f"--compilation_cache={options.compilation_cache}")
  return (
    argv
    + (["--rerun_stale"] if options.rerun_stale else [])
    + (["--debug"] if options.debug else [])
  )


def _preexec(share: list[int] | None):
  def setup():
    if share is not None:
      os.sched_setaffinity(0, share)
    try:  # Linux: the worker gets SIGTERM if the parent dies, so no queue outlives its runner.
      import ctypes

      ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
      pass

  return setup


def run_workers(
  argv: list[str], jobs: int, on_line: Callable[[int, str], None], cwd: Path | None = None
) -> list[int]:
  """Starts ``jobs`` copies of ``argv`` (each pinned to its share of the cores, in its own
  session so a terminal's Ctrl-C reaches only this process, which forwards it once), calls
  ``on_line(k, line)`` for every output line of worker k, and returns their exit codes."""
  env = dict(os.environ)
  # Several processes on one accelerator share its memory instead of each reserving 75% of it.
  env.setdefault("XLA_PYTHON_CLIENT_MEM_FRACTION", f"{0.9 / jobs:.2f}")
  env["PYTHONUNBUFFERED"] = "1"
  procs = [
    subprocess.Popen(
      argv,
      cwd=cwd,
      env=env,
      stdout=subprocess.PIPE,
      stderr=subprocess.STDOUT,
      text=True,
      bufsize=1,
      start_new_session=True,
      preexec_fn=_preexec(share),
    )
    for share in core_shares(jobs)
  ]

  def forward(signum, frame):
    del frame
    for p in procs:
      if p.poll() is None:
        p.send_signal(signum)

  installed = {}
  if threading.current_thread() is threading.main_thread():
    for s in (signal.SIGINT, signal.SIGTERM):
      installed[s] = signal.signal(s, forward)

  def relay(k: int, p: subprocess.Popen):
    for line in p.stdout:
      on_line(k, line.rstrip("\n"))

  threads = [threading.Thread(target=relay, args=(k, p), daemon=True) for k, p in enumerate(procs)]
  try:
    for t in threads:
      t.start()
    codes = [p.wait() for p in procs]
    for t in threads:
      t.join()
  finally:
    for s, handler in installed.items():
      signal.signal(s, handler)
  return codes
