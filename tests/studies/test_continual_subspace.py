"""studies/continual_subspace/study.py: the mean-projector counts of GPM+FL's client memories and
the per-(task, layer) table read from end-of-task records."""

from __future__ import annotations

import numpy as np

from studies.continual_subspace import study as bench


def _padded(columns: np.ndarray, d: int) -> np.ndarray:
  out = np.zeros((d, d), np.float32)
  out[:, : columns.shape[1]] = columns
  return out


def test_mean_projector_counts_common_and_union_directions():
  d = 6
  eye = np.eye(d, dtype=np.float32)
  # Both clients hold e0; only client 0 holds e1, only client 1 holds e2 and e3.
  bases = np.stack([_padded(eye[:, [0, 1]], d), _padded(eye[:, [0, 2, 3]], d)])
  got = bench.mean_projector_counts({"layer": bases})["layer"]
  assert got["common"] == 1  # e0: eigenvalue 1
  assert got["union"] == 4  # e0 (1) and e1, e2, e3 (1/2 each)
  np.testing.assert_allclose(got["trace_over_d"], (2 + 3) / 2 / d, rtol=1e-6)


def test_task_table_reads_fot_and_gpm_records():
  acc = [[0.8, 0.7], [None, 0.9]]
  fot_ends = [
    {"task_end": t, "rank/dense_0": 10 * (t + 1), "added/dense_0": 10, "eps_prime/dense_0": 0.96}
    for t in range(2)
  ]
  rows = bench.task_table("fot", fot_ends, [], acc)
  assert [(r["task"], r["rank"], r["a_tt"]) for r in rows] == [(0, 10, 0.8), (1, 20, 0.9)]
  gpm_ends = [
    {
      "task_end": 0,
      "mean_rank/head": 3.5,
      "min_rank/head": 2,
      "max_rank/head": 5,
      "threshold": 0.95,
    }
  ]
  extra = [{"task": 0, "head": {"common": 1, "union": 7, "trace_over_d": 0.1}}]
  (row,) = bench.task_table("gpm", gpm_ends, extra, acc)
  assert (row["rank"], row["min_rank"], row["max_rank"], row["common"], row["union"]) == (
    3.5,
    2,
    5,
    1,
    7,
  )
  assert bench.run_lib_width("dense_0", {"hidden": "400,300"}) == 784
  assert bench.run_lib_width("dense_1", {"hidden": "400,300"}) == 400
  assert bench.run_lib_width("head", {"hidden": "400,300"}) == 300
