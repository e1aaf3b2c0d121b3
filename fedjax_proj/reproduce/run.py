"""One (method, seed) run of a claim through the existing entry points, saved as one JSON file.

Every kind of claim runs in this process, as its entry point's own ``main`` would run it, from the
config :mod:`.resolve` gives (the entry point's presets plus the claim's budget overrides). Its
fingerprint decides whether a result on disk is ``done`` (same fingerprint: skipped), ``stale``
(another config: kept, rerun only with ``rerun_stale``) or ``missing`` (:mod:`.records`). Result
files: ``<results>/<claim>/<budget>/<method>-seed<k>.json`` (docs/reproduction.md, "Results"). A
run that stops before its result (a signal, a crash, a killed process) continues from its newest
checkpoint on the next attempt when its config and code are unchanged (:func:`.records.resumable`).

The modules behind a run: :mod:`.resolve` (what it computes), :mod:`.records` (its files),
:mod:`.availability` (data this machine may lack), :mod:`.runners` (each kind of claim's runner)
and :mod:`.provenance` (what a result records of its code and machine); each name is imported
from the module that defines it.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import time
from pathlib import Path

from fedjax_proj.reproduce.claims.common import Claim
from fedjax_proj.reproduce.provenance import (
  REPO_ROOT,
  arithmetic_deviations,
  code_fingerprint,
  data_deviations,
  git_commit,
  in_checkout,
  machine_info,
)
from fedjax_proj.reproduce.records import (
  RunState,
  check_result,
  failed_in,
  result_path,
  resumable,
  status,
  write_resume_record,
)
from fedjax_proj.reproduce.resolve import fingerprint, resolve_config, substitute_data
from fedjax_proj.reproduce.runners import RUNNERS, Diverged, read_curve

# Where results go without --results (docs/reproduction.md, "Results"; argued in docs/design.md,
# "The package and the checkout"): a checkout's committed results folder, which its code made and
# its docs cite, wherever the command runs from; for an installed package, ./fedjax_proj_results
# in the working directory (site-packages is no place for results: shared, maybe read-only, and
# replaced on upgrade).
CHECKOUT_RESULTS = REPO_ROOT / "results" / "reproduce"
INSTALLED_RESULTS = Path("fedjax_proj_results")
DEFAULT_RESULTS = CHECKOUT_RESULTS if in_checkout() else INSTALLED_RESULTS


class RunLocked(RuntimeError):
  """Another process holds the lock of this (claim, budget, method, seed)."""


def run_one(
  claim: Claim,
  budget: str,
  method: str,
  seed: int,
  *,
  results: Path,
  data_root: Path,
  config: dict | None = None,
  deviations: list[str] | None = None,
  log=print,
  on_start=None,
  attempt: str | None = None,
) -> dict:
  """Runs one (method, seed) and writes its result JSON; returns the result.

  The run first takes ``<method>-seed<k>.lock`` (a second process on the same run gets
  :class:`RunLocked` and touches nothing), then re-checks the result (finished by another process
  meanwhile: :class:`RunLocked` too), and only then prepares its work folder
  (``<method>-seed<k>.work``): an earlier attempt's checkpoints are continued when that attempt ran
  the same config and code (:func:`resumable`; the result then records ``resumed_from_round`` and
  ``wall_seconds`` counts every attempt), anything else there is cleared. The result is checked
  (:func:`check_result`) before it is written, atomically, so a file on disk is a whole valid
  result; a corrupt file in its place is kept as ``<name>.corrupt``.

  ``attempt`` names the command this run belongs to, shared by its ``--jobs`` workers: a run that
  failed (raised, other than a stop request) leaves ``<method>-seed<k>.failed`` with it, and
  another worker of the same command leaves that run alone (:class:`RunLocked`), so a failing run
  is tried once per command and listed once; a later command retries it.

  The phases: :func:`_lock_run`, :func:`_claim_run` and :func:`_prepare_work` (lock, re-check,
  resume), :func:`_execute` (the entry point's run), :func:`_result_record` and
  :func:`_write_result` (record, write).
  """
  config = config or resolve_config(claim, budget, method, seed, data_root)
  path = result_path(results, claim.name, budget, method, seed)
  lock = _lock_run(path)
  try:
    fp = fingerprint(config)
    failed = _claim_run(path, fp, attempt, lock)
    if on_start is not None:  # the run is this process's now (the runner announces it)
      on_start()
    work = path.with_suffix(".work")
    code = code_fingerprint()  # of the source files as the run starts
    earlier = _prepare_work(work, claim, fp, code, log)
    start = time.time()
    metrics, curve, diverged = _execute(
      claim, config, data_root, work, earlier, start, failed, attempt, log
    )
    result = _result_record(
      claim, budget, method, seed, config, data_root, deviations, code, earlier, start,
      metrics, curve, diverged,
    )  # fmt: skip
    _write_result(path, result, work, failed, lock)
    return result
  finally:
    lock.release()


def _lock_run(path: Path):
  """Takes the run's lock ``<method>-seed<k>.lock`` without waiting; returns the held
  ``filelock.FileLock``. Raises :class:`RunLocked` where another process holds it."""
  from filelock import FileLock, Timeout

  path.parent.mkdir(parents=True, exist_ok=True)
  lock = FileLock(str(path.with_suffix(".lock")))
  try:
    lock.acquire(timeout=0)
  except Timeout:
    raise RunLocked(
      f"{path.name} is being run by another process (lock {path.with_suffix('.lock')}); left to it"
    ) from None
  return lock


def _claim_run(path: Path, fp: str, attempt: str | None, lock) -> Path:
  """Under ``lock``, checks that the run is still due: not finished by another process meanwhile,
  not failed in another job of the same ``attempt`` (either: :class:`RunLocked`); keeps a corrupt
  result aside as ``<name>.json.corrupt``. Returns the run's ``.failed`` marker path."""
  state = status(path, fp)
  if state == RunState.DONE:  # another process finished it while this one waited in its queue
    # The finisher removed its lock file; taking the lock made a new one. Removed while held, as
    # _write_result does, so a finished run leaves no empty .lock whoever checked it last.
    Path(lock.lock_file).unlink(missing_ok=True)
    raise RunLocked(f"{path.name} was finished by another process meanwhile")
  failed = path.with_suffix(".failed")
  if attempt is not None and failed_in(failed, attempt):
    raise RunLocked(f"{path.name} failed in another job of this command; a rerun retries it")
  if state == RunState.CORRUPT:
    path.replace(path.with_suffix(".json.corrupt"))
  return failed


def _prepare_work(work: Path, claim: Claim, fp: str, code: str, log) -> dict:
  """The work folder of a run about to start: a stopped attempt's checkpoints continued where
  :func:`resumable` allows (logged), else the folder cleared and a fresh resume record written.
  Returns the attempt record (``fingerprint``, ``code``, ``seconds`` and ``sessions`` so far, and
  ``round`` when continuing)."""
  earlier, why_not = resumable(work, claim, fp, code)
  if earlier is None:
    if why_not:
      log(f"{work.stem}: a stopped attempt is not continued, {why_not}; starting afresh")
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True, exist_ok=True)
    earlier = {"fingerprint": fp, "code": code, "seconds": 0.0, "sessions": 0}
    write_resume_record(work, earlier, None)  # a killed attempt (no handler ran) resumes too
  else:
    log(
      f"resuming {work.stem} from its checkpoint after round {earlier['round']} in {work} "
      f"(same config and code; {earlier['seconds']:.0f} s spent in {earlier['sessions']} "
      "earlier session(s))"
    )
  return earlier


