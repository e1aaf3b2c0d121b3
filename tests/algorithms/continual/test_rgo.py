"""RGO+FL (003 F.2): the recursive projector update and the clients that store it."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from fedjax_proj.algorithms.continual import rgo as rgo_lib
from fedjax_proj.data.continual import task_partition
from fedjax_proj.data.federated import FederatedData
from fedjax_proj.training.continual import task_round_data
from tests import helpers

ALPHA = 1e-12


def _rows(m, d, seed, rank=None):
  """m input rows in d dimensions (spanning ``rank`` of them)."""
  rng = np.random.default_rng(seed)
  rank = rank or d
  return rng.normal(size=(m, rank)) @ rng.normal(size=(rank, d))


def _sherman_morrison(p, x_rows, alpha):
  """The recursion one row at a time: P ← P − P x xᵀ P / (α + xᵀ P x)."""
  p = np.array(p, np.float64)
  for x in x_rows:
    px = p @ x
    p = p - np.outer(px, px) / (alpha + x @ px)
  return p


@pytest.mark.parametrize("alpha", [0.5, 4.0])
def test_update_is_the_row_recursion_and_the_closed_form(alpha):
  d = 6
  x1, x2 = _rows(9, d, 0, rank=3), _rows(7, d, 1, rank=2)
  p1 = rgo_lib.update_projector(np.eye(d), x1.T @ x1, alpha, trace_norm=False)
  p2 = rgo_lib.update_projector(p1, x2.T @ x2, alpha, trace_norm=False)
  np.testing.assert_allclose(p1, _sherman_morrison(np.eye(d), x1, alpha), rtol=1e-9, atol=1e-12)
  np.testing.assert_allclose(p2, _sherman_morrison(p1, x2, alpha), rtol=1e-9, atol=1e-12)
  # Closed form over both tasks: (I + (X1ᵀX1 + X2ᵀX2) / α)⁻¹.
  closed = np.linalg.inv(np.eye(d) + (x1.T @ x1 + x2.T @ x2) / alpha)
  np.testing.assert_allclose(p2, closed, rtol=1e-9, atol=1e-12)
  # Symmetric positive definite; directions no task's inputs reach keep a unit step.
  np.testing.assert_array_equal(p2, p2.T)
  assert np.linalg.eigvalsh(p2).min() > 0
  free = np.linalg.svd(np.vstack([x1, x2]))[2][-1]  # rank 5 of 6: one free direction
  np.testing.assert_allclose(p2 @ free, free, atol=1e-9)


def test_trace_normalisation_rescales_the_same_projector():
  d = 5
  x1, x2 = _rows(8, d, 2, rank=2), _rows(8, d, 3, rank=2)
  p1 = rgo_lib.update_projector(np.eye(d), x1.T @ x1, 1.0, trace_norm=True)
  p2 = rgo_lib.update_projector(p1, x2.T @ x2, 1.0, trace_norm=True)
  for p in (p1, p2):
    assert np.trace(p) == pytest.approx(d)
    np.testing.assert_array_equal(p, p.T)
    assert np.linalg.eigvalsh(p).min() > 0
  raw = np.linalg.inv(np.linalg.inv(p1) + x2.T @ x2)
  np.testing.assert_allclose(p2, raw * d / np.trace(raw), rtol=1e-9)


def test_bad_hyperparameters_fail_before_building():
  with pytest.raises(ValueError, match=r"store_fraction must be in \[0, 1\]"):
    helpers.tiny_continual("rgo", store_fraction=1.5)
  with pytest.raises(ValueError, match="alpha must be > 0"):
    helpers.tiny_continual("rgo", alpha=0.0)


def test_chosen_clients_store_the_task_and_their_steps_spare_its_inputs():
  """After task 0, round(0.4 · 4) = 2 clients hold a projector, built from their own inputs; the
  others keep the identity; a stored projector damps the kernel's gradient along those inputs."""
  # The fake images are normalised to ~1e-5 (helpers.normalizer(0, 255)), so Dense_1's Gram
  # entries are ~1e-8: α = 1e-12 makes the stored inputs dominate, as α = 1 does at MNIST scale.
  bench, cm, _, _, variables = helpers.tiny_continual("rgo", alpha=ALPHA)
  state = cm.algorithm.init(variables, jax.random.key(0))
  fed = FederatedData(task_partition(bench, 0, 4, iid=True, seed=0), 16, 1)
  rd = task_round_data(bench.images, bench.labels, fed, np.arange(4, dtype=np.int32), 99, 0, 0)
  state, metrics = cm.end_task(state, rd, jax.random.key(1), 0)
  assert metrics["clients_updated"] == 2
  p = np.asarray(state.method["backbone/Dense_1"])  # [4 clients, 16, 16]
  stored = [c for c in range(4) if not np.allclose(p[c], np.eye(16))]
  assert len(stored) == 2
  for c in stored:
    np.testing.assert_allclose(np.trace(p[c]), 16.0, rtol=1e-5)
    np.testing.assert_allclose(p[c], p[c].T, atol=1e-6)
    # The same projector from the client's own layer inputs, computed here from its Gram matrix.
    gram = _client_gram(bench, state, rd, c)
    want = rgo_lib.update_projector(np.eye(16), gram, ALPHA, trace_norm=True)
    np.testing.assert_allclose(p[c], want, rtol=1e-4, atol=1e-5)
    # A step P G leaves the client's old layer inputs nearly unmoved next to the plain step G.
    x = np.linalg.svd(gram)[2][:2]  # the inputs' two strongest directions
    g = np.random.default_rng(c).normal(size=(16, 16))
    assert np.linalg.norm(x @ p[c] @ g) < 0.05 * np.linalg.norm(x @ g)


def _client_gram(bench, state, rd, c):
  """XᵀX of client c's Dense_1 inputs, in numpy from the global model's weights: the normalised
  (helpers.normalizer(0, 255)), task-0-permuted images through Dense_0 and a ReLU."""
  idx = np.asarray(rd.idx)[c].reshape(-1)[np.asarray(rd.mask)[c].reshape(-1)]
  x = np.asarray(bench.images, np.float64)[idx].reshape(len(idx), -1) / 255.0 / 255.0
  x = x[:, np.asarray(bench.permutations[0])]
  dense0 = state.variables["params"]["backbone"]["Dense_0"]
  rows = np.maximum(x @ np.asarray(dense0["kernel"], np.float64) + np.asarray(dense0["bias"]), 0)
  return rows.T @ rows
