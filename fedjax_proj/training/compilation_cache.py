"""JAX's persistent compilation cache, switched on by the entry points (docs/performance.md,
"Compilation cache").

Without it every process compiles its programs again, tens of seconds per seed on a CPU for
FedProj (docs/performance.md has the measurements). With it, a second process that builds the
same programs (the next seed, a resumed run, the claim runner's next job) loads the executables
from disk. JAX keys every entry by the program, the compile options, the backend
and the JAX/XLA versions, so an entry is only reused for the identical program: results do not
change.

The library never turns it on by itself; an entry point passes the user's choice to
:func:`enable`. The setting is a folder or ``"off"``; :func:`default_setting` gives the default
(``$FEDJAX_PROJ_COMPILATION_CACHE`` if set, else ``fedjax_proj/jax`` under ``$XDG_CACHE_HOME``,
else under ``~/.cache``).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from fedjax_proj.core.user_cache import user_cache_root

OFF = "off"
# The default of entry points' --compilation_cache when set (the test suite sets it to "off").
ENV = "FEDJAX_PROJ_COMPILATION_CACHE"
# Programs that compile faster than this are not stored: reading an entry back costs a file read
# and deserialisation, which only pays for programs that take a noticeable time to compile (the
# client step and server step of a round take seconds, the small helpers milliseconds). JAX's own
# default is 1 s; a loaded CPU compiles mid-sized programs in 0.5-1 s, which are worth keeping.
MIN_COMPILE_SECONDS = 0.5
# No floor on an entry's size: what an entry saves is compile time, whatever its size (JAX's
# default, 0, stated so that a change of JAX's default does not change ours).
MIN_ENTRY_BYTES = 0


def default_setting(environ: Mapping[str, str] = os.environ) -> str:
  """The cache folder an entry point uses unless told otherwise.

  ``$FEDJAX_PROJ_COMPILATION_CACHE`` (a folder or ``off``) if set, else
  ``$XDG_CACHE_HOME/fedjax_proj/jax`` (the XDG base directory convention), else
  ``~/.cache/fedjax_proj/jax``.
  """
  chosen = environ.get(ENV, "").strip()
  if chosen:
    return chosen
  return str(user_cache_root(environ) / "jax")


def enable(setting: str | os.PathLike | None, flag: str = "--compilation_cache") -> Path | None:
  """Points JAX's persistent compilation cache at ``setting`` (a folder, created if missing) or
  turns it off (``"off"``). Call it before the first compilation of the process.

  Args:
    setting: the folder, ``"off"``, or None for :func:`default_setting`.
    flag: how the caller names the setting, for error messages.

  Returns:
    The cache folder, or None when off.

  Raises:
    ValueError: the folder is a file, cannot be created or is not writable; the message names the
      path and the fix.
  """
  import jax

  setting = default_setting() if setting is None else os.fspath(setting).strip()
  if setting.lower() == OFF:
    jax.config.update("jax_enable_compilation_cache", False)
    return None
  if not setting:
    raise ValueError(f"{flag} is empty; pass a folder or {flag}={OFF}.")
  path = Path(setting).expanduser().absolute()
  fix = f"pass a writable folder with {flag}=DIR, or turn the cache off with {flag}={OFF}"
  if path.exists() and not path.is_dir():
    raise ValueError(f"the compilation cache {path} is a file, not a folder; {fix}.")
  try:
    # Private to the user: JAX runs what it loads from the cache (its set_cache_dir warns that a
    # cache others can write to lets them run code in this process).
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
  except OSError as e:
    raise ValueError(
      f"cannot create the compilation cache folder {path} ({e.strerror or e}); {fix}."
    ) from None
  if not os.access(path, os.W_OK | os.X_OK):
    raise ValueError(f"the compilation cache folder {path} is not writable; {fix}.")
  jax.config.update("jax_enable_compilation_cache", True)
  jax.config.update("jax_compilation_cache_dir", str(path))
  jax.config.update("jax_persistent_cache_min_compile_time_secs", MIN_COMPILE_SECONDS)
  jax.config.update("jax_persistent_cache_min_entry_size_bytes", MIN_ENTRY_BYTES)
  return path
