"""Packs real data for the accelerator machine into one compact npz (device/gpu_suite.py).

    python -m benchmarks.device.make_device_data --out_dir=.device_data

The device machine has no ../shared/data and receives at most 64 MiB of working tree
(docs/performance.md, "Running the GPU suite"). This packs, into ``<out_dir>/device_data.npz``:

* CIFAR-10 train (``--cifar10_train``, default all 50,000) and test (``--cifar10_test``) as the
  shared folder's own JPEG files, byte for byte (so the device decodes exactly the pixels the
  image-folder loader decodes here), in class order;
* a subset of the CIFAR-100 public set (``--public``), re-encoded as JPEG (``--public_format=jpeg``,
  ``--public_quality``; lossy, recorded in the file: enough for the GPU suite's timings) or as
  lossless WebP (``--public_format=webp_lossless``: the exact pixels, ~35 MiB for all 20,000, for
  claim runs, whose distillation and memory sets must be the ones a CPU run reads);
* an MNIST subset (``--mnist_train``/``--mnist_test``) as raw uint8 (GPSE's and FOT's PMNIST);
  ``--mnist_train=0`` leaves MNIST out (room for the lossless public set).

For claim runs of the CIFAR-10 claims (docs/reproduction.md, "Running claims on a GPU"):

    python -m benchmarks.device.make_device_data --public_format=webp_lossless --mnist_train=0

Subsets are drawn with a fixed seed, stratified by class for CIFAR-10. The total must stay under
``--max_mib`` (60), else the script stops naming the flag to lower. ``gpu_suite.py`` unpacks the
file into the layout of ../shared/data (``unpack``), so every benchmark finds it unchanged.
"""

from __future__ import annotations

import argparse
import io
import json
import sys
from pathlib import Path

import numpy as np

from benchmarks import flag_checks
from benchmarks.results_io import REPO_ROOT
from fedjax_proj.reproduce import provenance

REPO = REPO_ROOT

CIFAR10_CLASSES = (
  "airplane",
  "automobile",
  "bird",
  "cat",
  "deer",
  "dog",
  "frog",
  "horse",
  "ship",
  "truck",
)
FILE_NAME = "device_data.npz"


def _concat(blobs: list[bytes]) -> tuple[np.ndarray, np.ndarray]:
  """Byte strings as one uint8 array plus offsets [n + 1] (no pickled objects in the npz)."""
  offsets = np.zeros(len(blobs) + 1, np.int64)
  offsets[1:] = np.cumsum([len(b) for b in blobs])
  return np.frombuffer(b"".join(blobs), np.uint8).copy(), offsets


def _split(data: np.ndarray, offsets: np.ndarray) -> list[bytes]:
  raw = data.tobytes()
  return [raw[offsets[i] : offsets[i + 1]] for i in range(len(offsets) - 1)]


def cifar10_jpegs(root: Path, split: str, n: int, rng) -> tuple[list[bytes], np.ndarray]:
  """``n`` files of ``root/<split>/<class>/*.jpg``, stratified by class (all when n >= total)."""
  files = [sorted((root / split / c).glob("*.jpg")) for c in CIFAR10_CLASSES]
  total = sum(len(f) for f in files)
  if not total:
    raise FileNotFoundError(f"No CIFAR-10 JPEGs under {root / split}/<class>/; check --shared.")
  blobs, labels = [], []
  for label, fs in enumerate(files):
    k = len(fs) if n >= total else round(n * len(fs) / total)
    for i in sorted(rng.choice(len(fs), k, replace=False)):
      blobs.append(fs[i].read_bytes())
      labels.append(label)
  return blobs, np.asarray(labels, np.int16)


def _encode(image: np.ndarray, public_format: str, quality: int) -> bytes:
  from PIL import Image

  buf = io.BytesIO()
  if public_format == "webp_lossless":
    Image.fromarray(image).save(buf, format="WEBP", lossless=True, quality=100, method=6)
  else:
    Image.fromarray(image).save(buf, format="JPEG", quality=quality)
  return buf.getvalue()


