"""studies/head_effect/study.py runs the claim's FedAvg on FedGKD+'s network and nothing else, and
its contrasts are the paired differences they name."""

from __future__ import annotations

import json

import numpy as np
import pytest

from fedjax_proj.algorithms import moon
from fedjax_proj.reproduce import protocol, resolve
from fedjax_proj.reproduce.claims import CLAIMS
from studies.head_effect import study


def test_the_fourth_cell_is_the_claims_fedavg_on_fedgkd_plus_network(tmp_path):
  claim = CLAIMS[study.CLAIM]
  config = study.head_config(claim, 1003, tmp_path)
  fedavg = resolve.resolve_config(claim, study.BUDGET, "fedavg", 1003, tmp_path)
  plus = resolve.resolve_config(claim, study.BUDGET, "fedgkd_plus", 1003, tmp_path)
  assert config["method"] == "fedavg" and config["seed"] == 1003
  assert config["model_kwargs"] == plus["model_kwargs"] == moon.MODEL_KWARGS
  assert fedavg.get("model_kwargs", {}) != config["model_kwargs"]
  assert {k: v for k, v in config.items() if k != "model_kwargs"} == {
    k: v for k, v in fedavg.items() if k != "model_kwargs"
  }


def _curve(rng):
  return [{"round": r + 1, "test_accuracy": float(a)} for r, a in enumerate(rng.random(8) * 0.4)]


def _write_result(results, method, seed, curve):
  """A claim result as the claim runner writes it (records.check_result accepts it)."""
  r = {"claim": study.CLAIM, "budget": study.BUDGET, "method": method, "seed": seed}
  r |= {"metrics": {"test_accuracy": 100 * curve[-1]["test_accuracy"]}, "curve": curve}
  r |= {"config": {}, "git_commit": "c", "code": {"git_commit": "c", "fingerprint": "f"}}
  (results / f"{method}-seed{seed}.json").write_text(json.dumps(r))


def test_the_contrasts_pair_every_seed_and_decompose_fedgkd_plus_minus_fedavg(tmp_path):
  rng = np.random.default_rng(0)
  results, folder = tmp_path / "claim", tmp_path / "study"
  results.mkdir()
  folder.mkdir()
  seeds = [1000, 1001, 1002, 1004]
  curves = {}
  for seed in seeds:
    curves[study.HEAD, seed] = _curve(rng)
    run = {"seed": seed, "late": protocol.late_mean(curves[study.HEAD, seed])}
    (folder / f"seed{seed}.json").write_text(json.dumps({**run, "git_commit": "c", "code": "f"}))
    for method in ("fedavg", "fedgkd", "fedgkd_plus", "moon"):
      curves[method, seed] = _curve(rng)
      _write_result(results, method, seed, curves[method, seed])
  # A seed the study has not run is not paired, though the claim holds it.
  _write_result(results, "fedavg", 1003, _curve(rng))

  out = study.summarize(folder, results)

  def late(method):
    return np.array(
      [100 * np.mean([c["test_accuracy"] for c in curves[method, s][-3:]]) for s in seeds]
    )

  assert out["seeds"] == seeds
  assert out["sources"] == {m: [["c", "f"]] for m in (study.HEAD, *study.RECORDED)}
  rows = {r["contrast"]: r for r in out["contrasts"]}
  for name, better, worse in study.CONTRASTS:
    d = late(better) - late(worse)
    assert rows[name]["n"] == len(seeds)
    assert rows[name]["mean"] == pytest.approx(d.mean())
    assert rows[name]["std"] == pytest.approx(d.std(ddof=1))
    assert rows[name]["wins"] == int((d > 0).sum())
  total = rows["FedGKD+ - FedAvg (the claim's ordering)"]["mean"]
  parts = rows["distillation on MOON's network"]["mean"] + rows["head under FedAvg"]["mean"]
  assert total == pytest.approx(parts)
  assert json.loads((folder / "summary.json").read_text())["contrasts"] == out["contrasts"]


def test_it_runs_the_claims_declared_seeds_and_refuses_seeds_the_claim_lacks(tmp_path, monkeypatch):
  assert study.declared_seeds(CLAIMS[study.CLAIM]) == list(range(1000, 1020))
  rng = np.random.default_rng(1)
  for method in study.RECORDED:
    _write_result(tmp_path, method, 1000, _curve(rng))
  (tmp_path / "fedavg-seed1001.json").write_text("{}")  # corrupt: not a result the claim holds
  trained = []
  monkeypatch.setattr(study, "run_seed", lambda *a: trained.append(a))
  with pytest.raises(SystemExit, match="fedavg-seed1001.json"):
    study.main(["--seeds=1000,1001", f"--results={tmp_path}", f"--out={tmp_path / 'out'}"])
  assert not trained
