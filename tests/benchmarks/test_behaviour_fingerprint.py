"""``benchmarks/behaviour_fingerprint.py --compare``: what counts as behaviour and what does not."""

from __future__ import annotations

import json

import numpy as np

from benchmarks import behaviour_fingerprint as bf


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
