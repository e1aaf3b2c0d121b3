"""Multi-head wrapper: task selection (static or traced) and per-head gradients."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from models_testutil import jit, key

from fedjax_proj.models import multi_head
from fedjax_proj.models.cnn import CNN
from fedjax_proj.models.mlp import MLP

TASKS, CLASSES, HIDDEN = 3, 4, 16


@pytest.fixture(scope="module")
def mh():
  model = multi_head("mlp", TASKS, CLASSES, hidden=(HIDDEN,))
  x = jnp.asarray(np.random.default_rng(0).standard_normal((5, 10)), jnp.float32)
  return model, model.init(key(0), x), x


def test_layout(mh):
  model, variables, _ = mh
  assert model.num_classes == CLASSES and model.name == "multi_head_mlp"
  params = variables["params"]
  assert set(params) == {"backbone", "heads"}
  assert "head" not in params["backbone"]  # The backbone has no single-task classifier.
  assert params["heads"]["kernel"].shape == (TASKS, HIDDEN, CLASSES)
  assert params["heads"]["bias"].shape == (TASKS, CLASSES)


def test_task_selects_head(mh):
  model, variables, x = mh
  heads = variables["params"]["heads"]
  apply = jit(lambda v, x, t: model.apply(v, x, train=False, task=t))
  for t in range(TASKS):
    out = apply(variables, x, jnp.int32(t))  # Traced task: one program for every task.
    assert out.logits.shape == (x.shape[0], CLASSES)
    expected = out.features @ heads["kernel"][t] + heads["bias"][t]
    np.testing.assert_allclose(out.logits, expected, rtol=1e-5, atol=1e-6)
    static = model.apply(variables, x, train=False, task=t)
    np.testing.assert_allclose(static.logits, out.logits, rtol=1e-5, atol=1e-6)
  # vmap over tasks (e.g. clients on different tasks) gives every head.
  per_task = jax.vmap(lambda t: model.apply(variables, x, train=False, task=t).logits)(
    jnp.arange(TASKS)
  )
  np.testing.assert_allclose(per_task[2], apply(variables, x, 2).logits, rtol=1e-5, atol=1e-6)


def test_task_per_example_selects_each_rows_head(mh):
  model, variables, x = mh
  tasks = jnp.asarray([2, 0, 1, 1, 0], jnp.int32)
  out = jit(lambda v, x, t: model.apply(v, x, train=False, task=t))(variables, x, tasks)
  for i, t in enumerate(np.asarray(tasks)):
    want = model.apply(variables, x, train=False, task=int(t)).logits[i]
    np.testing.assert_allclose(out.logits[i], want, rtol=1e-5, atol=1e-6)


def test_gradients_reach_only_selected_head(mh):
  model, variables, x = mh

  def loss(params):
    return jnp.sum(model.apply({"params": params}, x, train=True, task=1).logits ** 2)

  grads = jit(jax.grad(loss))(variables["params"])
  g = grads["heads"]
  for other in (0, 2):
    assert np.all(g["kernel"][other] == 0) and np.all(g["bias"][other] == 0)
  assert np.any(g["kernel"][1] != 0)
  assert any(np.any(leaf != 0) for leaf in jax.tree_util.tree_leaves(grads["backbone"]))


def test_out_of_range_task_raises(mh):
  model, variables, x = mh
  with pytest.raises(ValueError, match="out of range"):
    model.apply(variables, x, train=False, task=TASKS)


def test_backbone_forms():
  x = jnp.zeros((1, 32, 32, 3))
  alex = multi_head("alexnet", 10, 10, head_bias=False)
  v = jax.eval_shape(alex.init, key(0), x)
  assert v["params"]["heads"]["kernel"].shape == (10, 2048, 10)
  assert "bias" not in v["params"]["heads"]
  out = jax.eval_shape(lambda v: alex.apply(v, jnp.zeros((2, 32, 32, 3)), train=False, task=3), v)
  assert out.logits.shape == (2, 10) and out.features.shape == (2, 2048)

  # A module instance (its classifier is dropped) and a module-building callable.
  from_instance = multi_head(MLP(num_classes=10, hidden=(8,)), 2, 3)
  v = jax.eval_shape(from_instance.init, key(0), jnp.zeros((1, 6)))
  assert set(v["params"]["backbone"]) == {"dense_0"}
  from_callable = multi_head(CNN, 2, 3, conv_impl="patches")
  v = jax.eval_shape(from_callable.init, key(0), jnp.zeros((1, 8, 8, 1)))
  assert v["params"]["heads"]["kernel"].shape == (2, 512, 3)

  with pytest.raises(ValueError, match="projection"):
    multi_head("mlp", 2, 3, projection_dim=8)
