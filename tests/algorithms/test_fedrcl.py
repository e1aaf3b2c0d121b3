"""FedRCL (fedrcl.py) against the NumPy reference; its relaxed contrastive terms; gradient
clipping."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_proj.algorithms.fedrcl import relaxed_contrastive_terms
from fedjax_proj.core.engine import run_vmap_scan
from tests.algorithms.baselines_reference import (
  BATCH_FN,
  LR,
  build,
  check_reference_is_not_fedavg,
  check_rounds_match_reference,
  flat,
  linear_model,
  np_logits,
  np_rcl_terms,
  to_np,
  toy_setup,
)


def test_toy_rounds_match_numpy_reference():
  check_rounds_match_reference("fedrcl")


def test_reference_is_not_fedavg():
  check_reference_is_not_fedavg("fedrcl")


def test_relaxation_penalty_is_active_on_the_toy_data():
  """FedRCL's relaxation penalty is active on this data (some same-class pairs are >= 0.7
  similar), so the reference exercises its penalty branch."""
  x, y, _ = toy_setup()
  p0 = to_np(linear_model().init(jax.random.key(0), jnp.asarray(x[:2]))["params"])
  feats = np_logits(p0, x[:6].astype(np.float64))
  assert np_rcl_terms(feats, y[:6])[2] > 0


def test_fedrcl_losses_match_numpy():
  rng = np.random.default_rng(0)
  for _ in range(3):  # the draws of test_moon.py's data, so the features are the same
    rng.normal(size=(6, 5))
  y = np.array([0, 0, 1, 1, 1, 2], np.int32)
  base = rng.normal(size=(3, 5))
  feats = (base[y] + 0.2 * rng.normal(size=(6, 5))).astype(np.float32)
  scl, pen, active = np_rcl_terms(feats.astype(np.float64), y)
  assert active > 0
  got = relaxed_contrastive_terms(jnp.asarray(feats), jnp.asarray(y))
  np.testing.assert_allclose(got, [scl, pen], rtol=1e-4)
  # Thresholds on either side of one same-class similarity switch that pair's penalty on and off.
  f = feats / np.linalg.norm(feats, axis=1, keepdims=True)
  s01 = float(f[0] @ f[1])  # the only other class-0 example of anchors 0 and 1
  for threshold in (s01 - 1e-3, s01 + 1e-3):
    ref = np_rcl_terms(feats.astype(np.float64), y, threshold=threshold, topk=1)
    got_t = relaxed_contrastive_terms(
      jnp.asarray(feats), jnp.asarray(y), threshold=threshold, topk_neg=1
    )
    np.testing.assert_allclose(got_t, ref[:2], rtol=1e-4)
  on = np_rcl_terms(feats.astype(np.float64), y, threshold=s01 - 1e-3)[2]
  off = np_rcl_terms(feats.astype(np.float64), y, threshold=s01 + 1e-3)[2]
  assert on == off + 2
  # Padding: masked rows must not change the result (neither as anchors nor as candidates).
  padded = np.concatenate([feats, rng.normal(size=(2, 5)).astype(np.float32)])
  y_pad = np.concatenate([y, [0, 1]]).astype(np.int32)
  mask = np.array([1] * 6 + [0, 0], np.float32)
  got_pad = relaxed_contrastive_terms(jnp.asarray(padded), jnp.asarray(y_pad), jnp.asarray(mask))
  np.testing.assert_allclose(got_pad, got, rtol=1e-5)


def test_fedrcl_clips_the_local_gradient():
  """With clip_norm = c below the raw gradient norm, one plain-SGD step moves the parameters by
  exactly lr·c; with a large c the step is the ordinary, much larger one."""
  x, y, rounds = toy_setup()
  rd = rounds[0]._replace(mask=rounds[0].mask.at[:, 1].set(False))  # one step per client
  keys = jax.random.split(jax.random.key(0), 2)
  steps = {}
  for clip_norm in (1e-3, 1e3):
    model, alg = build("fedrcl", {"clip_norm": clip_norm}, 0.0)
    variables = model.init(jax.random.key(0), jnp.asarray(x[:2]))
    shared, inputs = alg.broadcast(alg.init(variables, jax.random.key(0)), rd, jax.random.key(0))
    res = run_vmap_scan(
      alg.client, BATCH_FN, shared, inputs, rd.images, rd.labels, rd.idx, rd.mask, keys
    )
    p0 = flat(to_np(variables["params"]))
    steps[clip_norm] = [
      np.linalg.norm(
        flat(to_np(jax.tree.map(lambda a, c=c: a[c], res["variables"]["params"]))) - p0
      )
      for c in range(2)
    ]
  np.testing.assert_allclose(steps[1e-3], [LR * 1e-3] * 2, rtol=1e-3)
  assert min(steps[1e3]) > 10 * LR * 1e-3


def test_bad_hyperparameters_fail_clearly():
  with pytest.raises(ValueError, match="topk_neg >= 1"):
    build("fedrcl", {"topk_neg": 0}, 0.0)


def test_an_all_zero_feature_row_gives_a_finite_gradient():
  # Post-ReLU features of one example can all be zero; the loss's normalisation then must not
  # turn the batch gradient (and, after one step, the model) into NaN.
  features = jnp.asarray(np.random.default_rng(1).normal(size=(6, 8)), jnp.float32).at[1].set(0.0)
  labels = jnp.array([0, 0, 1, 1, 2, 2])
  loss, grad = jax.value_and_grad(lambda f: sum(relaxed_contrastive_terms(f, labels)))(features)
  assert np.isfinite(float(loss)) and np.isfinite(np.asarray(grad)).all()
  assert np.abs(np.asarray(grad)).sum() > 0  # the other rows still learn
