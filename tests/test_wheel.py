"""The package as a user installs it: a wheel built from pyproject.toml, installed into a fresh
virtual environment and run outside any checkout (docs/design.md, "The package and the checkout").

The claim runner then finds its presets in the package (fedjax_proj/configs), runs a claim in its
own process with ``--data`` pointing at the shared data, and writes the result to its default
folder for an installed package, ``./fedjax_proj_results``. Nothing is downloaded: the wheel is
built with this environment's setuptools and wheel (``--no-build-isolation``) and installed with
``--no-deps``; the fresh environment reaches this one's dependencies through a ``.pth`` file that
names its site-packages folders, whose own ``.pth`` files (this environment's editable
fedjax_proj) are not read, so the only fedjax_proj it can import is the wheel's.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import site
import subprocess
import sys
from pathlib import Path

import pytest

from fedjax_proj.data.sources import find_shared_data

ROOT = Path(__file__).resolve().parents[1]
CLAIM = ["fot-pmnist-noniid", "--budget=smoke", "--methods=fl", "--seeds=0"]


def _run(cmd, **kwargs) -> subprocess.CompletedProcess:
  proc = subprocess.run(
    [str(c) for c in cmd], capture_output=True, text=True, timeout=600, **kwargs
  )
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
  return proc


def build_wheel(out: Path) -> Path:
  """A wheel of the package, built from a copy of the sources (the checkout gets no build/)."""
  src = out / "src"
  shutil.copytree(
    ROOT / "fedjax_proj", src / "fedjax_proj", ignore=shutil.ignore_patterns("__pycache__")
  )
  for name in ("pyproject.toml", "README.md"):
    shutil.copy(ROOT / name, src / name)
  pip = [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation"]
  _run([*pip, "--no-index", "-w", out / "dist", src])
  (wheel,) = (out / "dist").glob("fedjax_proj-*.whl")
  return wheel


def fresh_venv(path: Path, wheel: Path) -> Path:
  """A new environment holding only the wheel, with this one's dependencies on its path; returns
  its interpreter."""
  _run([sys.executable, "-m", "venv", "--without-pip", path])
  python = path / "bin" / "python"
  purelib = _run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"])
  lines = [p for p in site.getsitepackages() if Path(p).is_dir()]
  (Path(purelib.stdout.strip()) / "test_env_dependencies.pth").write_text("\n".join(lines) + "\n")
  pip = [sys.executable, "-m", "pip", "--python", python, "install", "-q", "--no-deps"]
  _run([*pip, "--no-index", wheel])
  return python


@pytest.mark.slow
def test_wheel_runs_a_claim_outside_a_checkout(tmp_path):
  for module in ("setuptools", "wheel"):
    if importlib.util.find_spec(module) is None:
      pytest.skip(f"building the wheel offline needs {module} (the test extra)")
  shared = find_shared_data()
  if shared is None or not (shared / "mnist" / "train.npz").is_file():
    pytest.skip("../shared/data/mnist is absent; offline only")
  python = fresh_venv(tmp_path / "venv", build_wheel(tmp_path))
  elsewhere = tmp_path / "elsewhere"
  elsewhere.mkdir()
  # Nothing of the checkout on the path: not $PYTHONPATH, not the working directory.
  env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
  env["JAX_PLATFORMS"] = "cpu"
  where = _run(
    [python, "-c", "import fedjax_proj; print(fedjax_proj.__file__)"], cwd=elsewhere, env=env
  )
  assert Path(where.stdout.strip()).is_relative_to(tmp_path / "venv"), where.stdout

  listed = _run([python, "-m", "fedjax_proj.reproduce", "--list"], cwd=elsewhere, env=env).stdout
  assert "fot-pmnist-noniid" in listed and "fedproj-cifar10-dir0.3" in listed

  cmd = [python, "-m", "fedjax_proj.reproduce", *CLAIM, f"--data={shared}"]
  out = _run(cmd, cwd=elsewhere, env=env).stdout
  assert "done fot-pmnist-noniid smoke fl seed 0" in out
  # The installed package's default results folder, in the working directory.
  path = elsewhere / "fedjax_proj_results" / "fot-pmnist-noniid" / "smoke" / "fl-seed0.json"
  result = json.loads(path.read_text())
  assert 0.0 <= result["metrics"]["acc"] <= 100.0 and len(result["detail"]["acc_matrix"]) == 3
  assert result["git_commit"] == "unknown"  # an installed package is no checkout
