"""SIGINT/SIGTERM during the round loop: finish the running round, save, stop; a second aborts.

The round loop (:func:`fedjax_proj.training.loop.run_rounds`) installs :class:`StopOnSignal`
around its rounds, asks :func:`agreed` after each round whether the run stops there (with several
processes, a signal may reach only some of them; all stop after the same round), and raises
:func:`interrupted`'s :class:`TrainingInterrupted` once that round's checkpoint is saved
(docs/design.md, "The round loop").
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time

import jax

from fedjax_proj.core import distributed
from fedjax_proj.training.checkpoint import Checkpointer

# Signals a StopOnSignal caught in this process. A signal that arrives in a run's last round
# ends no round loop early (the run simply finishes), so a caller that runs one run after another
# (the claim runner's queue) reads it here and stops before the next run instead of forgetting it.
_caught: list[int] = []


def stop_requested() -> int | None:
  """The first SIGINT/SIGTERM a :class:`StopOnSignal` caught in this process, or None."""
  return _caught[0] if _caught else None


def clear_stop_request() -> None:
  """Forgets caught signals: a new queue (e.g. a second command in one notebook) starts afresh."""
  _caught.clear()


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


class StopOnSignal:
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
    _caught.append(signum)
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


def agreed(signum: int | None) -> int | None:
  """The signal every process stops for: a signal may reach only some processes of a job."""
  if jax.process_count() > 1:
    return distributed.max_over_processes(signum or 0) or None
  return signum


def interrupted(
  signum: int, received: bool, done: int, rounds: int, checkpointer: Checkpointer | None, where: str
) -> TrainingInterrupted:
  """The error that stops the run after round ``done``, saying what is on disk.

  ``received``: this process got the signal (else only another process of the job did);
  ``checkpointer``: the run's (it has saved round ``done``), or None.
  """
  name = signal.Signals(signum).name
  received_by = "received" if received else "received by another process"
  saved = checkpointer is not None
  what = (
    f"saved the checkpoint of round {done} in {checkpointer.directory}; resume with the "
    "same command plus --resume"
    if saved
    else "no checkpoint was saved (no output directory)"
  )
  message = f"{name} {received_by}: stopped after round {done}/{rounds}{where} and {what}."
  return TrainingInterrupted(message, done, signum, saved)
