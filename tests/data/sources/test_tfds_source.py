"""data.sources.tfds_source: TFDS splits (mocked); failing fast when TFDS cannot provide one."""

from __future__ import annotations

import numpy as np
import pytest

from fedjax_proj.data import sources
from fedjax_proj.data.sources import DataNotFoundError, tfds_source


def test_real_tfds_failure_is_data_not_found(tmp_path):
  # An empty TFDS dir and no download: fails fast, offline, without touching the network.
  with pytest.raises(DataNotFoundError, match="TFDS could not provide 'mnist'"):
    sources.load_tfds("mnist", "train", data_dir=tmp_path, download=False)


@pytest.mark.parametrize(
  "name, shape, num_classes",
  [("mnist", (28, 28, 1), 10), ("cifar10", (32, 32, 3), 10), ("cifar100", (32, 32, 3), 100)],
)
def test_tfds_mock(name, shape, num_classes):
  tfds = pytest.importorskip("tensorflow_datasets")
  with tfds.testing.mock_data(num_examples=6):
    ds = sources.load_tfds(name, "train")
    via_resolver = sources.load_dataset(name, "test")  # no local dir configured -> TFDS
  assert ds.images.shape == (6, *shape) and ds.images.dtype == np.uint8
  assert ds.labels.shape == (6,) and ds.labels.dtype == np.int32
  assert ds.num_classes == num_classes and ds.labels.max() < num_classes
  assert via_resolver.images.shape == (6, *shape)


def test_tfds_offline_fails_at_once_and_writes_nothing(tmp_path, monkeypatch):
  tfds = pytest.importorskip("tensorflow_datasets")

  calls = []

  def data_source(*args, download, **kwargs):
    calls.append(download)
    if download:
      raise AssertionError("TFDS started a download although there is no network")
    raise FileNotFoundError("not prepared")  # what TFDS says for data it has not prepared

  def no_load(*args, **kwargs):
    raise AssertionError("TFDS started a download although there is no network")

  monkeypatch.setattr(tfds_source, "network_available", lambda *a, **k: False)
  monkeypatch.setattr(tfds, "data_source", data_source)
  monkeypatch.setattr(tfds, "load", no_load)
  with pytest.raises(sources.DataNotFoundError, match="no network to download it") as e:
    sources.load_tfds("cifar10", "train", data_dir=tmp_path)
  assert "not prepared" in str(e.value) and calls == [False]
  assert list(tmp_path.iterdir()) == []
