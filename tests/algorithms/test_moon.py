"""MOON (moon.py) against the NumPy reference; its contrastive loss; its projection head."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_proj.algorithms import registry
from fedjax_proj.algorithms.moon import model_contrastive_loss
from tests.algorithms.baselines_reference import (
  build,
  check_reference_is_not_fedavg,
  check_rounds_match_reference,
  check_unsampled_clients_state_unchanged,
  np_cos,
  np_log_softmax,
)


def test_toy_rounds_match_numpy_reference():
  check_rounds_match_reference("moon")


def test_reference_is_not_fedavg():
  check_reference_is_not_fedavg("moon")


def test_unsampled_clients_state_unchanged_in_first_round():
  check_unsampled_clients_state_unchanged("moon")


def test_moon_loss_matches_numpy():
  rng = np.random.default_rng(0)
  z, zg, zp = (rng.normal(size=(6, 5)).astype(np.float32) for _ in range(3))
  logits = np.stack([np_cos(z, zg), np_cos(z, zp)], -1) / 0.5
  np.testing.assert_allclose(
    model_contrastive_loss(z, zg, zp, 0.5), -np_log_softmax(logits)[:, 0].mean(), rtol=1e-5
  )


def test_bad_hyperparameters_fail_clearly():
  with pytest.raises(ValueError, match="temperature must be > 0, got 0.0"):
    build("moon", {"temperature": 0.0}, 0.0)


def test_moon_declares_projection_head():
  assert registry.model_kwargs("moon") == {"projection_dim": 256, "classifier_on_projection": True}
  for name in ("fedprox", "fednova", "feddyn", "scaffold", "moon", "fedrcl"):
    assert not registry.needs_public(name)


def test_an_all_zero_feature_row_gives_a_finite_gradient():
  rng = np.random.default_rng(2)
  z, zg, zp = (jnp.asarray(rng.normal(size=(4, 5)), jnp.float32) for _ in range(3))
  z = z.at[0].set(0.0)
  grad = jax.grad(lambda v: model_contrastive_loss(v, zg, zp, 0.5))(z)
  assert np.isfinite(np.asarray(grad)).all() and np.abs(np.asarray(grad[1:])).sum() > 0


def test_moon_logits_come_from_the_projection_head():
  """MOON's network is encoder, projection head, output layer (the paper, Sec. 3.2; docs/parity.md
  "MOON"): the registry's model reads the logits from the projection, so perturbing only the
  head's output layer ``proj_out`` moves the logits. Before the fix the logits read the encoder's
  features and ``proj_out`` fed only the contrastive term."""
  from fedjax_proj.models import get_model

  model = get_model("mlp", 5, **registry.model_kwargs("moon"))
  x = jnp.asarray(np.random.default_rng(0).normal(size=(3, 12)), jnp.float32)
  variables = model.init(jax.random.key(0), x)
  params = variables["params"]
  assert params["head"]["kernel"].shape == (256, 5)
  moved = {**params, "proj_out": jax.tree_util.tree_map(lambda v: v + 0.1, params["proj_out"])}
  before = model.apply({**variables, "params": params}, x, train=False).logits
  after = model.apply({**variables, "params": moved}, x, train=False).logits
  assert np.abs(np.asarray(after - before)).max() > 1e-3
