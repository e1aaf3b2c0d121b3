"""Tests for fedjax_proj.data.sources: npz, image folders + cache, sklearn, TFDS, resolution."""

from __future__ import annotations

import os
import pathlib
import time

import numpy as np
import pytest
from PIL import Image

from fedjax_proj.data import sources
from fedjax_proj.data.sources import DataNotFoundError, UnknownDatasetError, image_folder, resolve


@pytest.fixture(autouse=True)
def isolated_env(tmp_path, monkeypatch):
  """Private cache dir and no inherited data dir, so tests neither pollute nor read $HOME."""
  monkeypatch.setenv(sources.CACHE_DIR_ENV, str(tmp_path / "cache"))
  monkeypatch.delenv(sources.DATA_DIR_ENV, raising=False)


def write_npz(path: pathlib.Path, n: int = 6, value: int = 0, **extra) -> pathlib.Path:
  path.parent.mkdir(parents=True, exist_ok=True)
  image = np.full((n, 4, 4, 3), value, np.uint8)
  label = np.arange(n, dtype=np.int64) % 3
  np.savez(path, image=image, label=label, **extra)
  return path


def write_png(path: pathlib.Path, array: np.ndarray) -> None:
  path.parent.mkdir(parents=True, exist_ok=True)
  Image.fromarray(array).save(path)


def make_tree(root: pathlib.Path, split: str = "train") -> dict[str, int]:
  """Writes classes in non-alphabetical creation order; returns the pixel value per class."""
  values = {"zebra": 30, "ant": 10, "moth": 20}
  for cls, value in values.items():
    for i in range(2 if cls != "moth" else 3):
      write_png(root / split / cls / f"{i:03d}.png", np.full((5, 4, 3), value + i, np.uint8))
  return values


# --------------------------------------------------------------------------------------------
# npz


def test_npz_round_trip(tmp_path):
  path = tmp_path / "d.npz"
  image = np.random.default_rng(0).integers(0, 256, (7, 3, 2, 1), dtype=np.uint8)
  label = np.array([0, 4, 1, 1, 2, 3, 0])
  np.savez(path, image=image, label=label)
  ds = sources.load_npz(path)
  np.testing.assert_array_equal(ds.images, image)
  np.testing.assert_array_equal(ds.labels, label)
  assert ds.labels.dtype == np.int32
  assert ds.num_classes == 5 and ds.name == "d"


def test_npz_num_classes_known_name_and_stored_key(tmp_path):
  path = write_npz(tmp_path / "x.npz")
  assert sources.load_npz(path, name="cifar100").num_classes == 100
  assert sources.load_npz(write_npz(tmp_path / "y.npz", num_classes=7)).num_classes == 7


def test_corrupt_npz_raises_clear_error(tmp_path):
  path = write_npz(tmp_path / "good.npz", n=50)
  truncated = tmp_path / "truncated.npz"
  truncated.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
  with pytest.raises(ValueError, match="truncated.npz"):
    sources.load_npz(truncated)
  garbage = tmp_path / "garbage.npz"
  garbage.write_bytes(b"this is not a zip archive")
  with pytest.raises(ValueError, match="garbage.npz.*corrupt"):
    sources.load_npz(garbage)


def test_npz_wrong_keys_shapes_dtypes(tmp_path):
  np.savez(tmp_path / "keys.npz", x=np.zeros((2, 2, 2, 1), np.uint8), y=np.zeros(2, int))
  with pytest.raises(ValueError, match=r"lacks the key.*'image'"):
    sources.load_npz(tmp_path / "keys.npz")
  np.savez(tmp_path / "f.npz", image=np.zeros((2, 2, 2, 1), np.float32), label=np.zeros(2, int))
  with pytest.raises(ValueError, match="uint8"):
    sources.load_npz(tmp_path / "f.npz")
  np.savez(tmp_path / "n.npz", image=np.zeros((2, 2, 2, 1), np.uint8), label=np.zeros(3, int))
  with pytest.raises(ValueError, match=r"expected \[2\]"):
    sources.load_npz(tmp_path / "n.npz")
  np.savez(tmp_path / "c.npz", image=np.zeros((2, 2, 2, 1), np.uint8), label=np.array([0, 12]))
  with pytest.raises(ValueError, match="out of range"):
    sources.load_npz(tmp_path / "c.npz", name="mnist")
  with pytest.raises(DataNotFoundError):
    sources.load_npz(tmp_path / "missing.npz")


