"""The per-user cache root of every cache the package keeps (decoded data, compiled programs, the
oneDNN handler): ``$XDG_CACHE_HOME/fedjax_proj`` (the XDG base directory convention), else
``~/.cache/fedjax_proj``. In core, the lowest layer, so that data, models and training share it."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path


def user_cache_root(environ: Mapping[str, str] = os.environ) -> Path:
  """``$XDG_CACHE_HOME/fedjax_proj`` where that variable is set and not blank, else
  ``~/.cache/fedjax_proj``."""
  base = environ.get("XDG_CACHE_HOME", "").strip() or str(Path("~/.cache").expanduser())
  return Path(base) / "fedjax_proj"
