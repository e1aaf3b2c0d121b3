"""The run's inputs besides the partition: train/test subsets, held-out data, the public set.

Also checks that data loaded for a known ``--dataset`` name is that dataset.
"""

from __future__ import annotations

import sys

import jax
import numpy as np

from fedjax_proj.algorithms import registry
from fedjax_proj.data.sources import expected_format, load_dataset
from fedjax_proj.training.config import check_run_memory


def check_dataset(ds, name: str, where: str) -> None:
  """Checks data loaded for a known ``--dataset`` name has that dataset's image shape and classes.

  Raises:
    ValueError: naming what the data is, what the name expects, and the two ways to fix it.
  """
  expected = expected_format(name)
  if expected is None:
    return
  shape, classes = expected
  got = (tuple(ds.images.shape[1:]), int(ds.num_classes))
  if got != (shape, classes):
    fmt = lambda s, k: f"examples of shape {'x'.join(map(str, s))} and {k} classes"
    raise ValueError(
      f"--dataset={name} expects {fmt(shape, classes)}, but the data from {where} has "
      f"{fmt(*got)}. Point --data_dir at {name}'s data, or pass the --dataset this data is."
    )


def _subset_indices(size: int, n: int, seed: int) -> np.ndarray:
  """The sorted indices a ``train_subset``/``test_subset`` of ``n`` keeps (all when n is 0)."""
  if not n or n >= size:
    return np.arange(size)
  return np.sort(np.random.default_rng(seed).choice(size, n, replace=False))


def subset(ds, n: int, seed: int):
  """(images, labels) of a seeded random ``n`` of ``ds`` in their original order (all when 0)."""
  if not n or n >= len(ds.labels):
    return ds.images, ds.labels
  keep = _subset_indices(len(ds.labels), n, seed)
  return ds.images[keep], ds.labels[keep]


def held_out(ds, n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
  """The examples :func:`subset` ``(ds, n, seed)`` leaves out, in their original order.

  FedGKD-VOTE's server validation split: paper 002 trains on 90% of the data, so
  ``train_subset=45000`` of CIFAR-10 leaves these 5,000 for validation (docs/reproduction.md).
  """
  out = np.setdiff1d(np.arange(len(ds.labels)), _subset_indices(len(ds.labels), n, seed))
  return ds.images[out], np.asarray(ds.labels[out], np.int32)


def same_label_space(public_name: str, private_name: str) -> bool:
  """Whether a public set's labels are the private task's labels: the same dataset by name.

  Equal class counts are not enough (ImageNet-100 and CIFAR-100 both have 100 classes).
  """
  canon = lambda n: n.strip().lower().replace("-", "").replace("_", "")
  return bool(public_name) and canon(public_name) == canon(private_name)


def check_not_private(public: np.ndarray, private: np.ndarray, where: str) -> None:
  """Refuses a public set that is mostly the private training set itself.

  Distillation and FedProj's memory assume the server holds data the clients do not (001 Sec. 4);
  passing the training set as ``--public_data`` would silently make every client's data public.
  Compared by the bytes of each example (a hash per example), so a re-saved copy is caught too.

  Raises:
    ValueError: half or more of the public examples are private training examples.
  """
  if public.shape[1:] != private.shape[1:] or not len(public):
    return
  as_rows = lambda a: np.ascontiguousarray(a).reshape(len(a), -1).view(np.uint8)
  seen = {hash(row.tobytes()) for row in as_rows(private)}
  shared = sum(hash(row.tobytes()) in seen for row in as_rows(public))
  if 2 * shared >= len(public):
    raise ValueError(
      f"--public_data={where}: {shared} of its {len(public)} examples are in the private training "
      "set; the public set must be data the clients do not hold (e.g. "
      "--public_data=../shared/data/cifar100/public_20k.npz for CIFAR-10), not the training set."
    )


def public_inputs(
  c, train_x: np.ndarray, num_classes: int, private_name: str = "", load=load_dataset
) -> tuple[dict, int]:
  """Loads the public set for methods that need one (with ``load``, ``load_dataset``'s
  signature: text runs tokenise it); validates it before any compute. A method that reads no
  public set never loads one, so a preset's public set (e.g. the NLP tasks' TFDS sets) need not
  be on the machine for it."""
  if not registry.needs_public(c.method):
    return {}, 0
  if not c.public_data:
    raise ValueError(
      f"Method {c.method!r} needs public data: pass --public_data=cifar100 or a path, e.g. "
      "--public_data=../shared/data/cifar100/public_20k.npz"
    )
  # The docs call the public set unlabelled: an npz without "label" is accepted.
  public = load(c.public_data, c.public_split, labelled=False)
  if c.public_size > len(public.labels):
    # Capped (a preset's public_size may exceed a small set) and recorded as used: the config,
    # and so summary.json and the checkpoint fingerprint, say what the run read.
    print(
      f"note: --public_size={c.public_size} exceeds the public set {c.public_data!r} "
      f"({len(public.labels)} examples); using all {len(public.labels)}",
      file=sys.stderr,
    )
    c.public_size = len(public.labels)
  images, labels = subset(public, c.public_size, c.seed + 2)
  check_not_private(images, train_x, c.public_data)
  if images.shape[1:] != train_x.shape[1:] or images.dtype != train_x.dtype:
    raise ValueError(
      f"Public data {c.public_data!r} has examples {images.shape[1:]} {images.dtype} but the "
      f"private data has {train_x.shape[1:]} {train_x.dtype}; use a public set of the same format."
    )
  check_run_memory(c, len(labels))  # before the model is built
  inputs = {"public_images": jax.device_put(images)}
  # FedProj's round-0 CE (001, Algorithm 1, line 16) reads public labels as private ones.
  if public.num_classes == num_classes and same_label_space(public.name, private_name):
    inputs["public_labels"] = jax.device_put(np.asarray(labels, np.int32))
  return inputs, len(labels)


def public_normalizer(c, public_images: np.ndarray | None):
  """The public set's normaliser under ``--normalization=code`` (None otherwise, or no public set).

  The FedProj authors' code normalises the public set with its own statistics (CIFAR-100's for
  CIFAR-100), not the private set's. The set is named by ``--public_data``: a dataset name, or a
  path whose file or a folder above it is one (``.../cifar100/public_20k.npz``: cifar100);
  statistics computed from the public images otherwise.
  """
  from pathlib import PurePath

  from fedjax_proj.data import pipeline

  if c.normalization != "code" or public_images is None:
    return None
  known = set(pipeline.CODE_CHANNEL_STATS) | set(pipeline.CHANNEL_STATS)
  path = PurePath(c.public_data)
  names = [path.stem, *(p.name for p in path.parents)]
  name = next((n.lower() for n in names if n.lower() in known), "")
  return pipeline.normalizer_for(name, np.asarray(public_images), "code")
