"""A claim run stopped after a checkpoint continues from it and equals an uninterrupted run.

The runs go through run.run_one and the image runner on tiny data (tests/reproduce/conftest.py),
the path every image and text claim takes; that the round loop itself continues bit-exactly is
tests/training/test_resume.py's.
"""

from __future__ import annotations

import json

import pytest

from fedjax_proj.reproduce import __main__ as cli
from fedjax_proj.reproduce import provenance, records, resolve, run, runners
from fedjax_proj.reproduce.claims import CLAIMS
from fedjax_proj.training.checkpoint import Checkpointer

CLAIM = CLAIMS["fedgkd-cifar10"]


def _config(data_root):
  config = runners.tiny(CLAIM, resolve.resolve_config(CLAIM, "cpu", "fedavg", 0, data_root))
  config["rounds"] = 3  # a checkpoint every round (runners._run_image): stop after 1, continue
  # What is tested is the runner's part (keep, continue, record); an MLP compiles in a fraction of
  # the CNN's time.
  config.update(model="mlp", model_kwargs={})
  return config


def _run(config, results, data_root):
  return run.run_one(
    CLAIM, "cpu", "fedavg", 0, results=results, data_root=data_root, config=config, log=print
  )


def _crash_after_saving(round_idx):
  save = Checkpointer.save

  def saving_then_crashing(self, r, state, meta=None):
    path = save(self, r, state, meta)
    if r == round_idx:
      raise RuntimeError(f"simulated crash after the checkpoint of round {r}")
    return path

  return saving_then_crashing


def _without_wall_clock(curve):
  return [{k: v for k, v in row.items() if k != "round_seconds"} for row in curve]


def test_a_stopped_claim_run_continues_and_equals_an_uninterrupted_one(
  data_root, tmp_path, monkeypatch, capsys
):
  config = _config(data_root)
  whole = _run(config, tmp_path / "whole", data_root)
  assert "resumed_from_round" not in whole
  assert [row["round"] for row in whole["curve"]] == [1, 2, 3]

  results = tmp_path / "stopped"
  with monkeypatch.context() as m:
    m.setattr(Checkpointer, "save", _crash_after_saving(1))
    with pytest.raises(RuntimeError, match="simulated crash"):
      _run(config, results, data_root)
  path = records.result_path(results, CLAIM.name, "cpu", "fedavg", 0)
  work = path.with_suffix(".work")
  assert not path.exists()
  record = json.loads((work / records.RESUME_RECORD).read_text())
  assert record["sessions"] == 1 and record["seconds"] > 0
  fp, code = resolve.fingerprint(config), provenance.code_fingerprint()
  assert records.resumable(work, CLAIM, fp, code)[0]["round"] == 1
  # Another config or other code: never spliced onto this checkpoint, the run starts afresh.
  assert "another config" in records.resumable(work, CLAIM, "0" * 16, code)[1]
  assert "other code" in records.resumable(work, CLAIM, fp, "0" * 16)[1]

  capsys.readouterr()
  resumed = _run(config, results, data_root)
  assert "from its checkpoint after round 1" in capsys.readouterr().out
  assert resumed["resumed_from_round"] == 1
  assert resumed["wall_seconds"] >= record["seconds"]
  assert resumed["metrics"] == whole["metrics"]
  assert _without_wall_clock(resumed["curve"]) == _without_wall_clock(whole["curve"])
  assert not work.exists()  # a finished run leaves only its result


def test_a_work_folder_of_other_code_is_cleared_not_continued(
  data_root, tmp_path, monkeypatch, capsys
):
  config = _config(data_root)
  path = records.result_path(tmp_path, CLAIM.name, "cpu", "fedavg", 0)
  work = path.with_suffix(".work")
  (work / "checkpoints" / "2").mkdir(parents=True)  # as a stopped attempt of other code left it
  stale = {
    "fingerprint": resolve.fingerprint(config),
    "code": "0" * 16,
    "seconds": 9e9,
    "sessions": 1,
  }
  (work / records.RESUME_RECORD).write_text(json.dumps(stale))
  seen = []

  def runner(claim, config, work, log):
    seen.append((bool(config.get("resume")), (work / "checkpoints").exists()))
    return {"test_accuracy": 10.0, "best_test_accuracy": 10.0}, [{"round": 1}]

  monkeypatch.setitem(runners.RUNNERS, "image", runner)
  result = _run(config, tmp_path, data_root)
  assert seen == [(False, False)]  # started afresh, in a cleared folder
  assert "not continued, its checkpoints are of other code" in capsys.readouterr().out
  assert "resumed_from_round" not in result and result["wall_seconds"] < 9e9


def test_the_queue_line_counts_the_runs_that_continue(data_root, tmp_path, capsys):
  """A work folder with a checkpoint and the record of this config and code is announced as
  continuing; one of other code is not."""
  args = ["fedgkd-cifar10", "--budget=smoke", "--methods=fedavg", "--seeds=0,1"]
  args += [f"--results={tmp_path}", f"--data={data_root}", "--no_run"]
  code = provenance.code_fingerprint()
  for seed, code_fp in ((0, code), (1, "0" * 16)):
    config = resolve.resolve_config(CLAIM, "smoke", "fedavg", seed, data_root)
    work = records.result_path(tmp_path, CLAIM.name, "smoke", "fedavg", seed).with_suffix(".work")
    (work / "checkpoints" / "1").mkdir(parents=True)
    record = {"fingerprint": resolve.fingerprint(config), "code": code_fp, "seconds": 1.0}
    (work / records.RESUME_RECORD).write_text(json.dumps(record | {"sessions": 1}))
  capsys.readouterr()
  assert cli.main(args) == 0
  assert "2 to run (1 continuing from a checkpoint)" in capsys.readouterr().out
