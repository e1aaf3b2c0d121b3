"""Reads the paper-setting tables of docs/reproduction.md so tests can hold presets to them.

Each table is introduced by an HTML comment naming it, ``<!-- table: NAME -->``, followed by a
markdown table whose first six columns are::

  | field | key | paper | ours | where | note |

``key`` is empty for rows a test cannot resolve from a config (they are documentation only) or a
backticked path that the calling test resolves (e.g. ```num_clients``` or ```fedproj.alpha```).
``paper`` and ``ours`` are the paper's and our preset's values; a row whose two values differ must
say why in ``note``. :func:`check_table` compares ``ours`` with what the code resolves, so the
document and the presets cannot drift apart.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

DOC = Path(__file__).resolve().parents[1] / "docs" / "reproduction.md"
_MARKER = re.compile(r"<!--\s*table:\s*([\w.-]+)\s*-->")


class Row(NamedTuple):
  field: str
  key: str
  paper: str
  ours: str
  where: str
  note: str


def _cells(line: str) -> list[str]:
  return [c.strip() for c in line.strip().strip("|").split("|")]


def read_tables(path: Path = DOC) -> dict[str, list[Row]]:
  """All marked tables of ``path``: name -> rows (header and rule lines skipped)."""
  tables: dict[str, list[Row]] = {}
  name = None
  for line in path.read_text().splitlines():
    marker = _MARKER.search(line)
    if marker:
      name = marker.group(1)
      tables[name] = []
      continue
    if name is None:
      continue
    if not line.strip().startswith("|"):
      if tables[name]:
        name = None  # the table ended
      continue
    cells = _cells(line)
    if cells[0].lower() == "field" or set(cells[0]) <= set("-: "):
      continue
    if len(cells) < 6:
      raise AssertionError(f"{path.name} table {name!r}: row needs 6 columns: {line!r}")
    tables[name].append(Row(*cells[:6]))
  return tables


def parse_value(text: str) -> Any:
  """A cell's value: a Python literal where it reads as one, else the stripped text."""
  text = text.strip().strip("`").replace(",", "") if _is_number(text) else text.strip().strip("`")
  try:
    return ast.literal_eval(text)
  except (ValueError, SyntaxError):
    return text


def _is_number(text: str) -> bool:
  return bool(re.fullmatch(r"`?-?[\d,]+(\.\d+)?(e-?\d+)?`?", text.strip()))


def same(a: Any, b: Any) -> bool:
  if isinstance(a, bool) or isinstance(b, bool):
    return a is b or a == b
  if isinstance(a, int | float) and isinstance(b, int | float):
    return abs(a - b) <= 1e-12 * max(1.0, abs(a), abs(b))
  if isinstance(a, list | tuple) and isinstance(b, list | tuple):
    return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
  return str(a) == str(b)


def check_table(rows: list[Row], resolve: Callable[[str], Any]) -> int:
  """Asserts every keyed row's ``ours`` equals ``resolve(key)``; returns how many were checked.

  Also asserts that every row whose paper and ours values differ explains why in ``note``.
  """
  problems, checked = [], 0
  for row in rows:
    if not same(parse_value(row.paper), parse_value(row.ours)) and not row.note:
      problems.append(f"{row.field}: paper {row.paper} != ours {row.ours} with no note")
    key = row.key.strip().strip("`")
    if not key:
      continue
    actual = resolve(key)
    checked += 1
    if not same(parse_value(row.ours), actual):
      problems.append(f"{row.field} ({key}): table says {row.ours}, code has {actual!r}")
  assert not problems, "docs/reproduction.md out of step with the presets:\n" + "\n".join(problems)
  return checked
