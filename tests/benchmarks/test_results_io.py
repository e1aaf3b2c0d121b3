"""benchmarks/results_io.py: the one writer of the benchmarks' JSON results."""

from __future__ import annotations

import json

import numpy as np
import pytest

from benchmarks import results_io


def test_writes_json_with_a_newline_and_makes_the_folders(tmp_path):
  path = results_io.write_results(tmp_path / "a" / "b" / "x.json", {"z": 1, "a": [1.5]})
  assert path == tmp_path / "a" / "b" / "x.json"
  assert path.read_text() == '{\n "z": 1,\n "a": [\n  1.5\n ]\n}\n'


def test_layout_options_pass_through(tmp_path):
  path = results_io.write_results(
    tmp_path / "x.json", {"z": np.float32(0.5), "a": 1}, indent=2, sort_keys=True, default=float
  )
  assert path.read_text() == '{\n  "a": 1,\n  "z": 0.5\n}\n'
  assert json.loads(path.read_text()) == {"a": 1, "z": 0.5}


def test_markdown_goes_beside_the_json(tmp_path):
  path = results_io.write_results(
    tmp_path / "fedntd.json", {"method": "fedntd"}, markdown="| a |\n"
  )
  assert (tmp_path / "fedntd.md").read_text() == "| a |\n"
  assert json.loads(path.read_text()) == {"method": "fedntd"}


def test_refuses_a_json_that_the_table_would_overwrite(tmp_path):
  with pytest.raises(ValueError, match="name it .json"):
    results_io.write_results(tmp_path / "x.md", {}, markdown="t")
  assert not any(tmp_path.iterdir())  # refused before writing


def test_results_dir_is_the_repository_results_folder():
  assert (results_io.REPO_ROOT / "fedjax_proj").is_dir()
  assert results_io.RESULTS_DIR == results_io.REPO_ROOT / "results"
