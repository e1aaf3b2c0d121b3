"""data.sources.image_folder: class folders give labels; decoding; the decoded-array cache."""

from __future__ import annotations

import os
import pathlib
import time

import numpy as np
import pytest

from fedjax_proj.data import sources
from fedjax_proj.data.sources import DataNotFoundError, image_folder
from tests.data.sources.files import make_tree, shared_data_or_skip, write_png


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


def test_first_decoding_says_so_and_a_cache_hit_is_silent(tmp_path, capfd):
  make_tree(tmp_path / "tree")
  sources.load_image_folder(tmp_path / "tree", "train", cache_dir=tmp_path / "c")
  err = capfd.readouterr().err
  cache_file = next((tmp_path / "c").rglob("*.npz"))
  assert f"decoding 7 images of {tmp_path / 'tree' / 'train'}" in err and str(cache_file) in err
  assert "decoded 7 images in" in err
  sources.load_image_folder(tmp_path / "tree", "train", cache_dir=tmp_path / "c")
  assert "decod" not in capfd.readouterr().err


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


def test_default_cache_dir_follows_the_environment(monkeypatch, tmp_path):
  monkeypatch.delenv("FEDJAX_PROJ_CACHE", raising=False)
  monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
  assert image_folder.default_cache_dir() == tmp_path / "xdg" / "fedjax_proj"
  monkeypatch.setenv("FEDJAX_PROJ_CACHE", str(tmp_path / "mine"))  # the project's own wins
  assert image_folder.default_cache_dir() == tmp_path / "mine"
  monkeypatch.delenv("FEDJAX_PROJ_CACHE")
  monkeypatch.delenv("XDG_CACHE_HOME")
  assert image_folder.default_cache_dir() == pathlib.Path("~/.cache/fedjax_proj").expanduser()
