"""data.sources.scikit_learn: the bundled iris and digits sets and their seeded split."""

from __future__ import annotations

import numpy as np
import pytest

from fedjax_proj.data import sources


@pytest.mark.parametrize(
  "name, split, shape, dtype",
  [
    ("iris", "all", (150, 4), np.float32),
    ("iris", "train", (120, 4), np.float32),
    ("iris", "test", (30, 4), np.float32),
    ("digits", "all", (1797, 8, 8, 1), np.uint8),
    ("digits", "test", (360, 8, 8, 1), np.uint8),
  ],
)
def test_sklearn_shapes(name, split, shape, dtype):
  ds = sources.load_dataset(name, split)
  assert ds.images.shape == shape and ds.images.dtype == dtype
  assert ds.labels.shape == shape[:1] and ds.labels.dtype == np.int32
  assert ds.num_classes == {"iris": 3, "digits": 10}[name]


def test_sklearn_splits_are_stratified_and_disjoint():
  train, test = sources.load_sklearn("iris", "train"), sources.load_sklearn("iris", "test")
  np.testing.assert_array_equal(np.bincount(test.labels), [10, 10, 10])
  rows = {tuple(r) for r in train.images} & {tuple(r) for r in test.images}
  assert len(rows) <= 1  # iris has one duplicated row; otherwise disjoint
  digits = sources.load_sklearn("digits", "all")
  assert digits.images.max() == 255 and digits.images.min() == 0
  with pytest.raises(ValueError, match="no split 'validation'"):
    sources.load_sklearn("iris", "validation")
