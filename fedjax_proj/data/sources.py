"""Dataset sources: decode a named dataset split into in-memory numpy arrays.

Every loader returns an :class:`ArrayDataset` (images uint8 [N, H, W, C] or tabular float32 [N, D],
labels int32 [N]). Sources:

* npz files with keys ``image`` (uint8 [N, H, W, C]) and ``label`` (integer [N]);
* image-folder trees ``root/<split>/<class>/*.png|jpg|jpeg`` (classes sorted alphabetically give
  the label order), decoded with PIL in a thread pool and cached as an npz;
* the scikit-learn bundled sets ``iris`` and ``digits``;
* TensorFlow Datasets (the default for named datasets when no local copy is configured).

:func:`load_dataset` resolves a name and split to one of them: an explicit ``data_dir``, then the
``FEDJAX_PROJ_DATA_DIR`` environment variable, then TFDS. When nothing is found it raises
:class:`DataNotFoundError` saying what was searched and how to provide the data offline.
"""

from __future__ import annotations

import concurrent.futures
import hashlib
import importlib.util
import os
import pathlib
import tempfile
import warnings
import zipfile
import zlib
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

PathLike = str | os.PathLike

DATA_DIR_ENV = "FEDJAX_PROJ_DATA_DIR"
CACHE_DIR_ENV = "FEDJAX_PROJ_CACHE"
SHARED_DATA_ENV = "FEDJAX_PROJ_SHARED_DATA"

IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg")

# Class counts of the datasets this project knows by name. Local npz copies of these get the
# true count even when a split happens to miss the highest class.
KNOWN_NUM_CLASSES: dict[str, int] = {
  "cifar10": 10,
  "cifar100": 100,
  "mnist": 10,
  "fashion_mnist": 10,
  "svhn_cropped": 10,
  "cinic10": 10,
  "iris": 3,
  "digits": 10,
}

# Example shape of the datasets known by name: data loaded for a name must have it
# (experiments check it before building a model, so a wrong --data_dir fails clearly).
KNOWN_SHAPES: dict[str, tuple[int, ...]] = {
  "cifar10": (32, 32, 3),
  "cifar100": (32, 32, 3),
  "mnist": (28, 28, 1),
  "fashion_mnist": (28, 28, 1),
  "svhn_cropped": (32, 32, 3),
  "cinic10": (32, 32, 3),
  "iris": (4,),
  "digits": (8, 8, 1),
}

# TFDS name -> (image feature key, label feature key). cifar100's "label" is the fine label.
TFDS_DATASETS: dict[str, tuple[str, str]] = {
  "cifar10": ("image", "label"),
  "cifar100": ("image", "label"),
  "mnist": ("image", "label"),
  "fashion_mnist": ("image", "label"),
  "svhn_cropped": ("image", "label"),
}

SKLEARN_DATASETS = ("iris", "digits")
SKLEARN_SPLITS = ("train", "test", "all")

NPZ_FORMAT_HELP = (
  "npz format: np.savez(path, image=<uint8 array [N, H, W, C]>, label=<integer array [N]>), "
  "labels 0..num_classes-1; an optional integer entry 'num_classes' overrides the inferred count"
)

# Bump when the cached npz layout or the decoding rules change, so old caches are not reused.
_CACHE_VERSION = "1"


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


def _canonical_name(name: str) -> str:
  """Lower-cases and maps '-' to '_' so 'Fashion-MNIST' finds 'fashion_mnist' in the tables."""
  return name.strip().lower().replace("-", "_")


def canonical_name(name: str) -> str:
  """The table key of a dataset name ('Fashion-MNIST' -> 'fashion_mnist')."""
  return _canonical_name(name)


def expected_format(name: str) -> tuple[tuple[int, ...], int] | None:
  """(example shape, class count) of a dataset known by name; None for paths and other names."""
  key = _canonical_name(name)
  if looks_like_path(name) or key not in KNOWN_SHAPES:
    return None
  return KNOWN_SHAPES[key], KNOWN_NUM_CLASSES[key]


def _supported_names() -> str:
  return ", ".join(sorted(set(TFDS_DATASETS) | set(SKLEARN_DATASETS) | set(KNOWN_NUM_CLASSES)))


