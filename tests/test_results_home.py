"""Results have a home git tracks: every result file under ``results/`` is tracked, and only a
run's work folder, lock and traceback are ignored (docs/design.md, "Layout")."""

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.skipif(
  shutil.which("git") is None or not (ROOT / ".git").exists(), reason="needs a git checkout"
)


def _ignored(path: str) -> bool:
  out = subprocess.run(
    ["git", "check-ignore", "-q", "--no-index", path], cwd=ROOT, capture_output=True
  )
  return out.returncode == 0


@pytest.mark.parametrize(
  "path",
  [
    "results/reproduce/fedgkd-cifar10/cpu/fedgkd-seed1000.json",
    "results/reproduce/fedgkd-cifar10/cpu/report.md",
    "results/reproduce/fedgkd-cifar10/cpu/verdicts.json",
    "results/peer/one_core.json",
    "results/cpu_step.json",
    "results/gpu/h200-2026-11-27/claims_v2_sfedkd_mnist.log",
  ],
)
def test_a_result_file_is_not_ignored(path):
  assert not _ignored(path), f"{path} is ignored by .gitignore; results/ must be tracked"


@pytest.mark.parametrize(
  "path",
  [
    "results/reproduce/fedgkd-cifar10/cpu/fedgkd-seed1000.work/checkpoints/3/state",
    "results/reproduce/fedgkd-cifar10/cpu/fedgkd-seed1000.lock",
    "results/reproduce/fedgkd-cifar10/cpu/fedgkd-seed1000.traceback",
  ],
)
def test_a_runs_work_folder_lock_and_traceback_are_ignored(path):
  assert _ignored(path), f"{path} is not ignored; a commit would carry a run's scratch files"


def test_no_tracked_file_lies_under_the_old_results_folder():
  tracked = subprocess.run(
    ["git", "ls-files", "benchmarks/results"], cwd=ROOT, capture_output=True, text=True, check=True
  ).stdout.split()
  assert not tracked, f"results belong under results/, not benchmarks/results: {tracked[:3]}"
