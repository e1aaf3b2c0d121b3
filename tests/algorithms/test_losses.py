"""Loss terms (losses.py): DKD against a NumPy reference (the KL decomposition, masking, gradients)
and FedNTD's not-true KL."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_proj.algorithms import losses
from tests import helpers


def _softmax(z):
  e = np.exp(z - z.max(-1, keepdims=True))
  return e / e.sum(-1, keepdims=True)


def numpy_dkd(teacher, student, labels, temperature):
  """Straight from the DKD paper's definitions, float64, probabilities (not log space)."""
  pt, ps = _softmax(teacher / temperature), _softmax(student / temperature)
  tckd, nckd = [], []
  for i, t in enumerate(labels):
    bt = np.array([pt[i, t], 1 - pt[i, t]])
    bs = np.array([ps[i, t], 1 - ps[i, t]])
    tckd.append(np.sum(bt * np.log(bt / bs)))
    keep = np.arange(pt.shape[1]) != t
    qt = pt[i, keep] / pt[i, keep].sum()
    qs = ps[i, keep] / ps[i, keep].sum()
    nckd.append(np.sum(qt * np.log(qt / qs)))
  return np.array(tckd), np.array(nckd)


def _case(b=16, c=7, seed=0, scale=3.0):
  rng = np.random.default_rng(seed)
  teacher = rng.normal(size=(b, c)) * scale
  student = rng.normal(size=(b, c)) * scale
  labels = rng.integers(0, c, b)
  return teacher, student, labels


