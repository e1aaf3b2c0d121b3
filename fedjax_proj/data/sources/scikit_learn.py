"""scikit-learn sources: the bundled ``iris`` and ``digits`` sets, split 80/20 with a fixed seed."""

from __future__ import annotations

import numpy as np

from fedjax_proj.data.sources.common import KNOWN_NUM_CLASSES, ArrayDataset, canonical_name

SKLEARN_DATASETS = ("iris", "digits")
SKLEARN_SPLITS = ("train", "test", "all")


def load_sklearn(name: str, split: str = "all") -> ArrayDataset:
  """Loads a scikit-learn bundled dataset (no download needed).

  ``iris`` gives float32 features [150, 4] and 3 classes. ``digits`` gives its 8x8 images as
  uint8 [1797, 8, 8, 1] scaled from 0..16 to 0..255 (x * 255 / 16, rounded) so they go through
  the same image pipeline as the other datasets; 10 classes.

  These sets have no official split: ``"train"`` is a stratified 80% drawn with
  ``train_test_split(random_state=0)``, ``"test"`` the other 20%, ``"all"`` everything. Indices
  within a split keep the original order.

  Args:
    name: ``"iris"`` or ``"digits"``.
    split: ``"train"``, ``"test"`` or ``"all"``.

  Returns:
    The split as an :class:`ArrayDataset`.
  """
  key = canonical_name(name)
  if key not in SKLEARN_DATASETS:
    raise ValueError(f"Unknown scikit-learn dataset {name!r}; supported: {SKLEARN_DATASETS}.")
  if split not in SKLEARN_SPLITS:
    raise ValueError(
      f"Dataset {key!r} has no split {split!r}; use one of {SKLEARN_SPLITS} (train/test are a "
      "seeded stratified 80/20 split)."
    )
  from sklearn import datasets as sk_datasets  # noqa: PLC0415  (slow import, only needed here)
  from sklearn.model_selection import train_test_split  # noqa: PLC0415

  if key == "iris":
    bunch = sk_datasets.load_iris()
    images = np.asarray(bunch.data, np.float32)
  else:
    bunch = sk_datasets.load_digits()
    scaled = np.rint(np.asarray(bunch.images, np.float64) * (255.0 / 16.0))
    images = scaled.astype(np.uint8)[..., None]
  labels = np.asarray(bunch.target, np.int32)
  if split != "all":
    train_idx, test_idx = train_test_split(
      np.arange(labels.shape[0]), test_size=0.2, random_state=0, stratify=labels
    )
    idx = np.sort(train_idx if split == "train" else test_idx)
    images, labels = images[idx], labels[idx]
  return ArrayDataset(images=images, labels=labels, num_classes=KNOWN_NUM_CLASSES[key], name=key)
