"""The benchmarks' results folder (results/ at the repository root) and the one way to write there.

Standard library only: a script that must set XLA's flags before JAX loads
(benchmarks/perf/cpu_step.py) or a peer runner in another framework's environment can import it.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
# Every benchmark's default --out is under here (git tracks it; a run's work folders are ignored).
RESULTS_DIR = REPO_ROOT / "results"


def write_results(
  path: str | Path,
  result: Any,
  *,
  indent: int = 1,
  sort_keys: bool = False,
  default: Callable[[Any], Any] | None = None,
  allow_nan: bool = True,
  markdown: str | None = None,
) -> Path:
  """Writes ``result`` as JSON to ``path`` (a trailing newline; parent folders made).

  Args:
    path: the file to write, by convention ``<stem>.json``.
    result: JSON-serialisable data.
    indent, sort_keys, default, allow_nan: as :func:`json.dumps`; each script keeps the layout its
      committed results already have, so a rerun's diff shows only changed numbers.
    markdown: if given, also written beside the JSON as ``path`` with the suffix ``.md``.

  Returns:
    ``path``, as a :class:`~pathlib.Path`.

  Raises:
    ValueError: if ``markdown`` is given and ``path`` ends in ``.md`` (the table would overwrite
      the JSON).
  """
  path = Path(path)
  if markdown is not None and path.suffix == ".md":
    raise ValueError(f"write_results: {path} would hold both the JSON and the table; name it .json")
  text = json.dumps(
    result, indent=indent, sort_keys=sort_keys, default=default, allow_nan=allow_nan
  )
  path.parent.mkdir(parents=True, exist_ok=True)
  path.write_text(text + "\n")
  if markdown is not None:
    path.with_suffix(".md").write_text(markdown)
  return path
