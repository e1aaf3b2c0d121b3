"""ER+FL's step loss: the mean CE over the local batch together with a sample of the memory."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from fedjax_proj.algorithms.client import StepContext
from fedjax_proj.algorithms.continual.er import union_replay_loss
from fedjax_proj.core.types import Batch
from fedjax_proj.data.continual import input_transform, permuted_mnist, task_model
from fedjax_proj.models import multi_head
from tests import helpers


def _setup():
  train, test = helpers.fake_mnist(60, 0), helpers.fake_mnist(20, 1)
  bench = permuted_mnist(train, test, num_tasks=3, seed=0)
  model = task_model(multi_head(helpers.TinyBackbone(), 3, 10), input_transform(bench))
  rng = np.random.default_rng(0)
  x = jnp.asarray(rng.normal(size=(4, 6, 6, 1)), jnp.float32)
  variables = model.init(jax.random.key(0), x)
  batch = Batch(x, jnp.asarray([1, 2, 3, 4], jnp.int32), jnp.asarray([1.0, 1.0, 1.0, 0.0]))
  # Memory [T=3, P=2]: task 0 holds 2 examples, task 1 one, task 2 (the current task) none.
  memory = {
    "x": jnp.asarray(rng.normal(size=(3, 2, 6, 6, 1)), jnp.float32),
    "y": jnp.asarray([[5, 6], [7, 0], [0, 0]], jnp.int32),
    "mask": jnp.asarray([[1.0, 1.0], [1.0, 0.0], [0.0, 0.0]]),
  }
  return model, variables, batch, memory


def _ce(model, variables, x, y, task):
  logits = model.apply(variables, x[None], train=False, task=jnp.int32(task)).logits
  return float(optax.softmax_cross_entropy_with_integer_labels(logits, jnp.asarray([y]))[0])


def _loss_fn(model, variables, batch, memory, replay_batch=None):
  """key -> the step loss (one compiled program per test)."""
  loss_fn = jax.jit(union_replay_loss(model, replay_batch))

  def at(key, memory=memory):
    ctx = StepContext({}, {"task": jnp.int32(2)}, memory, key)
    return float(loss_fn(variables["params"], batch, ctx)[0])

  return at


def test_every_stored_example_weighs_as_much_as_a_current_one():
  model, variables, batch, memory = _setup()
  current = [_ce(model, variables, batch.x[i], int(batch.y[i]), 2) for i in range(3)]
  stored = [
    _ce(model, variables, memory["x"][0, 0], 5, 0),
    _ce(model, variables, memory["x"][0, 1], 6, 0),
    _ce(model, variables, memory["x"][1, 0], 7, 1),  # through task 1's head and permutation
  ]
  # Batch size 4 >= 3 stored: the whole memory is replayed; the padded batch row is not counted.
  expected = (sum(current) + sum(stored)) / 6
  loss_at = _loss_fn(model, variables, batch, memory)
  assert loss_at(jax.random.key(3)) == pytest.approx(expected, rel=1e-5)
  # An empty memory (the first task) leaves the plain masked mean over the batch.
  empty = {**memory, "mask": jnp.zeros_like(memory["mask"])}
  assert loss_at(jax.random.key(3), empty) == pytest.approx(sum(current) / 3, rel=1e-5)


def test_replay_sample_is_uniform_over_stored_examples_only():
  model, variables, batch, memory = _setup()
  current = sum(_ce(model, variables, batch.x[i], int(batch.y[i]), 2) for i in range(3))
  stored = {
    "t0e0": _ce(model, variables, memory["x"][0, 0], 5, 0),
    "t0e1": _ce(model, variables, memory["x"][0, 1], 6, 0),
    "t1e0": _ce(model, variables, memory["x"][1, 0], 7, 1),
  }
  counts = dict.fromkeys(stored, 0)
  loss_at = _loss_fn(model, variables, batch, memory, replay_batch=1)
  for k in range(150):
    got = loss_at(jax.random.key(k))
    # Exactly one stored example joins the 3 current ones, never an empty slot.
    match = [n for n, ce in stored.items() if got == pytest.approx((current + ce) / 4, rel=1e-5)]
    assert len(match) == 1, got
    counts[match[0]] += 1
  assert all(25 <= c <= 75 for c in counts.values()), counts  # ~50 each (p < 1e-6 outside)


def test_glfc_weighs_each_example_by_its_gradient_over_its_groups_mean():
  """GLFC+FL (003 F.2): L_GC's weights |∇_i| / mean |∇| with |∇_i| = 1 − p_i(y_i), taken over the
  current batch and over the replayed examples separately (Dong et al., 2022)."""
  model, variables, batch, memory = _setup()
  current = np.array([_ce(model, variables, batch.x[i], int(batch.y[i]), 2) for i in range(3)])
  stored = np.array(
    [
      _ce(model, variables, memory["x"][0, 0], 5, 0),
      _ce(model, variables, memory["x"][0, 1], 6, 0),
      _ce(model, variables, memory["x"][1, 0], 7, 1),
    ]
  )

  def weighted(ce):
    grad = 1.0 - np.exp(-ce)  # 1 − softmax probability of the true class
    return np.sum(grad / grad.mean() * ce)

  expected = (weighted(current) + weighted(stored)) / 6
  loss_fn = jax.jit(union_replay_loss(model, weighting="gradient_compensation"))
  ctx = StepContext({}, {"task": jnp.int32(2)}, memory, jax.random.key(3))
  got = float(loss_fn(variables["params"], batch, ctx)[0])
  assert got == pytest.approx(expected, rel=1e-5)
  # Not ER's loss: the weights differ from 1 at these inputs.
  assert abs(expected - (current.sum() + stored.sum()) / 6) > 1e-3 * expected
  # The weights are constants: the gradient is that of Σ w_i CE_i / 6 at fixed w.
  w_b = (1 - np.exp(-current)) / (1 - np.exp(-current)).mean()
  w_r = (1 - np.exp(-stored)) / (1 - np.exp(-stored)).mean()
  examples = [(batch.x[i], int(batch.y[i]), 2, w_b[i]) for i in range(3)]
  examples += [(memory["x"][0, 0], 5, 0, w_r[0]), (memory["x"][0, 1], 6, 0, w_r[1])]
  examples += [(memory["x"][1, 0], 7, 1, w_r[2])]

  def fixed_weights(params):
    total = 0.0
    for x, y, task, w in examples:
      v = {**variables, "params": params}
      logits = model.apply(v, x[None], train=False, task=jnp.int32(task)).logits
      total += w * optax.softmax_cross_entropy_with_integer_labels(logits, jnp.asarray([y]))[0]
    return total / 6

  got_g = jax.jit(jax.grad(lambda p: loss_fn(p, batch, ctx)[0]))(variables["params"])
  want_g = jax.jit(jax.grad(fixed_weights))(variables["params"])
  for a, b in zip(jax.tree.leaves(got_g), jax.tree.leaves(want_g), strict=True):
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)
  # The first task weighs every example 1, as GLFC's code before any class is learned.
  first = StepContext({}, {"task": jnp.int32(0)}, {**memory, "mask": memory["mask"] * 0}, ctx.key)
  plain = np.mean([_ce(model, variables, batch.x[i], int(batch.y[i]), 0) for i in range(3)])
  assert float(loss_fn(variables["params"], batch, first)[0]) == pytest.approx(plain, rel=1e-5)
  with pytest.raises(ValueError, match="unknown replay weighting 'focal'"):
    union_replay_loss(model, weighting="focal")
