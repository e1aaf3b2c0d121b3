"""SFedKD's teacher choice (teacher_selection.py): distances vs NumPy, greedy selection vs brute
force, Eq. 5 weights."""

from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_proj.algorithms.sequential import teacher_selection

_greedy = jax.jit(teacher_selection.greedy_select, static_argnums=(1, 2))


def np_distance(p, q, metric, smoothing=1e-6):
  """NumPy reference of teacher_selection.distance (same smoothing)."""
  p = (np.asarray(p, np.float64) + smoothing) / (1 + len(p) * smoothing)
  q = (np.asarray(q, np.float64) + smoothing) / (1 + len(q) * smoothing)
  kl = lambda a, b: np.sum(np.where(a > 0, a * np.log(np.where(a > 0, a, 1) / b), 0.0))
  if metric == "kl":
    return kl(p, q)
  if metric == "l1":
    return np.abs(p - q).sum()
  if metric == "l2":
    return np.sqrt(np.square(p - q).sum())
  return 0.5 * kl(p, (p + q) / 2) + 0.5 * kl(q, (p + q) / 2)


def _score(dists, subset, metric):
  c = dists.shape[1]
  return np_distance(dists[list(subset)].mean(0), np.full(c, 1.0 / c), metric)


def brute_force(dists, k, metric):
  """The optimum of Eq. 6 (mean of the chosen distributions vs uniform) over all k-subsets."""
  return min(_score(dists, s, metric) for s in itertools.combinations(range(len(dists)), k))


def _random_dists(rng, m, c, classes_per_client=2):
  d = np.zeros((m, c))
  for i in range(m):
    cls = rng.choice(c, classes_per_client, replace=False)
    d[i, cls] = rng.dirichlet(np.ones(classes_per_client))
  return d


@pytest.mark.parametrize("metric", teacher_selection.METRICS)
def test_distance_matches_numpy(metric):
  rng = np.random.default_rng(0)
  p, q = rng.dirichlet(np.ones(5)), rng.dirichlet(np.ones(5))
  kl = lambda a, b: np.sum(a * np.log(a / b))
  ref = {
    "kl": kl(p, q),
    "l1": np.abs(p - q).sum(),
    "l2": np.sqrt(np.square(p - q).sum()),
    "js": 0.5 * kl(p, (p + q) / 2) + 0.5 * kl(q, (p + q) / 2),
  }[metric]
  got = teacher_selection.distance(jnp.asarray(p), jnp.asarray(q), metric, smoothing=0.0)
  np.testing.assert_allclose(got, ref, rtol=1e-5)
  # Disjoint supports: smoothing keeps KL finite (ExDir(2, α) clients with different classes).
  a, b = jnp.array([0.5, 0.5, 0.0, 0.0]), jnp.array([0.0, 0.0, 0.5, 0.5])
  assert np.isfinite(float(teacher_selection.distance(a, b, metric)))


@pytest.mark.parametrize("metric", teacher_selection.METRICS)
def test_greedy_is_exact_for_one_teacher_and_for_all(metric):
  rng = np.random.default_rng(1)
  for _ in range(5):
    d = _random_dists(rng, 6, 5)
    (pick,) = np.asarray(_greedy(jnp.asarray(d), 1, metric))
    assert _score(d, [pick], metric) == pytest.approx(brute_force(d, 1, metric), abs=1e-6)
    picks = np.asarray(_greedy(jnp.asarray(d), 6, metric))
    assert sorted(picks.tolist()) == list(range(6))


@pytest.mark.parametrize("metric", teacher_selection.METRICS)
def test_greedy_is_exact_for_single_class_clients(metric):
  """Max-coverage case of the paper (one class per client): greedy covers K distinct classes."""
  rng = np.random.default_rng(2)
  classes = rng.integers(0, 5, 8)
  d = np.eye(5)[classes]
  for k in (2, 3, 4):
    picks = np.asarray(_greedy(jnp.asarray(d), k, metric))
    assert len(set(classes[picks].tolist())) == min(k, len(set(classes.tolist())))
    assert _score(d, picks, metric) == pytest.approx(brute_force(d, k, metric), abs=1e-5)


@pytest.mark.parametrize("metric", teacher_selection.METRICS)
def test_greedy_steps_are_optimal_and_distinct(metric):
  """What greedy always promises: K distinct clients, each the best addition to the prefix."""
  rng = np.random.default_rng(3)
  for _ in range(4):
    d = _random_dists(rng, 7, 6)
    picks = np.asarray(_greedy(jnp.asarray(d), 4, metric)).tolist()
    assert len(set(picks)) == 4
    for j in range(4):
      rest = [i for i in range(7) if i not in picks[:j]]
      best = min(_score(d, picks[:j] + [i], metric) for i in rest)
      assert _score(d, picks[: j + 1], metric) == pytest.approx(best, abs=1e-6)


def test_greedy_is_not_exact_in_general():
  """Documented counterexample (K=2 of 4, KL): greedy first takes the most balanced single client
  (client 3, classes {0, 3}), which rules out the complementary pair (0, 2) covering all classes."""
  d = np.array(
    [[0.3, 0.0, 0.7, 0.0], [0.0, 0.0, 0.7, 0.3], [0.0, 0.9, 0.0, 0.1], [0.4, 0.0, 0.0, 0.6]]
  )
  picks = np.asarray(_greedy(jnp.asarray(d), 2, "kl")).tolist()
  assert picks == [3, 0]
  assert _score(d, [0, 2], "kl") == pytest.approx(brute_force(d, 2, "kl"), abs=1e-6)
  assert _score(d, picks, "kl") > brute_force(d, 2, "kl") + 0.05


def test_greedy_rejects_too_many_teachers():
  with pytest.raises(ValueError, match="num_teachers=5 must be in"):
    teacher_selection.greedy_select(jnp.ones((3, 4)) / 4, 5)
  with pytest.raises(ValueError, match="Unknown distribution metric"):
    teacher_selection.greedy_select(jnp.ones((3, 4)) / 4, 1, "cosine")


@pytest.mark.parametrize("metric", teacher_selection.METRICS)
def test_teacher_weights_sum_to_one_and_order(metric):
  rng = np.random.default_rng(4)
  teachers = _random_dists(rng, 5, 6, classes_per_client=3)
  student = _random_dists(rng, 1, 6, classes_per_client=3)[0]
  g, h = teacher_selection.teacher_weights(jnp.asarray(teachers), jnp.asarray(student), metric)
  d = np.array([np_distance(t, student, metric) for t in teachers])
  np.testing.assert_allclose(float(jnp.sum(g)), 1.0, rtol=1e-5)
  np.testing.assert_allclose(float(jnp.sum(h)), 1.0, rtol=1e-5)
  np.testing.assert_allclose(g, d / d.sum(), rtol=1e-4)  # Eq. 5
  inv = 1.0 / (d + 1e-4)
  np.testing.assert_allclose(h, inv / inv.sum(), rtol=1e-4)
  # More different teacher: larger NCKD weight g, smaller TCKD weight h.
  order = np.argsort(d)
  assert np.all(np.diff(np.asarray(g)[order]) >= 0)
  assert np.all(np.diff(np.asarray(h)[order]) <= 0)


def test_teacher_weights_identical_distributions():
  same = jnp.array([[0.5, 0.5, 0.0]] * 3)
  g, h = teacher_selection.teacher_weights(same, same[0], "l1")
  np.testing.assert_allclose(g, 1 / 3, rtol=1e-6)
  np.testing.assert_allclose(h, 1 / 3, rtol=1e-6)
