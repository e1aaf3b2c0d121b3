"""The datasets this project knows by name: one :class:`DatasetInfo` each, in :data:`DATASETS`.

Every name-keyed view the loaders and the input pipeline read is derived from this one table:
the class counts and example shapes (:mod:`fedjax_proj.data.sources.common`), the per-channel
statistics (:mod:`fedjax_proj.data.pipeline`) and the TFDS feature keys
(:mod:`fedjax_proj.data.sources.tfds_source`). A new dataset is one entry here (docs/design.md,
"Layout").
"""

from __future__ import annotations

from typing import NamedTuple

ChannelStats = tuple[tuple[float, ...], tuple[float, ...]]


class DatasetInfo(NamedTuple):
  """What the library knows about a named dataset.

  Attributes:
    name: the table key (lower case, ``_`` for ``-``: ``fashion_mnist``).
    num_classes: class count; a local copy gets it even when a split misses the highest class.
    shape: one example's shape; data loaded for the name must have it (an entry point checks it
      before building a model, so a wrong ``--data_dir`` fails clearly).
    channel_stats: (mean, std) per channel of the standard training split, on [0, 1] pixels;
      None: computed from the images.
    code_channel_stats: the statistics the FedProj authors' code normalises with
      (``--normalization=code``; docs/fedproj.md, "Parity with the authors' code"); None: as
      ``channel_stats``.
    tfds_keys: (image feature, label feature) of its TensorFlow Datasets builder of the same
      name; None: not loaded through TFDS.
  """

  name: str
  num_classes: int
  shape: tuple[int, ...]
  channel_stats: ChannelStats | None = None
  code_channel_stats: ChannelStats | None = None
  tfds_keys: tuple[str, str] | None = None


_TFDS = ("image", "label")  # cifar100's "label" is the fine label

DATASETS: dict[str, DatasetInfo] = {
  d.name: d
  for d in (
    DatasetInfo(
      "cifar10",
      10,
      (32, 32, 3),
      ((0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)),
      # The widely copied std (0.2023, 0.1994, 0.2010): the std of per-image stds, not of the
      # pixels.
      ((0.4914, 0.4822, 0.4465), (0.2023, 0.1994, 0.2010)),
      _TFDS,
    ),
    DatasetInfo(
      "cifar100",
      100,
      (32, 32, 3),
      ((0.5071, 0.4865, 0.4409), (0.2673, 0.2564, 0.2762)),
      # The authors' rounded statistics of their public CIFAR-100 set.
      ((0.507, 0.487, 0.441), (0.267, 0.256, 0.276)),
      _TFDS,
    ),
    DatasetInfo("mnist", 10, (28, 28, 1), ((0.1307,), (0.3081,)), tfds_keys=_TFDS),
    DatasetInfo("fashion_mnist", 10, (28, 28, 1), ((0.2860,), (0.3530,)), tfds_keys=_TFDS),
    DatasetInfo(
      "svhn_cropped",
      10,
      (32, 32, 3),
      ((0.4377, 0.4438, 0.4728), (0.1980, 0.2010, 0.1970)),
      tfds_keys=_TFDS,
    ),
    # Darlow et al. 2018: not in TFDS; an image folder (fedjax_proj/configs/image.py).
    DatasetInfo("cinic10", 10, (32, 32, 3), ((0.4789, 0.4723, 0.4305), (0.2421, 0.2383, 0.2587))),
    # scikit-learn's bundled sets (fedjax_proj/data/sources/scikit_learn.py).
    DatasetInfo("iris", 3, (4,)),
    DatasetInfo("digits", 10, (8, 8, 1)),
  )
}


def dataset_info(name: str) -> DatasetInfo:
  """The entry of a dataset known by name; a ValueError lists the known names."""
  try:
    return DATASETS[name]
  except KeyError:
    raise ValueError(
      f"Unknown dataset {name!r}; known names: {', '.join(sorted(DATASETS))} (add a DatasetInfo "
      "to fedjax_proj/data/datasets.py for another)."
    ) from None
