"""What a claim run's config reads that this machine may lack: an NLP run's text data (checked for
every run before the first starts) and a paper budget's TFDS public set offline (replaced by the
shared file, recorded as a deviation)."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

from fedjax_proj.reproduce.resolve import substitute_data
from fedjax_proj.training import fields


def missing_text_data(config: dict[str, Any], data_root: Path) -> list[str]:
  """What an NLP run's config reads that is not on this machine, each with where it was looked
  for and how to provide it (empty: all there). The claim runner checks every run's before the
  first starts, so a missing local file or an unprepared TFDS set offline is one line, not a
  failed run's traceback."""
  from fedjax_proj.algorithms.registry import needs_public
  from fedjax_proj.data.sources import text
  from fedjax_proj.data.sources.common import looks_like_path

  c = substitute_data(config, data_root)
  missing = []

  def check(name: str, data_dir: str, splits: tuple[str, ...], what: str) -> None:
    if data_dir:
      lacking = [s for s in splits if text.find_text_file(data_dir, name, s) is None]
      if lacking:
        files = ", ".join(f"{s}{'|'.join(text.TEXT_SUFFIXES)}" for s in lacking)
        missing.append(
          f"the {what} {name!r} is not in {data_dir} (no {files} there or in {name}/): put it "
          'there (docs/nlp.md, "Text data") or pass --data=<the shared data folder holding it>'
        )
      return
    tfds_name = text.TEXT_DATASETS[name].tfds_name
    if not tfds_has(tfds_name):
      missing.append(
        f"the {what} {name!r} (TFDS {tfds_name}) is not prepared here and TFDS cannot download "
        "it (offline): prepare it on a machine with internet and point $TFDS_DATA_DIR at it"
      )

  resolved = fields.resolve(c)  # a recorded config may predate a field: its default
  check(resolved.dataset, resolved.data_dir, ("train", "test"), "private set")
  public = resolved.public_data
  if public and needs_public(c["method"]):
    if looks_like_path(public) or public.endswith(text.TEXT_SUFFIXES):
      if not Path(public).is_file():
        missing.append(f"the public set {public} does not exist")
    elif public in text.TEXT_DATASETS:
      check(public, "", ("train",), "public set")
  return missing


@functools.cache
def tfds_has(name: str) -> bool:
  """Whether TFDS can give ``name`` now: prepared on disk, or downloadable (network reachable);
  asked once per process."""
  try:
    import tensorflow_datasets as tfds

    from fedjax_proj.data.sources.tfds_source import network_available

    return tfds.builder(name).is_prepared() or network_available()
  except Exception:  # noqa: BLE001 - any failure means TFDS cannot serve it here
    return False


@functools.cache
def _dataset_size(path: str) -> int:
  from fedjax_proj.data.sources import load_dataset

  return len(load_dataset(path, "train").labels)


def public_fallback(
  config: dict[str, Any], data_root: Path, fallback: str
) -> tuple[dict[str, Any], list[str]]:
  """The config a run can use here, and its deviations from the resolved one.

  A TFDS public set with a split other than ``train`` (the paper budgets' CIFAR-100 train +
  test) that TFDS cannot give here (offline, not prepared) becomes the ``fallback`` file
  (``{data}`` placeholder kept) with the memory capped at its size, so the run goes on and the
  report states the deviation instead of the run failing on a memory larger than the public set.
  """
  s = fields.resolve(config)
  name, split = s.public_data, s.public_split
  if not name or split == "train" or "/" in name or tfds_has(name):
    return config, []
  size = _dataset_size(fallback.replace("{data}", str(data_root)))
  out = {**config, "public_data": fallback, "public_split": "train"}
  notes = [
    f"public set: {name} {split} is not available from TFDS here (offline, not prepared); "
    f"used {fallback} ({size:,} images)"
  ]
  if out.get("public_size", 0) and out["public_size"] > size:
    out["public_size"] = 0
  if out.get("memory_size", 0) > size:
    notes.append(f"memory_size {out['memory_size']:,} capped at the public set's {size:,}")
    out["memory_size"] = size
  return out, notes
