"""Optional TensorBoard output: every numeric field of a round's metrics record as a scalar.

Uses ``tensorboardX`` (pure Python, no TensorFlow or PyTorch), installed with the ``tensorboard``
extra: ``pip install 'fedjax_proj[tensorboard]'``. ``metrics.jsonl`` stays the source of truth;
the event files are a view of it (a resumed run appends a new event file, which TensorBoard merges).
"""

from __future__ import annotations

import math
import os

INSTALL_HINT = (
  "TensorBoard output needs tensorboardX: pip install 'fedjax_proj[tensorboard]' "
  "(or pip install tensorboardX), or drop --tensorboard."
)


def require_tensorboardx():
  """Imports tensorboardX or raises an ImportError naming the install command."""
  try:
    import tensorboardX
  except ImportError as e:
    raise ImportError(INSTALL_HINT) from e
  except OSError as e:  # tensorboardX imports torch when present; a broken torch fails like this
    raise ImportError(f"tensorboardX failed to import ({e}). {INSTALL_HINT}") from e
  return tensorboardX


class TensorBoardWriter:
  """Writes ``record[key]`` at step ``record["round"]`` for every finite numeric field."""

  def __init__(self, logdir: str | os.PathLike):
    self._writer = require_tensorboardx().SummaryWriter(str(logdir))

  def write(self, record: dict) -> None:
    step = int(record["round"])
    for key, value in record.items():
      if key == "round" or isinstance(value, bool) or not isinstance(value, int | float):
        continue
      if math.isfinite(value):
        self._writer.add_scalar(key, value, step)
    self._writer.flush()

  def close(self) -> None:
    self._writer.close()
