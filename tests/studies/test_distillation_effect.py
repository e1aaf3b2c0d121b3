"""studies/distillation_effect/study.py measures the server's distillation without changing the
run."""

from __future__ import annotations

import json

import numpy as np
import pytest

from fedjax_proj.reproduce import resolve, runners
from fedjax_proj.reproduce.claims import CLAIMS
from studies.distillation_effect import study as distillation_effect

CLAIM = "fedproj-cifar10-dir0.3"


def _images(n, classes, seed):
  rng = np.random.default_rng(seed)
  images = rng.integers(0, 255, (n, 32, 32, 3), dtype=np.uint8)
  return {"image": images, "label": (np.arange(n) % classes).astype(np.int64)}


@pytest.fixture(scope="module")
def data_root(tmp_path_factory):
  """The shared data's layout with random pixels; the public set as large as the smoke budget's."""
  root = tmp_path_factory.mktemp("data")
  (root / "cifar10").mkdir()
  (root / "cifar100").mkdir()
  np.savez(root / "cifar10" / "train.npz", **_images(runners.TINY_TRAIN, 10, 0))
  np.savez(root / "cifar10" / "test.npz", **_images(100, 10, 1))
  np.savez(root / "cifar100" / "public_20k.npz", **_images(500, 100, 2))
  return root


def _tiny_config(data_root, **kwargs):
  claim = CLAIMS[CLAIM]
  c = runners.tiny(claim, resolve.resolve_config(claim, "smoke", "feddf", 0, data_root))
  c = resolve.substitute_data(c, data_root)
  c["method_kwargs"] = {**c["method_kwargs"], **kwargs}
  return c


@pytest.mark.compute_bound
def test_instrumented_run_equals_the_plain_run_and_is_written_per_seed(
  data_root, tmp_path, monkeypatch
):
  import ml_collections

  from fedjax_proj.training.experiment import run_experiment

  monkeypatch.setenv("FEDJAX_PROJ_SHARED_DATA", str(data_root))
  out = tmp_path / "effect.json"
  argv = [f"--claim={CLAIM}", "--budget=smoke", "--tiny", "--seeds=0", f"--out={out}"]
  result = distillation_effect.main(argv)
  assert json.loads(out.read_text()) == json.loads(json.dumps(result))
  seed = result["seeds"]["0"]
  plain = ml_collections.ConfigDict(
    {**_tiny_config(data_root), "output_dir": str(tmp_path / "plain"), "progress": False}
  )
  # Same config, same program: the wrapper passes the server step's values through unchanged.
  assert (
    seed["final_test_accuracy"]
    == run_experiment(plain, log=lambda *a, **k: None)["final_test_accuracy"]
  )
  rows = seed["rounds"]
  assert [r["round"] for r in rows] == [1, 2] and result["pooled"]["rounds"] == 2
  for r in rows:
    assert all(0.0 <= r[k] <= 1.0 for k in ("before", "after", "teacher", "clients"))
    assert r["gain"] == pytest.approx(r["after"] - r["before"])
  assert distillation_effect.main([f"--summarize={out}"]) == json.loads(out.read_text())


@pytest.mark.compute_bound
def test_without_distillation_the_gain_is_zero(data_root):
  rows = distillation_effect.diagnose(
    _tiny_config(data_root, distill_epochs=0), log=lambda *a, **k: None
  )["rounds"]
  # No distillation epoch leaves the average as it is; at most one of the 100 test images may
  # flip between the server's jitted average and the diagnostic's own (another float order).
  assert all(abs(r["gain"]) <= 0.01 for r in rows), rows


def test_methods_without_a_distillation_server_are_refused(data_root):
  with pytest.raises(ValueError, match="choose one of"):
    distillation_effect.diagnose({**_tiny_config(data_root), "method": "fedavg"})


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
