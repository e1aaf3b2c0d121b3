"""The round loop: one resumable loop with hooks, which every kind of run drives.

A run is a number of rounds, a ``step`` that runs round r, and the driver's :class:`Hooks` around
it (docs/design.md, "The round loop"). The loop owns what keeps a run safe, the same for every
driver:

* **Checkpoints** (:class:`~fedjax_proj.training.checkpoint.Checkpointer`): the state plus the
  loop's *carry* (host-side values: the last evaluation, a continual run's accuracy matrix, the
  wall time) every ``checkpoint_every`` rounds, at the driver's boundaries (a task's end), after
  the last round and when SIGINT/SIGTERM arrives (the running round finishes first; a second
  signal aborts at once). ``resume=True`` continues from the newest valid checkpoint and rewrites
  ``metrics.jsonl`` after it (a torn last line included), so the file equals an uninterrupted
  run's except for the wall-clock fields
  (:data:`~fedjax_proj.training.checkpoint.WALL_CLOCK_FIELDS`).
  Every round is a pure function of (seed, round), so nothing else is needed to continue exactly.
* **Non-finite stop**: a non-finite loss or non-finite global parameters stop the run
  (:class:`NonFiniteError`) without saving, so the last checkpoint on disk is the last good one.
* **Metrics** (``metrics.jsonl``, optionally TensorBoard) and **progress** (a bar with ETA on a
  terminal, one plain line per round into a log).

Drivers: :func:`train` (one round algorithm: parallel FL and the sequential chain) and
:func:`fedjax_proj.training.continual.train_continual` (a task schedule plus the end-of-task hook).

Several processes (``jax.distributed``; the round function then returns global arrays): every
process runs this loop identically and computes the same values; only process 0 writes
``metrics.jsonl``, ``summary.json``, ``final_variables.npz``, TensorBoard events and progress
output. Checkpoints are written collectively
(:class:`~fedjax_proj.training.checkpoint.Checkpointer`), and a signal stops every process after
the same round (the processes agree on it each round).
"""

from __future__ import annotations

import json
import math
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import jax
import numpy as np
from tqdm.auto import tqdm

from fedjax_proj.algorithms.families import RoundAlgorithm
from fedjax_proj.core import distributed
from fedjax_proj.core import random as random_lib
from fedjax_proj.core.tree import tree_all_finite
from fedjax_proj.data.federated import FederatedData
from fedjax_proj.training.checkpoint import (
  Checkpointer,
  CheckpointError,
  config_fingerprint,
  save_variables,
  truncate_metrics,
)
from fedjax_proj.training.metrics import MetricsWriter, to_python, write_json

FINAL_VARIABLES = "final_variables.npz"


class NonFiniteError(FloatingPointError):
  """Raised when a round produces a non-finite loss or non-finite global parameters."""


class TrainingInterrupted(Exception):
  """SIGINT/SIGTERM stopped the run after round ``round`` (saved when a checkpointer was given)."""

  def __init__(self, message: str, round_idx: int, signum: int, saved: bool):
    super().__init__(message)
    self.round = round_idx
    self.signum = signum
    self.saved = saved


class AbortedBySignal(KeyboardInterrupt):
  """A second SIGINT/SIGTERM during the rounds: the run stops at once, without saving.

  A KeyboardInterrupt that is not this one arrived outside the rounds (e.g. during start-up).
  """