def _resolve_num_classes(labels: np.ndarray, name: str, explicit: int | None, source: str) -> int:
  """Picks the class count (explicit > known name > max label + 1) and checks labels fit in it."""
  if explicit is not None:
    num_classes = int(explicit)
  else:
    num_classes = KNOWN_NUM_CLASSES.get(_canonical_name(name), 0)
    if not num_classes:
      num_classes = int(labels.max()) + 1 if labels.size else 0
  if labels.size and int(labels.max()) >= num_classes:
    raise ValueError(
      f"{source}: label {int(labels.max())} is out of range for {num_classes} classes "
      f"(dataset name {name!r}). Labels must be 0..num_classes-1; if the class count is right, "
      "fix the labels, otherwise store the correct count as 'num_classes' in the npz."
    )
  return num_classes


def _validate_labels(label: np.ndarray, num_examples: int, source: str) -> np.ndarray:
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


def load_npz(
  path: PathLike, *, name: str | None = None, num_classes: int | None = None
) -> ArrayDataset:
  """Loads an npz file holding a whole split.

  Args:
    path: an ``.npz`` with ``image`` (uint8 [N, H, W, C]; float [N, D] is accepted for tabular
      data) and ``label`` (integer [N]), optionally ``num_classes`` (integer scalar).
    name: dataset name used for the known class count and stored in the result; defaults to the
      file name without extension.
    num_classes: overrides every other way of getting the class count.

  Returns:
    The split as an :class:`ArrayDataset`.

  Raises:
    DataNotFoundError: the file does not exist.
    ValueError: the file is not a readable npz (corrupt, truncated) or its arrays have the wrong
      keys, shapes or dtypes.
  """
  path = pathlib.Path(path).expanduser()
  if not path.is_file():
    raise DataNotFoundError(f"npz file {path} does not exist. {NPZ_FORMAT_HELP}.")
  name = name if name is not None else path.stem
  try:
    with np.load(path, allow_pickle=False) as npz:
      if not isinstance(npz, np.lib.npyio.NpzFile):
        raise ValueError("it holds a single .npy array, not an npz archive")
      missing = [key for key in ("image", "label") if key not in npz.files]
      if missing:
        raise KeyError(missing)
      image = npz["image"]
      label = npz["label"]
      stored_classes = npz["num_classes"] if "num_classes" in npz.files else None
  except KeyError as e:
    raise ValueError(
      f"npz file {path} lacks the key(s) {e.args[0]}. {NPZ_FORMAT_HELP}. "
      "Re-save it with those key names."
    ) from e
  except (OSError, ValueError, EOFError, zipfile.BadZipFile, zlib.error) as e:
    # np.load raises a zoo of exception types for a damaged archive; all mean the same thing.
    raise ValueError(
      f"Cannot read npz file {path} ({type(e).__name__}: {e}); it is corrupt, truncated or not "
      f"an npz archive. Re-create or re-copy it. {NPZ_FORMAT_HELP}."
    ) from e

  source = f"npz file {path}"
  if image.ndim == 4 and image.dtype == np.uint8:
    pass
  elif image.ndim == 2 and np.issubdtype(image.dtype, np.floating):
    image = image.astype(np.float32)
  else:
    raise ValueError(
      f"{source}: 'image' has dtype {image.dtype} and shape {image.shape}; expected uint8 "
      f"[N, H, W, C] (add a channel axis to grayscale data with image[..., None] and scale to "
      f"0..255 before np.asarray(..., np.uint8)), or float [N, D] for tabular data. "
      f"{NPZ_FORMAT_HELP}."
    )
  labels = _validate_labels(label, image.shape[0], source)
  if num_classes is None and stored_classes is not None:
    if stored_classes.ndim != 0 or not np.issubdtype(stored_classes.dtype, np.integer):
      raise ValueError(
        f"{source}: 'num_classes' must be an integer scalar, got {stored_classes!r}."
      )
    num_classes = int(stored_classes)
  num_classes = _resolve_num_classes(labels, name, num_classes, source)
  return ArrayDataset(images=image, labels=labels, num_classes=num_classes, name=name)


# --------------------------------------------------------------------------------------------
# Image folders.


def default_cache_dir() -> pathlib.Path:
  """The decoded-image cache: ``$FEDJAX_PROJ_CACHE`` or ``~/.cache/fedjax_proj``."""
  env = os.environ.get(CACHE_DIR_ENV)
  if env:
    return pathlib.Path(env).expanduser()
  return pathlib.Path.home() / ".cache" / "fedjax_proj"


