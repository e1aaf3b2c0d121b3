"""The dataset registry (fedjax_proj/data/datasets.py): the one table the name views read."""

from __future__ import annotations

import pytest

from fedjax_proj.data import pipeline
from fedjax_proj.data.datasets import DATASETS, DatasetInfo, dataset_info
from fedjax_proj.data.sources import common, tfds_source


def test_every_view_is_the_registry():
  assert {k: d.num_classes for k, d in DATASETS.items()} == common.KNOWN_NUM_CLASSES
  assert {k: d.shape for k, d in DATASETS.items()} == common.KNOWN_SHAPES
  assert set(pipeline.CHANNEL_STATS) == {k for k, d in DATASETS.items() if d.channel_stats}
  assert set(tfds_source.TFDS_DATASETS) == {k for k, d in DATASETS.items() if d.tfds_keys}
  assert pipeline.CODE_CHANNEL_STATS["cifar10"][1] == (0.2023, 0.1994, 0.2010)


@pytest.mark.parametrize("info", DATASETS.values(), ids=list(DATASETS))
def test_entries_are_consistent(info: DatasetInfo):
  assert DATASETS[info.name] is info
  assert info.name == common.canonical_name(info.name)
  assert info.num_classes >= 2
  for stats in (info.channel_stats, info.code_channel_stats):
    if stats is not None:  # one mean and one std per channel of the example shape
      assert len(stats[0]) == len(stats[1]) == info.shape[-1]
      assert all(s > 0 for s in stats[1])


def test_an_unknown_name_lists_the_known_ones():
  with pytest.raises(ValueError, match="known names: cifar10, cifar100, cinic10"):
    dataset_info("cifar-1000")
