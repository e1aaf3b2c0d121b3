"""Evaluation of a global model: accuracy and loss over a whole split, inference mode."""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_proj.algorithms import losses
from fedjax_proj.core.types import Model


def make_evaluator(
  model: Model, normalize: Callable, batch_size: int = 500
) -> Callable[[dict, jax.Array, jax.Array], dict]:
  """Builds ``evaluate(variables, images, labels) -> {"accuracy", "loss"}``.

  The split is processed in fixed-size batches (the last one padded and masked), so one compiled
  forward pass serves every call. Inference mode: BatchNorm statistics are read, never updated.
  """

  @jax.jit
  def batch_stats(variables, images, labels, mask):
    out = model.apply(variables, normalize(images), train=False)
    logits = out.logits.astype(jnp.float32)
    ce = losses.cross_entropy(logits, labels, mask) * jnp.sum(mask)
    return losses.accuracy_count(logits, labels, mask), ce

  def evaluate(variables, images, labels) -> dict:
    n = int(labels.shape[0])
    correct = total_loss = 0.0
    for start in range(0, n, batch_size):
      stop = min(start + batch_size, n)
      pad = batch_size - (stop - start)
      x, y = images[start:stop], labels[start:stop]
      mask = np.ones(batch_size, np.float32)
      if pad:
        x = jnp.concatenate([x, jnp.zeros((pad, *x.shape[1:]), x.dtype)])
        y = jnp.concatenate([y, jnp.zeros((pad,), y.dtype)])
        mask[batch_size - pad :] = 0.0
      c, lsum = batch_stats(variables, x, y, jnp.asarray(mask))
      correct += float(c)
      total_loss += float(lsum)
    return {"accuracy": correct / max(n, 1), "loss": total_loss / max(n, 1)}

  return evaluate
