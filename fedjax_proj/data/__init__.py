"""Data: dataset sources, client partitions, the federated view and the on-device input pipeline.

* :mod:`~fedjax_proj.data.datasets` is the registry of datasets known by name (one
  :class:`DatasetInfo` each: classes, shape, channel statistics, TFDS keys).
* :mod:`~fedjax_proj.data.sources` decodes a named split (TFDS, image folder, npz, scikit-learn)
  into an :class:`ArrayDataset`; :func:`load_dataset` picks the source.
* :mod:`~fedjax_proj.data.partition` assigns sample indices to clients (IID, Dirichlet, shards,
  ExDir, manual), reproducibly from a seed.
* :mod:`~fedjax_proj.data.federated` and :mod:`~fedjax_proj.data.pipeline` turn those into the
  engine's [clients, steps, batch] layout and normalised batches.

Example::

  train = load_dataset("cifar10", "train", data_dir="/data/cifar10")
  parts = partition.partition(train.labels, "dirichlet:0.5", num_clients=100, seed=0)

The dispatcher ``partition.partition`` is deliberately not re-exported here: the name would
shadow the :mod:`~fedjax_proj.data.partition` module (``from fedjax_proj.data import partition``).
"""

from fedjax_proj.data.datasets import DATASETS, DatasetInfo, dataset_info
from fedjax_proj.data.federated import FederatedData
from fedjax_proj.data.partition import (
  PartitionError,
  PartitionScheme,
  dirichlet,
  exdir,
  iid,
  label_histogram,
  manual,
  parse_partition,
  shards,
)
from fedjax_proj.data.pipeline import (
  CHANNEL_STATS,
  flip_and_crop,
  make_batch_fn,
  normalizer,
  normalizer_for,
)
from fedjax_proj.data.sources import (
  ArrayDataset,
  DataNotFoundError,
  UnknownDatasetError,
  default_cache_dir,
  find_shared_data,
  load_dataset,
  load_image_folder,
  load_npz,
  load_sklearn,
  load_tfds,
)

__all__ = [
  "CHANNEL_STATS",
  "DATASETS",
  "ArrayDataset",
  "DataNotFoundError",
  "DatasetInfo",
  "FederatedData",
  "PartitionError",
  "PartitionScheme",
  "UnknownDatasetError",
  "dataset_info",
  "default_cache_dir",
  "dirichlet",
  "exdir",
  "find_shared_data",
  "flip_and_crop",
  "iid",
  "label_histogram",
  "load_dataset",
  "load_image_folder",
  "load_npz",
  "load_sklearn",
  "load_tfds",
  "make_batch_fn",
  "manual",
  "normalizer",
  "normalizer_for",
  "parse_partition",
  "shards",
]