def _execute(
  claim: Claim,
  config: dict,
  data_root: Path,
  work: Path,
  earlier: dict,
  start: float,
  failed: Path,
  attempt: str | None,
  log,
) -> tuple[dict, list[dict], dict | None]:
  """Runs the claim's entry point (:data:`RUNNERS`) in ``work``; returns (metrics, curve,
  diverged), ``diverged`` None unless the run diverged (then no metrics and the curve it logged).

  A run that stops (a signal, a crash) keeps its checkpoints and the time spent for the next
  attempt; a stop request is re-raised naming the command that continues it, and a failure under
  ``attempt`` leaves the ``failed`` marker."""
  from fedjax_proj.training.signals import TrainingInterrupted

  runner_config = substitute_data(config, data_root)
  if earlier.get("round"):
    runner_config["resume"] = True  # a RUN_FIELD: the same computation, continued
  try:
    metrics, curve = RUNNERS[claim.kind](claim, runner_config, work, log)
  except Diverged as e:
    # Recorded, never retried (docs/reproduction.md, "Results"). The curve up to the last finite
    # round is what the run logged before it stopped.
    logged = work / "metrics.jsonl"
    curve = read_curve(logged) if logged.is_file() else []
    return {}, curve, {"error": str(e), "last_finite_round": curve[-1]["round"] if curve else 0}
  except BaseException as e:
    # Stopped (a signal, a crash): what the checkpoints hold is kept for the next attempt,
    # with the time spent, so the result's wall_seconds counts every session.
    write_resume_record(work, earlier, time.time() - start)
    if isinstance(e, TrainingInterrupted):
      # A stop request: the round loop saved a checkpoint after its round. The loop's message
      # names an entry point's --resume flag; here the same command continues it.
      after = f" after round {e.round}" if e.round else ""
      raise TrainingInterrupted(
        f"{signal.Signals(e.signum).name} received: {work.stem} stopped{after}; run the same "
        "command again to continue it from its newest checkpoint",
        e.round,
        e.signum,
        e.saved,
      ) from e
    if attempt is not None and isinstance(e, Exception):
      with contextlib.suppress(OSError):  # written under the run lock: no other job starts it
        failed.write_text(json.dumps({"attempt": attempt, "error": f"{type(e).__name__}: {e}"}))
    raise
  return metrics, curve, None


