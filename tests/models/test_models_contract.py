"""Every registered model honours the Model contract: shapes, purity, jit, vmap, options."""

import jax
import jax.extend
import jax.numpy as jnp
import numpy as np
import pytest
from models_testutil import BATCH, FEATURE_DIMS, NUM_CLASSES, built, jit, key, perturbed, sample_x

from fedjax_proj.models import MODELS, count_params, get_model


def test_models_tuple():
  assert MODELS == (
    "mlp",
    "cnn",
    "resnet8",
    "resnet10",
    "resnet18",
    "alexnet",
    "alexnet8",
    "lenet5",
    "bert",
  )


def test_unknown_name_lists_valid_names():
  with pytest.raises(ValueError, match="resnet8.*alexnet"):
    get_model("vgg11", 10)


def test_shapes_purity_jit_vmap(model_name):
  model, variables, x, apply_eval, apply_train = built(model_name)
  assert model.name == model_name and model.num_classes == NUM_CLASSES
  assert "params" in variables

  out = apply_eval(variables, x)
  assert out.logits.shape == (BATCH, NUM_CLASSES)
  assert out.features.shape == (BATCH, FEATURE_DIMS[model_name])
  assert out.state.keys() == variables.keys() - {"params"}
  again = apply_eval(variables, x)
  np.testing.assert_array_equal(out.logits, again.logits)
  np.testing.assert_array_equal(out.features, again.features)

  train_out = apply_train(variables, x, key(1))
  assert train_out.logits.shape == (BATCH, NUM_CLASSES)
  assert train_out.features.shape == (BATCH, FEATURE_DIMS[model_name])
  assert train_out.state.keys() == variables.keys() - {"params"}
  train_again = apply_train(variables, x, key(1))
  np.testing.assert_array_equal(train_out.logits, train_again.logits)

  # vmap over a stack of two different models equals applying each.
  other = perturbed(variables)
  stacked = jax.tree_util.tree_map(lambda a, b: jnp.stack([a, b]), variables, other)
  both = jit(jax.vmap(lambda v: model.apply(v, x, train=False).logits))(stacked)
  assert both.shape == (2, BATCH, NUM_CLASSES)
  np.testing.assert_allclose(both[0], out.logits, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(both[1], apply_eval(other, x).logits, rtol=1e-5, atol=1e-5)


def test_eager_apply_with_default_prng():
  """Un-jitted apply (op-by-op dispatch) works the same."""
  model = get_model("mlp", NUM_CLASSES, dropout=0.5)
  x = sample_x("mlp")
  variables = model.init(jax.random.key(0), x)
  out = model.apply(variables, x, train=True, rng=jax.random.key(1))
  assert out.logits.shape == (BATCH, NUM_CLASSES) and out.state == {}


def test_vmap_train_step_over_clients():
  """A vmapped train-mode forward + grad over stacked BatchNorm models runs and returns state."""
  model, variables, x, _, _ = built("resnet8")
  stacked = jax.tree_util.tree_map(lambda a, b: jnp.stack([a, b]), variables, perturbed(variables))

  def step(v):
    def loss(params):
      out = model.apply({**v, "params": params}, x, train=True)
      return jnp.mean(out.logits**2), out.state

    return jax.grad(loss, has_aux=True)(v["params"])

  grads, state = jit(jax.vmap(step))(stacked)
  assert jax.tree_util.tree_structure(grads) == jax.tree_util.tree_structure(stacked["params"])
  assert jax.tree_util.tree_structure(state) == jax.tree_util.tree_structure(
    {"batch_stats": stacked["batch_stats"]}
  )


def _count(name, shape, **kw):
  model = get_model(name, 10, **kw)
  # eval_shape: counting needs shapes only, so nothing is compiled or run.
  return count_params(jax.eval_shape(model.init, key(0), jnp.zeros((1, *shape))))


def test_param_counts():
  resnet8 = _count("resnet8", (32, 32, 3))
  assert resnet8 == 78_042
  assert abs(resnet8 - 78_000) / 78_000 < 0.05
  assert _count("resnet8", (32, 32, 3), norm="group") == 78_042  # GroupNorm: same scale/bias.
  assert _count("resnet18", (32, 32, 3)) == 11_173_962
  resnet10 = _count("resnet10", (32, 32, 3))
  assert resnet10 == 4_903_242
  assert abs(resnet10 - 4_900_000) / 4_900_000 < 0.02  # FedProj paper 001, Table 5: d = 4.9M
  assert _count("cnn", (28, 28, 1)) == 1_663_370  # McMahan et al.'s count.
  assert _count("alexnet", (32, 32, 3)) == 6_528_896
  assert _count("alexnet", (32, 32, 3), norm="none") == 6_528_896 - 2 * (
    64 + 128 + 256 + 2048 + 2048
  )
  assert _count("mlp", (28, 28, 1)) == 199_210


def _forward_macs(name, shape):
  """Multiply-accumulates of one inference forward pass, read off the traced layer shapes."""
  model = get_model(name, 10)
  x = jnp.zeros((1, *shape))
  variables = jax.eval_shape(model.init, key(0), x)
  jaxpr = jax.make_jaxpr(lambda v: model.apply(v, x, train=False).logits)(variables)
  macs = 0

  def walk(jp):
    nonlocal macs
    for eqn in jp.eqns:
      if eqn.primitive.name == "conv_general_dilated":
        kernel = eqn.invars[1].aval.shape  # HWIO: kh, kw, in/groups, out
        out = eqn.outvars[0].aval.shape
        macs += int(np.prod(out)) * kernel[0] * kernel[1] * kernel[2]
      elif eqn.primitive.name == "dot_general":
        (contract, _), _ = eqn.params["dimension_numbers"]
        lhs = eqn.invars[0].aval.shape
        macs += int(np.prod(eqn.outvars[0].aval.shape)) * int(np.prod([lhs[d] for d in contract]))
    for sub in jax.extend.core.subjaxprs(jp):
      walk(getattr(sub, "jaxpr", sub))

  walk(jaxpr.jaxpr)
  return macs


def test_resnet10_is_fedprojs_table5_network():
  """Paper 001, Table 5: F = 65 MMACs per 32x32 example (4.9M parameters: test_param_counts)."""
  macs = _forward_macs("resnet10", (32, 32, 3))
  # stem + stage 1 (16x16, after the pool) + three strided stages (with 1x1 shortcuts) + fc.
  assert macs == 1_769_472 + 18_874_368 + 3 * 14_680_064 + 5_120  # = 64,689,152
  assert abs(macs - 65e6) / 65e6 < 0.02
  # The max pool halves the resolution before the first stage: without it MACs would be ~4x.
  assert _forward_macs("resnet8", (32, 32, 3)) < 13e6


def test_count_params_accepts_params_tree():
  variables = built("resnet8").variables
  assert count_params(variables["params"]) == count_params(variables)
  assert count_params(variables) < sum(x.size for x in jax.tree_util.tree_leaves(variables))


def test_group_norm_has_no_batch_stats():
  _, variables, x, _, train = built("resnet8", norm="group", num_groups=4)
  assert set(variables) == {"params"}
  assert variables["params"]["norm_stem"]["scale"].shape == (16,)
  out = train(variables, x)
  assert out.state == {}
  # No batch dependence: an example's output ignores its batch mates, in train mode too.
  alone = train(variables, x[:1]).logits
  np.testing.assert_allclose(out.logits[:1], alone, rtol=1e-5, atol=1e-5)


def test_group_size_option():
  model = get_model("resnet8", 10, norm="group", group_size=2)
  # Shape-checks the GroupNorm configuration without compiling.
  variables = jax.eval_shape(model.init, key(0), jnp.zeros((1, 16, 16, 3)))
  out = jax.eval_shape(
    lambda v: model.apply(v, jnp.zeros((2, 16, 16, 3)), train=False).logits, variables
  )
  assert out.shape == (2, 10)


@pytest.mark.parametrize("name", ["mlp", "cnn", "resnet8", "alexnet"])
def test_projection_head(name):
  proj_dim = 16
  _, variables, x, apply_eval, _ = built(name, projection_dim=proj_dim)
  out = apply_eval(variables, x)
  assert out.features.shape == (BATCH, proj_dim)
  assert out.logits.shape == (BATCH, NUM_CLASSES)
  params = variables["params"]
  d = FEATURE_DIMS[name]
  assert params["proj_hidden"]["kernel"].shape == (d, d)
  assert params["proj_out"]["kernel"].shape == (d, proj_dim)
  assert params["head"]["kernel"].shape == (d, NUM_CLASSES)

  # Logits come from the pooled features: the plain model with the same backbone agrees.
  plain_params = {k: v for k, v in params.items() if not k.startswith("proj_")}
  plain_out = built(name).eval({**variables, "params": plain_params}, x)
  np.testing.assert_allclose(out.logits, plain_out.logits, rtol=1e-6, atol=1e-6)


def test_classifier_on_projection():
  model = get_model("mlp", NUM_CLASSES, projection_dim=8, classifier_on_projection=True)
  variables = jax.eval_shape(model.init, key(0), jnp.zeros((1, 784)))
  assert variables["params"]["head"]["kernel"].shape == (8, NUM_CLASSES)


@pytest.mark.parametrize(
  "name,kwargs", [("mlp", {"dropout": 0.5}), ("alexnet", {"bn_batch_stats_at_eval": False})]
)
def test_dropout(name, kwargs):
  model, variables, x, apply_eval, apply_train = built(name, **kwargs)
  a = apply_train(variables, x, key(1)).logits
  b = apply_train(variables, x, key(2)).logits
  np.testing.assert_array_equal(a, apply_train(variables, x, key(1)).logits)
  assert not np.allclose(a, b)
  np.testing.assert_array_equal(apply_eval(variables, x).logits, apply_eval(variables, x).logits)
  with pytest.raises(ValueError, match="dropout.*rng"):
    jax.eval_shape(lambda v, x: model.apply(v, x, train=True), variables, x)
  if name == "mlp":  # Nothing else differs between modes: eval is the dropout-free network.
    assert not np.allclose(a, apply_eval(variables, x).logits)
    no_dropout = get_model("mlp", NUM_CLASSES)
    np.testing.assert_allclose(
      apply_eval(variables, x).logits,
      no_dropout.apply(variables, x, train=True).logits,
      rtol=1e-6,
      atol=1e-6,
    )


def test_no_dropout_model_trains_without_rng():
  model, variables, x, apply_eval, _ = built("mlp")
  out = model.apply(variables, x, train=True)
  np.testing.assert_allclose(out.logits, apply_eval(variables, x).logits, rtol=1e-6, atol=1e-6)


def test_mlp_per_layer_dropout_rates():
  model = get_model("mlp", 10, hidden=(40, 40, 40), dropout=(0.2, 0.5, 0.5))
  variables = jax.eval_shape(model.init, key(0), jnp.zeros((1, 784)))
  assert sorted(k for k in variables["params"] if k.startswith("dense")) == [
    "dense_0",
    "dense_1",
    "dense_2",
  ]
  bad = get_model("mlp", 10, hidden=(40, 40), dropout=(0.2,))
  with pytest.raises(ValueError, match="rates"):
    jax.eval_shape(bad.init, key(0), jnp.zeros((1, 784)))


def test_bad_options_raise():
  with pytest.raises(ValueError, match="norm"):
    jax.eval_shape(get_model("resnet8", 10, norm="layer").init, key(0), jnp.zeros((1, 8, 8, 3)))
  with pytest.raises(ValueError, match="conv impl"):
    jax.eval_shape(get_model("cnn", 10, conv_impl="fft").init, key(0), jnp.zeros((1, 8, 8, 1)))


def test_init_under_jit_and_vmap():
  """init traces inside a caller's jit/vmap (eval_shape traces without compiling)."""
  model = get_model("resnet8", 10)
  x = jnp.zeros((1, 8, 8, 3))
  direct = jax.eval_shape(model.init, key(0), x)
  jitted = jax.eval_shape(jit(lambda k: model.init(k, x)), key(0))
  assert jax.tree_util.tree_structure(direct) == jax.tree_util.tree_structure(jitted)
  many = jax.eval_shape(jax.vmap(lambda k: model.init(k, x)), jax.random.split(key(0), 3))
  assert many["params"]["head"]["kernel"].shape == (3, 64, 10)