def _list_image_folder(
  split_dir: pathlib.Path,
) -> tuple[list[str], list[tuple[str, int, int, int]]]:
  """Lists class folders (sorted) and their images as (path, label, size, mtime_ns).

  Hidden entries (leading '.') are skipped so that editor or OS droppings never become classes.
  """
  classes = sorted(
    entry.name
    for entry in os.scandir(split_dir)
    if entry.is_dir() and not entry.name.startswith(".")
  )
  files: list[tuple[str, int, int, int]] = []
  for label, cls in enumerate(classes):
    entries = sorted(
      (
        entry
        for entry in os.scandir(split_dir / cls)
        if entry.is_file()
        and not entry.name.startswith(".")
        and entry.name.lower().endswith(IMAGE_EXTENSIONS)
      ),
      key=lambda entry: entry.name,
    )
    for entry in entries:
      stat = entry.stat()
      files.append((entry.path, label, stat.st_size, stat.st_mtime_ns))
  return classes, files


def _has_image(folder: str) -> bool:
  return any(
    entry.is_file() and entry.name.lower().endswith(IMAGE_EXTENSIONS)
    for entry in os.scandir(folder)
  )


def _warn_on_split_class_mismatch(root: pathlib.Path, split: str, classes: list[str]) -> None:
  """Warns when sibling splits have other class folders: labels would then differ across splits.

  Label ids come from the sorted folder names of one split, so a test split missing a class
  folder would silently shift every later label. A sibling counts as a split when its first
  sub-folder directly holds images (so a dataset folder next to split folders is not one). This
  is a warning, not an error, because a sibling may still be something other than a split.
  """
  for entry in os.scandir(root):
    if not entry.is_dir() or entry.name == split or entry.name.startswith("."):
      continue
    other = sorted(
      sub.name for sub in os.scandir(entry.path) if sub.is_dir() and not sub.name.startswith(".")
    )
    if not other or other == classes or not _has_image(os.path.join(entry.path, other[0])):
      continue
    only_here = sorted(set(classes) - set(other))
    only_there = sorted(set(other) - set(classes))
    warnings.warn(
      f"Image folder {root}: class folders of split {split!r} differ from those of "
      f"{entry.name!r} (only in {split!r}: {only_here[:5]}, only in {entry.name!r}: "
      f"{only_there[:5]}). Label ids follow the sorted class folders of each split, so they "
      "will not match across splits; give every split the same class folders (an empty "
      "folder is fine).",
      stacklevel=3,
    )


def _decode_image(path: str) -> np.ndarray:
  """Decodes one image file to uint8 [H, W, 1] (grayscale) or [H, W, 3] (colour)."""
  from PIL import Image  # noqa: PLC0415  (PIL is only needed for image folders)

  try:
    with Image.open(path) as img:
      mode = img.mode
      if mode in ("1", "L", "LA"):
        img = img.convert("L") if mode != "L" else img
      elif mode in ("RGB",):
        pass
      elif mode in ("P", "PA", "RGBA", "RGBX", "CMYK", "YCbCr", "LAB", "HSV"):
        img = img.convert("RGB")
      else:
        # 16-bit and float images would be clipped by a conversion to 8 bits: refuse instead.
        raise ValueError(
          f"unsupported image mode {mode!r} (16-bit or float pixels); convert the images to "
          "8-bit grayscale or RGB"
        )
      array = np.asarray(img, dtype=np.uint8)
  except (OSError, SyntaxError) as e:  # PIL raises these for truncated or non-image files.
    raise ValueError(f"Cannot decode image {path}: {e}. Remove or replace the file.") from e
  except ValueError as e:
    raise ValueError(f"Cannot use image {path}: {e}.") from e
  return array[..., None] if array.ndim == 2 else array


def _decode_chunk(paths: Sequence[str]) -> list[np.ndarray]:
  return [_decode_image(path) for path in paths]


def _stack_images(arrays: list[np.ndarray], paths: Sequence[str]) -> np.ndarray:
  """Stacks decoded images; grayscale ones are repeated to RGB if any image is colour."""
  height, width = arrays[0].shape[:2]
  channels = max(array.shape[2] for array in arrays)
  out = np.empty((len(arrays), height, width, channels), np.uint8)
  for i, array in enumerate(arrays):
    if array.shape[:2] != (height, width):
      raise ValueError(
        f"Image {paths[i]} is {array.shape[1]}x{array.shape[0]} but {paths[0]} is "
        f"{width}x{height}; all images of an image folder must have the same size. Resize them "
        "first (e.g. with PIL Image.resize)."
      )
    out[i] = array  # broadcasting repeats a single grayscale channel when channels == 3
  return out


