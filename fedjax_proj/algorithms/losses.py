"""Shared loss terms: masked cross-entropy, tempered KL distillation, not-true and decoupled KD.

Conventions (METHODS.md): KL(p‖q) = Σ p log(p/q); "batchmean" = sum over classes, mean over the
(real, unmasked) examples of the batch. Distillation terms are multiplied by T².
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
  t = jax.lax.stop_gradient(teacher_logits.astype(jnp.float32)) / temperature
  s = student_logits.astype(jnp.float32) / temperature
  log_p = jax.nn.log_softmax(t, axis=-1)
  log_q = jax.nn.log_softmax(s, axis=-1)
  per_example = jnp.sum(jnp.exp(log_p) * (log_p - log_q), axis=-1)
  return temperature**2 * masked_mean(per_example, mask)
