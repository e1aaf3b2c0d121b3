"""Where and with what a run computed: the checkout, the code fingerprint (the package less its
report side, and the entry points), the git commit, the machine, and the run's deviations of
arithmetic or data from the budget (docs/reproduction.md, "Results")."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from pathlib import Path
from typing import Any

# The folder holding the package: a source checkout's root, or site-packages when installed.
REPO_ROOT = Path(__file__).resolve().parents[2]


def in_checkout(root: Path = REPO_ROOT) -> bool:
  """Whether the package runs from a source checkout (``root`` holds pyproject.toml, docs/ and
  benchmarks/ beside it), not from an installed copy."""
  return all((root / p).exists() for p in ("pyproject.toml", "docs", "benchmarks"))


# Files whose content decides what a run computes: the package (less the report side of the
# reproduce tool, which only reads results) and the entry points. Their hash is a result's code
# fingerprint; two results pair only when it is equal (or recorded as equivalent, report/).
# Paths relative to the package.
REPORT_ONLY = (
  "reproduce/report/__init__.py",
  "reproduce/report/results.py",
  "reproduce/report/verdicts.py",
  "reproduce/report/tables.py",
  "reproduce/report/figures.py",
  "reproduce/report/timing.py",
  "reproduce/report/writer.py",
  "reproduce/stats.py",
  "reproduce/protocol.py",
  "reproduce/__main__.py",
  "reproduce/claim_queue.py",
  "reproduce/jobs.py",
  "reproduce/docs_tables.py",
  "plot.py",
)


def code_files(repo_root: Path = REPO_ROOT) -> list[Path]:
  package = repo_root / "fedjax_proj"
  files = [f for f in package.rglob("*.py") if f.relative_to(package).as_posix() not in REPORT_ONLY]
  # C++ the package compiles and calls decides numbers too (models/onednn_conv.cc, the CPU
  # kernel gradient of conv_impl="onednn_grad").
  files += package.rglob("*.cc")
  return sorted(files + list((repo_root / "experiments").glob("*.py")))


def _command(args: list[str]) -> str | None:
  """``args``' stdout, stripped, or None where it cannot run, fails or prints nothing."""
  try:
    out = subprocess.run(args, capture_output=True, text=True, timeout=20, check=True).stdout
  except (OSError, subprocess.SubprocessError):
    return None
  return out.strip() or None


