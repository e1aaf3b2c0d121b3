"""The README's "Writing an algorithm" example runs as shown and trains (five FedAvg rounds on
scikit-learn's digits, which ship with the package's dependencies)."""

from __future__ import annotations

import re
import types
from pathlib import Path

import numpy as np
import pytest

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


def _exit_codes() -> dict[str, str]:
  """The README's exit-code table (under "Failures"): code -> meaning."""
  text = README.read_text()
  rows = re.findall(r"^  \| (\d+(?: \+ N)?) \| (.+) \|$", text, flags=re.M)
  return dict(rows)


def test_readme_exit_codes_are_the_ones_the_entry_points_return(tmp_path, capsys):
  import signal

  from fedjax_proj.configs import cifar10, common
  from fedjax_proj.training.loop import NonFiniteError
  from fedjax_proj.training.signals import TrainingInterrupted

  codes = _exit_codes()
  assert set(codes) == {"0", "1", "2", "3", "128 + N"}

  def ending(error):
    def run():
      raise error

    return common.run_reporting(run, [], str(tmp_path / "run"))

  nonfinite = ending(NonFiniteError("round 2: non-finite train loss nan"))
  assert "diverged" in codes[str(nonfinite)] and "non-finite" in codes[str(nonfinite)]
  refused = ending(ValueError("--output_dir holds a run"))
  assert "refused" in codes[str(refused)]
  stopped = ending(TrainingInterrupted("SIGTERM", 3, signal.SIGTERM, True))
  assert stopped == 128 + signal.SIGTERM and "143: SIGTERM" in codes["128 + N"]
  assert common.run_reporting(lambda: None, [], str(tmp_path / "run")) == 0
  with pytest.raises(SystemExit) as e:  # a flag out of range: the parser's refusal
    common.parse_config(["--rounds=0"], "test", cifar10.get_config, {})
  assert "a bad flag, before anything runs" in codes[str(e.value.code)]
  # The prose says the same as the table.
  assert f"stop the run with\n  exit code {nonfinite}," in README.read_text()
