"""A run's files around the round loop: where it writes, how a session opens and how it ends.

A run may take several *sessions* (processes that each run some of its rounds: a start, then a
``--resume`` after a stop). :class:`RunIO` says where the run writes and how it is kept;
:func:`open_session` restores the newest checkpoint (or clears an old run's) and trims
``metrics.jsonl`` to it; :class:`Records` writes each round's records (``metrics.jsonl``,
TensorBoard, progress); :func:`finish` writes the final variables and ``summary.json``, which marks
the run finished (docs/design.md, "The round loop").

Several processes: every process calls these alike; only process 0 writes files or prints.
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import jax
from tqdm.auto import tqdm

from fedjax_proj.core import distributed
from fedjax_proj.training import fields
from fedjax_proj.training.checkpoint import (
  Checkpointer,
  CheckpointError,
  config_fingerprint,
  record_rounds,
  save_variables,
  truncate_metrics,
  unrecorded,
)
from fedjax_proj.training.metrics import MetricsWriter, write_json

FINAL_VARIABLES = "final_variables.npz"


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


def run_io(c, output_dir: str | Path | None, s: fields.Config | None = None) -> RunIO:
  """The run management an entry point's config ``c`` asks for (its ``resume``, ``overwrite``,
  ``checkpoint_every``, ``keep_checkpoints``, ``tensorboard`` and ``progress`` fields, read from
  ``s``, the run's resolved config, default :func:`fields.resolve` of ``c``), writing to
  ``output_dir`` with checkpoints fingerprinted by the config as given (None: no files)."""
  s = fields.resolve(c) if s is None else s
  if output_dir is None:
    return RunIO(progress=s.progress)
  out, fingerprint = Path(output_dir), config_fingerprint(c.to_dict())
  return RunIO(
    output_dir=out,
    checkpointer=Checkpointer(out / "checkpoints", fingerprint, s.keep_checkpoints),
    checkpoint_every=s.checkpoint_every,
    resume=s.resume,
    overwrite=s.overwrite,
    tensorboard_dir=out / "tensorboard" if s.tensorboard else None,
    progress=s.progress,
  )


def last_good(checkpointer: Checkpointer | None) -> str:
  """Which checkpoint a stopped run keeps, for the error that stops it."""
  steps = checkpointer.steps() if checkpointer is not None else []
  if not steps:
    return "No checkpoint was saved."
  return f"The last good checkpoint (round {steps[-1]}) is kept in {checkpointer.directory}."


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
  start, carry = 0, {**carry, "wall_seconds": 0.0, "metrics_records": 0}
  metrics_path = Path(run.output_dir) / "metrics.jsonl" if run.output_dir is not None else None
  if checkpointer is not None and run.resume:
    # A checkpoint counts only with every record written up to it: resuming past a lost one
    # would leave a hole in metrics.jsonl. An older checkpoint the records do back is used
    # instead, or the resume is refused before any compute (Checkpointer.restore_latest).
    rounds_of, accept = None, None
    if metrics_path is not None:
      rounds_of = record_rounds(metrics_path)
      accept = lambda meta: unrecorded(rounds_of, meta, metrics_path)
    restored = checkpointer.restore_latest(state, accept)
    if restored is not None:
      state, meta = restored
      start = int(meta["round"])
      carry = {k: v if meta.get(k) is None else meta[k] for k, v in carry.items()}
      if rounds_of is not None:  # the records kept below (checkpoints before the count had none)
        carry["metrics_records"] = sum(r <= start for r in rounds_of)
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
  if start and metrics_path is not None and writes:  # the rounds after it are run again
    torn = truncate_metrics(metrics_path, start, drop_eval_of=stale_eval(start))
    if torn:
      print(
        f"{metrics_path}: dropped its torn last line ({len(torn)} bytes, {torn[:40]!r}...), "
        f"cut short by the crash or full disk that ended the last session; the rounds after "
        f"the checkpoint of round {start} are run again",
        file=sys.stderr,
      )
  return state, start, carry


class Records:
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


def finish(state, run: RunIO, global_variables: Callable, summary: dict) -> None:
  """Writes ``final_variables.npz`` and then ``summary.json`` (which marks the run finished)."""
  if run.output_dir is not None:
    final_variables = distributed.to_local(global_variables(state))  # a collective: every process
    if jax.process_index() == 0:
      save_variables(Path(run.output_dir) / FINAL_VARIABLES, final_variables)
      write_json(Path(run.output_dir) / "summary.json", summary)