class _StopOnSignal:
  """Turns the first SIGINT/SIGTERM into a flag checked between rounds; a second one aborts.

  Python runs a signal handler between bytecodes, so signals that arrive while the main thread is
  inside one compiled computation reach it once: a quick double Ctrl-C then counts as one (the
  round finishes and is saved) and a later one aborts.
  """

  SIGNALS = (signal.SIGINT, signal.SIGTERM)

  def __init__(self, enabled: bool, announce: bool = True):
    # Handlers can only be installed from the main thread (e.g. not inside a notebook worker).
    self.enabled = enabled and threading.current_thread() is threading.main_thread()
    self.announce = announce
    self.signum: int | None = None
    self._old: dict = {}
    # Set by the loop at the start of each round, for the message printed on the first signal.
    self.round = 0
    self.where = ""  # where round ``round`` stands in the run (a continual run's task)
    self.round_started = time.perf_counter()
    self.round_seconds: float | None = None  # the last completed round's duration

  def message(self) -> str:
    """What the first signal prints at once: which round the run stops after, and when."""
    if self.round_seconds is None:
      when = "time unknown: the first round includes compilation"
    else:
      left = max(0.0, self.round_seconds - (time.perf_counter() - self.round_started))
      when = f"about {left:.0f} s"
    return f"stopping after round {self.round}{self.where} ({when}); Ctrl-C again to abort\n"

  def _handle(self, signum, frame):
    del frame
    if self.signum is not None:
      raise AbortedBySignal(f"second signal {signum}: aborting without saving")
    self.signum = signum
    if self.announce:
      # os.write: print() is not safe inside a signal handler that interrupted another print.
      os.write(sys.stderr.fileno(), self.message().encode())

  def __enter__(self):
    if self.enabled:
      for sig in self.SIGNALS:
        self._old[sig] = signal.signal(sig, self._handle)
    return self

  def __exit__(self, *exc):
    for sig, old in self._old.items():
      signal.signal(sig, old)
    return False


def _local(tree):
  """``tree`` readable on this process: global (multi-process) arrays become host copies.

  A single process keeps its device arrays (no host round trip).
  """
  leaves = jax.tree.leaves(tree)
  if all(not isinstance(x, jax.Array) or x.is_fully_addressable for x in leaves):
    return tree
  return distributed.to_host(tree)


def _nonfinite_losses(metrics: dict) -> list[str]:
  """Names of loss metrics holding a NaN/inf (checked before NaN becomes null in the JSON)."""
  bad = []
  for key, value in metrics.items():
    if "loss" not in key or value is None:
      continue
    arr = np.asarray(value)
    if np.issubdtype(arr.dtype, np.floating) and not np.all(np.isfinite(arr)):
      bad.append(key)
  return bad


def last_good(checkpointer: Checkpointer | None) -> str:
  """Which checkpoint a stopped run keeps, for the error that stops it."""
  steps = checkpointer.steps() if checkpointer is not None else []
  if not steps:
    return "No checkpoint was saved."
  return f"The last good checkpoint (round {steps[-1]}) is kept in {checkpointer.directory}."


class RunIO(NamedTuple):
  """Where a run writes and what keeps it safe; the defaults write nothing.

  Attributes:
    output_dir: ``metrics.jsonl``, ``summary.json`` and ``final_variables.npz`` (the final global
      variables, keyed by pytree path) go there (None: no files).
    checkpointer: saves and restores the state and the loop's carry (None: no checkpoints;
      signals still stop the run between rounds).
    checkpoint_every: save every k rounds, at the driver's boundaries and after the last round
      (0: only on a signal).
    resume: continue from the checkpointer's newest valid checkpoint (a fresh start if none).
    overwrite: replace the checkpoints of an unfinished run instead of refusing to start (a
      finished run is always replaced; the entry points refuse that earlier without it).
    tensorboard_dir: also write each record's numbers as TensorBoard scalars there.
    progress: a progress bar with ETA on a terminal, one plain line per round into a log.
    handle_signals: catch SIGINT/SIGTERM to stop cleanly between rounds.
  """

  output_dir: str | Path | None = None
  checkpointer: Checkpointer | None = None
  checkpoint_every: int = 0
  resume: bool = False
  overwrite: bool = False
  tensorboard_dir: str | Path | None = None
  progress: bool = True
  handle_signals: bool = True


