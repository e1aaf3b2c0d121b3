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
