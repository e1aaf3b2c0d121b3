"""Image-folder sources: ``root/<split>/<class>/*.png|jpg|jpeg`` decoded with PIL and cached.

Class folders sorted by name give the label ids. Decoding runs in a thread pool and the decoded
arrays are cached as an npz keyed on the tree's file list, so a second load reads one file.
"""

from __future__ import annotations

import concurrent.futures
import hashlib
import os
import pathlib
import sys
import tempfile
import time
import warnings
from collections.abc import Sequence

import numpy as np
from tqdm.auto import tqdm

from fedjax_proj.core.user_cache import user_cache_root
from fedjax_proj.data.sources.common import (
  CACHE_DIR_ENV,
  ArrayDataset,
  DataNotFoundError,
  PathLike,
)

IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg")

# Bump when the cached npz layout or the decoding rules change, so old caches are not reused.
_CACHE_VERSION = "1"


def default_cache_dir() -> pathlib.Path:
  """The decoded-data cache: ``$FEDJAX_PROJ_CACHE``, else ``fedjax_proj`` under
  ``$XDG_CACHE_HOME`` (the XDG base directory convention, as the compilation cache's), else under
  ``~/.cache``."""
  env = os.environ.get(CACHE_DIR_ENV, "").strip()
  if env:
    return pathlib.Path(env).expanduser()
  return user_cache_root()


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
  # Decoding a large tree the first time takes a while (about a minute for CIFAR-10's 50k JPEGs on
  # 2 cores): say what is happening and where the result goes, and show progress on a terminal.
  began = time.perf_counter()
  print(
    f"decoding {len(paths)} images of {split_dir} (once: later runs read "
    f"{cache_file if use_cache else 'them again, the cache is off'})",
    file=sys.stderr,
    flush=True,
  )
  # Chunks amortise the per-task overhead of the executor over a few hundred small files.
  chunk = 256
  with (
    concurrent.futures.ThreadPoolExecutor(max_workers=workers) as executor,
    tqdm(total=len(paths), unit="image", desc="decoding", file=sys.stderr, disable=None) as bar,
  ):
    arrays = []
    for part in executor.map(
      _decode_chunk, [paths[i : i + chunk] for i in range(0, len(paths), chunk)]
    ):
      arrays.extend(part)
      bar.update(len(part))
  print(f"decoded {len(paths)} images in {time.perf_counter() - began:.1f} s", file=sys.stderr)
  images = _stack_images(arrays, paths)
  if use_cache:
    _write_cache(cache_file, images, labels, classes)
  return ArrayDataset(images=images, labels=labels, num_classes=len(classes), name=name)
