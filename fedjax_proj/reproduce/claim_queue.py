"""A claim's queue (``python -m fedjax_proj.reproduce``): every (method, seed) run planned with the
state of its result file (:class:`PlannedRun`), the queue's summary and ETA, and the runs, in this
process seed by seed or in ``--jobs`` pinned workers (:mod:`.jobs`). See :mod:`.__main__` and
docs/reproduction.md, "Results"."""

from __future__ import annotations

import os
import signal
import threading
import time
import traceback
from pathlib import Path
from typing import NamedTuple

from fedjax_proj.reproduce import (
  availability,
  jobs,
  protocol,
  provenance,
  records,
  resolve,
  run,
  runners,
  sweep,
)
from fedjax_proj.reproduce.claims import common as claims_common
from fedjax_proj.reproduce.claims import presets as claims_presets
from fedjax_proj.reproduce.options import RunOptions
from fedjax_proj.reproduce.report import timing as report_timing
from fedjax_proj.training import signals
from fedjax_proj.training.signals import TrainingInterrupted


class PlannedRun(NamedTuple):
  """One (method, seed) run of a claim's queue, as planned before any run starts."""

  method: str
  seed: int
  config: dict  # the config it runs here (planned_config), {data} placeholders kept
  deviations: list[str]  # its deviations from the budget on this machine
  path: Path  # its result file
  state: records.RunState  # its result file's state when planned


def planned_config(claim, budget: str, method: str, seed: int, root: Path) -> tuple[dict, list]:
  """The config a run uses on this machine and its deviations from the budget
  (availability.public_fallback: the paper's public set when TFDS cannot give it;
  provenance.data_deviations: a lossy public set in a device pack). The run adds any of arithmetic
  (run.run_one)."""
  config = sweep.config_for(claim, budget, method, seed, root)
  config, deviations = availability.public_fallback(config, root, claims_presets.PUBLIC)
  return config, deviations + provenance.data_deviations(config, root)


def current_fingerprints(
  claim: claims_common.Claim, budget: str, directory: Path, root: Path
) -> dict:
  """{stem: fingerprint of today's config} for every result file in ``directory``, so a report
  after running some methods or seeds still counts the others that are current."""
  out = {}
  for path in sorted(directory.glob("*-seed*.json")):
    method, _, seed = path.stem.rpartition("-seed")
    if method in claim.runnable and seed.isdigit():
      out[path.stem] = resolve.fingerprint(
        planned_config(claim, budget, method, int(seed), root)[0]
      )
  return out


def time_steps(claim, queue: list[PlannedRun], recorded: dict, root: Path) -> dict[str, float]:
  """{method: seconds of local steps a run} for each queued method with no recorded time, from
  one local step of its first queued run's config timed now (runners.STEP_TIMERS; the data is
  loaded and the step compiled: 10-40 s for the first method on a 2-core CPU, seconds for each
  further one). ``--no_run --time_step``."""
  timer = runners.STEP_TIMERS[claim.kind]
  timed: dict[str, float] = {}
  for p in queue:
    if recorded.get(p.method) or p.method in timed:
      continue
    print(f"timing one local step of {p.method} (seed {p.seed}'s config) ...", flush=True)
    t = timer(claim, resolve.substitute_data(p.config, root))
    timed[p.method] = t["seconds"]
    print(
      f"timed {p.method}: {t['step_seconds'] * 1e3:.1f} ms a step x {t['steps']:,} local steps "
      f"= {t['seconds']:.0f} s a run",
      flush=True,
    )
  return timed


def queue_summary(
  plan: list[PlannedRun],
  queue: list[PlannedRun],
  recorded: dict,
  rerun_stale: bool,
  n_jobs: int = 1,
  continuing: int = 0,
  timed: dict[str, float] | None = None,
  timeable: bool = True,
) -> str:
  """One line before the first run: what is done, what will run (``continuing`` of it from a
  stopped attempt's checkpoint), what is left alone, and how long the queue takes in one process
  at the mean wall time each method's results recorded (their machines' load included: the
  results' ``load_average``; a continued run counted whole)."""
  counts: dict[str, int] = {}
  for p in plan:
    counts[p.state] = counts.get(p.state, 0) + 1
  parts = [f"{counts.get(records.RunState.DONE, 0)} done", f"{len(queue)} to run"]
  if continuing:
    parts[-1] += f" ({continuing} continuing from a checkpoint)"
  parts += [
    f"{counts[s]} {s}"
    for s in (records.RunState.MISSING, records.RunState.CORRUPT)
    if counts.get(s)
  ]
  if counts.get(records.RunState.STALE):
    parts.append(
      f"{counts[records.RunState.STALE]} stale"
      + ("" if rerun_stale else " left alone (--rerun_stale reruns them)")
    )
  queued = {p.method for p in queue}
  means = ", ".join(
    f"{m} {sum(v) / len(v):.0f} s" for m, v in sorted(recorded.items()) if m in queued and v
  )
  first = min((p.seed for p in queue), default=0)
  left = report_timing.eta([p.method for p in queue], recorded, n_jobs, first, timed, timeable)
  line = f"queue: {', '.join(parts)}; {left}"
  return line + (f" (mean per run: {means})" if means and queue else "")


