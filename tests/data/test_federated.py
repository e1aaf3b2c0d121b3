"""Round layout: every client example appears exactly once per epoch; sampling is reproducible."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_proj.data.federated import FederatedData
from fedjax_proj.data.pipeline import flip_and_crop, make_batch_fn, normalizer


def _clients():
  return [np.arange(0, 7), np.arange(7, 26), np.arange(26, 56)]


def test_layout_covers_each_example_once_per_epoch():
  fd = FederatedData(_clients(), batch_size=4, local_epochs=3)
  idx, mask, n = fd.round_layout(np.array([0, 1, 2]), round_idx=0, seed=0)
  assert idx.shape == mask.shape == (3, fd.num_steps, 4)
  np.testing.assert_array_equal(n, [7, 19, 30])
  for c, data in enumerate(_clients()):
    used = idx[c][mask[c]]
    counts = np.bincount(used, minlength=56)
    np.testing.assert_array_equal(counts[data], 3)  # E epochs, each example once per epoch
    assert counts.sum() == 3 * len(data)
  # the step axis is padded for small clients and those steps are fully masked
  assert fd.num_steps == 3 * 8
  assert not mask[0, 3 * 2 :].any()


def test_layout_and_sampling_reproducible():
  fd = FederatedData(_clients(), batch_size=4)
  a = fd.round_layout(fd.sample_clients(5, 2, seed=1), 5, seed=1)
  b = fd.round_layout(fd.sample_clients(5, 2, seed=1), 5, seed=1)
  for x, y in zip(a, b):
    np.testing.assert_array_equal(x, y)
  c = fd.round_layout(fd.sample_clients(5, 2, seed=1), 6, seed=1)
  assert not np.array_equal(a[0], c[0])


def test_fixed_local_steps():
  fd = FederatedData(_clients(), batch_size=5, local_steps=4)
  idx, mask, _ = fd.round_layout(np.array([0]), 0, 0)
  assert mask.all() and idx.shape == (1, 4, 5)
  assert set(idx.ravel()) <= set(range(7))


def test_bad_inputs():
  with pytest.raises(ValueError, match="hold no examples"):
    FederatedData([np.arange(3), np.array([], int)], batch_size=2)
  fd = FederatedData(_clients(), batch_size=2)
  with pytest.raises(ValueError, match="clients_per_round"):
    fd.sample_clients(0, 4, 0)


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