def _cache_path(cache_dir: pathlib.Path, root: pathlib.Path, split: str, key: str) -> pathlib.Path:
  safe = "".join(c if c.isalnum() or c in "-_" else "_" for c in f"{root.name}_{split}")
  root_hash = hashlib.sha256(f"{root}\n{split}".encode()).hexdigest()[:8]
  return cache_dir / f"imagefolder_{safe}_{root_hash}_{key[:24]}.npz"


def _read_cache(path: pathlib.Path) -> tuple[np.ndarray, np.ndarray, list[str]] | None:
  """Returns (images, labels, classes) from a cache file, or None when absent or unreadable."""
  if not path.is_file():
    return None
  try:
    with np.load(path, allow_pickle=False) as npz:
      return npz["image"], npz["label"], [str(c) for c in npz["classes"]]
  except Exception as e:  # noqa: BLE001  a damaged cache is never fatal: decode again instead.
    warnings.warn(f"Ignoring unreadable cache file {path} ({e}); decoding again.", stacklevel=3)
    return None


def _write_cache(
  path: pathlib.Path, images: np.ndarray, labels: np.ndarray, classes: list[str]
) -> None:
  """Writes the cache atomically (tmp file + os.replace) and drops stale versions of it.

  Atomic so that a concurrent reader, or a run killed mid-write, never sees half a file.
  """
  tmp_name = None
  try:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(dir=path.parent, prefix=path.stem, suffix=".tmp")
    with os.fdopen(fd, "wb") as f:
      np.savez(f, image=images, label=labels, classes=np.asarray(classes, dtype=np.str_))
    os.replace(tmp_name, path)
    tmp_name = None
    prefix = path.name[: path.name.rindex("_") + 1]  # same root and split, other file list
    for stale in path.parent.glob(prefix + "*.npz"):
      if stale != path:
        stale.unlink(missing_ok=True)
  except OSError as e:
    warnings.warn(
      f"Could not write the image cache {path} ({e}); loading works but will decode again next "
      f"time. Set {CACHE_DIR_ENV} to a writable folder to enable caching.",
      stacklevel=3,
    )
  finally:
    if tmp_name is not None:
      pathlib.Path(tmp_name).unlink(missing_ok=True)


def load_image_folder(
  root: PathLike,
  split: str,
  *,
  name: str | None = None,
  cache_dir: PathLike | None = None,
  use_cache: bool = True,
  num_workers: int | None = None,
) -> ArrayDataset:
  """Loads ``root/<split>/<class>/*.png|jpg|jpeg`` into memory.

  Class folders sorted by name give the label ids (so ``airplane`` .. ``truck`` is CIFAR-10's
  standard order); files within a class are taken in name order. Grayscale-only trees give
  [N, H, W, 1], otherwise [N, H, W, 3]. The decoded arrays are cached as an npz keyed on the root
  path, the split and every file's name, size and mtime, so a changed tree is decoded again.

  Args:
    root: the folder holding one sub-folder per split.
    split: split folder name, e.g. ``"train"``.
    name: dataset name stored in the result; defaults to ``root``'s folder name.
    cache_dir: where to cache decoded arrays; default :func:`default_cache_dir`.
    use_cache: set False to neither read nor write the cache.
    num_workers: decoding threads; default ``min(8, 2 * cpu_count)``.

  Returns:
    The split as an :class:`ArrayDataset`; ``num_classes`` is the number of class folders.

  Raises:
    DataNotFoundError: ``root/<split>`` does not exist.
    ValueError: no class folders or images, undecodable files, or images of different sizes.
  """
  root = pathlib.Path(root).expanduser().resolve()
  split_dir = root / split
  if not split_dir.is_dir():
    raise DataNotFoundError(
      f"Image folder split {split_dir} does not exist. Expected the layout "
      f"{root}/<split>/<class>/*.png|jpg|jpeg."
    )
  name = name if name is not None else root.name
  classes, files = _list_image_folder(split_dir)
  if not classes:
    raise ValueError(
      f"{split_dir} has no class sub-folders. Expected {split_dir}/<class>/*.png|jpg|jpeg, one "
      "folder per class."
    )
  if not files:
    raise ValueError(
      f"No images (*.png, *.jpg, *.jpeg) in the class folders of {split_dir} ({classes[:5]}...)."
    )
  _warn_on_split_class_mismatch(root, split, classes)

  digest = hashlib.sha256(f"v{_CACHE_VERSION}\n{root}\n{split}\n".encode())
  prefix = os.path.join(split_dir, "")
  for path, label, size, mtime in files:
    digest.update(f"{path[len(prefix) :]}\t{label}\t{size}\t{mtime}\n".encode())
  cache_file = _cache_path(
    pathlib.Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir(),
    root,
    split,
    digest.hexdigest(),
  )
  labels = np.asarray([label for _, label, _, _ in files], np.int32)
  if use_cache:
    cached = _read_cache(cache_file)
    if (
      cached is not None
      and cached[2] == classes
      and cached[0].shape[0] == len(files)
      and np.array_equal(cached[1], labels)
    ):
      return ArrayDataset(images=cached[0], labels=labels, num_classes=len(classes), name=name)

  paths = [path for path, _, _, _ in files]
  workers = num_workers or min(8, 2 * (os.cpu_count() or 1))
  # Chunks amortise the per-task overhead of the executor over a few hundred small files.
  chunk = 256
  with concurrent.futures.ThreadPoolExecutor(max_workers=workers) as executor:
    decoded = executor.map(
      _decode_chunk, [paths[i : i + chunk] for i in range(0, len(paths), chunk)]
    )
    arrays = [array for part in decoded for array in part]
  images = _stack_images(arrays, paths)
  if use_cache:
    _write_cache(cache_file, images, labels, classes)
  return ArrayDataset(images=images, labels=labels, num_classes=len(classes), name=name)


