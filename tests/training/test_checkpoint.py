"""Checkpointer: exact round trip, keep-n, corrupt or incomplete ones skipped, foreign ones refused.

Also the in-process resume path of :func:`fedjax_proj.training.loop.train`: a SIGINT delivered
mid-run stops after the running round, saves, and a resumed run ends with the same parameters and
the same metrics file (wall-clock fields aside) as an uninterrupted run.
"""

from __future__ import annotations

import functools
import json
import os
import signal
from contextlib import nullcontext
from pathlib import Path
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fedjax_proj
from fedjax_proj.algorithms.base import make_round
from fedjax_proj.algorithms.fedavg import fedavg
from fedjax_proj.data.federated import FederatedData
from fedjax_proj.training import checkpoint as ckpt
from fedjax_proj.training.loop import train
from fedjax_proj.training.metrics import read_metrics
from fedjax_proj.training.session import RunIO
from fedjax_proj.training.signals import TrainingInterrupted
from tests import helpers


class State(NamedTuple):
  params: dict
  clients: jax.Array  # stacked per-client state
  key: jax.Array  # a typed PRNG key: stored as key data, re-wrapped on restore
  round: jax.Array


def _state(value: float) -> State:
  return State(
    {"w": jnp.full((3, 2), value, jnp.float32), "b": jnp.arange(2, dtype=jnp.int32)},
    jnp.full((4, 5), value * 2, jnp.bfloat16),
    jax.random.key(int(value)),
    jnp.asarray(int(value), jnp.int32),
  )


FP = ckpt.config_fingerprint({"method": "fedavg", "lr": 0.1, "output_dir": "/x", "progress": True})


def _same(a, b) -> bool:
  a, b = ckpt._to_storable(a), ckpt._to_storable(b)
  return jax.tree.structure(a) == jax.tree.structure(b) and all(
    x.dtype == y.dtype and np.array_equal(np.asarray(x), np.asarray(y))
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b))
  )


def test_round_trip_is_exact_and_keeps_last_n(tmp_path):
  c = ckpt.Checkpointer(tmp_path / "ck", FP, keep=2)
  for r in (1, 2, 3):
    c.save(r, _state(r + 0.5), {"last_eval": {"accuracy": r / 10}})
  assert c.steps() == [2, 3]
  template = _state(0.0)
  state, meta = c.restore_latest(template)
  c.close()
  assert isinstance(state, State)
  assert _same(state, _state(3.5))
  assert not _same(state, template)
  assert meta["round"] == 3 and meta["last_eval"] == {"accuracy": 0.3}
  assert jax.dtypes.issubdtype(state.key.dtype, jax.dtypes.prng_key)


def test_empty_directory_restores_nothing(tmp_path):
  assert ckpt.Checkpointer(tmp_path / "none", FP).restore_latest(_state(0.0)) is None


def _largest_file(step_dir: Path) -> Path:
  files = [p for p in step_dir.rglob("*") if p.is_file() and p.name != ckpt.MANIFEST]
  return max(files, key=lambda p: p.stat().st_size)


