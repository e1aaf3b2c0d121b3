"""Shared loss terms: masked cross-entropy, tempered KL distillation, not-true and decoupled KD.

Conventions (docs/methods.md, "Conventions"): KL(p‖q) = Σ p log(p/q); "batchmean" = sum over
classes, mean over the (real, unmasked) examples of the batch. Distillation terms are multiplied by
T².
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax

from fedjax_proj.core.types import Array


def masked_mean(values: Array, mask: Array | None) -> Array:
  """Mean of per-example ``values`` over examples where ``mask`` is nonzero (0 if none)."""
  if mask is None:
    return jnp.mean(values)
  mask = mask.astype(values.dtype)
  return jnp.sum(values * mask) / jnp.maximum(jnp.sum(mask), 1.0)


def l2_norm(x: Array, axis: int = -1, keepdims: bool = False) -> Array:
  """Euclidean norm along ``axis`` whose gradient at a zero vector is 0, not NaN.

  ``jnp.linalg.norm``'s gradient is x / ‖x‖, which is 0/0 at x = 0, and clamping the norm
  afterwards (``maximum(norm, eps)``) does not help: the chain rule multiplies that NaN by the
  clamp's zero. One example whose ReLU features are all zero then turns the whole batch gradient,
  and the model, into NaN. Zero vectors are swapped for ones before the norm and their result
  for 0 after it (the double ``where``), so every other vector goes through ``jnp.linalg.norm``
  itself, forward and backward.
  """
  nonzero = jnp.any(x != 0, axis=axis, keepdims=True)
  norm = jnp.linalg.norm(jnp.where(nonzero, x, 1.0), axis=axis, keepdims=True)
  norm = jnp.where(nonzero, norm, 0.0)
  return norm if keepdims else jnp.squeeze(norm, axis)


def cross_entropy(logits: Array, labels: Array, mask: Array | None = None) -> Array:
  """Masked mean softmax cross-entropy with integer labels."""
  per_example = optax.softmax_cross_entropy_with_integer_labels(logits.astype(jnp.float32), labels)
  return masked_mean(per_example, mask)


def accuracy_count(logits: Array, labels: Array, mask: Array | None = None) -> Array:
  """Number of correctly classified (unmasked) examples."""
  correct = (jnp.argmax(logits, -1) == labels).astype(jnp.float32)
  return jnp.sum(correct if mask is None else correct * mask)


def kl_from_logits(
  teacher_logits: Array,
  student_logits: Array,
  temperature: float = 1.0,
  mask: Array | None = None,
) -> Array:
  """T²·KL(σ(z_t/T) ‖ σ(z_s/T)), batchmean over unmasked examples.

  Gradients flow into the student only; the teacher is treated as a constant.
  """
  per_example = kl_per_example(teacher_logits, student_logits, temperature)
  return temperature**2 * masked_mean(per_example, mask)


def kl_per_example(teacher_logits: Array, student_logits: Array, temperature: float = 1.0) -> Array:
  """KL(σ(z_t/T) ‖ σ(z_s/T)) per example (over the last axis), WITHOUT the T² factor.

  The teacher is a constant (stop_gradient). Shapes [..., C] -> [...].
  """
  t = jax.lax.stop_gradient(teacher_logits.astype(jnp.float32)) / temperature
  s = student_logits.astype(jnp.float32) / temperature
  log_p = jax.nn.log_softmax(t, axis=-1)
  log_q = jax.nn.log_softmax(s, axis=-1)
  return jnp.sum(jnp.exp(log_p) * (log_p - log_q), axis=-1)


# --- Decoupled knowledge distillation (DKD; Zhao et al., CVPR 2022; megvii-research/mdistiller) ---
# KL(p^T‖p^S) = TCKD + (1 − p_t^T)·NCKD per example (DKD paper, Eq. 1–3), before T² and weights.

_NON_TARGET_MASK_VALUE = 1000.0  # mdistiller masks the target logit by subtracting 1000 at T.


def dkd_per_example(
  teacher_logits: Array, student_logits: Array, labels: Array, temperature: float = 4.0
) -> tuple[Array, Array]:
  """Per-example DKD terms (TCKD, NCKD) at temperature T, WITHOUT the T² factor.

  TCKD = KL(b^T‖b^S) with b = [p_t, 1 − p_t] the binary target/non-target split of σ(z/T);
  NCKD = KL(p̂^T‖p̂^S) with p̂ the softmax over the non-target classes (the target logit masked by
  −1000 after dividing by T, as in mdistiller). Computed in log space, so nothing underflows to
  log 0. The teacher is a constant (stop_gradient).

  Args:
    teacher_logits: [B, C].
    student_logits: [B, C].
    labels: [B] int target classes.
    temperature: T.

  Returns:
    (tckd [B], nckd [B]).
  """
  t = jax.lax.stop_gradient(teacher_logits.astype(jnp.float32)) / temperature
  s = student_logits.astype(jnp.float32) / temperature
  gt = jax.nn.one_hot(labels, t.shape[-1], dtype=jnp.float32)

  def binary_log_probs(z):
    log_all = jax.nn.logsumexp(z, axis=-1)
    log_target = jnp.sum(z * gt, axis=-1) - log_all
    log_other = jax.nn.logsumexp(z - _NON_TARGET_MASK_VALUE * gt, axis=-1) - log_all
    return log_target, log_other

  lt_t, lo_t = binary_log_probs(t)
  lt_s, lo_s = binary_log_probs(s)
  tckd = jnp.exp(lt_t) * (lt_t - lt_s) + jnp.exp(lo_t) * (lo_t - lo_s)
  log_p = jax.nn.log_softmax(t - _NON_TARGET_MASK_VALUE * gt, axis=-1)
  log_q = jax.nn.log_softmax(s - _NON_TARGET_MASK_VALUE * gt, axis=-1)
  nckd = jnp.sum(jnp.exp(log_p) * (log_p - log_q), axis=-1)
  return tckd, nckd


def not_true_kl(
  teacher_logits: Array,
  student_logits: Array,
  labels: Array,
  temperature: float = 1.0,
  mask: Array | None = None,
) -> Array:
  """FedNTD's not-true distillation: τ²·KL(σ(z̃_t/τ) ‖ σ(z̃_s/τ)), batchmean.

  z̃ drops the true class: both distributions are softmaxes over the K − 1 other classes, so the
  true class contributes exactly nothing (Lee et al., NeurIPS 2022; code Lee-Gihun/FedNTD).
  """
  num_classes = student_logits.shape[-1]
  true = jax.nn.one_hot(labels, num_classes, dtype=bool)
  t = jnp.where(true, -jnp.inf, jax.lax.stop_gradient(teacher_logits.astype(jnp.float32)))
  s = jnp.where(true, -jnp.inf, student_logits.astype(jnp.float32))
  log_p = jax.nn.log_softmax(t / temperature, axis=-1)
  log_q = jax.nn.log_softmax(s / temperature, axis=-1)
  terms = jnp.where(true, 0.0, jnp.exp(log_p) * (log_p - log_q))
  return temperature**2 * masked_mean(jnp.sum(terms, axis=-1), mask)
