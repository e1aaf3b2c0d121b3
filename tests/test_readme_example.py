"""The README's "Writing an algorithm" example runs as shown and trains (five FedAvg rounds on
scikit-learn's digits, which ship with the package's dependencies)."""

from __future__ import annotations

import re
import types
from pathlib import Path

import numpy as np

README = Path(__file__).resolve().parents[1] / "README.md"


def test_readme_algorithm_example_runs_and_learns(capsys):
  text = README.read_text()
  section = text[text.index("### Writing an algorithm") :]
  section = section[: section.index("\n### ", 1)]
  blocks = re.findall(r"```python\n(.*?)```", section, flags=re.S)
  assert len(blocks) == 1, "README 'Writing an algorithm' should hold one python example"
  module = types.ModuleType("readme_example")
  exec(compile(blocks[0], str(README), "exec"), module.__dict__)
  assert "round 5: train_loss=" in capsys.readouterr().out
  assert np.isfinite(float(module.metrics["train_loss"]))
  # 10 classes: chance is 0.1; five rounds of FedAvg on digits reach far above it.
  assert module.accuracy > 0.5
