"""Continual runs on the round loop: interrupted and resumed, they equal the uninterrupted run.

In process (a tiny multi-head MLP on fake 6x6 MNIST, 2 tasks of 2 rounds): a SIGINT mid-task
(round 3, after task 1's end-of-task pass) and one in the last round of a task (round 2, whose
end-of-task pass then runs before the save) stop the run with a checkpoint; ``resume`` ends with
the same state (FOT's bases, EWC's Fishers, ER's buffer), accuracy matrix, final parameters and
``metrics.jsonl`` (wall-clock fields aside) as a run never stopped: the same program twice, so
exactly equal. The CLI (``experiments/pmnist.py`` under SIGINT and SIGKILL) is
tests/configs/test_continual_cli_resume.py.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import signal

import jax
import numpy as np
import pytest

from fedjax_proj.configs import common  # the entry points' messages
from fedjax_proj.training import checkpoint as ckpt
from fedjax_proj.training.continual import TaskSchedule, train_continual
from fedjax_proj.training.session import RunIO
from fedjax_proj.training.signals import TrainingInterrupted
from tests import helpers

HPARAMS = {"fot": {"eps": 0.9}, "er": {"buffer_per_task": 4}, "ewc": {"lam": 1.0}}
SCHEDULE = TaskSchedule((2, 2), num_clients=4, clients_per_round=2, batch_size=16, iid=False)


@functools.cache
def _setup(method: str):
  """The benchmark, method, compiled round and evaluator, built once per method."""
  return helpers.tiny_continual(method, **HPARAMS[method])


def _run(method: str, out, *, resume=False, stop_at=None, every=0):
  bench, cm, round_fn, evaluate, variables = _setup(method)

  def stopping_round(state, rd, key):  # Ctrl-C arrives while round ``stop_at`` runs
    state, metrics = round_fn(state, rd, key)
    if int(state.round) == stop_at:
      os.kill(os.getpid(), signal.SIGINT)
    return state, metrics

  fp = ckpt.config_fingerprint({"method": method})
  run = RunIO(
    output_dir=out,
    checkpointer=ckpt.Checkpointer(out / "checkpoints", fp, keep=2),
    checkpoint_every=every,  # 0: only the signal's checkpoint (each save costs ~0.1 s)
    resume=resume,
    progress=False,
  )
  return train_continual(cm, stopping_round, bench, evaluate, variables, SCHEDULE, seed=1, run=run)


def _same_state(a, b) -> bool:
  a, b = ckpt._to_storable(a), ckpt._to_storable(b)
  return jax.tree.structure(a) == jax.tree.structure(b) and all(
    x.dtype == y.dtype and np.array_equal(np.asarray(x), np.asarray(y))
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b))
  )


@pytest.mark.parametrize("method", ["fot", "ewc", "er"])
def test_resume_mid_task_and_at_a_task_end_equals_the_uninterrupted_run(method, tmp_path):
  full_state, full = _run(method, tmp_path / "full")
  assert full["resumed_from_round"] == 0
  assert all(v is not None for v in (full["acc_matrix"][0][0], full["acc_matrix"][1][1]))
  for stop_at, where in [(3, "task 2/2, round 1/2 of the task"), (2, "task 1/2, round 2/2")]:
    out = tmp_path / f"cut{stop_at}"
    with pytest.raises(TrainingInterrupted, match=f"stopped after round {stop_at}/4 ") as e:
      _run(method, out, stop_at=stop_at)
    assert where in str(e.value) and e.value.saved
    # What a second Ctrl-C (or a crash) would report as on disk names the task too.
    assert f"checkpoint of round {stop_at} ({where}" in common.on_disk(str(out), [])
    records = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert records[-1].get("task_end") == (0 if stop_at == 2 else None)
    assert not (out / "summary.json").exists()
    # A new run over the stopped one without --resume is refused (it may be a forgotten resume).
    with pytest.raises(ckpt.CheckpointError, match="unfinished run"):
      _run(method, out)
    state, summary = _run(method, out, resume=True)
    assert _same_state(state, full_state)  # the method's bases / Fishers / buffer included
    assert summary["acc_matrix"] == full["acc_matrix"] and summary["acc"] == full["acc"]
    assert summary["resumed_from_round"] == stop_at
    assert ckpt.comparable_metrics(out) == ckpt.comparable_metrics(tmp_path / "full")
    a = ckpt.load_variables(tmp_path / "full" / "final_variables.npz")
    b = ckpt.load_variables(out / "final_variables.npz")
    assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)


def test_resume_rewrites_a_task_end_line_written_after_the_checkpoint(tmp_path):
  """A crash after the checkpoint of round 1 but after round 2 and its task end were logged: the
  task-end line (which has no ``round``) goes with its round, and is not duplicated."""
  _, full = _run("er", tmp_path / "full")
  out = tmp_path / "cut"
  with pytest.raises(TrainingInterrupted):
    _run("er", out, stop_at=2, every=1)
  # The newest checkpoint is round 1, as if the process had died before saving round 2.
  shutil.rmtree(out / "checkpoints" / "2")
  assert '"task_end": 0' in (out / "metrics.jsonl").read_text()
  _, summary = _run("er", out, resume=True, every=1)
  assert summary["acc_matrix"] == full["acc_matrix"]
  assert ckpt.comparable_metrics(out) == ckpt.comparable_metrics(tmp_path / "full")
