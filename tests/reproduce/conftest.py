"""Tiny stand-ins for the shared data folder, for claim runs through the runner's code path."""

from __future__ import annotations

import numpy as np
import pytest

from fedjax_proj.reproduce import runners


def _images(n, shape, classes, seed):
  rng = np.random.default_rng(seed)
  labels = np.arange(n) % classes
  images = rng.integers(0, 255, (n, *shape), dtype=np.uint8)
  return {"image": images, "label": labels.astype(np.int64)}


@pytest.fixture(scope="module")
def data_root(tmp_path_factory):
  """A data folder laid out as ``../shared/data``: CIFAR-10, MNIST and Fashion-MNIST of
  runners.TINY_TRAIN training and 100 test images (random pixels, balanced labels) and a 128-image
  CIFAR-100 public file."""
  root = tmp_path_factory.mktemp("data")
  grayscale = (28, 28, 1)
  for name, shape, classes in (
    ("cifar10", (32, 32, 3), 10),
    ("mnist", grayscale, 10),
    ("fashion_mnist", grayscale, 10),
  ):
    (root / name).mkdir()
    np.savez(root / name / "train.npz", **_images(runners.TINY_TRAIN, shape, classes, 0))
    np.savez(root / name / "test.npz", **_images(100, shape, classes, 1))
  (root / "cifar100").mkdir()
  np.savez(root / "cifar100" / "public_20k.npz", **_images(128, (32, 32, 3), 100, 2))
  return root
