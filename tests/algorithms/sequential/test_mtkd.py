"""Multi-teacher KD on FedSeq (mtkd.py; 004 Table 2): each weight formula and the KD term against
NumPy, AVER's equivalence with distilling the averaged soft targets, and the round."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from fedjax_proj.algorithms import registry
from fedjax_proj.algorithms.base import make_round
from fedjax_proj.algorithms.sequential.fedseq import fedseq
from fedjax_proj.algorithms.sequential.mtkd import (
  MTKDConfig,
  mtkd,
  multi_teacher_kd,
  teacher_weights,
)
from fedjax_proj.core import tree as tree_lib
from tests import helpers
from tests.algorithms.sequential.test_base import LR


def _np_softmax(z, axis=-1):
  e = np.exp(z - z.max(axis=axis, keepdims=True))
  return e / e.sum(axis=axis, keepdims=True)


def np_weights(weighting, t_logits, labels):
  """NumPy reference, float64: [K, B] weights (docstring of mtkd.py)."""
  t = np.asarray(t_logits, np.float64)
  k, b, _ = t.shape
  if weighting == "aver":
    return np.full((k, b), 1.0 / k)
  p = _np_softmax(t)
  if weighting == "ebkd":
    h = -(p * np.log(p)).sum(-1)
    return (1.0 - h / h.sum(0)) / (k - 1)
  ce = -np.log(p[:, np.arange(b), labels])  # [K, B]
  return (1.0 - _np_softmax(ce, axis=0)) / (k - 1)


def _inputs(seed=0, k=3, b=6, c=5):
  rng = np.random.default_rng(seed)
  t = rng.normal(size=(k, b, c)) * np.array([0.5, 2.0, 4.0])[:k, None, None]  # unequal sharpness
  s = rng.normal(size=(b, c))
  y = rng.integers(0, c, b)
  mask = (np.arange(b) < b - 2).astype(np.float32)
  return jnp.asarray(t, jnp.float32), jnp.asarray(s, jnp.float32), jnp.asarray(y), jnp.asarray(mask)


@pytest.mark.parametrize("weighting", ["aver", "ebkd", "camkd"])
def test_teacher_weights_match_numpy_and_sum_to_one(weighting):
  t, _, y, _ = _inputs()
  w = np.asarray(teacher_weights(weighting, t, y))
  ref = np_weights(weighting, np.asarray(t), np.asarray(y))
  np.testing.assert_allclose(w, ref, rtol=1e-5, atol=1e-7)
  np.testing.assert_allclose(w.sum(0), 1.0, rtol=1e-6)
  assert np.all(w >= 0)


def test_weights_favour_confident_and_correct_teachers():
  """EBKD: lower entropy, larger weight; CA-MKD: lower CE on the true label, larger weight."""
  t, _, y, _ = _inputs(1)
  p = _np_softmax(np.asarray(t, np.float64))
  entropy = -(p * np.log(p)).sum(-1)
  ce = -np.log(p[:, np.arange(p.shape[1]), np.asarray(y)])
  for weighting, score in (("ebkd", entropy), ("camkd", ce)):
    w = np.asarray(teacher_weights(weighting, t, y))
    for b in range(w.shape[1]):
      order = np.argsort(score[:, b])
      assert np.all(np.diff(w[order, b]) <= 1e-7), (weighting, b)


def test_one_teacher_gets_weight_one():
  t, _, y, _ = _inputs(k=1)
  for weighting in ("aver", "ebkd", "camkd"):
    np.testing.assert_allclose(teacher_weights(weighting, t, y), 1.0)


@pytest.mark.parametrize("weighting", ["aver", "ebkd", "camkd"])
@pytest.mark.parametrize("squared", [True, False])
def test_kd_term_matches_numpy(weighting, squared):
  t, s, y, mask = _inputs(2)
  cfg = MTKDConfig(weighting=weighting, temperature=3.0, temperature_squared=squared)
  got = multi_teacher_kd(t, s, y, mask, cfg)
  tau = 3.0
  p = _np_softmax(np.asarray(t, np.float64) / tau)
  q = _np_softmax(np.asarray(s, np.float64) / tau)
  kl = (p * (np.log(p) - np.log(q)[None])).sum(-1)  # [K, B]
  per_example = (np_weights(weighting, np.asarray(t), np.asarray(y)) * kl).sum(0)
  m = np.asarray(mask)
  ref = (per_example * m).sum() / m.sum() * (tau**2 if squared else 1.0)
  np.testing.assert_allclose(got, ref, rtol=1e-5)


def test_aver_gradient_equals_kl_to_the_averaged_soft_targets():
  """Σ_k KL(p_k‖q)/K and KL(mean_k p_k‖q) differ by a constant: equal student gradients."""
  t, s, y, mask = _inputs(3)
  cfg = MTKDConfig(weighting="aver", temperature=2.0, temperature_squared=False)
  grad = jax.grad(lambda z: multi_teacher_kd(t, z, y, mask, cfg))(s)
  p_mean = jnp.mean(jax.nn.softmax(t / 2.0, axis=-1), axis=0)

  def kl_to_mean(z):
    log_q = jax.nn.log_softmax(z / 2.0, axis=-1)
    per = jnp.sum(p_mean * (jnp.log(p_mean) - log_q), axis=-1)
    return jnp.sum(per * mask) / jnp.sum(mask)

  np.testing.assert_allclose(grad, jax.grad(kl_to_mean)(s), atol=1e-6)
  assert float(jnp.abs(grad).max()) > 1e-3


def test_bad_input_is_a_clear_error():
  with pytest.raises(ValueError, match="Unknown weighting"):
    MTKDConfig(weighting="mean").validate()
  with pytest.raises(ValueError, match="Unknown teacher selection"):
    MTKDConfig(selection="best").validate()
  with pytest.raises(ValueError, match="selection='best' is not one of"):
    registry.check_hparams("fedseq_ebkd", {"selection": "best"})
  with pytest.raises(ValueError, match="unknown key"):
    registry.check_hparams("fedseq_camkd", {"weighting": "aver"})  # fixed by the name


def test_zero_kd_weight_is_fedseq_and_kd_changes_training():
  x, y, model, fd, variables = helpers.sequential_setup()
  bf = helpers.float_batch_fn()

  def final(alg):
    round_fn = make_round(alg, "vmap_scan", bf)
    state = alg.init(variables, jax.random.key(0))
    for r in range(2):
      state, _ = round_fn(state, helpers.round_data(fd, x, y, round_idx=r), jax.random.key(20 + r))
    return tree_lib.tree_ravel(state.variables)

  ref = final(fedseq(model, optax.sgd(LR)))
  off = final(mtkd(model, optax.sgd(LR), 3, MTKDConfig("camkd", 2, kd_weight=0.0)))
  on = final(mtkd(model, optax.sgd(LR), 3, MTKDConfig("camkd", 2)))
  np.testing.assert_allclose(off, ref, atol=1e-5)
  assert np.abs(np.asarray(on - ref)).max() > 1e-3
