"""experiments/quickstart.ipynb runs top to bottom (smoke budget) in a fresh ``python3`` kernel.

Executed with nbclient (the ``test`` extra) on the offline data in ``../shared/data``; it writes
both runs and the curves PNG, and its install cell is a no-op because the package is importable.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fedjax_proj.data.sources import find_shared_data

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOK = ROOT / "experiments" / "quickstart.ipynb"


def test_quickstart_notebook_runs_on_smoke_budget(tmp_path, monkeypatch):
  nbformat = pytest.importorskip(
    "nbformat", reason="install the test extra: pip install -e .[test]"
  )
  nbclient = pytest.importorskip(
    "nbclient", reason="install the test extra: pip install -e .[test]"
  )
  pytest.importorskip("ipykernel", reason="install the test extra: pip install -e .[test]")
  shared = find_shared_data()
  if shared is None or not (shared / "cifar10").exists():
    pytest.skip("../shared/data (CIFAR-10 + CIFAR-100 public subset) is absent; offline only")
  monkeypatch.setenv("FEDJAX_PROJ_SMOKE", "1")
  monkeypatch.setenv("JAX_PLATFORMS", "cpu")
  nb = nbformat.read(NOTEBOOK, as_version=4)
  assert nb.metadata["kernelspec"]["name"] == "python3"
  client = nbclient.NotebookClient(
    nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
  )
  client.execute()
  runs = tmp_path / "runs" / "quickstart-smoke"
  for method in ("fedavg", "fedproj"):
    summary = json.loads((runs / method / "summary.json").read_text())
    assert summary["method"] == method and summary["rounds"] == 2
    assert 0.0 <= summary["final_test_accuracy"] <= 1.0
  assert (runs / "curves.png").stat().st_size > 10_000
  outputs = [o for cell in nb.cells if cell.cell_type == "code" for o in cell.get("outputs", [])]
  text = "".join(o.get("text", "") for o in outputs)
  assert "fedavg   final test accuracy" in text and "fedproj  final test accuracy" in text
  assert any("image/png" in o.get("data", {}) for o in outputs)  # the figure is displayed
