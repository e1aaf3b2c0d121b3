"""TensorFlow Datasets sources: a TFDS split read fully into memory (ArrayRecord, else TFRecord).

A missing split is downloaded only when the network answers; otherwise the loader fails at once
with :class:`~fedjax_proj.data.sources.common.DataNotFoundError` saying what it tried.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Sequence

import numpy as np

from fedjax_proj.data.datasets import DATASETS
from fedjax_proj.data.sources.common import (
  ArrayDataset,
  DataNotFoundError,
  PathLike,
  canonical_name,
  resolve_num_classes,
  validate_labels,
)

# TFDS name -> (image feature key, label feature key): the dataset registry's TFDS datasets
# (fedjax_proj/data/datasets.py). cifar100's "label" is the fine label.
TFDS_DATASETS: dict[str, tuple[str, str]] = {
  k: d.tfds_keys for k, d in DATASETS.items() if d.tfds_keys
}


def _tensorflow_installed() -> bool:
  return importlib.util.find_spec("tensorflow") is not None


def _examples_to_arrays(
  examples: Sequence[dict], image_key: str, label_key: str, source: str
) -> tuple[np.ndarray, np.ndarray]:
  if not examples:
    raise ValueError(f"{source} returned no examples.")
  images = np.stack([np.asarray(ex[image_key]) for ex in examples])
  labels = np.asarray([ex[label_key] for ex in examples])
  return images, labels


def _finish_tfds(
  images: np.ndarray, labels: np.ndarray, key: str, num_classes: int | None, source: str
) -> ArrayDataset:
  if images.dtype != np.uint8 or images.ndim != 4:
    raise ValueError(
      f"{source}: images have dtype {images.dtype} and shape {images.shape}; expected uint8 "
      "[N, H, W, C]."
    )
  labels = validate_labels(labels, images.shape[0], source)
  num_classes = resolve_num_classes(labels, key, num_classes, source)
  return ArrayDataset(images=images, labels=labels, num_classes=num_classes, name=key)


def _tfds_num_classes(info, label_key: str) -> int | None:
  """Reads the class count from TFDS metadata; None when the metadata does not have it."""
  try:
    return int(info.features[label_key].num_classes)
  except (AttributeError, KeyError, TypeError):
    return None


# Where TFDS downloads from; a TCP connection to it says whether a download can start.
NETWORK_PROBE = ("storage.googleapis.com", 443)
NETWORK_TIMEOUT = 3.0


def network_available(
  address: tuple[str, int] = NETWORK_PROBE, timeout: float = NETWORK_TIMEOUT
) -> bool:
  """Whether a TCP connection to ``address`` opens within ``timeout`` seconds (DNS included)."""
  import socket  # noqa: PLC0415

  try:
    with socket.create_connection(address, timeout=timeout):
      return True
  except OSError:
    return False


def load_tfds(
  name: str, split: str, data_dir: PathLike | None = None, *, download: bool = True
) -> ArrayDataset:
  """Loads a TFDS split fully into memory.

  Tries ``tfds.data_source`` first: it reads ArrayRecord files with random access and needs no
  TensorFlow. If that fails (e.g. data prepared in the older TFRecord format) and TensorFlow is
  installed, falls back to ``tfds.load(..., batch_size=-1)`` + ``tfds.as_numpy``.

  Args:
    name: one of ``TFDS_DATASETS`` (cifar10, cifar100 (fine labels), mnist, fashion_mnist,
      svhn_cropped).
    split: a TFDS split string, e.g. ``"train"``, ``"test"`` or ``"train[:10%]"``.
    data_dir: TFDS data dir; default TFDS's own (``$TFDS_DATA_DIR`` or ``~/tensorflow_datasets``).
    download: let TFDS download and prepare the data when it is missing.

  Returns:
    The split as an :class:`ArrayDataset`.

  Raises:
    ValueError: ``name`` is not a supported TFDS dataset.
    DataNotFoundError: TFDS could not provide the data (not prepared, no network, ...).
  """
  key = canonical_name(name)
  if key not in TFDS_DATASETS:
    raise ValueError(
      f"Dataset {name!r} is not supported through TFDS; supported: {sorted(TFDS_DATASETS)}."
    )
  image_key, label_key = TFDS_DATASETS[key]
  where = f"data_dir={data_dir}" if data_dir is not None else "TFDS default data_dir"
  try:
    import tensorflow_datasets as tfds  # noqa: PLC0415  (slow import, only needed here)
  except ImportError as e:
    raise DataNotFoundError(
      f"TFDS dataset {key!r} split {split!r}: tensorflow_datasets is not importable ({e})."
    ) from e

  data_dir = os.fspath(data_dir) if data_dir is not None else None
  failures = []

  # TFDS signals "not available" with many exception types (network, missing prepare step,
  # unsupported file format, missing optional modules), so any exception here means "try the
  # next way"; the conversion below stays outside the try so our own bugs are not hidden.
  def source_or_none(allow_download: bool):
    try:
      return tfds.data_source(key, split=split, data_dir=data_dir, download=allow_download)
    except Exception as e:  # noqa: BLE001
      failures.append(f"tfds.data_source: {type(e).__name__}: {str(e).strip()[:300]}")
      return None

  source = source_or_none(False)  # prepared data needs no network
  if source is None and download:
    if not network_available():
      # TFDS would retry the download for minutes and leave partial files behind: fail at once.
      raise DataNotFoundError(
        f"TFDS dataset {key!r} split {split!r} is not prepared ({where}) and there is no network "
        f"to download it (no connection to {NETWORK_PROBE[0]}:{NETWORK_PROBE[1]} within "
        f"{NETWORK_TIMEOUT:g} s).\n  " + "\n  ".join(failures)
      )
    source = source_or_none(True)
  if source is not None:
    # Item-by-item access: batched __getitems__ is not implemented by tfds.testing.mock_data.
    examples = [source[i] for i in range(len(source))]
    images, labels = _examples_to_arrays(examples, image_key, label_key, f"TFDS {key}:{split}")
    num_classes = _tfds_num_classes(source.dataset_info, label_key)
    return _finish_tfds(images, labels, key, num_classes, f"TFDS {key}:{split}")

  if _tensorflow_installed():
    try:
      data, info = tfds.load(
        key, split=split, data_dir=data_dir, batch_size=-1, download=download, with_info=True
      )
      arrays = tfds.as_numpy(data)
    except Exception as e:  # noqa: BLE001
      failures.append(f"tfds.load: {type(e).__name__}: {str(e).strip()[:300]}")
    else:
      return _finish_tfds(
        np.asarray(arrays[image_key]),
        np.asarray(arrays[label_key]),
        key,
        _tfds_num_classes(info, label_key),
        f"TFDS {key}:{split}",
      )
  else:
    failures.append("tfds.load: skipped (TensorFlow is not installed)")
  raise DataNotFoundError(
    f"TFDS could not provide {key!r} split {split!r} ({where}, download={download}):\n  "
    + "\n  ".join(failures)
  )
