"""``tools/behaviour_fingerprint.py --compare``: what counts as behaviour and what does not."""

from __future__ import annotations

import json

import jax.numpy as jnp
import numpy as np

from fedjax_proj.algorithms import losses
from tools import behaviour_fingerprint as bf


def _run_dir(path, summary, metrics, variables):
  path.mkdir()
  (path / "summary.json").write_text(json.dumps(summary))
  (path / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in metrics))
  np.savez(path / "final_variables.npz", **variables)
  return path


def test_compare_ignores_how_a_run_was_managed_but_not_what_it_computed(tmp_path):
  w = {"params/w": np.arange(3, dtype=np.float32)}
  base = _run_dir(
    tmp_path / "a",
    {"acc": 0.5, "wall_seconds": 3.0, "resumed_from_round": 0, "output_dir": "a"},
    [{"round": 1, "test_accuracy": 0.5, "round_seconds": 1.0}],
    w,
  )
  resumed = _run_dir(
    tmp_path / "b",
    {"acc": 0.5, "wall_seconds": 9.0, "resumed_from_round": 3, "output_dir": "b"},
    [{"round": 1, "test_accuracy": 0.5, "round_seconds": 2.0}],
    w,
  )
  assert bf.compare_run(base, resumed) == []
  other = _run_dir(
    tmp_path / "c",
    {"acc": 0.25, "resumed_from_round": 0},
    [{"round": 1, "test_accuracy": 0.5}],
    {"params/w": np.arange(3, dtype=np.float32) + np.float32(1e-7)},
  )
  diffs = bf.compare_run(base, other)
  assert any(d.startswith("summary.json: acc: 0.5 vs 0.25") for d in diffs), diffs
  assert any("final_variables.npz leaf params/w: differs" in d for d in diffs), diffs


def test_compare_reads_every_output_file_and_counts_an_empty_run_as_different(tmp_path):
  a, b, empty = (tmp_path / n for n in ("a", "b", "empty"))
  for d, acc in ((a, 0.5), (b, 0.75)):
    d.mkdir()
    (d / "pilot_iris.json").write_text(json.dumps({"acc": acc, "loss": float("nan")}))
  diffs = bf.compare_run(a, b)
  assert diffs == ["pilot_iris.json: acc: 0.5 vs 0.75"], diffs  # NaN equals NaN: same divergence
  empty.mkdir()
  assert bf.compare_run(empty, empty) != []


def _linalg_norm(x, axis=-1, keepdims=False):
  """The norm before ``losses.l2_norm``: ``jnp.linalg.norm``, whose gradient at a zero row is NaN
  (its callers clamp the norm after it, which does not stop the NaN)."""
  return jnp.linalg.norm(x, axis=axis, keepdims=keepdims)


def test_reverting_the_zero_norm_fix_is_a_behaviour_change(tmp_path, monkeypatch):
  # The training runs never produce an all-zero feature row, so they cannot see this change
  # (docs/methods.md, FedRCL); the edge-case probe must.
  fixed, again, reverted = (tmp_path / n for n in ("fixed", "again", "reverted"))
  bf.write_probe("edge_cases", fixed / "edge_cases")
  bf.write_probe("edge_cases", again / "edge_cases")
  assert bf.compare(fixed, again) == 0
  monkeypatch.setattr(losses, "l2_norm", _linalg_norm)
  bf.write_probe("edge_cases", reverted / "edge_cases")
  assert bf.compare(fixed, reverted) == 1
  diffs = bf.compare_run(fixed / "edge_cases", reverted / "edge_cases")
  for method in ("moon", "fedrcl"):
    assert any(f"leaf {method}/grad: differs" in d for d in diffs), diffs
  assert not any("padding" in d for d in diffs), diffs  # only what the norm reaches changed
  summary = json.loads((reverted / "edge_cases" / "summary.json").read_text())
  assert not summary["moon"]["finite"] and not summary["fedrcl"]["finite"]
  assert json.loads((fixed / "edge_cases" / "summary.json").read_text())["moon"]["finite"]
