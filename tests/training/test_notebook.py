"""experiments/quickstart.ipynb runs top to bottom (smoke budget) in a fresh ``python3`` kernel.

Executed with nbclient (the ``test`` extra) on the offline data in ``../shared/data``; it writes
both runs and the curves PNG, and its install cell is a no-op because the package is importable.
"""

from __future__ import annotations

import ast
import json
import re
import shlex
from pathlib import Path

import pytest

from fedjax_proj.data.sources import find_shared_data
from fedjax_proj.training.metrics import read_metrics

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
    assert summary["method"] == method and summary["rounds"] == 4
    assert 0.0 <= summary["final_test_accuracy"] <= 1.0
  # The smoke budget shows the projection: the projected-steps panel is not flat at 0.
  fractions = [r["projected_fraction"] for r in read_metrics(runs / "fedproj")]
  assert fractions[0] == 0.0 and max(fractions) > 0.0, fractions
  assert (runs / "curves.png").stat().st_size > 10_000
  outputs = [o for cell in nb.cells if cell.cell_type == "code" for o in cell.get("outputs", [])]
  text = "".join(o.get("text", "") for o in outputs)
  assert "fedavg   final test accuracy" in text and "fedproj  final test accuracy" in text
  assert any("image/png" in o.get("data", {}) for o in outputs)  # the figure is displayed


def _code_cells() -> list[str]:
  cells = json.loads(NOTEBOOK.read_text())["cells"]
  return ["".join(c["source"]) for c in cells if c["cell_type"] == "code"]


@pytest.mark.parametrize("smoke", [True, False])
def test_notebook_runs_what_the_cifar10_entry_point_runs(smoke):
  """Without running it: every run of the notebook is ``cifar10.resolve`` of its preset and
  fields (fedjax_proj/configs/common.py ``resolve``, the step the flags go through), and the
  command it prints resolves, through the entry point's own flag parsing, to the very same
  config."""
  from fedjax_proj.configs import cifar10, common
  from fedjax_proj.core.engine import STRATEGIES
  from fedjax_proj.models import MODELS

  code = _code_cells()
  assert not any("base_config" in c for c in code), "the notebook builds a config of its own"
  # It runs against the installed package: no path edits, no files loaded by path.
  assert not any("sys.path" in c or "spec_from_file_location" in c for c in code)
  calls = [
    node
    for c in code
    # An IPython magic (%pip) is no Python: parse it as a pass.
    for node in ast.walk(ast.parse(re.sub(r"(?m)^(\s*)%.*$", r"\1pass", c)))
    if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "run_experiment"
  ]
  assert calls and all(ast.unparse(call.args[0]).startswith("cifar10.resolve(") for call in calls)

  (setup,) = [c for c in code if "FIELDS = {" in c]
  printed = []
  scope = {"SMOKE": smoke, "DATA_DIR": "", "PUBLIC": "cifar100", "Path": Path, "shlex": shlex}
  scope.update(cifar10=cifar10, print=lambda *a: printed.append(" ".join(map(str, a))))
  exec(setup, scope)
  (command,) = [line for line in printed if line.startswith("python experiments/cifar10.py")]
  choices = {"method": common.parallel_methods(), "strategy": STRATEGIES, "model": MODELS}
  for method in ("fedavg", "fedproj"):
    argv = [a.replace("<fedavg|fedproj>", method) for a in shlex.split(command)[2:]]
    from_flags = common.parse_config(argv, "", cifar10.get_config, choices, cifar10.PRESETS)
    from_flags = cifar10.prepare(from_flags)
    in_notebook = cifar10.resolve(scope["PRESET"], {**scope["FIELDS"], "method": method})
    assert from_flags.to_dict() == in_notebook.to_dict()
    assert in_notebook.rounds == (4 if smoke else 20) and in_notebook.partition == "dirichlet:0.3"
