"""data.federated: every client example appears exactly once per epoch; sampling is reproducible."""

from __future__ import annotations

import numpy as np
import pytest

from fedjax_proj.data.federated import FederatedData


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
