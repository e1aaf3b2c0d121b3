"""Pytree utilities: stacking round trips, scatter leaves other rows alone, flat algebra."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_proj.core import tree as T


def _trees():
  return [{"a": jnp.full((2, 3), float(i)), "b": {"c": jnp.arange(4.0) * i}} for i in range(3)]


def test_stack_unstack_roundtrip():
  trees = _trees()
  stacked = T.stack_clients(trees)
  assert stacked["a"].shape == (3, 2, 3)
  for t, u in zip(trees, T.unstack_clients(stacked)):
    np.testing.assert_array_equal(T.tree_ravel(t), T.tree_ravel(u))
  with pytest.raises(ValueError):
    T.stack_clients([])


def test_index_and_scatter():
  stacked = T.stack_clients(_trees())
  picked = T.index_clients(stacked, jnp.array([2, 0]))
  np.testing.assert_array_equal(picked["a"][0], jnp.full((2, 3), 2.0))
  values = T.tree_scale(-1.0, picked)
  out = T.scatter_clients(stacked, jnp.array([2, 0]), values)
  np.testing.assert_array_equal(out["a"][1], stacked["a"][1])  # unsampled row untouched
  np.testing.assert_array_equal(out["a"][2], -stacked["a"][2])
  np.testing.assert_array_equal(out["b"]["c"][0], -stacked["b"]["c"][0])


def test_weighted_mean():
  stacked = T.stack_clients(_trees())
  w = jnp.array([1.0, 1.0, 2.0])
  m = T.weighted_mean(stacked, w)
  np.testing.assert_allclose(m["a"], jnp.full((2, 3), (0 + 1 + 4) / 4))


def test_flat_dot_and_norm_span_all_leaves():
  a = {"x": jnp.array([1.0, 2.0]), "y": {"z": jnp.array([[3.0]])}}
  b = {"x": jnp.array([4.0, -1.0]), "y": {"z": jnp.array([[2.0]])}}
  assert float(T.tree_dot(a, b)) == pytest.approx(4 - 2 + 6)
  assert float(T.tree_norm(a)) == pytest.approx(np.sqrt(14))
  np.testing.assert_array_equal(T.tree_ravel(a), [1.0, 2.0, 3.0])


def test_where_and_finite():
  a, b = {"x": jnp.ones(2)}, {"x": jnp.zeros(2)}
  np.testing.assert_array_equal(T.tree_where(jnp.array(False), a, b)["x"], b["x"])
  assert bool(T.tree_all_finite(a))
  assert not bool(T.tree_all_finite({"x": jnp.array([1.0, jnp.nan])}))


def test_sum_clients_equals_leading_axis_sum():
  rng = np.random.default_rng(0)
  tree = {"w": rng.normal(size=(5, 3, 4)).astype(np.float32), "b": rng.normal(size=(5,))}
  got = T.sum_clients({k: jnp.asarray(v) for k, v in tree.items()})
  np.testing.assert_allclose(got["w"], tree["w"].sum(0), rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(got["b"], tree["b"].sum(0), rtol=1e-5, atol=1e-6)
  assert got["w"].shape == (3, 4) and got["b"].shape == ()
