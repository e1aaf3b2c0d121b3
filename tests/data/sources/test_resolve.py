"""data.sources.resolve: which source a name and split come from; the not-found messages."""

from __future__ import annotations

import numpy as np
import pytest

from fedjax_proj.data import sources
from fedjax_proj.data.sources import DataNotFoundError, UnknownDatasetError, resolve
from tests.data.sources.files import make_tree, shared_data_or_skip, write_npz


def test_data_dir_argument_beats_env_var(tmp_path, monkeypatch):
  write_npz(tmp_path / "arg" / "train.npz", value=1)
  write_npz(tmp_path / "env" / "train.npz", value=2)
  monkeypatch.setenv(sources.DATA_DIR_ENV, str(tmp_path / "env"))
  assert sources.load_dataset("mnist", "train", data_dir=tmp_path / "arg").images[0, 0, 0, 0] == 1
  assert sources.load_dataset("mnist", "train").images[0, 0, 0, 0] == 2


def test_local_lookup_order(tmp_path):
  root = tmp_path / "d"
  make_tree(root / "cifar10")  # 4th: <name>/<split>/
  assert sources.load_dataset("cifar10", "train", data_dir=root).images.shape[0] == 7
  make_tree(root)  # 3rd: <split>/
  ds = sources.load_dataset("cifar10", "train", data_dir=root)
  assert ds.images.shape[0] == 7 and ds.num_classes == 3
  write_npz(root / "cifar10" / "train.npz", n=5)  # 2nd: <name>/<split>.npz
  assert sources.load_dataset("cifar10", "train", data_dir=root).images.shape[0] == 5
  write_npz(root / "train.npz", n=4)  # 1st: <split>.npz
  ds = sources.load_dataset("cifar10", "train", data_dir=root)
  assert ds.images.shape[0] == 4 and ds.num_classes == 10 and ds.name == "cifar10"


def test_data_dir_may_be_an_npz_file_and_name_may_be_a_path(tmp_path):
  path = write_npz(tmp_path / "whole.npz", n=3)
  assert sources.load_dataset("mnist", "test", data_dir=path).images.shape[0] == 3
  assert sources.load_dataset(str(path), "anything").images.shape[0] == 3
  make_tree(tmp_path / "tree")
  assert sources.load_dataset(str(tmp_path / "tree"), "train").num_classes == 3


def test_missing_data_raises_with_offline_instructions(tmp_path, monkeypatch):
  def offline_tfds(name, split, data_dir=None, *, download=True):
    raise DataNotFoundError("simulated: no network")

  monkeypatch.setattr(resolve, "load_tfds", offline_tfds)
  # $FEDJAX_PROJ_DATA_DIR falls back to TFDS; an explicit data_dir never does.
  monkeypatch.setenv(sources.DATA_DIR_ENV, str(tmp_path))
  with pytest.raises(DataNotFoundError) as info:
    sources.load_dataset("cifar10", "train")
  message = str(info.value)
  for needle in (
    "'cifar10'",
    "'train'",
    "--data_dir",
    "FEDJAX_PROJ_DATA_DIR",
    "train.npz",
    "simulated: no network",
    "uint8",
  ):
    assert needle in message
  assert isinstance(info.value, FileNotFoundError)
  with pytest.raises(DataNotFoundError, match="TFDS is not tried") as info:
    sources.load_dataset("cifar10", "train", data_dir=tmp_path)
  assert "simulated: no network" not in str(info.value)
  monkeypatch.delenv(sources.DATA_DIR_ENV)
  with pytest.raises(DataNotFoundError, match="FEDJAX_PROJ_DATA_DIR"):
    sources.load_dataset("mnist", "test")


def test_nonexistent_data_dir_and_unknown_name(tmp_path):
  with pytest.raises(DataNotFoundError, match="does not exist"):
    sources.load_dataset("mnist", "train", data_dir=tmp_path / "typo")
  with pytest.raises(UnknownDatasetError, match="cifar10") as info:
    sources.load_dataset("cifar1O", "train")
  assert isinstance(info.value, ValueError)
  with pytest.raises(ValueError, match="not supported through TFDS"):
    sources.load_tfds("cinic10", "train")


@pytest.mark.slow
def test_real_mnist_test_npz():
  root = shared_data_or_skip()
  if not (root / "mnist" / "test.npz").is_file():
    pytest.skip(f"{root}/mnist/test.npz is absent")
  ds = sources.load_dataset("mnist", "test", data_dir=root)
  assert ds.images.shape == (10000, 28, 28, 1) and ds.images.dtype == np.uint8
  assert ds.num_classes == 10 and ds.labels.shape == (10000,)