def test_terms_equal_numpy_reference():
  for temperature in (1.0, 4.0):
    teacher, student, labels = _case()
    tckd, nckd = losses.dkd_per_example(
      jnp.asarray(teacher, jnp.float32), jnp.asarray(student, jnp.float32), labels, temperature
    )
    ref_t, ref_n = numpy_dkd(teacher, student, labels, temperature)
    np.testing.assert_allclose(tckd, ref_t, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(nckd, ref_n, rtol=1e-4, atol=1e-6)


def test_kl_equals_tckd_plus_weighted_nckd():
  """DKD Eq. 3: KL(p^T‖p^S) = TCKD + (1 − p_t^T)·NCKD, same T, before T² and weights."""
  teacher, student, labels = _case(seed=1)
  temperature = 4.0
  t, s = jnp.asarray(teacher, jnp.float32), jnp.asarray(student, jnp.float32)
  tckd, nckd = losses.dkd_per_example(t, s, labels, temperature)
  log_p = jax.nn.log_softmax(t / temperature)
  log_q = jax.nn.log_softmax(s / temperature)
  kl = jnp.sum(jnp.exp(log_p) * (log_p - log_q), -1)
  p_target = jnp.exp(log_p[jnp.arange(len(labels)), labels])
  np.testing.assert_allclose(kl, tckd + (1 - p_target) * nckd, rtol=1e-4, atol=1e-6)
  # And the batchmean wrapper of the full KL agrees with the decomposition (× T²).
  whole = losses.kl_from_logits(t, s, temperature)
  np.testing.assert_allclose(
    whole, temperature**2 * jnp.mean(tckd + (1 - p_target) * nckd), rtol=1e-4
  )


def test_losses_are_masked_means_times_t_squared():
  teacher, student, labels = _case(seed=2)
  mask = (np.arange(16) % 3 != 0).astype(np.float32)
  t, s = jnp.asarray(teacher, jnp.float32), jnp.asarray(student, jnp.float32)
  ref_t, ref_n = numpy_dkd(teacher, student, labels, 4.0)
  keep = mask > 0
  tckd, nckd = helpers.dkd_loss(t, s, labels, 4.0, jnp.asarray(mask))
  np.testing.assert_allclose(tckd, 16 * ref_t[keep].mean(), rtol=1e-4)
  np.testing.assert_allclose(nckd, 16 * ref_n[keep].mean(), rtol=1e-4)


def test_zero_when_equal_and_finite_for_extreme_logits():
  teacher, _, labels = _case(seed=3)
  t = jnp.asarray(teacher, jnp.float32)
  tckd, nckd = losses.dkd_per_example(t, t, labels, 4.0)
  np.testing.assert_allclose(tckd, 0.0, atol=1e-6)
  np.testing.assert_allclose(nckd, 0.0, atol=1e-6)
  big = jnp.asarray(teacher * 1e3, jnp.float32)  # saturated softmaxes
  tckd, nckd = losses.dkd_per_example(big, -big, labels, 1.0)
  assert np.all(np.isfinite(tckd)) and np.all(np.isfinite(nckd))
  assert np.all(np.asarray(tckd) >= -1e-5) and np.all(np.asarray(nckd) >= -1e-5)


def test_gradient_flows_to_student_only():
  teacher, student, labels = _case(seed=4)
  t, s = jnp.asarray(teacher, jnp.float32), jnp.asarray(student, jnp.float32)
  f = lambda a, b: sum(helpers.dkd_loss(a, b, labels))
  gt, gs = jax.grad(f, argnums=(0, 1))(t, s)
  assert np.all(np.asarray(gt) == 0)
  assert np.abs(np.asarray(gs)).max() > 1e-4
  assert np.all(np.isfinite(np.asarray(gs)))


def test_not_true_kl_matches_numpy_and_masks_true_class():
  rng = np.random.default_rng(0)
  zt, zs = rng.normal(size=(5, 6)), rng.normal(size=(5, 6))
  labels = rng.integers(0, 6, 5)
  tau = 2.0
  expected = []
  for i in range(5):
    keep = np.arange(6) != labels[i]
    p, q = _softmax(zt[i, keep] / tau), _softmax(zs[i, keep] / tau)
    expected.append(np.sum(p * np.log(p / q)))
  got = losses.not_true_kl(jnp.asarray(zt), jnp.asarray(zs), jnp.asarray(labels), tau)
  np.testing.assert_allclose(got, tau**2 * np.mean(expected), rtol=1e-5)
  # moving the true-class logits of teacher and student changes nothing
  bump = jax.nn.one_hot(labels, 6) * 7.0
  got2 = losses.not_true_kl(
    jnp.asarray(zt) + bump, jnp.asarray(zs) - bump, jnp.asarray(labels), tau
  )
  np.testing.assert_allclose(got2, got, rtol=1e-5)
  grad = jax.grad(lambda s: losses.not_true_kl(jnp.asarray(zt), s, jnp.asarray(labels), tau))(
    jnp.asarray(zs, jnp.float32)
  )
  assert np.all(np.isfinite(grad))
  np.testing.assert_array_equal(np.asarray(grad)[np.arange(5), labels], 0.0)


def test_l2_norm_equals_the_norm_and_has_a_finite_gradient_at_zero():
  x = jnp.asarray(np.random.default_rng(0).normal(size=(5, 7)), jnp.float32).at[2].set(0.0)
  np.testing.assert_allclose(losses.l2_norm(x), np.linalg.norm(np.asarray(x), axis=-1), rtol=1e-6)
  assert losses.l2_norm(x, keepdims=True).shape == (5, 1)
  grad = jax.grad(lambda v: jnp.sum(losses.l2_norm(v)))(x)
  # d‖x‖/dx = x/‖x‖ on non-zero rows; 0 (not jnp.linalg.norm's NaN) on the zero row.
  np.testing.assert_array_equal(np.asarray(grad[2]), 0.0)
  expected = np.asarray(x) / np.linalg.norm(np.asarray(x), axis=-1, keepdims=True).clip(1e-30)
  np.testing.assert_allclose(np.delete(grad, 2, 0), np.delete(expected, 2, 0), rtol=1e-5)
  assert np.isnan(np.asarray(jax.grad(lambda v: jnp.sum(jnp.linalg.norm(v, axis=-1)))(x))).any()
