"""Shared pieces of the dataset sources: the result type, errors, name tables and label checks.

Every loader in :mod:`fedjax_proj.data.sources` returns an :class:`ArrayDataset` and raises
:class:`DataNotFoundError` when it cannot find its data; the views of the dataset registry
(class counts, example shapes) and the label checks below are shared by the npz, TFDS and
scikit-learn loaders and by name resolution.
"""

from __future__ import annotations

import os
from typing import NamedTuple

import numpy as np

from fedjax_proj.data.datasets import DATASETS

PathLike = str | os.PathLike

DATA_DIR_ENV = "FEDJAX_PROJ_DATA_DIR"
CACHE_DIR_ENV = "FEDJAX_PROJ_CACHE"
SHARED_DATA_ENV = "FEDJAX_PROJ_SHARED_DATA"

# Views of the dataset registry (fedjax_proj/data/datasets.py) the loaders read: class counts
# (local npz copies of these get the true count even when a split misses the highest class) and
# example shapes (data loaded for a name must have it).
KNOWN_NUM_CLASSES: dict[str, int] = {k: d.num_classes for k, d in DATASETS.items()}
KNOWN_SHAPES: dict[str, tuple[int, ...]] = {k: d.shape for k, d in DATASETS.items()}

NPZ_FORMAT_HELP = (
  "npz format: np.savez(path, image=<uint8 array [N, H, W, C]>, label=<integer array [N]>), "
  "labels 0..num_classes-1; an optional integer entry 'num_classes' overrides the inferred count"
)


class DataNotFoundError(FileNotFoundError):
  """A dataset split could not be found locally nor loaded from TFDS."""


class UnknownDatasetError(DataNotFoundError, ValueError):
  """A dataset name that no source supports, with no local copy found either.

  Both a :class:`DataNotFoundError` (nothing was loaded) and a ``ValueError`` (the name is bad).
  """


class ArrayDataset(NamedTuple):
  """One split of a dataset, fully in memory.

  Attributes:
    images: uint8 [N, H, W, C] for image datasets; float32 [N, D] for tabular ones (Iris).
    labels: int32 [N], values in ``[0, num_classes)``.
    num_classes: number of classes of the dataset (not only those present in this split).
    name: dataset name, for logs and run names.
  """

  images: np.ndarray
  labels: np.ndarray
  num_classes: int
  name: str


def canonical_name(name: str) -> str:
  """The table key of a dataset name: lower-case, '-' as '_' (Fashion-MNIST: 'fashion_mnist')."""
  return name.strip().lower().replace("-", "_")


def looks_like_path(name: str) -> bool:
  """Whether a dataset argument names a file or folder rather than a dataset."""
  return os.sep in name or (os.altsep is not None and os.altsep in name) or name.endswith(".npz")


def expected_format(name: str) -> tuple[tuple[int, ...], int] | None:
  """(example shape, class count) of a dataset known by name; None for paths and other names."""
  key = canonical_name(name)
  if looks_like_path(name) or key not in KNOWN_SHAPES:
    return None
  return KNOWN_SHAPES[key], KNOWN_NUM_CLASSES[key]


def resolve_num_classes(labels: np.ndarray, name: str, explicit: int | None, source: str) -> int:
  """Picks the class count (explicit > known name > max label + 1) and checks labels fit in it."""
  if explicit is not None:
    num_classes = int(explicit)
  else:
    num_classes = KNOWN_NUM_CLASSES.get(canonical_name(name), 0)
    if not num_classes:
      num_classes = int(labels.max()) + 1 if labels.size else 0
  if labels.size and int(labels.max()) >= num_classes:
    raise ValueError(
      f"{source}: label {int(labels.max())} is out of range for {num_classes} classes "
      f"(dataset name {name!r}). Labels must be 0..num_classes-1; if the class count is right, "
      "fix the labels, otherwise store the correct count as 'num_classes' in the npz."
    )
  return num_classes


def validate_labels(label: np.ndarray, num_examples: int, source: str) -> np.ndarray:
  """Checks labels are a 1-D non-negative integer array of the right length; returns int32."""
  if label.ndim != 1 or label.shape[0] != num_examples:
    raise ValueError(
      f"{source}: 'label' has shape {label.shape}, expected [{num_examples}] (one integer label "
      f"per image). {NPZ_FORMAT_HELP}."
    )
  if not np.issubdtype(label.dtype, np.integer):
    raise ValueError(
      f"{source}: 'label' has dtype {label.dtype}, expected an integer dtype. Convert the class "
      f"ids with label.astype(np.int64). {NPZ_FORMAT_HELP}."
    )
  if label.size and (int(label.min()) < 0 or int(label.max()) > np.iinfo(np.int32).max):
    raise ValueError(
      f"{source}: labels span [{int(label.min())}, {int(label.max())}]; they must be class ids "
      f"0..num_classes-1. {NPZ_FORMAT_HELP}."
    )
  return label.astype(np.int32)