# --------------------------------------------------------------------------------------------
# Image folders


def test_image_folder_labels_follow_alphabetical_classes(tmp_path):
  values = make_tree(tmp_path / "tree")
  ds = sources.load_image_folder(tmp_path / "tree", "train")
  assert ds.images.shape == (7, 5, 4, 3) and ds.images.dtype == np.uint8
  assert ds.num_classes == 3 and ds.name == "tree"
  np.testing.assert_array_equal(ds.labels, [0, 0, 1, 1, 1, 2, 2])  # ant, moth, zebra
  for label, cls in enumerate(sorted(values)):
    np.testing.assert_array_equal(ds.images[ds.labels == label][:, 0, 0, 0] // 10 * 10, values[cls])


def test_image_folder_cache_hit_returns_identical_arrays(tmp_path, monkeypatch):
  make_tree(tmp_path / "tree")
  first = sources.load_image_folder(tmp_path / "tree", "train")
  cached = list((tmp_path / "cache").glob("*.npz"))
  assert len(cached) == 1

  def no_decoding(path):
    raise AssertionError(f"cache miss: decoded {path}")

  monkeypatch.setattr(image_folder, "_decode_image", no_decoding)
  second = sources.load_image_folder(tmp_path / "tree", "train")
  np.testing.assert_array_equal(first.images, second.images)
  np.testing.assert_array_equal(first.labels, second.labels)
  assert first.num_classes == second.num_classes


def test_image_folder_cache_invalidated_by_changed_file(tmp_path):
  make_tree(tmp_path / "tree")
  before = sources.load_image_folder(tmp_path / "tree", "train")
  path = tmp_path / "tree" / "train" / "ant" / "000.png"
  write_png(path, np.full((5, 4, 3), 99, np.uint8))
  os.utime(path, ns=(time.time_ns(), time.time_ns() + 10**9))  # a distinct mtime for sure
  after = sources.load_image_folder(tmp_path / "tree", "train")
  assert before.images[0, 0, 0, 0] == 10 and after.images[0, 0, 0, 0] == 99
  assert len(list((tmp_path / "cache").glob("*.npz"))) == 1  # the stale entry was removed


def test_image_folder_grayscale_and_mixed(tmp_path):
  for i in range(2):
    write_png(tmp_path / "g" / "test" / "a" / f"{i}.png", np.full((3, 3), 7, np.uint8))
  gray = sources.load_image_folder(tmp_path / "g", "test", use_cache=False)
  assert gray.images.shape == (2, 3, 3, 1)
  write_png(tmp_path / "g" / "test" / "b" / "0.png", np.full((3, 3, 3), 9, np.uint8))
  mixed = sources.load_image_folder(tmp_path / "g", "test", use_cache=False)
  assert mixed.images.shape == (3, 3, 3, 3)
  np.testing.assert_array_equal(mixed.images[0], 7)


def test_image_folder_errors(tmp_path):
  with pytest.raises(DataNotFoundError, match="does not exist"):
    sources.load_image_folder(tmp_path, "train")
  write_png(tmp_path / "t" / "train" / "a" / "0.png", np.zeros((4, 4, 3), np.uint8))
  write_png(tmp_path / "t" / "train" / "b" / "0.png", np.zeros((5, 4, 3), np.uint8))
  with pytest.raises(ValueError, match="same size"):
    sources.load_image_folder(tmp_path / "t", "train", use_cache=False)
  (tmp_path / "t" / "train" / "b" / "0.png").write_bytes(b"not a png")
  with pytest.raises(ValueError, match="Cannot decode image"):
    sources.load_image_folder(tmp_path / "t", "train", use_cache=False)


def test_image_folder_warns_when_splits_have_different_classes(tmp_path):
  make_tree(tmp_path / "tree", "train")
  write_png(tmp_path / "tree" / "test" / "ant" / "0.png", np.zeros((5, 4, 3), np.uint8))
  with pytest.warns(UserWarning, match="differ"):
    sources.load_image_folder(tmp_path / "tree", "test", use_cache=False)


# --------------------------------------------------------------------------------------------
# Resolution


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
  # $FEDJAX_PROJ_DATA_DIR falls back to TFDS; an explicit data_dir never does (issue 13).
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


def test_real_tfds_failure_is_data_not_found(tmp_path):
  # An empty TFDS dir and no download: fails fast, offline, without touching the network.
  with pytest.raises(DataNotFoundError, match="TFDS could not provide 'mnist'"):
    sources.load_tfds("mnist", "train", data_dir=tmp_path, download=False)


# --------------------------------------------------------------------------------------------
# scikit-learn and TFDS


@pytest.mark.parametrize(
  "name, split, shape, dtype",
  [
    ("iris", "all", (150, 4), np.float32),
    ("iris", "train", (120, 4), np.float32),
    ("iris", "test", (30, 4), np.float32),
    ("digits", "all", (1797, 8, 8, 1), np.uint8),
    ("digits", "test", (360, 8, 8, 1), np.uint8),
  ],
)
def test_sklearn_shapes(name, split, shape, dtype):
  ds = sources.load_dataset(name, split)
  assert ds.images.shape == shape and ds.images.dtype == dtype
  assert ds.labels.shape == shape[:1] and ds.labels.dtype == np.int32
  assert ds.num_classes == {"iris": 3, "digits": 10}[name]


def test_sklearn_splits_are_stratified_and_disjoint():
  train, test = sources.load_sklearn("iris", "train"), sources.load_sklearn("iris", "test")
  np.testing.assert_array_equal(np.bincount(test.labels), [10, 10, 10])
  rows = {tuple(r) for r in train.images} & {tuple(r) for r in test.images}
  assert len(rows) <= 1  # iris has one duplicated row; otherwise disjoint
  digits = sources.load_sklearn("digits", "all")
  assert digits.images.max() == 255 and digits.images.min() == 0
  with pytest.raises(ValueError, match="no split 'validation'"):
    sources.load_sklearn("iris", "validation")


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


# --------------------------------------------------------------------------------------------
# Real shared data (../shared/data), when present


def shared_data_or_skip() -> pathlib.Path:
  root = sources.find_shared_data()
  if root is None:
    pytest.skip(
      f"shared real data not found (neither ${sources.SHARED_DATA_ENV} nor <repo>/../shared/data)"
    )
  return root


@pytest.mark.slow
def test_real_mnist_test_npz():
  root = shared_data_or_skip()
  if not (root / "mnist" / "test.npz").is_file():
    pytest.skip(f"{root}/mnist/test.npz is absent")
  ds = sources.load_dataset("mnist", "test", data_dir=root)
  assert ds.images.shape == (10000, 28, 28, 1) and ds.images.dtype == np.uint8
  assert ds.num_classes == 10 and ds.labels.shape == (10000,)


@pytest.mark.slow
def test_real_cifar10_test_image_folder_cold_and_warm():
  root = shared_data_or_skip()
  if not (root / "cifar10" / "test").is_dir():
    pytest.skip(f"{root}/cifar10/test is absent")
  start = time.perf_counter()
  cold = sources.load_dataset("cifar10", "test", data_dir=root)
  cold_s = time.perf_counter() - start
  start = time.perf_counter()
  warm = sources.load_dataset("cifar10", "test", data_dir=root)
  warm_s = time.perf_counter() - start
  print(f"CIFAR-10 test image folder: cold {cold_s:.2f}s, warm {warm_s:.2f}s")
  assert cold.images.shape == (10000, 32, 32, 3) and cold.images.dtype == np.uint8
  np.testing.assert_array_equal(np.bincount(cold.labels), [1000] * 10)
  np.testing.assert_array_equal(cold.images, warm.images)
  np.testing.assert_array_equal(cold.labels, warm.labels)
  assert cold.num_classes == 10
