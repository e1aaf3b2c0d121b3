"""``models.pool.max_pool`` equals ``nn.max_pool`` bit for bit: forward, gradient (ties included:
flax gives the cotangent to the first maximal element of a window), JVP, under vmap; and it calls
flax where the windows overlap or the input is padded."""

import itertools
from unittest import mock

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_proj.models import pool as pool_lib
from fedjax_proj.models.cnn import CNN


def _flax(w, s, p):
  return lambda x: nn.max_pool(x, w, strides=s, padding=p)


def _ours(w, s, p):
  return lambda x: pool_lib.max_pool(x, w, strides=s, padding=p, impl="reshape")


def _results(f, x, seed=1):
  """(y, x-cotangent, y-tangent) of ``f`` at ``x`` for fixed random directions, as numpy."""
  rng = np.random.default_rng(seed)
  ct = jnp.asarray(rng.standard_normal(jax.eval_shape(f, x).shape), jnp.float32)
  t = jnp.asarray(rng.standard_normal(x.shape), jnp.float32)

  @jax.jit
  def run(x, ct, t):
    y, vjp = jax.vjp(f, x)
    return y, vjp(ct)[0], jax.jvp(f, (x,), (t,))[1]

  return [np.asarray(a) for a in run(x, ct, t)]


def _assert_bitwise(a, b, what=""):
  for part, u, v in zip(("forward", "gradient", "jvp"), a, b, strict=True):
    assert u.shape == v.shape and u.dtype == v.dtype, (what, part)
    assert u.tobytes() == v.tobytes(), (what, part, np.argwhere(u != v)[:4].tolist())


def _inputs(shape, seed=0):
  """Random normals (no ties), small integers (ties among positive values) and their ReLU
  (windows of zeros), the last two being where flax's and ``jnp.max``'s gradients part ways."""
  rng = np.random.default_rng(seed)
  ints = jnp.asarray(rng.integers(-2, 3, shape), jnp.float32)
  return {
    "normal": jnp.asarray(rng.standard_normal(shape), jnp.float32),
    "ties": ints,
    "relu_ties": jax.nn.relu(ints),
  }


TILING = [
  ((2, 8, 8, 3), (2, 2), "VALID"),
  ((2, 9, 7, 3), (2, 2), "VALID"),  # flax crops the trailing row / column
  ((2, 8, 8, 3), (2, 2), "SAME"),  # divisible: SAME pads nothing
  ((2, 8, 8, 3), (2, 2), ((0, 0), (0, 0))),
  ((2, 9, 10, 2), (3, 3), "VALID"),
  ((2, 8, 6, 3), (2, 3), "VALID"),
  ((2, 3, 8, 8, 2), (2, 2), "VALID"),  # two batch dimensions
  ((8, 8, 2), (2, 2), "VALID"),  # none: flax adds one
]


@pytest.mark.parametrize("shape,window,padding", TILING)
def test_tiling_windows_equal_flax_bitwise(shape, window, padding):
  for name, x in _inputs(shape).items():
    ref = _results(_flax(window, window, padding), x)
    got = _results(_ours(window, window, padding), x)
    _assert_bitwise(ref, got, name)


def test_every_tie_pattern_of_a_window():
  """All 256 windows of {0, 1, -0, NaN} values: the cotangent and tangent follow flax's one
  element (with a NaN, the element where XLA's select walk ends)."""
  pats = np.array(list(itertools.product([0.0, 1.0, -0.0, np.nan], repeat=4)), np.float32)
  x = jnp.asarray(pats.reshape(-1, 2, 2, 1))
  w = (2, 2)
  _assert_bitwise(_results(_flax(w, w, "VALID"), x), _results(_ours(w, w, "VALID"), x))
  # jnp.max alone would split the cotangent among the tied maxima: that is what this guards.
  g = jax.grad(lambda x: jnp.sum(pool_lib.max_pool(x, w, w, impl="reshape")))(x)
  assert np.asarray(g).sum(axis=(1, 2, 3)).tolist() == [1.0] * len(pats)
  assert np.isnan(np.asarray(pool_lib.max_pool(x, w, w, impl="reshape"))).sum() == 175


