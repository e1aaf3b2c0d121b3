"""The conv implementations equal ``nn.Conv``: forward, input/kernel/bias gradients, layout."""

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from models_testutil import built, jit, key

from fedjax_proj.models import CONV_IMPLS, Conv, get_model

TOL = dict(rtol=1e-5, atol=1e-5)
CIN, COUT = 3, 5


def _close(a, b, **tol):
  jax.tree_util.tree_map(lambda u, v: np.testing.assert_allclose(u, v, **(tol or TOL)), a, b)


def _normal(shape, seed, scale=1.0):
  # numpy, not jax.random: tests would otherwise compile a sampler per shape.
  return jnp.asarray(np.random.default_rng(seed).standard_normal(shape) * scale, jnp.float32)


def _forward_and_grads(module, kernel, padding):
  """(y, (d params, d x)) of sum(y * cotangent) for fixed inputs, in one jitted program."""
  x = _normal((2, 9, 8, CIN), 0)
  params = {
    "params": {"kernel": _normal((kernel, kernel, CIN, COUT), 1, 0.3), "bias": _normal((COUT,), 2)}
  }

  def f(params, x):
    y = module.apply(params, x)
    return jnp.sum(y * _normal(y.shape, 3)), y

  grads, y = jit(jax.grad(f, argnums=(0, 1), has_aux=True))(params, x)
  return y, grads


@functools.cache
def _reference(kernel, strides, padding):
  module = nn.Conv(COUT, (kernel, kernel), strides=(strides, strides), padding=padding)
  return _forward_and_grads(module, kernel, padding)


CASES = [
  # (kernel, strides, padding): odd and even kernels (even makes SAME padding asymmetric),
  # explicit PyTorch-style padding and the 1x1 strided shortcut used by the ResNets.
  (3, 1, "SAME"),
  (3, 2, "SAME"),
  (4, 2, "SAME"),
  (3, 1, "VALID"),
  (3, 2, "VALID"),
  (4, 1, "VALID"),
  (3, 2, ((1, 1), (1, 1))),
  (1, 2, ((0, 0), (0, 0))),
]


@pytest.mark.parametrize("impl", ["patches_grad", "patches"])
@pytest.mark.parametrize("kernel,strides,padding", CASES)
def test_conv_matches_nn_conv(impl, kernel, strides, padding):
  mine = Conv(COUT, (kernel, kernel), strides=(strides, strides), padding=padding, impl=impl)
  y_ref, grads_ref = _reference(kernel, strides, padding)
  y, grads = _forward_and_grads(mine, kernel, padding)
  assert y.shape == y_ref.shape
  _close(y, y_ref)
  _close(grads, grads_ref)


def test_xla_impl_and_param_layout():
  x = jnp.zeros((1, 8, 8, CIN))
  for impl in CONV_IMPLS:
    for use_bias in (True, False):
      mine = jax.eval_shape(Conv(COUT, (3, 3), use_bias=use_bias, impl=impl).init, key(0), x)
      ref = jax.eval_shape(nn.Conv(COUT, (3, 3), use_bias=use_bias).init, key(0), x)
      assert jax.tree_util.tree_map(jnp.shape, mine) == jax.tree_util.tree_map(jnp.shape, ref)
  y_ref, grads_ref = _reference(3, 2, "SAME")
  y, grads = _forward_and_grads(Conv(COUT, (3, 3), strides=(2, 2), impl="xla"), 3, "SAME")
  _close(y, y_ref)
  _close(grads, grads_ref)


@pytest.mark.parametrize("impl", ["patches_grad", "patches"])
def test_conv_grads_under_vmap_and_scan(impl):
  """The engine's setting: per-client kernels (vmap) and a loop of local steps (scan)."""
  x = _normal((3, 8, 8, 4), 4)
  kernels = _normal((2, 3, 3, 4, 6), 5, 0.3)

  def run(impl):
    conv = Conv(6, (3, 3), strides=(2, 2), use_bias=False, impl=impl)

    def client(kernel):
      def step(k, _):
        g = jax.grad(lambda k: jnp.sum(jnp.tanh(conv.apply({"params": {"kernel": k}}, x))))(k)
        return k - 0.1 * g, None

      return jax.lax.scan(step, kernel, None, length=3)[0]

    return jit(jax.vmap(client))(kernels)

  _close(run(impl), run("xla"))


def test_model_params_interchangeable_across_impls():
  """One set of ResNet-8 variables drives every implementation to the same outputs."""
  b = built("resnet8")
  ref = b.eval(b.variables, b.x)
  for impl in ("patches_grad", "patches"):
    model = get_model("resnet8", b.model.num_classes, conv_impl=impl)
    shapes = jax.eval_shape(model.init, key(0), b.x[:1])
    assert jax.tree_util.tree_structure(shapes) == jax.tree_util.tree_structure(b.variables)
    out = jit(functools.partial(model.apply, train=False))(b.variables, b.x)
    _close(out.logits, ref.logits, rtol=1e-4, atol=1e-5)
    _close(out.features, ref.features, rtol=1e-4, atol=1e-5)
