"""benchmarks/distillation_effect.py measures the server's distillation without changing the run."""

from __future__ import annotations

import numpy as np
import pytest

from benchmarks import distillation_effect
from fedjax_proj.reproduce import run
from fedjax_proj.reproduce.claims import CLAIMS


def _images(n, classes, seed):
  rng = np.random.default_rng(seed)
  images = rng.integers(0, 255, (n, 32, 32, 3), dtype=np.uint8)
  return {"image": images, "label": (np.arange(n) % classes).astype(np.int64)}


@pytest.fixture(scope="module")
def config(tmp_path_factory):
  root = tmp_path_factory.mktemp("data")
  for name, n, classes, seed in (("cifar10", run.TINY_TRAIN, 10, 0), ("cifar100", 128, 100, 2)):
    (root / name).mkdir()
    files = {"train.npz": n} if name == "cifar10" else {"public_20k.npz": n}
    for file, size in files.items():
      np.savez(root / name / file, **_images(size, classes, seed))
  np.savez(root / "cifar10" / "test.npz", **_images(100, 10, 1))
  claim = CLAIMS["fedproj-cifar10-dir0.3"]
  c = run.tiny(claim, run.resolve_config(claim, "cpu", "feddf", 0, root))
  c = run.substitute_data(c, root)
  c.update(public_size=128, memory_size=128)
  return c


def test_instrumented_run_equals_the_plain_run_and_reports_every_round(config, tmp_path):
  import ml_collections

  from fedjax_proj.training.experiment import run_experiment

  result = distillation_effect.diagnose(config, log=lambda *a, **k: None)
  plain = ml_collections.ConfigDict({**config, "output_dir": str(tmp_path), "progress": False})
  assert (
    result["final_test_accuracy"]
    == run_experiment(plain, log=lambda *a, **k: None)["final_test_accuracy"]
  )
  rows = result["rounds"]
  assert [r["round"] for r in rows] == list(range(1, config["rounds"] + 1))
  for r in rows:
    assert all(0.0 <= r[k] <= 1.0 for k in ("before", "after", "teacher", "clients"))
    assert r["gain"] == pytest.approx(r["after"] - r["before"])


def test_without_distillation_the_gain_is_zero(config):
  c = {**config, "method_kwargs": {**config["method_kwargs"], "distill_epochs": 0}}
  rows = distillation_effect.diagnose(c, log=lambda *a, **k: None)["rounds"]
  # No distillation epoch leaves the average as it is; at most one of the 100 test images may
  # flip between the server's jitted average and the diagnostic's own (another float order).
  assert all(abs(r["gain"]) <= 0.01 for r in rows), rows


def test_methods_without_a_distillation_server_are_refused(config):
  with pytest.raises(ValueError, match="choose one of"):
    distillation_effect.diagnose({**config, "method": "fedavg"})


def test_summary_counts_gains_teacher_leads_and_distances():
  rows = [  # distillation moves towards the teacher, up where it leads, down where it trails
    {"before": 0.40, "after": 0.44, "teacher": 0.45, "clients": 0.30},
    {"before": 0.50, "after": 0.42, "teacher": 0.40, "clients": 0.30},
    {"before": 0.30, "after": 0.30, "teacher": 0.35, "clients": 0.20},
  ]
  s = distillation_effect.summarize(rows)
  assert s["rounds"] == 3 and s["rounds_gain_positive"] == 1
  assert s["mean_gain"] == pytest.approx((0.04 - 0.08 + 0.0) / 3)
  assert s["rounds_teacher_above_before"] == 2
  assert s["mean_teacher_minus_before"] == pytest.approx((0.05 - 0.10 + 0.05) / 3)
  assert s["mean_distance_to_teacher_before"] == pytest.approx((0.05 + 0.10 + 0.05) / 3)
  assert s["mean_distance_to_teacher_after"] == pytest.approx((0.01 + 0.02 + 0.05) / 3)
  assert (s["rounds_gain_sign_is_teacher_lead_sign"], s["rounds_with_both_signs"]) == (2, 2)
  assert s["mean_clients"] == pytest.approx(0.8 / 3)
