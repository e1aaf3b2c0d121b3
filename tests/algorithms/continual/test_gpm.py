"""GPM's memory update of one layer (algorithms/continual/gpm.py, ``extend_memory``)."""

from __future__ import annotations

import numpy as np
import pytest

from fedjax_proj.algorithms.continual.gpm import extend_memory


def _inputs(d: int, sv: list[float], seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
  """Rows X [N, d] with singular values ``sv`` and right singular vectors V [d, len(sv)]."""
  rng = np.random.default_rng(seed)
  n = 3 * len(sv)
  left, _ = np.linalg.qr(rng.normal(size=(n, len(sv))))
  right, _ = np.linalg.qr(rng.normal(size=(d, len(sv))))
  return left @ np.diag(sv) @ right.T, right


def _span_angle(a: np.ndarray, b: np.ndarray) -> float:
  """Largest principal angle (radians) between the column spans of a and b (same width)."""
  qa, _ = np.linalg.qr(a)
  qb, _ = np.linalg.qr(b)
  s = np.linalg.svd(qa.T @ qb, compute_uv=False)
  return float(np.arccos(np.clip(s.min(), -1.0, 1.0)))


def test_first_task_keeps_smallest_rank_reaching_threshold():
  # Energy shares 0.5, 0.3, 0.15, 0.05: cumulative 0.5, 0.8, 0.95, 1.0.
  x, right = _inputs(12, list(np.sqrt([0.5, 0.3, 0.15, 0.05])))
  for th, want in ((0.7, 2), (0.9, 3), (0.97, 4), (0.4, 1)):
    basis, rank, added = extend_memory(x, np.zeros((12, 12), np.float32), 0, th)
    assert (rank, added) == (want, want), th
    assert _span_angle(basis[:, :rank], right[:, :want]) < 1e-3
    np.testing.assert_allclose(basis[:, :rank].T @ basis[:, :rank], np.eye(rank), atol=1e-5)
    assert not basis[:, rank:].any()


def test_later_task_counts_the_stored_share():
  x, right = _inputs(12, list(np.sqrt([0.5, 0.3, 0.15, 0.05])))
  stored = np.zeros((12, 12), np.float32)
  stored[:, 0] = right[:, 1]  # covers 0.3 of X's energy
  # 0.3 + 0.5 = 0.8 < 0.9; 0.8 + 0.15 = 0.95 >= 0.9: two new directions (V_0, then V_2).
  basis, rank, added = extend_memory(x, stored, 1, 0.9)
  assert (rank, added) == (3, 2)
  np.testing.assert_allclose(basis[:, 0], stored[:, 0])  # the stored direction stays first
  assert _span_angle(basis[:, :3], right[:, :3]) < 1e-3


def test_nothing_added_when_stored_basis_covers_threshold():
  x, right = _inputs(12, list(np.sqrt([0.5, 0.3, 0.15, 0.05])))
  stored = np.zeros((12, 12), np.float32)
  stored[:, :2] = right[:, :2]  # 0.8 covered: nothing to add below it
  basis, rank, added = extend_memory(x, stored, 2, 0.79)
  assert (rank, added) == (2, 0)
  np.testing.assert_array_equal(basis, stored)
  _, rank, added = extend_memory(x, stored, 2, 0.81)
  assert (rank, added) == (3, 1)


def test_full_basis_and_zero_inputs_are_left_alone():
  full = np.eye(5, dtype=np.float32)
  x, _ = _inputs(5, [1.0, 0.5])
  assert extend_memory(x, full, 5, 0.99)[1:] == (5, 0)
  empty = np.zeros((5, 5), np.float32)
  assert extend_memory(np.zeros((4, 5)), empty, 0, 0.99)[1:] == (0, 0)


@pytest.mark.parametrize("th", [0.95, 0.99])
def test_rank_never_exceeds_input_rank(th):
  x, _ = _inputs(10, [1.0, 1.0, 1.0])  # rank-3 inputs with equal shares
  _, rank, _ = extend_memory(x, np.zeros((10, 10), np.float32), 0, th)
  assert rank == 3
