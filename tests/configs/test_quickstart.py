"""experiments/quickstart.py, the README's main command: FedAvg vs FedProj on scikit-learn's
digits with no data folder, and an unlabelled public set; a Ctrl-C before round 1 says so."""

from __future__ import annotations

import json

import numpy as np

from fedjax_proj.configs import common, quickstart


def test_quickstart_runs_both_methods_and_plots(tmp_path, capsys):
  assert quickstart.main([f"--output_dir={tmp_path}", "--rounds=2"]) == 0
  out = capsys.readouterr().out
  assert "summary" in out and f"{tmp_path / 'curves.png'}" in out
  assert (tmp_path / "curves.png").read_bytes()[:4] == b"\x89PNG"
  for method in quickstart.METHODS:
    summary = json.loads((tmp_path / method / "summary.json").read_text())
    assert summary["method"] == method and summary["rounds"] == 2
    assert 0.0 <= summary["final_test_accuracy"] <= 1.0
  with np.load(tmp_path / quickstart.PUBLIC_FILE) as public:
    assert public.files == ["image"]  # unlabelled, and accepted as the public set
  fedproj = [json.loads(x) for x in (tmp_path / "fedproj/metrics.jsonl").read_text().splitlines()]
  assert "lmem_global" in fedproj[-1]


def test_ctrl_c_before_round_one_is_not_called_a_second_interrupt(tmp_path, monkeypatch, capsys):
  from fedjax_proj.training import experiment

  def interrupted(config):
    raise KeyboardInterrupt

  monkeypatch.setattr(experiment, "run_experiment", interrupted)
  code = common.main(
    ["--dataset=digits", "--preset=smoke", f"--output_dir={tmp_path / 'run'}"],
    "test",
    lambda preset: common_config(),
    {},
  )
  err = capsys.readouterr().err
  assert code == 130
  assert "aborted before round 1" in err and "second" not in err
  assert "nothing was written" in err


def common_config():
  from fedjax_proj.training.config import base_config

  c = base_config()
  c.model = "mlp"
  return c
