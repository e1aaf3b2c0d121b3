"""MOON's projection head is a wrapper of any backbone (fedjax_proj/models/projection.py) whose
parameter tree is the one the backbones with the head built in had: the recorded
moon_param_trees.json (every registered backbone, logits on the features and on the projection),
so checkpoints, the parity records and the fingerprints keep their names and shapes."""

from __future__ import annotations

import json
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_proj.models import (
  CONV_MODELS,
  MODEL_SPECS,
  MODELS,
  get_model,
  model_spec,
  projection_head,
)
from fedjax_proj.models.mlp import MLP
from fedjax_proj.training.config import validate_model_kwargs

RECORDED = json.loads((Path(__file__).with_name("moon_param_trees.json")).read_text())
GRAYSCALE = ("mlp", "cnn", "lenet5")


def _tree(variables) -> dict[str, list[int]]:
  flat = jax.tree_util.tree_flatten_with_path(variables)[0]
  return {jax.tree_util.keystr(path): list(leaf.shape) for path, leaf in flat}


@pytest.mark.parametrize("key", sorted(RECORDED))
def test_moon_models_keep_the_recorded_parameter_tree(key):
  name, on_projection = key.split("+moon")
  shape = (2, 28, 28, 1) if name in GRAYSCALE else (2, 32, 32, 3)
  model = get_model(name, 10, projection_dim=256, classifier_on_projection=on_projection == "True")
  variables = jax.eval_shape(model.init, jax.random.key(0), jnp.ones(shape))
  assert _tree(variables) == RECORDED[key]
  assert model.name == name


def test_every_backbone_that_takes_the_head_is_recorded():
  assert {k.split("+moon")[0] for k in RECORDED} == {
    n for n, s in MODEL_SPECS.items() if s.projection
  }


def test_the_wrapper_adds_the_head_to_a_backbone_module():
  x = jnp.ones((3, 12))
  model = projection_head(MLP(num_classes=7, hidden=(16,)), 5, 4)
  variables = model.init(jax.random.key(0), x)
  # The backbone's layers beside the head's, not under a "backbone" key; its classifier dropped.
  assert set(variables["params"]) == {"dense_0", "proj_hidden", "proj_out", "head"}
  out = model.apply(variables, x, train=False)
  assert out.features.shape == (3, 4) and out.logits.shape == (3, 5)
  # The logits read the backbone's features, not the projection (classifier_on_projection off).
  h = jax.nn.relu(
    x @ variables["params"]["dense_0"]["kernel"] + variables["params"]["dense_0"]["bias"]
  )
  head = variables["params"]["head"]
  np.testing.assert_allclose(out.logits, h @ head["kernel"] + head["bias"], rtol=1e-5, atol=1e-6)
  with pytest.raises(ValueError, match="projection_dim must be >= 1"):
    projection_head(MLP, 5, 0)


def test_alexnet_keeps_its_bias_free_classifier():
  model = get_model("alexnet", 10, projection_dim=8, fc_features=16)
  variables = jax.eval_shape(model.init, jax.random.key(0), jnp.ones((1, 32, 32, 3)))
  assert set(variables["params"]["head"]) == {"kernel"}


def test_the_registry_is_one_spec_per_model():
  assert tuple(MODEL_SPECS) == MODELS
  assert tuple(n for n, s in MODEL_SPECS.items() if s.convolutions) == CONV_MODELS
  assert all(model_spec(n).name == n for n in MODELS)
  with pytest.raises(ValueError, match="valid names: mlp, cnn"):
    model_spec("vgg")


def test_the_encoder_takes_no_projection_head():
  with pytest.raises(TypeError, match="bert takes no projection head"):
    get_model("bert", 2, size="tiny", projection_dim=8)
  # A backbone's own option still reaches its factory through the wrapper.
  with pytest.raises(ValueError, match="does not take these options"):
    validate_model_kwargs("mlp", {"projection_dim": 8, "stage_features": 3})
