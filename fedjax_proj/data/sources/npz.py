"""npz sources: one split stored whole as ``image`` (uint8 [N, H, W, C]) and ``label`` arrays."""

from __future__ import annotations

import pathlib
import zipfile
import zlib

import numpy as np

from fedjax_proj.data.sources.common import (
  NPZ_FORMAT_HELP,
  ArrayDataset,
  DataNotFoundError,
  PathLike,
  resolve_num_classes,
  validate_labels,
)


def load_npz(
  path: PathLike,
  *,
  name: str | None = None,
  num_classes: int | None = None,
  labelled: bool = True,
) -> ArrayDataset:
  """Loads an npz file holding a whole split.

  Args:
    path: an ``.npz`` with ``image`` (uint8 [N, H, W, C]; float [N, D] is accepted for tabular
      data) and ``label`` (integer [N]), optionally ``num_classes`` (integer scalar).
    name: dataset name used for the known class count and stored in the result; defaults to the
      file name without extension.
    num_classes: overrides every other way of getting the class count.
    labelled: whether ``label`` is required. With False (an unlabelled public set) a file without
      it loads with every label -1 and ``num_classes`` 0.

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
      required = ("image", "label") if labelled else ("image",)
      missing = [key for key in required if key not in npz.files]
      if missing:
        raise KeyError(missing)
      image = npz["image"]
      label = npz["label"] if "label" in npz.files else None
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
  if label is None:  # an unlabelled set (labelled=False)
    return ArrayDataset(
      images=image, labels=np.full(image.shape[0], -1, np.int32), num_classes=0, name=name
    )
  labels = validate_labels(label, image.shape[0], source)
  if num_classes is None and stored_classes is not None:
    if stored_classes.ndim != 0 or not np.issubdtype(stored_classes.dtype, np.integer):
      raise ValueError(
        f"{source}: 'num_classes' must be an integer scalar, got {stored_classes!r}."
      )
    num_classes = int(stored_classes)
  num_classes = resolve_num_classes(labels, name, num_classes, source)
  return ArrayDataset(images=image, labels=labels, num_classes=num_classes, name=name)