def run_io(c, output_dir: str | Path | None) -> RunIO:
  """The run management an entry point's config ``c`` asks for (its ``resume``, ``overwrite``,
  ``checkpoint_every``, ``keep_checkpoints``, ``tensorboard`` and ``progress`` fields), writing to
  ``output_dir`` with checkpoints fingerprinted by the config (None: no files)."""
  progress = c.get("progress", True)
  if output_dir is None:
    return RunIO(progress=progress)
  out, fingerprint = Path(output_dir), config_fingerprint(c.to_dict())
  return RunIO(
    output_dir=out,
    checkpointer=Checkpointer(out / "checkpoints", fingerprint, c.get("keep_checkpoints", 3)),
    checkpoint_every=c.get("checkpoint_every", 0),
    resume=c.get("resume", False),
    overwrite=c.get("overwrite", False),
    tensorboard_dir=out / "tensorboard" if c.get("tensorboard", False) else None,
    progress=progress,
  )


class Hooks(NamedTuple):
  """What a driver puts on the round loop (each called on every process, in this order).

  Attributes:
    step: ``step(state, r) -> (state, metrics)`` runs round ``r`` (0-based).
    after: ``after(state, r, record, carry) -> (state, records)``, after round ``r``'s record is
      made: evaluation, a task's end. It may add fields to ``record``, updates ``carry`` in place
      and returns further records to log.
    line: ``line(record, plain) -> str | None``, the progress line of a record (``plain``: the
      output is a log, not a terminal with a bar).
    boundary: ``boundary(done) -> bool``, also checkpoint after ``done`` rounds (when periodic
      checkpoints are on): a task's end.
    where: ``where(done) -> str``, appended to "round <done>/<rounds>" in messages.
  """

  step: Callable
  after: Callable
  line: Callable
  boundary: Callable[[int], bool] = lambda done: False
  where: Callable[[int], str] = lambda done: ""


def open_session(state, run: RunIO, rounds: int, carry: dict, stale_eval=lambda start: False):
  """Restores the newest checkpoint (``run.resume``) or clears an old run's, and trims
  ``metrics.jsonl`` to the checkpoint.

  Args:
    state: the initial state (the template of the restore).
    run: the run's files and checkpoints.
    rounds: the run's length.
    carry: the loop's initial carry; a checkpoint's values replace it.
    stale_eval: ``stale_eval(start)``: the record of round ``start`` loses its evaluation (an
      extended run evaluated its former last round only because it was last).

  Returns:
    (state, rounds done before this session, carry with ``wall_seconds``).
  """
  if rounds < 1:
    raise ValueError(f"rounds must be >= 1, got {rounds}.")
  if run.checkpoint_every < 0:
    raise ValueError(f"checkpoint_every must be >= 0, got {run.checkpoint_every}.")
  writes, checkpointer = jax.process_index() == 0, run.checkpointer
  start, carry = 0, {**carry, "wall_seconds": 0.0}
  if checkpointer is not None and run.resume:
    restored = checkpointer.restore_latest(state)
    if restored is not None:
      state, meta = restored
      start = int(meta["round"])
      carry = {k: v if meta.get(k) is None else meta[k] for k, v in carry.items()}
      previous = Path(run.output_dir) / "summary.json" if run.output_dir is not None else None
      if previous is not None and previous.is_file():
        # The run finished at this checkpoint: its summary also timed the work after the save.
        done_before = json.loads(previous.read_text())
        if done_before.get("rounds") == start:
          wall = float(done_before.get("wall_seconds") or 0.0)
          carry["wall_seconds"] = max(carry["wall_seconds"], wall)
      saved_rounds = int(meta.get("rounds") or meta.get("config", {}).get("rounds") or rounds)
      if start > rounds:
        raise CheckpointError(
          f"The checkpoint in {checkpointer.directory} is at round {start}, beyond "
          f"--rounds={rounds}: a run cannot be shortened. Pass --rounds >= {start}, or "
          "start a new run in another --output_dir."
        )
      if writes:
        extend = f", extending the run from {saved_rounds} to {rounds} rounds" * (
          rounds > saved_rounds
        )
        print(f"resuming from the checkpoint of round {start}{extend}", file=sys.stderr)
  elif checkpointer is not None and checkpointer.steps():
    # A finished run is replaced (as its metrics file is); an unfinished one may be a preempted
    # job whose relaunch forgot --resume, so its checkpoints are deleted only when asked.
    meta = checkpointer.newest_meta() or {}
    total = meta.get("rounds") or meta.get("config", {}).get("rounds", math.inf)
    if meta.get("round", -1) < total and not run.overwrite:
      raise CheckpointError(
        f"{checkpointer.directory} holds the checkpoints of an unfinished run (rounds "
        f"{checkpointer.steps()}); pass --resume to continue it, --overwrite to replace it, or "
        "choose another --output_dir for a new run."
      )
    if writes:
      print(f"replacing the run in {checkpointer.directory.parent}", file=sys.stderr)
    checkpointer.clear()
  if start and run.output_dir is not None and writes:  # the rounds after it are run again
    metrics_path = Path(run.output_dir) / "metrics.jsonl"
    torn = truncate_metrics(metrics_path, start, drop_eval_of=stale_eval(start))
    if torn:
      print(
        f"{metrics_path}: dropped its torn last line ({len(torn)} bytes, {torn[:40]!r}...), "
        f"cut short by the crash or full disk that ended the last session; the rounds after "
        f"the checkpoint of round {start} are run again",
        file=sys.stderr,
      )
  return state, start, carry


