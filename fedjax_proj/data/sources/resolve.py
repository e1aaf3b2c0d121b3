"""Name resolution: which source loads a dataset name and split (local copy, scikit-learn, TFDS).

:func:`load_dataset` tries an explicit ``data_dir``, then ``$FEDJAX_PROJ_DATA_DIR``, then TFDS;
when nothing is found its :class:`~fedjax_proj.data.sources.common.DataNotFoundError` lists what
was searched and how to provide the data offline.
"""

from __future__ import annotations

import os
import pathlib
import warnings

from fedjax_proj.data.sources.common import (
  DATA_DIR_ENV,
  KNOWN_NUM_CLASSES,
  NPZ_FORMAT_HELP,
  SHARED_DATA_ENV,
  ArrayDataset,
  DataNotFoundError,
  PathLike,
  UnknownDatasetError,
  canonical_name,
  looks_like_path,
)
from fedjax_proj.data.sources.image_folder import load_image_folder
from fedjax_proj.data.sources.npz import load_npz
from fedjax_proj.data.sources.scikit_learn import SKLEARN_DATASETS, load_sklearn
from fedjax_proj.data.sources.tfds_source import TFDS_DATASETS, load_tfds


def _supported_names() -> str:
  return ", ".join(sorted(set(TFDS_DATASETS) | set(SKLEARN_DATASETS) | set(KNOWN_NUM_CLASSES)))


def _local_candidates(root: pathlib.Path, name: str, split: str) -> list[tuple[pathlib.Path, str]]:
  """The places, in order, where a local copy of (name, split) may live under ``root``."""
  return [
    (root / f"{split}.npz", "npz"),
    (root / name / f"{split}.npz", "npz"),
    (root / split, "folder"),
    (root / name / split, "folder"),
  ]


def _load_local(path: pathlib.Path, kind: str, name: str, labelled: bool = True) -> ArrayDataset:
  if kind == "npz":
    return load_npz(path, name=name, labelled=labelled)
  return load_image_folder(path.parent, path.name, name=name)


def _search_local(
  root: pathlib.Path, name: str, split: str, searched: list[str], labelled: bool = True
) -> ArrayDataset | None:
  """Loads (name, split) from the first local candidate under ``root``; None if none exists."""
  if root.is_file():
    if root.suffix.lower() != ".npz":
      raise ValueError(
        f"Data path {root} is a file but not an .npz; point it at an npz file or at a folder "
        f"with <split>.npz or <split>/<class>/*.png|jpg. {NPZ_FORMAT_HELP}."
      )
    # A direct path to one npz is used whole, whatever the split.
    return load_npz(root, name=name, labelled=labelled)
  for path, kind in _local_candidates(root, name, split):
    searched.append(f"  {path}{'/ (image folder)' if kind == 'folder' else ''}")
    if (kind == "npz" and path.is_file()) or (kind == "folder" and path.is_dir()):
      return _load_local(path, kind, name, labelled)
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
  name: str,
  split: str,
  data_dir: PathLike | None = None,
  *,
  download: bool = True,
  labelled: bool = True,
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
    labelled: False accepts a local npz without ``label`` (an unlabelled public set: labels -1,
      ``num_classes`` 0).

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
    stem = path.stem if path.is_file() else path.name
    dataset = _search_local(path, stem, split, searched, labelled)
    if dataset is None:
      raise DataNotFoundError(_not_found_message(name, split, searched or [str(path)], None))
    return dataset

  key = canonical_name(name)
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
    dataset = _search_local(root, name, split, searched, labelled)
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
  repo_root = pathlib.Path(__file__).resolve().parents[3]
  path = repo_root.parent / "shared" / "data"
  return path if path.is_dir() else None