class RunsFailed(RuntimeError):
  """Some (method, seed) runs of a claim raised; the others ran to the end."""

  def __init__(self, failures: list[str], expected: dict):
    self.expected = expected
    super().__init__(
      f"{len(failures)} run(s) failed (no result written; rerun the command to retry them):\n  "
      + "\n  ".join(failures)
    )


class ClaimPlan(NamedTuple):
  """What a claim command runs (:func:`plan_claim`): every planned run, the queue and the
  fingerprints its report expects."""

  runs: list[PlannedRun]  # every (method, seed), seed by seed, with its result file's state
  queue: list[PlannedRun]  # the runs to run: missing, corrupt, and stale with rerun_stale
  expected: dict[str, str]  # {"<method>-seed<k>": fingerprint of the config it runs}


def plan_claim(
  claim: claims_common.Claim, budget: str, root: Path, results: Path, options: RunOptions
) -> ClaimPlan:
  """Plans ``options``' (method, seed) runs seed by seed (seed 0 of every method, then seed 1,
  ...), each with its config on this machine and its result file's state; computes nothing."""
  runs, expected = [], {}
  for seed in options.seeds:
    for method in options.methods:
      config, deviations = planned_config(claim, budget, method, seed, root)
      fp = resolve.fingerprint(config)
      expected[f"{method}-seed{seed}"] = fp
      path = records.result_path(results, claim.name, budget, method, seed)
      runs.append(PlannedRun(method, seed, config, deviations, path, records.status(path, fp)))
  rerun = (records.RunState.MISSING, records.RunState.CORRUPT)
  queue = [
    p
    for p in runs
    if p.state in rerun or (p.state == records.RunState.STALE and options.rerun_stale)
  ]
  return ClaimPlan(runs, queue, expected)


def check_options(claim: claims_common.Claim, budget: str, options: RunOptions) -> None:
  """Refuses options a claim's budget cannot run (a ValueError naming the fix): an unknown
  budget, methods or seeds; the command line refuses the same before building them."""
  if budget not in claim.budgets and not budget.startswith("sweep/"):
    raise ValueError(
      f"claim {claim.name} has no budget {budget!r}; its budgets: {', '.join(claim.budgets)}"
    )
  if not options.methods or not options.seeds:
    raise ValueError("RunOptions lists no method or no seed; list at least one of each")
  bad = [m for m in options.methods if m not in claim.runnable]
  if bad:
    raise ValueError(
      f"methods {bad} not in claim {claim.name}; choose from {', '.join(claim.runnable)}"
    )
  if len(set(options.methods)) < len(options.methods):
    raise ValueError(f"methods {list(options.methods)} list a method twice; list each once")
  if len(set(options.seeds)) < len(options.seeds) or min(options.seeds) < 0:
    raise ValueError(f"seeds {list(options.seeds)} must be distinct non-negative integers")
  if options.protocol not in ("v1", "v2"):
    raise ValueError(f"protocol must be v1 or v2, got {options.protocol!r}")
  # Seeds from V2_FIRST_SEED on are protocol v2's: a v1 command never runs them, nor v2 others.
  v2 = [s >= protocol.V2_FIRST_SEED for s in options.seeds]
  if not all(v2) if options.protocol == "v2" else any(v2):
    raise ValueError(
      f"seeds {list(options.seeds)}: protocol v2 runs the seeds from {protocol.V2_FIRST_SEED} on, "
      "v1 those below it; pick seeds of one protocol and set RunOptions.protocol to it"
    )
  if options.jobs < 1:
    raise ValueError(f"jobs must be >= 1, got {options.jobs}")