def test_gradient_under_vmap_equals_flax():
  """Per-client gradients (vmap over a leading axis) of ReLU then pooling, with ties."""
  x = _inputs((3, 2, 8, 8, 2), seed=3)["ties"]

  def grads(pool):
    return jax.jit(jax.vmap(jax.grad(lambda a: jnp.sum(pool(jax.nn.relu(a)) ** 2))))(x)

  w = (2, 2)
  ref = np.asarray(grads(_flax(w, w, "VALID")))
  assert ref.tobytes() == np.asarray(grads(_ours(w, w, "VALID"))).tobytes()


def _primitives(f, x):
  return {str(e.primitive) for e in jax.make_jaxpr(f)(x).jaxpr.eqns}


FALLBACK = [
  ((2, 9, 9, 3), (3, 3), (2, 2), ((1, 1), (1, 1))),  # ResNet's stem pooling: overlapping
  ((2, 9, 8, 3), (2, 2), (2, 2), "SAME"),  # odd size: SAME pads
  ((2, 8, 8, 3), (3, 3), (1, 1), "VALID"),  # stride != window
  ((2, 8, 8, 3), (2, 2), (2, 2), ((0, 1), (0, 0))),  # explicit padding
]


@pytest.mark.parametrize("shape,window,strides,padding", FALLBACK)
def test_other_windows_call_flax(shape, window, strides, padding):
  x = _inputs(shape)["ties"]
  ours = lambda x: pool_lib.max_pool(x, window, strides, padding, impl="reshape")  # noqa: E731
  assert "reduce_window_max" in _primitives(ours, x)
  _assert_bitwise(
    _results(lambda x: nn.max_pool(x, window, strides=strides, padding=padding), x),
    _results(ours, x),
  )


def test_tiling_windows_take_the_reshape_path_and_impl_choice():
  x = jnp.zeros((2, 8, 8, 3))
  w = (2, 2)
  assert "reduce_window_max" not in _primitives(_ours(w, w, "VALID"), x)
  flax_path = lambda x: pool_lib.max_pool(x, w, w, impl="reduce_window")  # noqa: E731
  assert "reduce_window_max" in _primitives(flax_path, x)
  assert pool_lib.pool_impl_for("cpu") == "reshape"
  assert pool_lib.pool_impl_for("gpu") == "reduce_window"
  with pytest.raises(ValueError, match="impl must be one of"):
    pool_lib.max_pool(x, w, w, impl="fast")


def test_cnn_gradient_with_positive_ties_equals_flax_pooling():
  """A small FedAvg CNN on images with a constant region and positive conv biases: many windows
  hold equal positive activations, and the parameter gradient is flax pooling's bit for bit."""
  module = CNN(num_classes=3, conv_features=(4, 6), hidden=(8,))
  x = np.zeros((2, 16, 16, 1), np.float32)
  x[:, 8:] = np.random.default_rng(0).standard_normal((2, 8, 16, 1))
  x = jnp.asarray(x)
  params = dict(module.init(jax.random.key(0), x, train=False)["params"])
  for name in ("conv_0", "conv_1"):
    params[name] = {**params[name], "bias": jnp.full_like(params[name]["bias"], 0.1)}

  def grad():
    def loss(p):
      logits, _ = module.apply({"params": p}, x, train=False)
      return jnp.mean(jax.nn.log_softmax(logits)[jnp.arange(2), jnp.asarray([1, 2])])

    return jax.jit(jax.grad(loss))(params)

  ours = grad()
  with mock.patch.object(pool_lib, "pool_impl_for", lambda backend=None: "reduce_window"):
    ref = grad()
  for a, b in zip(jax.tree.leaves(ref), jax.tree.leaves(ours), strict=True):
    assert np.asarray(a).tobytes() == np.asarray(b).tobytes()