# --------------------------------------------------------------------------------------------
# scikit-learn bundled sets.


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
  key = _canonical_name(name)
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


# --------------------------------------------------------------------------------------------
# TensorFlow Datasets.


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
  labels = _validate_labels(labels, images.shape[0], source)
  num_classes = _resolve_num_classes(labels, key, num_classes, source)
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
  key = _canonical_name(name)
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


# --------------------------------------------------------------------------------------------
# Resolution.


def looks_like_path(name: str) -> bool:
  """Whether a dataset argument names a file or folder rather than a dataset."""
  return os.sep in name or (os.altsep is not None and os.altsep in name) or name.endswith(".npz")


def _local_candidates(root: pathlib.Path, name: str, split: str) -> list[tuple[pathlib.Path, str]]:
  """The places, in order, where a local copy of (name, split) may live under ``root``."""
  return [
    (root / f"{split}.npz", "npz"),
    (root / name / f"{split}.npz", "npz"),
    (root / split, "folder"),
    (root / name / split, "folder"),
  ]


def _load_local(path: pathlib.Path, kind: str, name: str) -> ArrayDataset:
  if kind == "npz":
    return load_npz(path, name=name)
  return load_image_folder(path.parent, path.name, name=name)


def _search_local(
  root: pathlib.Path, name: str, split: str, searched: list[str]
) -> ArrayDataset | None:
  """Loads (name, split) from the first local candidate under ``root``; None if none exists."""
  if root.is_file():
    if root.suffix.lower() != ".npz":
      raise ValueError(
        f"Data path {root} is a file but not an .npz; point it at an npz file or at a folder "
        f"with <split>.npz or <split>/<class>/*.png|jpg. {NPZ_FORMAT_HELP}."
      )
    # A direct path to one npz is used whole, whatever the split.
    return load_npz(root, name=name)
  for path, kind in _local_candidates(root, name, split):
    searched.append(f"  {path}{'/ (image folder)' if kind == 'folder' else ''}")
    if (kind == "npz" and path.is_file()) or (kind == "folder" and path.is_dir()):
      return _load_local(path, kind, name)
  return None


def _not_found_message(name: str, split: str, searched: list[str], tfds_error: str | None) -> str:
  lines = [f"Dataset {name!r} split {split!r} was not found.", "Searched:"]
  # Items already indented are the candidates under the preceding "local root" item.
  lines += [f"    {item.strip()}" if item.startswith(" ") else f"  - {item}" for item in searched]
  if tfds_error:
    lines.append("  - TFDS: " + tfds_error.replace("\n", "\n    "))
  lines += [
    "To use a local copy (works offline), either:",
    "  - pass --data_dir=<folder> (data_dir=... in Python), or",
    f"  - set {DATA_DIR_ENV}=<folder>,",
    "where <folder> holds <split>.npz, <name>/<split>.npz, <split>/<class>/*.png|jpg, or "
    "<name>/<split>/<class>/*.png|jpg; data_dir may also be the path of a single .npz file.",
    f"{NPZ_FORMAT_HELP}.",
  ]
  return "\n".join(lines)