def check_plan(
  claim: claims_common.Claim, budget: str, root: Path, plan: ClaimPlan, options: RunOptions
) -> None:
  """The refusals before anything computes: every image run's config is valid, and a text
  claim's queue finds its data here (before a run, or ``time_step``'s timing, starts)."""
  if claim.kind == "image":  # every run's config is valid before the first one starts
    import ml_collections

    from fedjax_proj.training.config import validate_config

    for p in plan.runs:
      validate_config(ml_collections.ConfigDict(resolve.substitute_data(p.config, root)))
  if claim.kind == "nlp" and (not options.no_run or options.time_step):
    missing = list(
      dict.fromkeys(m for p in plan.queue for m in availability.missing_text_data(p.config, root))
    )
    if missing:
      raise FileNotFoundError(f"{claim.name} {budget}: " + "; ".join(missing) + ".")


def run_claim(
  claim: claims_common.Claim, budget: str, root: Path, results: Path, options: RunOptions
) -> dict:
  """Runs the missing (method, seed) pairs of ``options`` seed by seed; returns {stem:
  fingerprint}. The phases: :func:`check_options`, :func:`plan_claim` (the queue),
  :func:`check_plan` (refusals before compute), :func:`execute_plan` (the runs).

  A run that raises is reported and skipped, and the remaining runs go on; at the end
  :class:`RunsFailed` lists every failure (the command then exits 1).
  """
  check_options(claim, budget, options)
  plan = plan_claim(claim, budget, root, results, options)
  for note in sorted({d for p in plan.runs for d in p.deviations}):
    # Results record {data} (machine-independent); this machine's folder is what the user has.
    print(f"deviation: {note.replace('{data}', str(root))}", flush=True)
  check_plan(claim, budget, root, plan, options)
  return execute_plan(claim, budget, root, results, plan, options)


def execute_plan(
  claim: claims_common.Claim,
  budget: str,
  root: Path,
  results: Path,
  plan: ClaimPlan,
  options: RunOptions,
) -> dict:
  """Runs ``plan``'s queue (here seed by seed, or in ``options.jobs`` workers), printing each
  run's status and the queue's progress; returns ``plan.expected``. :class:`RunsFailed` at the
  end lists the runs that raised."""
  queue, expected, failed = plan.queue, plan.expected, []
  recorded = report_timing.recorded_seconds(
    records.result_path(results, claim.name, budget, "x", 0).parent,
    backend=provenance.local_backend(),
  )
  if not options.worker:  # a worker's parent prints the queue and its progress
    code = provenance.code_fingerprint()
    work = {p.path.with_suffix(".work"): expected[f"{p.method}-seed{p.seed}"] for p in queue}
    continuing = sum(records.resumable(w, claim, fp, code)[0] is not None for w, fp in work.items())
    timed = time_steps(claim, queue, recorded, root) if options.time_step else None
    timeable = claim.kind in runners.STEP_TIMERS
    summary = queue_summary(
      plan.runs, queue, recorded, options.rerun_stale, options.jobs, continuing, timed, timeable
    )
    print(summary, flush=True)
  parallel = options.jobs > 1 and not options.no_run
  ran = 0
  signals.clear_stop_request()
  for method, seed, config, deviations, path, state in plan.runs:
    tag = f"{claim.name} {budget} {method} seed {seed}"
    if state == records.RunState.DONE:
      print(f"skip {tag}: done with the same config ({path})", flush=True)
      continue
    if state == records.RunState.CORRUPT:
      _, why = records.read_result(path)
      print(f"corrupt {tag}: {path} ({why}); kept as {path.name}.corrupt and rerun", flush=True)
    if state == records.RunState.STALE and not options.rerun_stale:
      print(f"stale {tag}: {path} is from another config; rerun with --rerun_stale", flush=True)
      continue
    if options.no_run:
      print(f"{state} {tag}", flush=True)
      continue
    if parallel:  # the workers run it
      continue
    signum = signals.stop_requested()
    if signum is not None:  # caught in the previous run's last round, which then finished
      name = signal.Signals(signum).name
      print(f"stopped before {tag}: {name} arrived as the previous run ended", flush=True)
      raise TrainingInterrupted(f"{name} received; {tag} not started", 0, signum, True)
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
      result = run.run_one(
        claim,
        budget,
        method,
        seed,
        results=results,
        data_root=root,
        config=config,
        deviations=deviations,
        on_start=lambda tag=tag, state=state: print(f"run {tag} ({state})", flush=True),
        attempt=options.attempt,
      )
    except run.RunLocked as e:  # another process runs it: leave it alone, not a failure
      print(f"locked {tag}: {e}", flush=True)
      continue
    except TrainingInterrupted as e:
      # A stop request (SIGTERM from a scheduler or `kill`) stops the queue, not just this run:
      # the next run would start only to be killed too. The run saved a checkpoint after its
      # round: a rerun of the command continues it from there (run.resumable).
      print(f"stopped {tag}: {e}", flush=True)
      raise
    except Exception as e:  # noqa: BLE001 - one failed run must not cost the queued ones
      # An hours-long queue of runs goes on past a run that fails (a crash, missing data; a
      # diverging loss is an outcome, recorded as a diverged result); the failures are listed
      # at the end and make the command exit 1. No result file is written, so a rerun retries
      # exactly the failed runs.
      # Its message is the one line a user needs; the traceback, for a bug report, goes to a file
      # beside the result (and here too with --debug), not between the queue's lines.
      failed.append(f"{tag}: {type(e).__name__}: {e}")
      kept = _keep_traceback(path.with_suffix(".traceback"))
      print(f"FAILED {tag}: {type(e).__name__}: {e} ({kept})", flush=True)
      if options.debug:
        traceback.print_exc()
      continue
    path.with_suffix(".traceback").unlink(missing_ok=True)  # an earlier attempt's, now moot
    summary = ", ".join(f"{k}={v:.2f}" for k, v in result["metrics"].items())
    if result.get("diverged"):
      d = result["diverged"]
      summary = f"DIVERGED after round {d['last_finite_round']} ({d['error']}), recorded"
    print(f"done {tag}: {summary} in {result['wall_seconds']:.0f} s", flush=True)
    ran += 1
    recorded.setdefault(method, []).append(result["wall_seconds"])
    if not options.worker:
      left = [p.method for p in queue[ran:]]
      print(f"queue: {ran} of {len(queue)} run; {report_timing.eta(left, recorded)}", flush=True)
  if parallel and queue:
    failed = run_in_jobs(options, claim, budget, root, results, queue, recorded)
  if failed:
    raise RunsFailed(failed, expected)
  return expected


