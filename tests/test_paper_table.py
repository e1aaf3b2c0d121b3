"""The preset-table reader catches drift and unexplained departures from a paper."""

from __future__ import annotations

import pytest

from tests.paper_table import check_table, read_tables

DOC = """# Reproduction

<!-- table: demo -->
| field | key | paper | ours | where | note |
|---|---|---|---|---|---|
| clients | `num_clients` | 100 | 100 | 001 Sec. 5 | |
| lr | `lr` | 1e-3 | 0.001 | 001 Table 5 | |
| memory | `memory_size` | 50,000 | 20,000 | 001 Table 5 | public set absent offline |
| model | | ResNet-10 | ResNet-10 | 001 Table 5 | |

Text after the table.
"""


def _write(tmp_path, text):
  path = tmp_path / "reproduction.md"
  path.write_text(text)
  return path


def test_reads_rows_and_accepts_a_matching_config(tmp_path):
  rows = read_tables(_write(tmp_path, DOC))["demo"]
  assert [r.field for r in rows] == ["clients", "lr", "memory", "model"]
  config = {"num_clients": 100, "lr": 1e-3, "memory_size": 20000}
  assert check_table(rows, config.__getitem__) == 3


def test_a_drifted_preset_fails(tmp_path):
  rows = read_tables(_write(tmp_path, DOC))["demo"]
  config = {"num_clients": 50, "lr": 1e-3, "memory_size": 20000}
  with pytest.raises(AssertionError, match="num_clients"):
    check_table(rows, config.__getitem__)


def test_a_departure_without_a_reason_fails(tmp_path):
  rows = read_tables(_write(tmp_path, DOC.replace("public set absent offline", "")))["demo"]
  config = {"num_clients": 100, "lr": 1e-3, "memory_size": 20000}
  with pytest.raises(AssertionError, match="no note"):
    check_table(rows, config.__getitem__)
