"""BatchNorm semantics: inference never changes state, and padding never enters the statistics."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from models_testutil import BATCH, built, key

# Models with running statistics: FedDF's ResNet-8 and the AlexNet with the usual BatchNorm.
RUNNING_STATS = [("resnet8", {}), ("alexnet", {"bn_batch_stats_at_eval": False})]
PAD = 2


def _trees_equal(a, b):
  return jax.tree_util.tree_structure(a) == jax.tree_util.tree_structure(b) and all(
    np.array_equal(x, y) for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b))
  )


def _trained_variables(b):
  """Variables whose running statistics moved away from their (0, 1) initial values."""
  return {**b.variables, **b.train(b.variables, b.x, key(7)).state}


# Inputs are prepared in numpy: every distinct eager jnp op would compile a small XLA program.
def _padded(x, fill):
  pad = np.broadcast_to(np.asarray(fill, np.float32), (PAD, *x.shape[1:]))
  mask = np.array([1.0] * x.shape[0] + [0.0] * PAD, np.float32)
  return jnp.asarray(np.concatenate([np.asarray(x), pad])), jnp.asarray(mask)


def _garbage(shape):
  return np.random.default_rng(3).standard_normal((PAD, *shape)).astype(np.float32) * 50.0 + 7.0


def _other_batch_mates(x):
  x2 = np.array(x)
  x2[1:] = x2[1:] * -3.0 + 1.0
  return jnp.asarray(x2)


@pytest.mark.parametrize("name,kwargs", RUNNING_STATS)
def test_eval_keeps_state_and_ignores_batch_mates(name, kwargs):
  b = built(name, **kwargs)
  variables = _trained_variables(b)
  out = b.eval(variables, b.x)
  assert _trees_equal(out.state, {"batch_stats": variables["batch_stats"]})
  # Changing the other examples of the batch does not change example 0's eval output.
  x2 = _other_batch_mates(b.x)
  np.testing.assert_allclose(b.eval(variables, x2).logits[0], out.logits[0], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name,kwargs", RUNNING_STATS)
def test_train_updates_batch_stats(name, kwargs):
  b = built(name, **kwargs)
  state = b.train(b.variables, b.x, key(1)).state
  assert set(state) == {"batch_stats"}
  old, new = b.variables["batch_stats"], state["batch_stats"]
  assert jax.tree_util.tree_structure(old) == jax.tree_util.tree_structure(new)
  assert all(
    not np.allclose(o, n)
    for o, n in zip(jax.tree_util.tree_leaves(old), jax.tree_util.tree_leaves(new))
  )


@pytest.mark.parametrize("name,kwargs", RUNNING_STATS)
def test_masked_examples_do_not_affect_statistics(name, kwargs):
  b = built(name, **kwargs)
  garbage = _garbage(b.x.shape[1:])
  x_garbage, mask = _padded(b.x, garbage)
  x_zeros, _ = _padded(b.x, 0.0)
  out_g = b.train(b.variables, x_garbage, key(1), mask)
  out_z = b.train(b.variables, x_zeros, key(1), mask)
  np.testing.assert_allclose(out_g.logits[:BATCH], out_z.logits[:BATCH], rtol=1e-5, atol=1e-5)
  jax.tree_util.tree_map(
    lambda g, z: np.testing.assert_allclose(g, z, rtol=1e-5, atol=1e-6), out_g.state, out_z.state
  )
  if name == "resnet8":  # No dropout, so the unpadded batch is directly comparable.
    ref = b.train(b.variables, b.x)
    np.testing.assert_allclose(out_g.logits[:BATCH], ref.logits, rtol=1e-5, atol=1e-5)
    jax.tree_util.tree_map(
      lambda g, r: np.testing.assert_allclose(g, r, rtol=1e-5, atol=1e-6), out_g.state, ref.state
    )


def test_all_padding_step_keeps_state_and_stays_finite():
  b = built("resnet8")
  x_pad, _ = _padded(b.x, 0.0)
  none_real = b.train(b.variables, x_pad, None, jnp.asarray(np.zeros(BATCH + PAD, np.float32)))
  assert _trees_equal(none_real.state, {"batch_stats": b.variables["batch_stats"]})
  assert np.all(np.isfinite(none_real.logits))
  # An all-ones mask is the same as no mask.
  all_real = b.train(b.variables, x_pad, None, jnp.asarray(np.ones(BATCH + PAD, np.float32)))
  no_mask = b.train(b.variables, x_pad)
  np.testing.assert_allclose(all_real.logits, no_mask.logits, rtol=1e-6, atol=1e-6)


def test_gpm_batch_stats_at_eval():
  """GPM's track_running_stats=False: no running statistics, batch statistics at eval too."""
  b = built("alexnet")
  assert set(b.variables) == {"params"}
  assert b.variables["params"]["norm_0"]["scale"].shape == (64,)
  out = b.eval(b.variables, b.x)
  assert out.state == {}
  assert b.train(b.variables, b.x, key(1)).state == {}
  # Eval output depends on the batch (by design) ...
  x2 = _other_batch_mates(b.x)
  assert not np.allclose(b.eval(b.variables, x2).logits[0], out.logits[0])
  # ... but masked padding is excluded from the eval statistics.
  garbage = _garbage(b.x.shape[1:])
  x_pad, mask = _padded(b.x, garbage)
  np.testing.assert_allclose(
    b.eval(b.variables, x_pad, mask).logits[:BATCH], out.logits, rtol=1e-4, atol=1e-5
  )