def cpu_model(cpuinfo: Path = Path("/proc/cpuinfo")) -> str | None:
  """The CPU's model name (Linux's /proc/cpuinfo), or None where it is not readable."""
  try:
    lines = cpuinfo.read_text().splitlines()
  except OSError:
    return None
  names = [line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")]
  return names[0] if names and names[0] else None


def card(backend: str, device_kind: str) -> str | None:
  """The physical device a run computed on, beyond its kind: two H200s are one kind, yet a claim
  whose runs span leases spans cards, and docs/reproduction.md ("The gpu budget") names each.

  GPU: nvidia-smi's name and UUID of JAX's device 0, the first of ``CUDA_VISIBLE_DEVICES``
  (index 0 where unset; the device machines here hold one GPU, so the orders cannot disagree).
  CPU: the processor's model name, None where it cannot be read (JAX's kind is only "cpu").
  Another accelerator, or a GPU without nvidia-smi: ``device_kind``.
  """
  if backend == "gpu":
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")[0].strip() or "0"
    query = ["nvidia-smi", "--query-gpu=name,uuid", "--format=csv,noheader", "-i", visible]
    found = _command(query)
    if found:
      return ", ".join(part.strip() for part in found.splitlines()[0].split(","))
  if backend == "cpu":
    return cpu_model()
  return device_kind


def machine_info() -> dict:
  """Where a run computed: JAX's backend and device kind, the card (:func:`card`), the cores this
  process may use and the machine's. A result keeps it so a report can say which machine produced
  which numbers (the same code computes in another reduction order on a GPU) and an ETA uses
  times from the same kind."""
  import jax

  from fedjax_proj.training.placement import conv_impl_for

  backend, kind = jax.default_backend(), jax.devices()[0].device_kind
  return {
    "backend": backend,
    "device_kind": kind,
    "card": card(backend, kind),
    "cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
    "cpu_count": os.cpu_count(),
    # None: the backend's default, which on recent NVIDIA GPUs computes float32 matrix products
    # and convolutions in TF32 (report.results.arithmetic); JAX_DEFAULT_MATMUL_PRECISION=float32
    # pins it.
    "matmul_precision": jax.config.jax_default_matmul_precision or "default",
    # The CPU placement's convolution implementation (placement.conv_impl_for), another
    # summation order of the same gradient than XLA's; None off CPU
    # (docs/performance.md, "The CPU convolution kernel gradient").
    "cpu_conv_impl": conv_impl_for() if jax.default_backend() == "cpu" else None,
  }


# Precisions at which an accelerator computes float32 products in full float32 (JAX's names).
FULL_FLOAT32 = ("float32", "highest", "F32_F32_F32")


# Written beside data unpacked from a device pack (benchmarks/device/make_device_data.py): what the
# pack holds, e.g. whether its public set is a lossy copy.
DATA_RECORD = "DEVICE_DATA.json"


def arithmetic_deviations(machine: dict) -> list[str]:
  """A run's deviation of arithmetic from the budget's float32: matrix products and convolutions
  at an accelerator's reduced default (TF32 on recent NVIDIA GPUs, bfloat16 passes on TPUs)
  instead of full float32 (XLA:CPU has no reduced mode; JAX_DEFAULT_MATMUL_PRECISION=float32
  pins it on an accelerator)."""
  precision = str(machine.get("matmul_precision") or "default")
  if machine.get("backend", "cpu") == "cpu" or precision in FULL_FLOAT32:
    return []
  return [
    f"matmul precision: {precision} on {machine.get('device_kind')} (the accelerator's reduced "
    "default, TF32 on recent NVIDIA GPUs), not float32"
  ]


def data_deviations(config: dict[str, Any], data_root: Path) -> list[str]:
  """A run's deviation of data from the shared folder's: a config that reads a public set from a
  data folder unpacked from a device pack whose public set is a lossy copy (other pixels than the
  shared file's)."""
  record = Path(data_root) / DATA_RECORD
  if not config.get("public_data") or not record.is_file():
    return []
  about = str(json.loads(record.read_text()).get("about", ""))
  return [f"public set: a lossy copy ({about})"] if "lossy" in about else []


def local_backend() -> str:
  """The backend a run here will most likely use, found without starting JAX (which would take
  an accelerator's memory in a parent process): "gpu" where an NVIDIA device node exists, "tpu"
  where an accel node exists, else "cpu". Only ETAs use it."""
  if Path("/dev/nvidia0").exists():
    return "gpu"
  if Path("/dev/accel0").exists():
    return "tpu"
  return "cpu"


def code_fingerprint(repo_root: Path = REPO_ROOT) -> str:
  """SHA-256 (16 hex digits) over the paths and contents of :func:`code_files`."""
  h = hashlib.sha256()
  for f in code_files(repo_root):
    h.update(f.relative_to(repo_root).as_posix().encode() + b"\0" + f.read_bytes() + b"\0")
  return h.hexdigest()[:16]


def git_commit(repo_root: Path = REPO_ROOT) -> str:
  """HEAD of the checkout (``-dirty`` with tracked changes), or ``$FEDJAX_PROJ_GIT_COMMIT`` where
  set: a copy of the tree whose git history is not its own (an accelerator's copy of the working
  tree) names the commit it was copied at (docs/reproduction.md, "Running claims on a GPU"); the
  code fingerprint beside it is computed from the files either way. An installed package has no
  commit ("unknown"), even where its site-packages lies inside some git checkout."""
  named = os.environ.get("FEDJAX_PROJ_GIT_COMMIT", "").strip()
  if named:
    return named
  if not in_checkout(repo_root):
    return "unknown"
  try:
    out = subprocess.run(
      ["git", "-C", str(repo_root), "rev-parse", "HEAD"], capture_output=True, text=True, check=True
    ).stdout.strip()
    dirty = subprocess.run(
      ["git", "-C", str(repo_root), "status", "--porcelain", "--untracked-files=no"],
      capture_output=True,
      text=True,
      check=True,
    ).stdout.strip()
    return out + ("-dirty" if dirty else "")
  except (OSError, subprocess.CalledProcessError):
    return "unknown"