def _result_record(
  claim: Claim,
  budget: str,
  method: str,
  seed: int,
  config: dict,
  data_root: Path,
  deviations: list[str] | None,
  code: str,
  earlier: dict,
  start: float,
  metrics: dict,
  curve: list[dict],
  diverged: dict | None,
) -> dict:
  """The result of a finished (or diverged) run: its metrics, curve, config, deviations, code,
  machine and time over every session; checked by :func:`check_result` (a RuntimeError names
  what is invalid)."""
  # What a runner returns beyond the claim's metrics (e.g. the continual accuracy matrix).
  detail = {k: metrics.pop(k) for k in list(metrics) if k not in claim.metrics}
  commit = git_commit()
  machine = machine_info()
  deviations = list(  # the planned ones (the runner's queue) already hold the data's
    dict.fromkeys(
      [*(deviations or []), *data_deviations(config, data_root), *arithmetic_deviations(machine)]
    )
  )
  result = {
    "claim": claim.name,
    "budget": budget,
    "method": method,
    "seed": seed,
    "metrics": metrics,
    "curve": curve,
    "detail": detail,
    "wall_seconds": earlier["seconds"] + time.time() - start,  # every session of the run
    "fingerprint": fingerprint(config, deviations),
    "config": config,
    "deviations": deviations,
    "git_commit": commit,
    "code": {"git_commit": commit, "fingerprint": code},
    "load_average": list(os.getloadavg()),
    "machine": machine,
    **({"diverged": diverged} if diverged else {}),
    **({"resumed_from_round": earlier["round"]} if earlier.get("round") else {}),
    "finished": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
  }
  problem = check_result(result)
  if problem:
    raise RuntimeError(f"{claim.name} {budget} {method} seed {seed}: invalid result ({problem})")
  return result


def _write_result(path: Path, result: dict, work: Path, failed: Path, lock) -> None:
  """Writes ``result`` to ``path`` atomically, then clears the run's work folder, its ``.failed``
  marker and its lock file (the lock itself is released by the caller)."""
  tmp = path.with_suffix(".json.tmp")
  tmp.write_text(json.dumps(result, indent=1, default=str) + "\n")
  tmp.replace(path)
  shutil.rmtree(work, ignore_errors=True)
  failed.unlink(missing_ok=True)
  # Removed while still held: a process that opened it before finds the result done once it
  # gets the lock, and a later one makes a new file. A finished run leaves no empty .lock.
  Path(lock.lock_file).unlink(missing_ok=True)
