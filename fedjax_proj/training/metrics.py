"""Run outputs: a JSON-lines metrics file (one object per round) and a summary JSON."""

from __future__ import annotations

import json
import math
import os
import warnings
from pathlib import Path
from typing import Any

import numpy as np


def to_python(value: Any) -> Any:
  """Converts arrays/NumPy scalars to JSON-serialisable Python values (NaN/inf become None)."""
  if isinstance(value, dict):
    return {str(k): to_python(v) for k, v in value.items()}
  if isinstance(value, list | tuple):
    return [to_python(v) for v in value]
  if hasattr(value, "shape") or isinstance(value, np.generic):
    arr = np.asarray(value)
    return to_python(arr.tolist()) if arr.ndim else to_python(arr.item())
  if isinstance(value, float) and not math.isfinite(value):
    return None
  return value


class MetricsWriter:
  """Appends one JSON object per round to ``metrics.jsonl`` (flushed each line)."""

  def __init__(self, output_dir: str | os.PathLike, truncate: bool = True):
    self.dir = Path(output_dir)
    self.dir.mkdir(parents=True, exist_ok=True)
    self.path = self.dir / "metrics.jsonl"
    self._file = open(self.path, "w" if truncate else "a")  # noqa: SIM115 (lives with the writer)

  def write(self, record: dict) -> None:
    self._file.write(json.dumps(to_python(record), sort_keys=True) + "\n")
    self._file.flush()

  def close(self) -> None:
    self._file.close()


def write_json(path: str | os.PathLike, obj: dict) -> None:
  """Writes ``obj`` as JSON atomically (temp file + rename)."""
  path = Path(path)
  tmp = path.with_suffix(path.suffix + ".tmp")
  tmp.write_text(json.dumps(to_python(obj), indent=2, sort_keys=True) + "\n")
  os.replace(tmp, path)


def read_metrics_lines(path: str | os.PathLike) -> tuple[list[tuple[dict, str]], str]:
  """The records of a ``metrics.jsonl`` with their lines, and a torn last line ('' if none).

  A crash or a full disk while a line is written leaves its first bytes only; that line (the
  last one) is returned apart instead of failing the whole file. Any other unreadable line is an
  error naming the file and the line.

  Raises:
    ValueError: a line other than the last is not a JSON object.
  """
  path = Path(path)
  if path.is_dir():
    path = path / "metrics.jsonl"
  lines = [line for line in path.read_text(errors="replace").splitlines(keepends=True)]
  records, torn = [], ""
  for i, line in enumerate(lines):
    if not line.strip("\x00 \t\r\n"):
      continue
    try:
      record = json.loads(line)
      if not isinstance(record, dict):
        raise ValueError(f"a {type(record).__name__}, not an object")
    except ValueError as e:
      if all(not rest.strip("\x00 \t\r\n") for rest in lines[i + 1 :]):
        torn = "".join(lines[i:])
        break
      raise ValueError(
        f"{path}, line {i + 1}, is not a JSON object ({e}); the lines after it are intact, so it "
        "was edited or damaged, not cut short by a crash. Delete or repair that line."
      ) from e
    records.append((record, line if line.endswith("\n") else line + "\n"))
  return records, torn


def read_metrics(path: str | os.PathLike) -> list[dict]:
  """Reads a ``metrics.jsonl`` file (or a run directory holding one).

  A torn last line (a crash or a full disk while it was written) is skipped with a warning.
  """
  records, torn = read_metrics_lines(path)
  if torn:
    warnings.warn(f"{path}: skipped a torn last line ({len(torn)} bytes)", stacklevel=2)
  return [record for record, _ in records]
