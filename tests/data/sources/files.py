"""Small datasets written to disk for the source tests: npz files, PNG trees, the shared data."""

from __future__ import annotations

import pathlib

import numpy as np
import pytest
from PIL import Image

from fedjax_proj.data import sources


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


def shared_data_or_skip() -> pathlib.Path:
  root = sources.find_shared_data()
  if root is None:
    pytest.skip(
      f"shared real data not found (neither ${sources.SHARED_DATA_ENV} nor <repo>/../shared/data)"
    )
  return root
