"""The round loop: one resumable loop with hooks, which every kind of run drives.

A run is a number of rounds, a ``step`` that runs round r, and the driver's :class:`Hooks` around
it (docs/design.md, "The round loop"). The loop owns what keeps a run safe, the same for every
driver:

* **Checkpoints** (:class:`~fedjax_proj.training.checkpoint.Checkpointer`): the state plus the
  loop's *carry* (host-side values: the last evaluation, a continual run's accuracy matrix, the
  wall time) every ``checkpoint_every`` rounds, at the driver's boundaries (a task's end), after
  the last round and when SIGINT/SIGTERM arrives (the running round finishes first; a second
  signal aborts at once; :mod:`fedjax_proj.training.signals`). ``resume=True`` continues from the
  newest valid checkpoint and rewrites ``metrics.jsonl`` after it (a torn last line included;
  :func:`~fedjax_proj.training.session.open_session`), so the file equals an uninterrupted run's
  except for the wall-clock fields (:data:`~fedjax_proj.training.checkpoint.WALL_CLOCK_FIELDS`).
  Every round is a pure function of (seed, round), so nothing else is needed to continue exactly.
* **Non-finite stop**: a non-finite loss or non-finite global parameters stop the run
  (:class:`NonFiniteError`) without saving, so the last checkpoint on disk is the last good one.
* **Metrics** (``metrics.jsonl``, optionally TensorBoard) and **progress** (a bar with ETA on a
  terminal, one plain line per round into a log): :class:`~fedjax_proj.training.session.Records`.

Where a run writes and how it is kept is a :class:`~fedjax_proj.training.session.RunIO`; a driver
opens the session, runs :func:`run_rounds` and ends with
:func:`~fedjax_proj.training.session.finish`.

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

import math
import time
from collections.abc import Callable
from typing import NamedTuple

import jax
import numpy as np

from fedjax_proj.algorithms.families import RoundAlgorithm
from fedjax_proj.core import random as random_lib
from fedjax_proj.core.distributed import to_local
from fedjax_proj.core.tree import tree_all_finite
from fedjax_proj.data.federated import FederatedData
from fedjax_proj.training import signals
from fedjax_proj.training.metrics import to_python
from fedjax_proj.training.session import Records, RunIO, finish, last_good, open_session


class NonFiniteError(FloatingPointError):
  """Raised when a round produces a non-finite loss or non-finite global parameters."""


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


def _finite_check(global_variables: Callable, name: str, checkpointer) -> Callable:
  """``check(state, metrics, r)``: raises :class:`NonFiniteError` on a non-finite loss metric or
  non-finite global parameters, before the round is logged or saved."""
  all_finite = jax.jit(lambda s: tree_all_finite(global_variables(s)))

  def check(state, metrics: dict, r: int) -> None:
    bad = _nonfinite_losses(metrics)
    if not bool(to_local(all_finite(state))):
      bad.append("global parameters")
    if bad:
      raise NonFiniteError(
        f"Round {r + 1} of {name} produced non-finite {', '.join(bad)}. "
        f"{last_good(checkpointer)} Lower the learning rate or check the inputs."
      )

  return check


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
  records = Records(run, start, rounds, algorithm.name, hooks.line)
  check = _finite_check(algorithm.global_variables, algorithm.name, run.checkpointer)
  wall_before, began, every = carry["wall_seconds"], time.perf_counter(), run.checkpoint_every
  try:
    with signals.StopOnSignal(run.handle_signals, announce=jax.process_index() == 0) as stop:
      for r in records.bar:
        t0 = time.perf_counter()
        stop.round, stop.where, stop.round_started = r + 1, hooks.where(r + 1), t0
        state, metrics = hooks.step(state, r)
        metrics = to_local(metrics)
        check(state, metrics, r)
        record = {"round": r + 1, **to_python(metrics), "round_seconds": time.perf_counter() - t0}
        if r > start:  # the first round of a session includes compilation
          stop.round_seconds = record["round_seconds"]
        state, more = hooks.after(state, r, record, carry)
        records.write([record, *more], r)
        carry["metrics_records"] += 1 + len(more)  # what the checkpoint's resume must find
        done, signum = r + 1, signals.agreed(stop.signum)
        if signum is None and done < rounds:
          # Past this check the run stops after the next round, not this one: a signal during
          # this round's checkpoint (a task's end, with a continual run's end-of-task state) named
          # this round in its message and then stopped after the next.
          stop.round, stop.where, stop.round_started = (
            done + 1,
            hooks.where(done + 1),
            time.perf_counter(),
          )
        carry["wall_seconds"] = wall_before + time.perf_counter() - began
        periodic = every and (done % every == 0 or done == rounds or hooks.boundary(done))
        if run.checkpointer is not None and (periodic or signum is not None):
          run.checkpointer.save(
            done, state, {"rounds": rounds, "where": hooks.where(done), **carry}
          )
        if signum is not None and done < rounds:
          received, where = stop.signum is not None, hooks.where(done)
          raise signals.interrupted(signum, received, done, rounds, run.checkpointer, where)
  finally:
    records.close()
    if run.checkpointer is not None:
      run.checkpointer.close()
  carry["wall_seconds"] = wall_before + time.perf_counter() - began
  return state, carry


def _evaluation(evaluate, test, algorithm, eval_every: int, rounds: int, checkpointer):
  """The FL run's ``after`` hook: the global model's test accuracy and loss every k rounds."""

  def after(state, r, record, carry):
    if test is None or ((r + 1) % eval_every and r + 1 != rounds):
      return state, []
    ev = evaluate(to_local(algorithm.global_variables(state)), *test)
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
    run: files, checkpoints, resume and signals
      (:class:`~fedjax_proj.training.session.RunIO`; None: no files).
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