def _keep_traceback(where: Path) -> str:
  """Writes the exception being handled's traceback to ``where``; says where it went (or, where
  it could not be written, that --debug prints it)."""
  try:
    where.write_text(traceback.format_exc())
  except OSError as e:
    return f"its traceback could not be written to {where} ({e.strerror}); --debug prints it"
  return f"traceback in {where}; --debug prints it here"


# Worker lines the parent has printed itself (the plan's statuses) or that only say a run was
# left to another worker.
_QUIET = ("skip ", "stale ", "corrupt ", "deviation: ", "locked ")


def run_in_jobs(options, claim, budget: str, root: Path, results: Path, queue, recorded) -> list:
  """Runs ``queue`` in ``options.jobs`` pinned worker processes (:mod:`.jobs`), relaying their
  lines and the queue's progress; returns the failures (the workers' FAILED lines). A worker
  stopped by a signal stops the parent as a single runner's stop request does."""
  left = {f"{claim.name} {budget} {p.method} seed {p.seed}": (p.method, p.path) for p in queue}
  failed, lock = [], threading.Lock()

  def on_line(k: int, line: str) -> None:
    with lock:
      if line.startswith(_QUIET):
        return
      print(f"[job {k}] {line}", flush=True)
      if line.startswith("FAILED "):
        failed.append(line[len("FAILED ") :])
      if line.startswith("done "):
        method, path = left.pop(line[len("done ") :].split(":", 1)[0], (None, None))
        result = records.read_result(path)[0] if path is not None else None
        if result is not None:  # its time sharpens the estimate, as in one process
          recorded.setdefault(method, []).append(float(result["wall_seconds"]))
        done = len(queue) - len(left)
        eta = report_timing.eta([m for m, _ in left.values()], recorded, options.jobs)
        print(f"queue: {done} of {len(queue)} run; {eta}", flush=True)

  attempt = f"{os.getpid()}-{time.time_ns()}"  # one name per command: a failing run runs once
  argv = jobs.worker_argv(options, claim.name, budget, root, results, attempt)
  print(f"starting {options.jobs} jobs, cores {jobs.core_shares(options.jobs)}", flush=True)
  # In this process's working directory: relative --results/--data mean the same, and the
  # workers import fedjax_proj as this process did (installed, $PYTHONPATH or the directory).
  codes = jobs.run_workers(argv, options.jobs, on_line)
  # A worker stopped by a signal exits 128+n (a run's stop request) or -n (killed by it).
  stopped = [-c if c < 0 else c - 128 for c in codes if c < 0 or c > 128]
  if stopped:
    raise TrainingInterrupted(
      f"{len(stopped)} of {len(codes)} job(s) stopped by a signal", 0, stopped[0], False
    )
  odd = [f"job {k} exited with {c}" for k, c in enumerate(codes) if c not in (0, 1)]
  if any(c == 1 for c in codes) and not failed:
    odd.append("a job exited with 1 (its lines above say why)")
  return failed + odd
