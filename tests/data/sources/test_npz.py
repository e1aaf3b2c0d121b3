"""data.sources.npz: npz files whole, and their format errors."""

from __future__ import annotations

import numpy as np
import pytest

from fedjax_proj.data import sources
from fedjax_proj.data.sources import DataNotFoundError
from tests.data.sources.files import write_npz


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
