"""The round loop: sample clients, lay out their batches, run the compiled round, evaluate, log.

Library code: every input is an explicit argument (no flags). Experiments build these arguments from
their config (see :mod:`fedjax_proj.training.experiment`).

Robustness (README, "Paper presets and run management"): with a
:class:`~fedjax_proj.training.checkpoint.Checkpointer` the server state is saved every
``checkpoint_every`` rounds, after the last round, and when SIGINT/SIGTERM arrives (the running
round finishes first; a second signal aborts at once). ``resume=True``
continues from the newest valid checkpoint and rewrites ``metrics.jsonl`` after it, so the file
equals an uninterrupted run's except for the wall-clock fields
(:data:`~fedjax_proj.training.checkpoint.WALL_CLOCK_FIELDS`). A non-finite training loss or
non-finite global parameters stop the run (:class:`NonFiniteError`) without saving, so the last
checkpoint on disk is the last good one.

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
    self.round_started = time.perf_counter()
    self.round_seconds: float | None = None  # the last completed round's duration

  def message(self) -> str:
    """What the first signal prints at once: which round the run stops after, and when."""
    if self.round_seconds is None:
      when = "time unknown: the first round includes compilation"
    else:
      left = max(0.0, self.round_seconds - (time.perf_counter() - self.round_started))
      when = f"about {left:.0f} s"
    return f"stopping after round {self.round} ({when}); Ctrl-C again to abort\n"

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
  output_dir: str | Path | None = None,
  round_inputs: dict | None = None,
  extra_metrics: Callable[[object], dict] | None = None,
  summary_extra: dict | None = None,
  progress: bool = True,
  checkpointer: Checkpointer | None = None,
  checkpoint_every: int = 0,
  resume: bool = False,
  overwrite: bool = False,
  tensorboard_dir: str | Path | None = None,
  handle_signals: bool = True,
) -> tuple[object, dict]:
  """Runs ``rounds`` federated rounds (from the last checkpoint when resuming).

  Args:
    algorithm: the algorithm (for ``init`` and ``global_variables``).
    round_fn: the compiled round from :func:`fedjax_proj.algorithms.base.make_round`.
    fed_data: client partition, batch size and local epochs.
    train_set: (images, labels) of the whole training set; put on device once.
    test_set: (images, labels) for evaluation, or None.
    evaluate: ``evaluate(variables, images, labels) -> {"accuracy", "loss"}``.
    init_variables: the initial global model.
    rounds: number of rounds.
    clients_per_round: clients sampled per round.
    seed: the run's seed; every random draw derives from it and the round index.
    eval_every: evaluate the global model every k rounds (and after the last round).
    output_dir: where ``metrics.jsonl``, ``summary.json`` and ``final_variables.npz`` (the final
      global variables, keyed by pytree path) go (None: no files).
    round_inputs: device arrays every round needs (e.g. the public set), in ``RoundData.extra``.
    extra_metrics: ``extra_metrics(state) -> dict`` logged each round (e.g. FedProj's L_mem).
    summary_extra: fields added to the summary (method, config).
    progress: show a progress bar with ETA.
    checkpointer: saves/restores the server state (None: no checkpoints, signals still stop).
    checkpoint_every: save every k rounds and after the last one (0: only on a signal).
    resume: continue from the checkpointer's newest valid checkpoint (fresh start if none). A
      larger ``rounds`` than the checkpointed run's extends it: rounds are pure functions of
      (seed, round), so the extension equals a run started with the larger ``rounds``.
    overwrite: replace the checkpoints of an unfinished run instead of refusing to start (a
      finished run is always replaced; experiments refuse that earlier without ``overwrite``).
    tensorboard_dir: also write the per-round scalars as TensorBoard events there.
    handle_signals: catch SIGINT/SIGTERM to stop cleanly between rounds.

  In a job of several processes only process 0 writes files and progress output (see the module
  docstring); ``output_dir`` and the checkpoint directory must be the same on every process.

  Returns:
    (final server state, summary dict).

  Raises:
    NonFiniteError: a round produced a non-finite training/test loss or global parameters.
    TrainingInterrupted: SIGINT/SIGTERM arrived; the state after the running round was saved.
    CheckpointError: resuming from a checkpoint of another config or version, or starting a new
      run over the checkpoints of an unfinished run without ``resume`` (a finished run's
      checkpoints are replaced).
  """
  if rounds < 1:
    raise ValueError(f"rounds must be >= 1, got {rounds}.")
  if checkpoint_every < 0:
    raise ValueError(f"checkpoint_every must be >= 0, got {checkpoint_every}.")
  # One writer per job: in a multi-process run every process computes the same records.
  writes = jax.process_index() == 0
  multi_process = jax.process_count() > 1
  seed_key = jax.random.key(seed)
  state = algorithm.init(init_variables, random_lib.stream_key(seed_key, "init"))
  start_round, last_eval, wall_before, saved_rounds = 0, {}, 0.0, rounds
  if checkpointer is not None:
    if resume:
      restored = checkpointer.restore_latest(state)
      if restored is not None:
        state, meta = restored
        start_round, last_eval = int(meta["round"]), dict(meta.get("last_eval") or {})
        # Wall time already spent by the sessions before this one: the summary reports the total.
        wall_before = float(meta.get("wall_seconds") or 0.0)
        previous = Path(output_dir) / "summary.json" if output_dir is not None else None
        if previous is not None and previous.is_file():
          # The run finished at this checkpoint: its summary also timed the work after the save.
          done_before = json.loads(previous.read_text())
          if done_before.get("rounds") == start_round:
            wall_before = max(wall_before, float(done_before.get("wall_seconds") or 0.0))
        saved_rounds = int(meta.get("rounds") or meta.get("config", {}).get("rounds") or rounds)
        if start_round > rounds:
          raise CheckpointError(
            f"The checkpoint in {checkpointer.directory} is at round {start_round}, beyond "
            f"--rounds={rounds}: a run cannot be shortened. Pass --rounds >= {start_round}, or "
            "start a new run in another --output_dir."
          )
        if writes:
          extend = f", extending the run from {saved_rounds} to {rounds} rounds" * (
            rounds > saved_rounds
          )
          print(f"resuming from the checkpoint of round {start_round}{extend}", file=sys.stderr)
    elif checkpointer.steps():
      # A finished run is replaced (as its metrics file is); an unfinished one may be a preempted
      # job whose relaunch forgot --resume, so its checkpoints are deleted only when asked.
      meta = checkpointer.newest_meta() or {}
      total = meta.get("rounds") or meta.get("config", {}).get("rounds", math.inf)
      finished = meta.get("round", -1) >= total
      if not finished and not overwrite:
        raise CheckpointError(
          f"{checkpointer.directory} holds the checkpoints of an unfinished run (rounds "
          f"{checkpointer.steps()}); pass --resume to continue it, --overwrite to replace it, or "
          "choose another --output_dir for a new run."
        )
      if writes:
        print(f"replacing the run in {checkpointer.directory.parent}", file=sys.stderr)
      checkpointer.clear()
  images, labels = jax.device_put(train_set[0]), jax.device_put(np.asarray(train_set[1], np.int32))
  if test_set is not None:
    test_images = jax.device_put(test_set[0])
    test_labels = jax.device_put(np.asarray(test_set[1], np.int32))
  extra = dict(round_inputs or {})
  writer = None
  if output_dir is not None and writes:
    if start_round:  # lines after the checkpoint are re-written by the rounds below
      # An extended run's former last round was evaluated only because it was last: drop that
      # evaluation when off the eval_every grid, as a run started at ``rounds`` has none there.
      stale_eval = start_round < rounds and start_round % eval_every != 0
      metrics_path = Path(output_dir) / "metrics.jsonl"
      torn = truncate_metrics(metrics_path, start_round, drop_eval_of=stale_eval)
      if torn:
        print(
          f"{metrics_path}: dropped its torn last line ({len(torn)} bytes, {torn[:40]!r}...), "
          f"cut short by the crash or full disk that ended the last session; the rounds after "
          f"the checkpoint of round {start_round} are run again",
          file=sys.stderr,
        )
    writer = MetricsWriter(output_dir, truncate=not start_round)
  tb = None
  if tensorboard_dir is not None and writes:
    from fedjax_proj.training.tensorboard import TensorBoardWriter

    tb = TensorBoardWriter(tensorboard_dir)
  all_finite = jax.jit(lambda s: tree_all_finite(algorithm.global_variables(s)))

  def last_good() -> str:
    steps = checkpointer.steps() if checkpointer is not None else []
    if not steps:
      return "No checkpoint was saved."
    return f"The last good checkpoint (round {steps[-1]}) is kept in {checkpointer.directory}."

  start = time.perf_counter()
  # A progress bar redraws itself with carriage returns: only for a terminal. Into a file or a
  # pipe (a log), every round gets one plain line instead.
  interactive = progress and writes and getattr(sys.stderr, "isatty", lambda: False)()
  plain_progress = progress and writes and not interactive
  bar = tqdm(
    range(start_round, rounds),
    desc=algorithm.name,
    disable=not interactive,
    file=sys.stderr,
    unit="round",
    initial=start_round,
    total=rounds,
  )
  try:
    with _StopOnSignal(handle_signals, announce=writes) as stop:
      for r in bar:
        t0 = time.perf_counter()
        stop.round, stop.round_started = r + 1, t0
        sampled = fed_data.sample_clients(r, clients_per_round, seed)
        rd = fed_data.round_data(images, labels, sampled, r, seed, extra)
        state, metrics = round_fn(state, rd, random_lib.round_key(seed_key, r))
        if extra_metrics is not None:
          metrics = {**metrics, **extra_metrics(state)}
        metrics = _local(metrics)
        bad = _nonfinite_losses(metrics)
        if not bool(_local(all_finite(state))):
          bad.append("global parameters")
        if bad:
          raise NonFiniteError(
            f"Round {r + 1} of {algorithm.name} produced non-finite {', '.join(bad)}. "
            f"{last_good()} Lower the learning rate or check the inputs."
          )
        record = {"round": r + 1, **to_python(metrics)}
        record["round_seconds"] = time.perf_counter() - t0
        if r > start_round:  # the first round of a session includes compilation
          stop.round_seconds = record["round_seconds"]
        if (
          test_set is not None
          and evaluate is not None
          and ((r + 1) % eval_every == 0 or r + 1 == rounds)
        ):
          ev = evaluate(_local(algorithm.global_variables(state)), test_images, test_labels)
          if not math.isfinite(ev["loss"]):
            raise NonFiniteError(
              f"Round {r + 1} of {algorithm.name}: non-finite test loss. {last_good()}"
            )
          record["test_accuracy"], record["test_loss"] = ev["accuracy"], ev["loss"]
          last_eval = ev
          if writes:
            bar.write(
              f"round {r + 1}/{rounds}  test_accuracy={ev['accuracy']:.4f}  "
              f"train_loss={record.get('train_loss') or float('nan'):.4f}"
              + (f"  ({record['round_seconds']:.1f} s)" if plain_progress else "")
            )
        elif plain_progress:
          print(
            f"round {r + 1}/{rounds}  train_loss={record.get('train_loss') or float('nan'):.4f}  "
            f"({record['round_seconds']:.1f} s)",
            flush=True,
          )
        if writer is not None:
          writer.write(record)
        if tb is not None:
          tb.write(record)
        bar.set_postfix(loss=f"{record.get('train_loss') or float('nan'):.3f}")
        done = r + 1
        signum = stop.signum
        if multi_process:  # a signal may reach only some processes; all stop after this round
          signum = distributed.max_over_processes(signum or 0) or None
        periodic = checkpoint_every and (done % checkpoint_every == 0 or done == rounds)
        if checkpointer is not None and (periodic or signum is not None):
          wall = wall_before + time.perf_counter() - start
          checkpointer.save(
            done, state, {"last_eval": last_eval, "rounds": rounds, "wall_seconds": wall}
          )
        if signum is not None and done < rounds:
          name = signal.Signals(signum).name
          # Only another process of the job may have been signalled.
          received = "received" if stop.signum is not None else "received by another process"
          saved = checkpointer is not None
          where = (
            f"saved the checkpoint of round {done} in {checkpointer.directory}; resume with the "
            "same command plus --resume"
            if saved
            else "no checkpoint was saved (no output directory)"
          )
          raise TrainingInterrupted(
            f"{name} {received}: stopped after round {done}/{rounds} and {where}.",
            done,
            signum,
            saved,
          )
  finally:
    if writer is not None:
      writer.close()
    if tb is not None:
      tb.close()
    if checkpointer is not None:
      checkpointer.close()
    bar.close()
  summary = {
    "method": algorithm.name,
    "rounds": rounds,
    "seed": seed,
    "final_test_accuracy": last_eval.get("accuracy"),
    "final_test_loss": last_eval.get("loss"),
    # Total over every session of the run (a resumed run adds its checkpoint's time).
    "wall_seconds": wall_before + time.perf_counter() - start,
    "resumed_from_round": start_round,
    **(summary_extra or {}),
  }
  if output_dir is not None:
    final_variables = _local(algorithm.global_variables(state))  # a collective: every process
    if writes:
      save_variables(Path(output_dir) / FINAL_VARIABLES, final_variables)
      write_json(Path(output_dir) / "summary.json", summary)
  return state, summary
