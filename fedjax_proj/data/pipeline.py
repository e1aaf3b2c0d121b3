"""On-device input pipeline: gather a step's examples, normalise, optionally augment.

The training set is put on the device once; every local step gathers its batch by index inside the
compiled round, so a round ships only a small [clients, steps, batch] index array.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_proj.core.types import Array, Batch
from fedjax_proj.data.datasets import DATASETS

# Per-channel statistics of the standard training splits (the dataset registry's,
# fedjax_proj/data/datasets.py).
CHANNEL_STATS = {k: d.channel_stats for k, d in DATASETS.items() if d.channel_stats}


# The FedProj authors' code (docs/fedproj.md, "Parity with the authors' code"): CIFAR-10 with the
# widely copied std (the std of per-image stds, not of the pixels), the public CIFAR-100 set with
# its own rounded statistics. ``normalization="code"`` picks these.
CODE_CHANNEL_STATS = {k: d.code_channel_stats for k, d in DATASETS.items() if d.code_channel_stats}
NORMALIZATIONS = ("dataset", "code")


def normalizer(mean, std) -> Callable[[Array], Array]:
  """Returns ``x -> (x / 255 - mean) / std`` for uint8 images; float inputs pass through."""
  mean = jnp.asarray(mean, jnp.float32)
  std = jnp.asarray(std, jnp.float32)

  def normalize(x: Array) -> Array:
    if jnp.issubdtype(x.dtype, jnp.floating):
      return x.astype(jnp.float32)
    return (x.astype(jnp.float32) / 255.0 - mean) / std

  return normalize


def normalizer_for(
  name: str, images: np.ndarray | None = None, stats: str = "dataset"
) -> Callable[[Array], Array]:
  """Normaliser for a dataset: known statistics by name, else computed from ``images``.

  ``stats="code"`` prefers :data:`CODE_CHANNEL_STATS` (the FedProj authors' values).
  """
  if stats not in NORMALIZATIONS:
    raise ValueError(f"normalization must be one of {NORMALIZATIONS}, got {stats!r}.")
  if stats == "code" and name in CODE_CHANNEL_STATS:
    return normalizer(*CODE_CHANNEL_STATS[name])
  if name in CHANNEL_STATS:
    return normalizer(*CHANNEL_STATS[name])
  if images is None or not np.issubdtype(images.dtype, np.integer):
    return normalizer(0.0, 1.0)
  flat = images.reshape(-1, images.shape[-1]).astype(np.float64) / 255.0
  return normalizer(flat.mean(0), np.maximum(flat.std(0), 1e-3))


def flip_and_crop(key: Array, x: Array, padding: int = 4) -> Array:
  """Random horizontal flip and random crop after zero padding, per example. x: [B, H, W, C]."""
  b, h, w, _ = x.shape
  k_flip, k_crop = jax.random.split(key)
  flip = jax.random.bernoulli(k_flip, 0.5, (b,))
  x = jnp.where(flip[:, None, None, None], x[:, :, ::-1, :], x)
  padded = jnp.pad(x, ((0, 0), (padding, padding), (padding, padding), (0, 0)))
  offsets = jax.random.randint(k_crop, (b, 2), 0, 2 * padding + 1)

  def crop(img, off):
    return jax.lax.dynamic_slice(img, (off[0], off[1], 0), (h, w, img.shape[-1]))

  return jax.vmap(crop)(padded, offsets)


def make_batch_fn(
  normalize: Callable[[Array], Array], augment: bool = False
) -> Callable[[Array, Array, Array, Array, Array], Batch]:
  """Builds the engine's ``batch_fn(images, labels, idx, mask, key) -> Batch``."""

  def batch_fn(images, labels, idx, mask, key):
    x = normalize(images[idx])
    if augment:
      x = flip_and_crop(key, x)
    return Batch(x=x, y=labels[idx].astype(jnp.int32), mask=mask.astype(jnp.float32))

  return batch_fn
