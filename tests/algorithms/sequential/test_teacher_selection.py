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


# --- Ablations of 004 (Tables 2-3) ---


def test_uniform_switches_replace_one_weight_by_the_average():
  """Table 2's ✗ columns: the switched weight is 1/K, the other one stays Eq. 5's."""
  rng = np.random.default_rng(6)
  teachers = jnp.asarray(_random_dists(rng, 4, 6, classes_per_client=3))
  student = jnp.asarray(_random_dists(rng, 1, 6, classes_per_client=3)[0])
  g, h = teacher_selection.teacher_weights(teachers, student, "kl")
  assert np.ptp(np.asarray(g)) > 0.01 and np.ptp(np.asarray(h)) > 0.01  # not uniform already
  ug, uh = teacher_selection.teacher_weights(teachers, student, "kl", uniform_g=True)
  np.testing.assert_allclose(ug, np.full(4, 0.25), rtol=1e-6)
  np.testing.assert_allclose(uh, h, rtol=1e-6)
  ug, uh = teacher_selection.teacher_weights(teachers, student, "kl", uniform_h=True)
  np.testing.assert_allclose(ug, g, rtol=1e-6)
  np.testing.assert_allclose(uh, np.full(4, 0.25), rtol=1e-6)


def test_random_selection_is_uniform_over_subsets_and_reproducible():
  """Table 3's "Random": K distinct clients, a pure function of the key, every K-subset drawn."""
  keys = jax.random.split(jax.random.key(0), 300)
  draw = jax.jit(jax.vmap(lambda key: teacher_selection.random_select(key, 4, 2)))
  picks = np.asarray(draw(keys))
  assert np.all(picks[:, 0] != picks[:, 1]) and picks.min() >= 0 and picks.max() < 4
  counts = {}
  for row in picks.tolist():
    counts[frozenset(row)] = counts.get(frozenset(row), 0) + 1
  assert len(counts) == 6  # all C(4, 2) subsets
  # Uniform: each subset 50 of 300 expected; s.d. ≈ 6.5, so 25..75 is about 4 s.d.
  assert all(25 <= c <= 75 for c in counts.values()), counts
  np.testing.assert_array_equal(picks, np.asarray(draw(keys)))


def test_random_selection_differs_from_greedy_on_a_constructed_case():
  """Single-class clients 0, 1 (class 0) and 2, 3 (class 1): greedy always takes a complementary
  pair (one client of each class); random also takes same-class pairs, as often as their share
  (2 of the 6 pairs)."""
  d = jnp.asarray(np.eye(2)[[0, 0, 1, 1]])
  classes = np.array([0, 0, 1, 1])
  greedy = np.asarray(teacher_selection.select(d, 2, "greedy"))
  assert sorted(classes[greedy].tolist()) == [0, 1]
  keys = jax.random.split(jax.random.key(1), 120)
  picks = np.asarray(jax.vmap(lambda key: teacher_selection.select(d, 2, "random", key=key))(keys))
  same = int(np.sum(classes[picks[:, 0]] == classes[picks[:, 1]]))
  assert 20 <= same <= 60  # expected 40 of 120 (1/3); s.d. ≈ 5.2


def test_selection_errors_are_clear():
  with pytest.raises(ValueError, match="Unknown teacher selection"):
    teacher_selection.select(jnp.ones((3, 4)) / 4, 1, "best")
  with pytest.raises(ValueError, match="needs a PRNG key"):
    teacher_selection.select(jnp.ones((3, 4)) / 4, 1, "random")
  with pytest.raises(ValueError, match="num_teachers=4 must be in"):
    teacher_selection.random_select(jax.random.key(0), 3, 4)