def decode_images(data: np.ndarray, offsets: np.ndarray) -> np.ndarray:
  """Decodes concatenated image files (JPEG or WebP: PIL reads the format from the bytes)."""
  from PIL import Image

  return np.stack(
    [np.asarray(Image.open(io.BytesIO(b)).convert("RGB")) for b in _split(data, offsets)]
  )


def build(args) -> dict[str, np.ndarray]:
  shared = Path(args.shared)
  rng = np.random.default_rng(args.seed)
  out: dict[str, np.ndarray] = {}
  for split, n in (("train", args.cifar10_train), ("test", args.cifar10_test)):
    blobs, labels = cifar10_jpegs(shared / "cifar10", split, n, rng)
    out[f"cifar10_{split}_jpeg"], out[f"cifar10_{split}_offsets"] = _concat(blobs)
    out[f"cifar10_{split}_label"] = labels
  with np.load(shared / "cifar100" / "public_20k.npz") as z:
    keep = np.sort(rng.choice(len(z["label"]), min(args.public, len(z["label"])), replace=False))
    images, labels = z["image"][keep], z["label"][keep]
  blobs = [_encode(im, args.public_format, args.public_quality) for im in images]
  out["public_jpeg"], out["public_offsets"] = _concat(blobs)
  out["public_label"] = labels.astype(np.int16)
  for split, n in (("train", args.mnist_train), ("test", args.mnist_test)):
    if args.mnist_train <= 0:  # left out: no empty MNIST files that a run would read as data
      break
    with np.load(shared / "mnist" / f"{split}.npz") as z:
      keep = np.sort(rng.choice(len(z["label"]), min(n, len(z["label"])), replace=False))
      out[f"mnist_{split}_image"], out[f"mnist_{split}_label"] = z["image"][keep], z["label"][keep]
  out["about"] = np.asarray(
    f"built by benchmarks/device/make_device_data.py seed={args.seed} from {shared}; public set "
    + (
      "as lossless WebP (exact pixels)"
      if args.public_format == "webp_lossless"
      else f"re-encoded as JPEG quality {args.public_quality} (lossy)"
    )
  )
  return out


def unpack(npz_path: Path, dest: Path) -> dict[str, int]:
  """Writes ``dest/{cifar10,mnist}/{train,test}.npz`` (MNIST where packed) and
  ``dest/cifar100/public_20k.npz``.

  The layout of ../shared/data with npz files (``image`` uint8, ``label`` int64), so
  ``FEDJAX_PROJ_SHARED_DATA=dest`` and ``load_dataset`` find it. Returns example counts.
  """
  counts = {}
  with np.load(npz_path) as z:
    # What the pack holds, beside the data: a claim run records a lossy public set as a deviation
    # (fedjax_proj/reproduce/provenance.py, data_deviations).
    dest.mkdir(parents=True, exist_ok=True)
    (dest / provenance.DATA_RECORD).write_text(json.dumps({"about": str(z["about"])}) + "\n")
    parts = {
      "cifar10/train.npz": ("cifar10_train_jpeg", "cifar10_train_offsets", "cifar10_train_label"),
      "cifar10/test.npz": ("cifar10_test_jpeg", "cifar10_test_offsets", "cifar10_test_label"),
      "cifar100/public_20k.npz": ("public_jpeg", "public_offsets", "public_label"),
    }
    for rel, (data, offsets, label) in parts.items():
      images = decode_images(z[data], z[offsets])
      (dest / rel).parent.mkdir(parents=True, exist_ok=True)
      np.savez(dest / rel, image=images, label=z[label].astype(np.int64))
      counts[rel] = len(images)
    for split in ("train", "test"):
      if f"mnist_{split}_image" not in z.files:  # packed without MNIST (--mnist_train=0)
        continue
      (dest / "mnist").mkdir(parents=True, exist_ok=True)
      images = z[f"mnist_{split}_image"]
      np.savez(
        dest / "mnist" / f"{split}.npz",
        image=images,
        label=z[f"mnist_{split}_label"].astype(np.int64),
      )
      counts[f"mnist/{split}.npz"] = len(images)
  return counts


