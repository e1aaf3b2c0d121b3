"""benchmarks/accuracy/accuracy_cifar10.py's two settings, and its former name
accuracy_sequential.py, build the configs they document (no training: run_experiment is replaced
by a recorder)."""

from __future__ import annotations

import json

import pytest

from benchmarks.accuracy import accuracy_cifar10, accuracy_sequential


@pytest.fixture
def recorded(monkeypatch, tmp_path):
  """The configs the benchmark would run, with their data folder faked."""
  configs = []

  def run(config):
    configs.append(config)
    return {"final_test_accuracy": 0.5, "wall_seconds": 1.0, "strategy": "vmap_scan"}

  monkeypatch.setattr(accuracy_cifar10, "run_experiment", run)
  (tmp_path / "cifar10").mkdir()
  monkeypatch.setattr(accuracy_cifar10, "find_shared_data", lambda: tmp_path)
  monkeypatch.chdir(tmp_path)
  return configs


def test_drift_setting_defaults_and_overrides(recorded, tmp_path):
  out = tmp_path / "drift.json"
  assert accuracy_cifar10.main(["--methods=fedavg,moon", "--rounds=3", f"--out={out}"]) == 0
  fedavg, moon = recorded
  assert (fedavg.partition, fedavg.momentum, fedavg.clients_per_round) == ("dirichlet:0.3", 0.9, 5)
  assert fedavg.rounds == 3 and fedavg.train_subset == 10000  # the flag wins, the rest is drift's
  assert moon.method_kwargs.mu == 5.0 and "mu" not in fedavg.method_kwargs
  result = json.loads(out.read_text())
  assert result["benchmark"] == "accuracy_cifar10" and result["table"]["moon"]["mean"] == 50.0


def test_sequential_setting_and_its_former_name(recorded, tmp_path):
  out = tmp_path / "seq.json"
  argv = ["--methods=fedseq,sfedkd", "--method_kwargs=sfedkd:beta=2", f"--out={out}"]
  assert accuracy_cifar10.main(["--setting=sequential", *argv]) == 0
  assert accuracy_sequential.main(["--num_teachers=3", *argv]) == 0
  fedseq, sfedkd, fedseq_again, sfedkd_again = recorded
  assert (fedseq.partition, fedseq.momentum, fedseq.rounds) == ("exdir:2:0.5", 0.0, 8)
  assert (fedseq.clients_per_round, fedseq.train_subset) == (10, 6000)
  assert dict(sfedkd.method_kwargs) == {"num_teachers": 5, "beta": 2}
  assert dict(sfedkd_again.method_kwargs) == {"num_teachers": 3, "beta": 2}
  assert fedseq_again.to_dict() == fedseq.to_dict()
  assert json.loads(out.read_text())["benchmark"] == "accuracy_sequential"