@pytest.mark.parametrize("damage", ["truncate", "no_manifest"])
def test_corrupt_latest_falls_back_to_previous_with_warning(tmp_path, damage):
  c = ckpt.Checkpointer(tmp_path / "ck", FP, keep=3)
  c.save(1, _state(1.0))
  c.save(2, _state(2.0))
  c.close()
  step2 = tmp_path / "ck" / "2"
  if damage == "truncate":  # a crash/disk error leaves a short file
    victim = _largest_file(step2)
    victim.write_bytes(victim.read_bytes()[: victim.stat().st_size // 2])
  else:  # a crash after orbax committed but before our manifest was written
    (step2 / ckpt.MANIFEST).unlink()
  c = ckpt.Checkpointer(tmp_path / "ck", FP, keep=3)
  with pytest.warns(RuntimeWarning, match="round 2 .* corrupt or incomplete"):
    state, meta = c.restore_latest(_state(0.0))
  assert meta["round"] == 1 and _same(state, _state(1.0))
  assert c.steps() == [1]  # the bad one is moved aside, not deleted
  assert any(p.name.startswith("corrupt-2-") for p in (tmp_path / "ck").iterdir())
  c.save(2, _state(5.0))  # the run can save round 2 again
  assert _same(c.restore_latest(_state(0.0))[0], _state(5.0))
  c.close()


def test_leftover_temporary_directory_of_a_crashed_save_is_ignored(tmp_path):
  c = ckpt.Checkpointer(tmp_path / "ck", FP)
  c.save(1, _state(1.0))
  c.close()
  junk = tmp_path / "ck" / "2.orbax-checkpoint-tmp-123"
  junk.mkdir()
  (junk / "partial").write_bytes(b"\0" * 10)
  state, meta = ckpt.Checkpointer(tmp_path / "ck", FP).restore_latest(_state(0.0))
  assert meta["round"] == 1 and _same(state, _state(1.0))


def test_other_config_or_version_is_refused(tmp_path, monkeypatch):
  ckpt.Checkpointer(tmp_path / "ck", FP).save(1, _state(1.0))
  # Non-semantic fields (output dir, progress...) do not matter.
  same = ckpt.config_fingerprint({"method": "fedavg", "lr": 0.1, "output_dir": "/y"})
  assert same["hash"] == FP["hash"]
  other = ckpt.config_fingerprint({"method": "fedavg", "lr": 0.2, "output_dir": "/x"})
  with pytest.raises(ckpt.CheckpointError, match=r"another config \(lr: 0.1 -> 0.2\)"):
    ckpt.Checkpointer(tmp_path / "ck", other).restore_latest(_state(0.0))
  monkeypatch.setattr(fedjax_proj, "__version__", "9.9.9")
  with pytest.raises(ckpt.CheckpointError, match="written by fedjax_proj 0.1.0, this is 9.9.9"):
    ckpt.Checkpointer(tmp_path / "ck", FP).restore_latest(_state(0.0))


def test_truncate_and_compare_metrics(tmp_path):
  path = tmp_path / "metrics.jsonl"
  lines = [
    f'{{"round": {r}, "round_seconds": {r * 0.1}, "train_loss": {1 / r}}}\n' for r in (1, 2, 3)
  ]
  path.write_text("".join(lines))
  ckpt.truncate_metrics(path, 2)
  assert path.read_text() == "".join(lines[:2])
  other = tmp_path / "other.jsonl"
  other.write_text(
    "".join(x.replace('"round_seconds": 0.', '"round_seconds": 9.') for x in lines[:2])
  )
  assert other.read_text() != path.read_text()
  assert ckpt.comparable_metrics(other) == ckpt.comparable_metrics(path)


@functools.cache
def _setup():
  # One algorithm and compiled round shared by every run below: compiled once, not per run.
  x, y = helpers.synthetic_data(96)
  fed = FederatedData(helpers.unequal_clients(96, (10, 20, 30, 20)), batch_size=8)
  model = helpers.tiny_model()
  alg = fedavg(model, helpers.sgd(0.1))
  variables = model.init(jax.random.key(0), x[:2])
  return x, y, fed, alg, make_round(alg, "vmap_scan", helpers.float_batch_fn()), variables


def _tiny_run(out: Path, rounds: int, *, resume=False, stop_at=None, every=2, keep=2):
  x, y, fed, alg, round_fn, variables = _setup()

  def extra_metrics(state):
    # Deliver Ctrl-C during a round (the subprocess test in test_resume.py sends SIGTERM).
    if stop_at is not None and int(state.round) == stop_at:
      os.kill(os.getpid(), signal.SIGINT)
    return {}

  fp = ckpt.config_fingerprint({"lr": 0.1, "rounds": rounds})
  return train(
    alg,
    round_fn,
    fed,
    (x, y),
    None,
    None,
    variables,
    rounds=rounds,
    clients_per_round=2,
    seed=3,
    extra_metrics=extra_metrics,
    run=RunIO(
      output_dir=out,
      checkpointer=ckpt.Checkpointer(out / "checkpoints", fp, keep=keep),
      checkpoint_every=every,
      resume=resume,
      progress=False,
    ),
  )


def test_in_process_sigint_and_resume_match_an_uninterrupted_run(tmp_path):
  full, _ = _tiny_run(tmp_path / "full", 7)
  with pytest.raises(TrainingInterrupted, match="SIGINT received: stopped after round 3/7") as e:
    _tiny_run(tmp_path / "cut", 7, stop_at=3)
  assert e.value.saved and e.value.signum == signal.SIGINT
  assert [r["round"] for r in read_metrics(tmp_path / "cut")] == [1, 2, 3]
  assert ckpt.Checkpointer(tmp_path / "cut" / "checkpoints", FP).steps() == [2, 3]
  # Starting over an interrupted run without --resume is refused.
  with pytest.raises(ckpt.CheckpointError, match="unfinished run .* pass --resume"):
    _tiny_run(tmp_path / "cut", 7)
  resumed, summary = _tiny_run(tmp_path / "cut", 7, resume=True)
  assert summary["resumed_from_round"] == 3
  assert _same(resumed, full)
  assert ckpt.comparable_metrics(tmp_path / "cut") == ckpt.comparable_metrics(tmp_path / "full")
  a = ckpt.load_variables(tmp_path / "full" / "final_variables.npz")
  b = ckpt.load_variables(tmp_path / "cut" / "final_variables.npz")
  assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)


def test_first_signal_sets_a_flag_second_aborts_and_handlers_are_restored():
  from fedjax_proj.training.signals import StopOnSignal

  before = signal.getsignal(signal.SIGTERM)
  with StopOnSignal(True) as stop:
    os.kill(os.getpid(), signal.SIGTERM)
    assert stop.signum == signal.SIGTERM  # the round in progress is allowed to finish
    with pytest.raises(KeyboardInterrupt, match="aborting without saving"):
      os.kill(os.getpid(), signal.SIGINT)
  assert signal.getsignal(signal.SIGTERM) is before


def test_zero_size_leaves_round_trip(tmp_path):
  """FedDF/FedET carry an empty memory buffer; orbax cannot store zero-size arrays directly."""
  import jax.numpy as jnp

  from fedjax_proj.training.checkpoint import Checkpointer, config_fingerprint

  state = {
    "w": jnp.arange(3.0),
    "memory_idx": jnp.zeros((0,), jnp.int32),
    "memory_logits": jnp.zeros((0, 10), jnp.float32),
  }
  ck = Checkpointer(tmp_path / "ck", config_fingerprint({"a": 1}))
  ck.save(1, state, {})
  restored, _ = ck.restore_latest(state)
  assert restored["memory_idx"].shape == (0,) and restored["memory_logits"].shape == (0, 10)
  assert restored["w"].tolist() == [0.0, 1.0, 2.0]
  ck.close()


def test_resume_after_a_torn_last_metrics_line_drops_it_says_so_and_matches(tmp_path, capfd):
  """A crash or a full disk mid-line leaves a torn last line in metrics.jsonl: --resume drops it
  (and every line after the checkpoint), says so, and ends equal to an uninterrupted run."""
  full, _ = _tiny_run(tmp_path / "full", 5)
  cut = tmp_path / "cut"
  with pytest.raises(TrainingInterrupted):
    _tiny_run(cut, 5, stop_at=2)  # checkpoint of round 2 on disk
  path = cut / "metrics.jsonl"
  line3 = json.dumps({"round": 3, "round_seconds": 0.1, "train_loss": 0.5}) + "\n"
  path.write_text(path.read_text() + line3 + line3[:17])  # round 3 intact, round 4 torn
  with pytest.warns(UserWarning, match="torn last line"):
    assert [r["round"] for r in read_metrics(cut)] == [1, 2, 3]  # readers skip it (plot)
  capfd.readouterr()
  resumed, _ = _tiny_run(cut, 5, resume=True)
  err = capfd.readouterr().err
  assert f"{path}: dropped its torn last line (17 bytes" in err
  assert "checkpoint of round 2" in err
  assert _same(resumed, full)
  assert ckpt.comparable_metrics(cut) == ckpt.comparable_metrics(tmp_path / "full")


def _files(directory: Path) -> dict[str, bytes]:
  return {
    str(p.relative_to(directory)): p.read_bytes() for p in directory.rglob("*") if p.is_file()
  }


@pytest.mark.parametrize("every", [1, 2])
@pytest.mark.parametrize("damage", ["torn_before", "torn_at", "torn_after", "deleted"])
def test_resume_never_loses_a_record_torn_or_deleted_around_the_checkpoint(
  tmp_path, capfd, every, damage
):
  """A crash can tear the last line of metrics.jsonl in any round, or the file can be lost. The
  newest checkpoint is at round 3 (checkpoints: every=1 -> 1, 2, 3; every=2 -> 2, 3). A resume
  either ends equal to the uninterrupted run, from the newest checkpoint the records back, or is
  refused before any compute with every file as it was."""
  full, _ = _tiny_run(tmp_path / "full", 5)
  cut = tmp_path / "cut"
  with pytest.raises(TrainingInterrupted):
    _tiny_run(cut, 5, stop_at=3, every=every, keep=3)
  assert ckpt.Checkpointer(cut / "checkpoints", FP).steps() == [1, 2, 3][every - 1 :]
  path = cut / "metrics.jsonl"
  lines = path.read_text().splitlines(keepends=True)
  line4 = json.dumps({"round": 4, "round_seconds": 0.1, "train_loss": 0.5}) + "\n"
  if damage == "deleted":
    path.unlink()
  else:  # the torn line is the record of round 2 (before), 3 (at) or 4 (after the checkpoint)
    torn_round = {"torn_before": 2, "torn_at": 3, "torn_after": 4}[damage]
    path.write_text(
      "".join((lines + [line4])[: torn_round - 1]) + (lines + [line4])[torn_round - 1][:15]
    )
  # The newest checkpoint the records back: none if it would be older than the oldest kept.
  expected_start = {"torn_before": 1, "torn_at": 2, "torn_after": 3, "deleted": 0}[damage]
  if every == 2 and expected_start == 1:
    expected_start = 0
  capfd.readouterr()
  if expected_start == 0:
    before = _files(cut)
    with pytest.raises(ckpt.CheckpointError, match="can be continued.*--overwrite") as e:
      _tiny_run(cut, 5, resume=True, every=every, keep=3)
    assert "metrics.jsonl" in str(e.value)
    assert _files(cut) == before  # refused before any compute: nothing moved, cut or written
    return
  moved_aside = expected_start < 3  # the newer checkpoints move aside with a warning
  with pytest.warns(RuntimeWarning, match="cannot be continued") if moved_aside else nullcontext():
    resumed, summary = _tiny_run(cut, 5, resume=True, every=every, keep=3)
  assert summary["resumed_from_round"] == expected_start
  assert f"resuming from the checkpoint of round {expected_start}" in capfd.readouterr().err
  assert _same(resumed, full)
  assert ckpt.comparable_metrics(cut) == ckpt.comparable_metrics(tmp_path / "full")
  if moved_aside:  # kept aside, not deleted
    assert any(p.name.startswith("unrecorded-3-") for p in (cut / "checkpoints").iterdir())


def test_a_lost_task_end_line_is_caught_by_the_checkpoints_record_count(tmp_path):
  """A continual run's task-end line has no round of its own: the count of records written up to
  a checkpoint (its metadata) is what shows it lost."""
  rounds = [1, 2, 2, 3]  # round 2 ended a task: a second line in round 2
  path = tmp_path / "metrics.jsonl"
  assert ckpt.unrecorded(rounds, {"round": 2, "metrics_records": 3}, path) is None
  assert ckpt.unrecorded(rounds[:2], {"round": 2, "metrics_records": 3}, path) == (
    f"{path} holds 2 of the 3 records written up to round 2"
  )
  assert ckpt.unrecorded(rounds[:2], {"round": 2}, path) is None  # older checkpoints: rounds only
  assert "lacks the records of rounds 2-3" in ckpt.unrecorded([1], {"round": 3}, path)
  assert "is missing" in ckpt.unrecorded(None, {"round": 1}, path)


def test_resume_with_every_checkpoint_unreadable_is_refused(tmp_path):
  cut = tmp_path / "cut"
  with pytest.raises(TrainingInterrupted):
    _tiny_run(cut, 5, stop_at=3)
  steps = ckpt.Checkpointer(cut / "checkpoints", FP).steps()
  for step in steps:
    (cut / "checkpoints" / str(step) / ckpt.MANIFEST).write_text("{")
  metrics = (cut / "metrics.jsonl").read_text()
  with (
    pytest.warns(RuntimeWarning, match="corrupt or incomplete"),
    pytest.raises(ckpt.CheckpointError, match=r"Every checkpoint .* is unreadable.*--overwrite"),
  ):
    _tiny_run(cut, 5, resume=True)
  assert (cut / "metrics.jsonl").read_text() == metrics  # no round ran


def test_an_unreadable_line_before_the_last_is_an_error_naming_file_and_line(tmp_path):
  path = tmp_path / "metrics.jsonl"
  path.write_text('{"round": 1}\n{"round": 2, "tra\n{"round": 3}\n')
  with pytest.raises(ValueError, match=r"metrics.jsonl, line 2, is not a JSON object"):
    ckpt.truncate_metrics(path, 1)


def test_progress_into_a_log_writes_one_clean_line_per_round(capfd):
  """With stdout/stderr not a terminal the progress bar is off: no carriage-return frames, one
  plain line per round instead."""
  x, y, fed, alg, round_fn, variables = _setup()
  train(alg, round_fn, fed, (x, y), None, None, variables, rounds=3, clients_per_round=2, seed=0)
  out, err = capfd.readouterr()
  assert "\r" not in out + err and "round/s" not in out + err
  assert [line.split("  ")[0] for line in out.splitlines()] == [
    "round 1/3",
    "round 2/3",
    "round 3/3",
  ]
