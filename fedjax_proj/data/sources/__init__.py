"""Dataset sources: decode a named dataset split into in-memory numpy arrays.

Every loader returns an :class:`ArrayDataset` (images uint8 [N, H, W, C] or tabular float32 [N, D],
labels int32 [N]). One module per source:

* :mod:`~fedjax_proj.data.sources.npz`: npz files with keys ``image`` (uint8 [N, H, W, C]) and
  ``label`` (integer [N]);
* :mod:`~fedjax_proj.data.sources.image_folder`: image-folder trees
  ``root/<split>/<class>/*.png|jpg|jpeg`` (classes sorted alphabetically give the label order),
  decoded with PIL in a thread pool and cached as an npz;
* :mod:`~fedjax_proj.data.sources.scikit_learn`: the scikit-learn bundled sets ``iris`` and
  ``digits``;
* :mod:`~fedjax_proj.data.sources.tfds_source`: TensorFlow Datasets (the default for named
  datasets when no local copy is configured).

:func:`load_dataset` (:mod:`~fedjax_proj.data.sources.resolve`) resolves a name and split to one
of them: an explicit ``data_dir``, then the ``FEDJAX_PROJ_DATA_DIR`` environment variable, then
TFDS. When nothing is found it raises :class:`DataNotFoundError` saying what was searched and how
to provide the data offline. :mod:`~fedjax_proj.data.sources.common` holds the result type, the
errors and the tables of datasets known by name.

This package re-exports the public API, so ``from fedjax_proj.data.sources import load_dataset``
works; a test that replaces a function must patch it in the module that calls it (e.g.
``tfds_source.network_available``, ``resolve.load_tfds``).
"""

from fedjax_proj.data.sources.common import (
  CACHE_DIR_ENV,
  DATA_DIR_ENV,
  KNOWN_NUM_CLASSES,
  KNOWN_SHAPES,
  NPZ_FORMAT_HELP,
  SHARED_DATA_ENV,
  ArrayDataset,
  DataNotFoundError,
  PathLike,
  UnknownDatasetError,
  canonical_name,
  expected_format,
  looks_like_path,
)
from fedjax_proj.data.sources.image_folder import (
  IMAGE_EXTENSIONS,
  default_cache_dir,
  load_image_folder,
)
from fedjax_proj.data.sources.npz import load_npz
from fedjax_proj.data.sources.resolve import find_shared_data, load_dataset
from fedjax_proj.data.sources.scikit_learn import SKLEARN_DATASETS, SKLEARN_SPLITS, load_sklearn
from fedjax_proj.data.sources.tfds_source import (
  NETWORK_PROBE,
  NETWORK_TIMEOUT,
  TFDS_DATASETS,
  load_tfds,
  network_available,
)

__all__ = [
  "CACHE_DIR_ENV",
  "DATA_DIR_ENV",
  "IMAGE_EXTENSIONS",
  "KNOWN_NUM_CLASSES",
  "KNOWN_SHAPES",
  "NETWORK_PROBE",
  "NETWORK_TIMEOUT",
  "NPZ_FORMAT_HELP",
  "SHARED_DATA_ENV",
  "SKLEARN_DATASETS",
  "SKLEARN_SPLITS",
  "TFDS_DATASETS",
  "ArrayDataset",
  "DataNotFoundError",
  "PathLike",
  "UnknownDatasetError",
  "canonical_name",
  "default_cache_dir",
  "expected_format",
  "find_shared_data",
  "load_dataset",
  "load_image_folder",
  "load_npz",
  "load_sklearn",
  "load_tfds",
  "looks_like_path",
  "network_available",
]
