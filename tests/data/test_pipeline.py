"""data.pipeline: normalisation, augmentation and the engine's batch gather on the round layout."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_proj.data.federated import FederatedData
from fedjax_proj.data.pipeline import (
  CHANNEL_STATS,
  flip_and_crop,
  make_batch_fn,
  normalizer,
  normalizer_for,
)


def test_batch_fn_normalises_and_masks():
  images = jnp.arange(2 * 4 * 4 * 3, dtype=jnp.uint8).reshape(2, 4, 4, 3)
  labels = jnp.array([3, 1])
  fn = make_batch_fn(normalizer((0.5, 0.5, 0.5), (0.25, 0.25, 0.25)))
  b = fn(images, labels, jnp.array([1, 0]), jnp.array([True, False]), jax.random.key(0))
  np.testing.assert_allclose(b.x[0], (images[1] / 255.0 - 0.5) / 0.25, rtol=1e-6)
  np.testing.assert_array_equal(b.y, [1, 3])
  np.testing.assert_array_equal(b.mask, [1.0, 0.0])


def test_flip_and_crop_preserves_content_statistics():
  x = jax.random.uniform(jax.random.key(0), (64, 8, 8, 3))
  y = flip_and_crop(jax.random.key(1), x, padding=2)
  assert y.shape == x.shape
  assert not np.allclose(x, y)
  # zero padding means crops only remove mass, never add it
  assert float(jnp.sum(y)) <= float(jnp.sum(x)) + 1e-3
  # padding=0 leaves only flips: each image equals itself or its mirror
  z = flip_and_crop(jax.random.key(2), x, padding=0)
  same = jnp.all(z == x, axis=(1, 2, 3)) | jnp.all(z == x[:, :, ::-1], axis=(1, 2, 3))
  assert bool(jnp.all(same))


def test_normalizer_scales_uint8_per_channel_and_passes_floats_through():
  norm = normalizer((0.5, 0.25), (0.5, 0.125))
  x = np.array([[[[0, 255], [51, 102]]]], np.uint8)  # [1, 1, 2, 2]
  expected = (x.astype(np.float64) / 255.0 - np.array([0.5, 0.25])) / np.array([0.5, 0.125])
  np.testing.assert_allclose(norm(jnp.asarray(x)), expected, rtol=1e-6)
  floats = jnp.asarray([[0.3, -2.0]], jnp.float32)
  out = norm(floats)
  assert out.dtype == jnp.float32
  np.testing.assert_array_equal(out, floats)  # already features: unchanged


def test_normalizer_for_known_names_uses_the_table_and_others_their_own_statistics():
  images = np.random.default_rng(0).integers(0, 256, (50, 4, 4, 3), dtype=np.uint8)
  mean, std = CHANNEL_STATS["cifar10"]
  np.testing.assert_allclose(
    normalizer_for("cifar10", images)(jnp.asarray(images)),
    normalizer(mean, std)(jnp.asarray(images)),
    rtol=1e-6,
  )
  # An unknown name: the images' own per-channel statistics, so the result is standardised.
  skewed = (images // 4 + np.array([0, 60, 120], np.uint8)).astype(np.uint8)
  out = np.asarray(normalizer_for("my_folder", skewed)(jnp.asarray(skewed)), np.float64)
  np.testing.assert_allclose(out.mean(axis=(0, 1, 2)), 0.0, atol=1e-5)
  np.testing.assert_allclose(out.std(axis=(0, 1, 2)), 1.0, atol=1e-4)
  # Tabular (float) data and no data at all are left as they are.
  tabular = np.random.default_rng(1).normal(size=(5, 4)).astype(np.float32)
  np.testing.assert_array_equal(normalizer_for("iris", tabular)(jnp.asarray(tabular)), tabular)


def test_flip_and_crop_gives_a_window_of_the_padded_maybe_mirrored_image():
  padding = 2
  x = jax.random.uniform(jax.random.key(0), (12, 5, 6, 2))
  y = np.asarray(jax.jit(flip_and_crop, static_argnums=2)(jax.random.key(7), x, padding))
  padded = np.pad(np.asarray(x), ((0, 0), (padding, padding), (padding, padding), (0, 0)))
  mirrored = padded[:, :, ::-1, :]  # mirroring the padded image = padding the mirror
  h, w = x.shape[1:3]
  windows = set()
  for b in range(x.shape[0]):
    found = [
      (flip, dy, dx)
      for flip, src in ((False, padded), (True, mirrored))
      for dy in range(2 * padding + 1)
      for dx in range(2 * padding + 1)
      if np.array_equal(src[b, dy : dy + h, dx : dx + w], y[b])
    ]
    assert found, f"example {b} is not a crop of its padded (mirrored) image"
    windows.add(found[0])
  assert len(windows) > 3  # offsets and flips are drawn per example, not once per batch


def test_round_layout_through_batch_fn_feeds_each_example_once_per_epoch():
  clients = [np.arange(0, 5), np.arange(5, 16), np.arange(16, 19)]
  fd = FederatedData(clients, batch_size=4, local_epochs=2)
  idx, mask, _ = fd.round_layout(np.array([0, 1, 2]), round_idx=3, seed=1)
  n = 19
  # Float "images" carry their own index, so the gathered batch says which examples it holds.
  images = jnp.arange(n, dtype=jnp.float32).reshape(n, 1, 1, 1)
  labels = jnp.arange(n) % 7
  batch_fn = make_batch_fn(normalizer(0.0, 1.0))
  keys = jax.random.split(jax.random.key(0), idx.shape[:2])
  gather = jax.vmap(jax.vmap(lambda i, m, k: batch_fn(images, labels, i, m, k)))
  batches = gather(jnp.asarray(idx), jnp.asarray(mask), keys)
  assert batches.x.shape == (3, fd.num_steps, 4, 1, 1, 1)
  assert batches.y.dtype == jnp.int32 and batches.mask.dtype == jnp.float32
  ids = np.asarray(batches.x[..., 0, 0, 0]).astype(int)
  np.testing.assert_array_equal(np.asarray(batches.y), ids % 7)  # labels travel with images
  np.testing.assert_array_equal(np.asarray(batches.mask), mask.astype(np.float32))
  for c, data in enumerate(clients):
    fed = ids[c][mask[c]]
    np.testing.assert_array_equal(np.sort(fed), np.sort(np.repeat(data, 2)))  # E = 2 epochs
    per_epoch = -(-len(data) // 4)
    for e in range(2):  # each epoch alone holds every example exactly once
      steps = slice(e * per_epoch, (e + 1) * per_epoch)
      epoch = ids[c, steps][mask[c, steps]]
      np.testing.assert_array_equal(np.sort(epoch), data)