def _interrupted(signum: int, received: bool, done: int, rounds: int, run: RunIO, where: str):
  name = signal.Signals(signum).name
  # Only another process of the job may have been signalled.
  received_by = "received" if received else "received by another process"
  saved = run.checkpointer is not None
  what = (
    f"saved the checkpoint of round {done} in {run.checkpointer.directory}; resume with the "
    "same command plus --resume"
    if saved
    else "no checkpoint was saved (no output directory)"
  )
  message = f"{name} {received_by}: stopped after round {done}/{rounds}{where} and {what}."
  return TrainingInterrupted(message, done, signum, saved)


class _Records:
  """Where a run's records go: ``metrics.jsonl``, TensorBoard and the progress output.

  Only process 0 writes. A progress bar redraws itself with carriage returns, so it is only for a
  terminal; into a file or a pipe (a log) every round gets one plain line instead.
  """

  def __init__(self, run: RunIO, start: int, rounds: int, name: str, line: Callable):
    writes = jax.process_index() == 0
    self.writer = self.tb = None
    if run.output_dir is not None and writes:
      self.writer = MetricsWriter(run.output_dir, truncate=not start)
    if run.tensorboard_dir is not None and writes:
      from fedjax_proj.training.tensorboard import TensorBoardWriter

      self.tb = TensorBoardWriter(run.tensorboard_dir)
    if not writes:
      line = lambda record, plain: None  # noqa: E731
    self.interactive = run.progress and writes and getattr(sys.stderr, "isatty", lambda: False)()
    self.plain, self.line = run.progress and not self.interactive, line
    self.bar = tqdm(
      range(start, rounds),
      desc=name,
      disable=not self.interactive,
      file=sys.stderr,
      unit="round",
      initial=start,
      total=rounds,
    )

  def write(self, records: list[dict], r: int) -> None:
    for record in records:
      if self.writer is not None:
        self.writer.write(record)
      if self.tb is not None:
        self.tb.write({**record, "round": r + 1})
      text = self.line(record, self.plain)
      if text:
        self.bar.write(text) if self.interactive else print(text, flush=True)
    self.bar.set_postfix(loss=f"{records[0].get('train_loss') or float('nan'):.3f}")

  def close(self) -> None:
    for closing in (self.writer, self.tb, self.bar):
      if closing is not None:
        closing.close()


def _finite_check(global_variables: Callable, name: str, checkpointer) -> Callable:
  """``check(state, metrics, r)``: raises :class:`NonFiniteError` on a non-finite loss metric or
  non-finite global parameters, before the round is logged or saved."""
  all_finite = jax.jit(lambda s: tree_all_finite(global_variables(s)))

  def check(state, metrics: dict, r: int) -> None:
    bad = _nonfinite_losses(metrics)
    if not bool(_local(all_finite(state))):
      bad.append("global parameters")
    if bad:
      raise NonFiniteError(
        f"Round {r + 1} of {name} produced non-finite {', '.join(bad)}. "
        f"{last_good(checkpointer)} Lower the learning rate or check the inputs."
      )

  return check