def check_counts(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
  """Each count and setting in its range, before any file is read or encoded.

  A count of 0 would pack empty arrays that a run reads as data (MNIST alone may be left out,
  ``--mnist_train=0``); a negative one, or a negative seed, is NumPy's traceback mid-build.
  """
  flag_checks.at_least(p, args, 1, "cifar10_train", "cifar10_test", "public")
  flag_checks.at_least(p, args, 0, "mnist_train", "seed")
  if args.mnist_train:
    flag_checks.at_least(p, args, 1, "mnist_test")
  if not 1 <= args.public_quality <= 100:
    p.error(f"--public_quality must be a JPEG quality in 1..100, got {args.public_quality}")
  if not args.max_mib > 0:  # NaN too
    p.error(f"--max_mib must be > 0, got {args.max_mib}")
  out = Path(args.out_dir)
  if out.exists() and not out.is_dir():
    p.error(f"--out_dir={out} is a file; name a folder for {FILE_NAME}")


def check_paths(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
  """The shared folder holds every file the build reads (a missing one named, with the fix)."""
  shared = Path(args.shared)
  if not shared.is_dir():
    p.error(f"--shared={shared} is not a folder; pass the shared data folder (its README)")
  need = [shared / "cifar10" / "train", shared / "cifar10" / "test"]
  need.append(shared / "cifar100" / "public_20k.npz")
  if args.mnist_train:
    need += [shared / "mnist" / "train.npz", shared / "mnist" / "test.npz"]
  if missing := [str(path) for path in need if not path.exists()]:
    p.error(
      f"--shared={shared} lacks {', '.join(missing)}; pass the shared data folder (its README)"
      + ("" if not args.mnist_train else ", or --mnist_train=0 to leave MNIST out")
    )


def main(argv=None) -> int:
  from fedjax_proj.data.sources import find_shared_data

  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--out_dir", default=str(REPO / ".device_data"))
  p.add_argument("--shared", default="", help="the shared data folder (default: found as tests do)")
  p.add_argument("--cifar10_train", type=int, default=50000)
  p.add_argument("--cifar10_test", type=int, default=10000)
  p.add_argument("--public", type=int, default=20000)
  p.add_argument("--public_format", choices=("jpeg", "webp_lossless"), default="jpeg")
  p.add_argument(
    "--public_quality", type=int, default=90, help="JPEG quality (--public_format=jpeg)"
  )
  p.add_argument("--mnist_train", type=int, default=60000)
  p.add_argument("--mnist_test", type=int, default=10000)
  p.add_argument("--max_mib", type=float, default=60.0)
  p.add_argument("--seed", type=int, default=0)
  args = p.parse_args(argv)
  check_counts(p, args)
  if not args.shared:
    found = find_shared_data()
    if found is None:
      p.error(
        "the shared data folder was not found: pass --shared=/path/to/shared/data or set "
        "$FEDJAX_PROJ_SHARED_DATA"
      )
    args.shared = str(found)
  check_paths(p, args)
  arrays = build(args)
  out = Path(args.out_dir)
  out.mkdir(parents=True, exist_ok=True)
  path = out / FILE_NAME
  np.savez_compressed(path, **arrays)
  mib = path.stat().st_size / 2**20
  if mib > args.max_mib:
    path.unlink()
    p.error(
      f"the packed data is {mib:.1f} MiB > --max_mib={args.max_mib} (the device takes 64 MiB of "
      "working tree in all): lower --cifar10_train, --cifar10_test, --public or --mnist_train"
    )
  sizes = {k: v.nbytes / 2**20 for k, v in arrays.items()}
  print(f"wrote {path}: {mib:.1f} MiB")
  for k, v in sizes.items():
    print(f"  {k}: {v:.1f} MiB")
  return 0


if __name__ == "__main__":
  sys.exit(main())