def load_dataset(
  name: str, split: str, data_dir: PathLike | None = None, *, download: bool = True
) -> ArrayDataset:
  """Loads a dataset split from the first source that has it.

  Resolution: ``iris``/``digits`` come from scikit-learn. A ``name`` containing a path separator
  or ending in ``.npz`` is itself the data path. Otherwise the local root is ``data_dir`` if
  given, else ``$FEDJAX_PROJ_DATA_DIR`` if set; under it the first existing of
  ``<split>.npz``, ``<name>/<split>.npz``, ``<split>/`` (image folder), ``<name>/<split>/`` is
  used. ``data_dir`` may also be an ``.npz`` file, used whole. When no local copy is found, TFDS
  is tried (with its own data dir: set ``$TFDS_DATA_DIR`` to point it elsewhere).

  Args:
    name: dataset name (see ``KNOWN_NUM_CLASSES``; any name works for local copies) or a path.
    split: split name, e.g. ``"train"`` or ``"test"``.
    data_dir: a local folder or npz file; overrides ``$FEDJAX_PROJ_DATA_DIR``.
    download: allow TFDS to download when it is reached.

  Returns:
    The split as an :class:`ArrayDataset`.

  Raises:
    DataNotFoundError: no source has the split; the message lists what was searched and how to
      supply the data offline.
    ValueError: a name that is neither local nor supported, or a malformed local copy.
  """
  if looks_like_path(name):
    path = pathlib.Path(name).expanduser()
    searched: list[str] = []
    dataset = _search_local(path, path.stem if path.is_file() else path.name, split, searched)
    if dataset is None:
      raise DataNotFoundError(_not_found_message(name, split, searched or [str(path)], None))
    return dataset

  key = _canonical_name(name)
  if key in SKLEARN_DATASETS:
    return load_sklearn(key, split)

  searched = []
  if data_dir is not None:
    root, origin = pathlib.Path(data_dir).expanduser(), "data_dir argument"
  elif os.environ.get(DATA_DIR_ENV):
    root, origin = pathlib.Path(os.environ[DATA_DIR_ENV]).expanduser(), f"${DATA_DIR_ENV}"
  else:
    root, origin = None, None
    searched.append(f"no local folder: data_dir not given and ${DATA_DIR_ENV} not set")

  if root is not None:
    if not root.exists():
      # A configured path that does not exist is almost surely a typo: say so rather than
      # silently falling through to a download.
      raise DataNotFoundError(
        f"{origin} points to {root}, which does not exist (dataset {name!r}, split {split!r}). "
        f"Fix the path, or unset it to use TFDS.\n{NPZ_FORMAT_HELP}."
      )
    searched.append(f"local root {root} (from {origin}):")
    dataset = _search_local(root, name, split, searched)
    if dataset is not None:
      return dataset
    if data_dir is not None:
      # An explicit folder is the user's statement of where the data is: never download instead.
      raise DataNotFoundError(
        f"--data_dir={data_dir} holds no data for {name!r} split {split!r} (TFDS is not tried "
        "when a data_dir is given).\n" + _not_found_message(name, split, searched, None)
      )

  if key not in TFDS_DATASETS:
    hint = (
      f"{key!r} is not in TFDS under that name; it can only come from a local copy. "
      if key in KNOWN_NUM_CLASSES
      else f"Unknown dataset {name!r}; supported names: {_supported_names()} (any other name "
      "works only with a local copy). "
    )
    error = DataNotFoundError if key in KNOWN_NUM_CLASSES else UnknownDatasetError
    raise error(hint + "\n" + _not_found_message(name, split, searched, None))
  try:
    return load_tfds(key, split, download=download)
  except DataNotFoundError as e:
    raise DataNotFoundError(_not_found_message(name, split, searched, str(e))) from e


def find_shared_data() -> pathlib.Path | None:
  """Locates the project's shared real-data folder, for tests and benchmarks only.

  ``$FEDJAX_PROJ_SHARED_DATA`` if set, else ``<repository root>/../shared/data``, where the
  repository root is the folder holding the ``fedjax_proj`` package. The library's loaders never
  look here on their own.

  Returns:
    The folder, or None when it does not exist.
  """
  env = os.environ.get(SHARED_DATA_ENV)
  if env:
    path = pathlib.Path(env).expanduser()
    if not path.is_dir():
      warnings.warn(f"${SHARED_DATA_ENV}={env} is not a folder; ignoring it.", stacklevel=2)
      return None
    return path
  repo_root = pathlib.Path(__file__).resolve().parents[2]
  path = repo_root.parent / "shared" / "data"
  return path if path.is_dir() else None