def _agreed(signum: int | None) -> int | None:
  """The signal every process stops for: a signal may reach only some processes of a job."""
  if jax.process_count() > 1:
    return distributed.max_over_processes(signum or 0) or None
  return signum


def run_rounds(
  state,
  algorithm: RoundAlgorithm,
  hooks: Hooks,
  run: RunIO,
  *,
  start: int,
  rounds: int,
  carry: dict,
):
  """Runs rounds ``start .. rounds - 1`` of ``algorithm`` (its ``name`` and ``global_variables``)
  with ``hooks``: checks, records, checkpoints, signals.

  Returns:
    (state, carry); ``carry["wall_seconds"]`` is the wall time of every session so far.
  """
  records = _Records(run, start, rounds, algorithm.name, hooks.line)
  check = _finite_check(algorithm.global_variables, algorithm.name, run.checkpointer)
  wall_before, began, every = carry["wall_seconds"], time.perf_counter(), run.checkpoint_every
  try:
    with _StopOnSignal(run.handle_signals, announce=jax.process_index() == 0) as stop:
      for r in records.bar:
        t0 = time.perf_counter()
        stop.round, stop.where, stop.round_started = r + 1, hooks.where(r + 1), t0
        state, metrics = hooks.step(state, r)
        metrics = _local(metrics)
        check(state, metrics, r)
        record = {"round": r + 1, **to_python(metrics), "round_seconds": time.perf_counter() - t0}
        if r > start:  # the first round of a session includes compilation
          stop.round_seconds = record["round_seconds"]
        state, more = hooks.after(state, r, record, carry)
        records.write([record, *more], r)
        done, signum = r + 1, _agreed(stop.signum)
        carry["wall_seconds"] = wall_before + time.perf_counter() - began
        periodic = every and (done % every == 0 or done == rounds or hooks.boundary(done))
        if run.checkpointer is not None and (periodic or signum is not None):
          run.checkpointer.save(
            done, state, {"rounds": rounds, "where": hooks.where(done), **carry}
          )
        if signum is not None and done < rounds:
          raise _interrupted(signum, stop.signum is not None, done, rounds, run, hooks.where(done))
  finally:
    records.close()
    if run.checkpointer is not None:
      run.checkpointer.close()
  carry["wall_seconds"] = wall_before + time.perf_counter() - began
  return state, carry


def finish(state, run: RunIO, global_variables: Callable, summary: dict) -> None:
  """Writes ``final_variables.npz`` and then ``summary.json`` (which marks the run finished)."""
  if run.output_dir is not None:
    final_variables = _local(global_variables(state))  # a collective: every process
    if jax.process_index() == 0:
      save_variables(Path(run.output_dir) / FINAL_VARIABLES, final_variables)
      write_json(Path(run.output_dir) / "summary.json", summary)


def _evaluation(evaluate, test, algorithm, eval_every: int, rounds: int, checkpointer):
  """The FL run's ``after`` hook: the global model's test accuracy and loss every k rounds."""

  def after(state, r, record, carry):
    if test is None or ((r + 1) % eval_every and r + 1 != rounds):
      return state, []
    ev = evaluate(_local(algorithm.global_variables(state)), *test)
    if not math.isfinite(ev["loss"]):
      raise NonFiniteError(
        f"Round {r + 1} of {algorithm.name}: non-finite test loss. {last_good(checkpointer)}"
      )
    record["test_accuracy"], record["test_loss"] = ev["accuracy"], ev["loss"]
    carry["last_eval"] = ev
    return state, []

  return after


def _round_line(rounds: int):
  """The FL run's progress lines: every evaluation, and every round into a log."""

  def line(record, plain):
    loss, took = record.get("train_loss") or float("nan"), f"  ({record['round_seconds']:.1f} s)"
    if "test_accuracy" in record:
      return (
        f"round {record['round']}/{rounds}  test_accuracy={record['test_accuracy']:.4f}  "
        f"train_loss={loss:.4f}" + took * plain
      )
    return f"round {record['round']}/{rounds}  train_loss={loss:.4f}{took}" if plain else None

  return line


def to_device(data: tuple[np.ndarray, np.ndarray]) -> tuple[jax.Array, jax.Array]:
  """(images, labels) on the device once, labels as int32."""
  return jax.device_put(data[0]), jax.device_put(np.asarray(data[1], np.int32))


def train(
  algorithm: RoundAlgorithm,
  round_fn: Callable,
  fed_data: FederatedData,
  train_set: tuple[np.ndarray, np.ndarray],
  test_set: tuple[np.ndarray, np.ndarray] | None,
  evaluate: Callable[[dict, jax.Array, jax.Array], dict] | None,
  init_variables: dict,
  *,
  rounds: int,
  clients_per_round: int,
  seed: int,
  eval_every: int = 1,
  round_inputs: dict | None = None,
  extra_metrics: Callable[[object], dict] | None = None,
  summary_extra: dict | None = None,
  run: RunIO | None = None,
) -> tuple[object, dict]:
  """Runs ``rounds`` rounds of one round algorithm (parallel FL or the sequential chain) on the
  round loop, from the newest checkpoint when ``run.resume``; returns (final state, summary).

  Rounds are pure functions of (seed, round), so a larger ``rounds`` than a checkpointed run's
  extends it exactly as a run started with the larger ``rounds``.

  Args:
    algorithm: the algorithm (``name``, ``init`` and ``global_variables``).
    round_fn: its compiled round (:func:`fedjax_proj.algorithms.base.make_round`).
    fed_data: client partition, batch size and local epochs.
    train_set, test_set: (images, labels); the training set is put on the device once; no test
      set (or no ``evaluate(variables, images, labels) -> {"accuracy", "loss"}``): no evaluation.
    init_variables: the initial global model.
    rounds, clients_per_round, seed, eval_every: the run's length, clients sampled per round,
      seed, and how often the global model is evaluated (also after the last round).
    round_inputs: device arrays every round needs (e.g. the public set), in ``RoundData.extra``.
    extra_metrics: ``extra_metrics(state) -> dict`` logged each round (e.g. FedProj's L_mem).
    summary_extra: fields added to the summary (method, config).
    run: files, checkpoints, resume and signals (:class:`RunIO`; None: no files).
  """
  run = run or RunIO()
  seed_key = jax.random.key(seed)
  state = algorithm.init(init_variables, random_lib.stream_key(seed_key, "init"))
  state, start, carry = open_session(
    state, run, rounds, {"last_eval": {}}, lambda s: s < rounds and s % eval_every != 0
  )
  images, labels = to_device(train_set)
  test = to_device(test_set) if test_set is not None and evaluate is not None else None
  extra = dict(round_inputs or {})

  def step(state, r):
    sampled = fed_data.sample_clients(r, clients_per_round, seed)
    rd = fed_data.round_data(images, labels, sampled, r, seed, extra)
    state, metrics = round_fn(state, rd, random_lib.round_key(seed_key, r))
    return state, metrics if extra_metrics is None else {**metrics, **extra_metrics(state)}

  after = _evaluation(evaluate, test, algorithm, eval_every, rounds, run.checkpointer)
  hooks = Hooks(step, after, _round_line(rounds))
  state, carry = run_rounds(state, algorithm, hooks, run, start=start, rounds=rounds, carry=carry)
  summary = {
    "method": algorithm.name,
    "rounds": rounds,
    "seed": seed,
    "final_test_accuracy": carry["last_eval"].get("accuracy"),
    "final_test_loss": carry["last_eval"].get("loss"),
    "wall_seconds": carry["wall_seconds"],  # every session of the run
    "resumed_from_round": start,
    **(summary_extra or {}),
  }
  finish(state, run, algorithm.global_variables, summary)
  return state, summary
