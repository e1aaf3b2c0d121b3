"""The run directory: one run at a time, never lost by a rerun, a typo or a second launch.

What this module guarantees about ``<output_dir>`` (README, "Paper presets and run management"):

* **One writer.** :class:`RunLock` takes an exclusive ``fcntl`` lock (``filelock``) on
  ``<output_dir>/.lock`` for the whole run and records the holder's pid, host and command in
  ``.lock.json``. A second run into the same directory is refused, naming that holder. The kernel
  drops the lock when its process dies, so a lock left by a killed run is taken over at once, with a
  message naming the dead holder.
* **No silent replacement.** :func:`check_run_dir` refuses a new run over a directory that holds a
  run (finished or not) unless ``overwrite``; ``resume`` needs a checkpoint to resume from and,
  when there is none, lists the run directories next to the one given (a mistyped name is the
  usual cause).
* **Writable before compute.** A file-valued or read-only ``output_dir`` is refused before any data
  is loaded.

Library code: explicit arguments only. Errors are :class:`RunDirError` (a ``ValueError``) whose
message names the problem and the fix.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shlex
import socket
import sys
import time
from pathlib import Path

LOCK_FILE = ".lock"
HOLDER_FILE = ".lock.json"
# Files a run writes into its directory (training/session.py): where any is, "a run lives here".
RUN_FILES = ("metrics.jsonl", "summary.json", "final_variables.npz", "checkpoints", "tensorboard")


class RunDirError(ValueError):
  """The output directory cannot be used as asked (in use, holds a run, not writable, ...)."""


# What to do about an OSError, by errno (describe_os_error).
_OS_ERROR_FIXES = {
  errno.ENOSPC: "free space on that filesystem (or pass an --output_dir on another one)",
  errno.EDQUOT: "free space within your quota (or pass an --output_dir elsewhere)",
  errno.ENAMETOOLONG: "choose a shorter --output_dir (each folder name at most 255 bytes)",
  errno.EACCES: "choose an --output_dir you may write to, or fix its permissions",
  errno.EPERM: "choose an --output_dir you may write to, or fix its permissions",
  errno.EROFS: "the filesystem is read-only: choose an --output_dir on a writable one",
  errno.ENOENT: "check the path",
  errno.EIO: "the disk reported an I/O error: check it, or use another --output_dir",
}


def describe_os_error(e: OSError) -> str:
  """One line for an OSError: the cause (with its errno name), the path and what to do.

  The entry points print it instead of a traceback (fedjax_proj/configs/common.py); whatever the
  run had checkpointed stays resumable (a checkpoint is renamed into place only once complete).
  """
  cause = e.strerror or str(e) or type(e).__name__
  name = errno.errorcode.get(e.errno, "") if e.errno is not None else ""
  path = e.filename if e.filename is not None else ""
  if e.filename2 is not None:
    path = f"{path} -> {e.filename2}"
  fix = _OS_ERROR_FIXES.get(e.errno, "")
  return f"{cause}{f' ({name})' if name else ''}{f': {path}' if path else ''}" + (
    f"; {fix}" if fix else ""
  )


def _pid_alive(pid: int) -> bool:
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  except PermissionError:  # alive, owned by someone else
    return True
  return True


def _describe(holder: dict) -> str:
  return (
    f"pid {holder.get('pid', '?')} on {holder.get('host', '?')} since "
    f"{holder.get('started', '?')}: {holder.get('command', '?')}"
  )


def check_writable(output_dir: str | os.PathLike, flag: str = "--output_dir") -> Path:
  """Creates ``output_dir`` if needed and checks a file can be written in it.

  The check every folder a user passes to write into goes through before any compute, so the
  error names that flag and path (``flag``: how the caller names it, e.g. ``--results``).

  Raises:
    RunDirError: the path is a file, or the directory cannot be created or written.
  """
  path = Path(output_dir)
  if path.exists() and not path.is_dir():
    raise RunDirError(
      f"{flag}={output_dir} is a file, not a directory; choose a directory path (it is "
      "created if missing)."
    )
  try:
    path.mkdir(parents=True, exist_ok=True)
    probe = path / f".write-probe-{os.getpid()}"
    probe.write_bytes(b"")
    probe.unlink()
  except OSError as e:
    raise RunDirError(
      f"{flag}={output_dir} is not writable ({e.strerror or e}); choose a directory you "
      "can write to, or fix its permissions."
    ) from e
  return path


def check_folder(folder: str | os.PathLike, flag: str) -> Path:
  """``folder`` as a Path when it is an existing folder this process can read.

  The check every folder a user passes to read from goes through: the error names ``flag`` and
  the path, never a default put in its place.

  Raises:
    RunDirError: the path does not exist, is a file, or cannot be read.
  """
  path = Path(folder).expanduser()
  if not path.exists():
    raise RunDirError(f"{flag}={folder} does not exist; check the path.")
  if not path.is_dir():
    raise RunDirError(f"{flag}={folder} is a file, not a folder; pass the folder that holds it.")
  if not os.access(path, os.R_OK | os.X_OK):
    raise RunDirError(f"{flag}={folder} cannot be read (permission denied); fix its permissions.")
  return path


class RunLock:
  """Exclusive lock on a run directory for the lifetime of a run (a context manager).

  Args:
    output_dir: the run directory (must exist and be writable).
    command: what to record as the holder's command (default: this process's argv).
    log: where the stale-lock takeover message goes.
  """

  def __init__(self, output_dir: str | os.PathLike, command: str | None = None, log=None):
    from filelock import FileLock  # noqa: PLC0415  (small; only runs with an output dir lock)

    self.directory = Path(output_dir)
    self.command = command or shlex.join([sys.executable, *sys.argv])
    self._log = log or (lambda msg: print(msg, file=sys.stderr))
    self._lock = FileLock(str(self.directory / LOCK_FILE), timeout=0)
    self.holder_path = self.directory / HOLDER_FILE

  def _read_holder(self) -> dict:
    try:
      return json.loads(self.holder_path.read_text())
    except (OSError, ValueError):
      return {}

  def acquire(self) -> RunLock:
    from filelock import Timeout  # noqa: PLC0415

    try:
      self._lock.acquire()
    except Timeout:
      holder = self._read_holder()
      raise RunDirError(
        f"{self.directory} is in use by another run ({_describe(holder)}). Wait for it to "
        "finish, stop it, or choose another --output_dir."
      ) from None
    previous = self._read_holder()
    if previous and previous.get("pid") != os.getpid():
      # We hold the kernel lock, so the recorded holder no longer holds it: it died or was killed.
      state = "no longer running" if not _pid_alive(int(previous.get("pid", -1))) else "gone"
      self._log(
        f"note: taking over the stale lock of {self.directory} left by {_describe(previous)} "
        f"({state})"
      )
    record = {
      "pid": os.getpid(),
      "host": socket.gethostname(),
      "started": time.strftime("%Y-%m-%d %H:%M:%S"),
      "command": self.command,
    }
    tmp = self.holder_path.with_name(HOLDER_FILE + ".tmp")
    tmp.write_text(json.dumps(record))
    os.replace(tmp, self.holder_path)
    return self

  def release(self) -> None:
    if self._lock.is_locked:
      with contextlib.suppress(OSError):
        self.holder_path.unlink()
      self._lock.release()

  def __enter__(self) -> RunLock:
    return self.acquire()

  def __exit__(self, *exc) -> bool:
    self.release()
    return False


def nearby_runs(output_dir: str | os.PathLike, limit: int = 8) -> list[str]:
  """Run directories (holding metrics or checkpoints) next to ``output_dir``, newest first."""
  path = Path(output_dir).absolute()
  parent = path.parent
  if not parent.is_dir():
    return []
  runs = []
  for entry in parent.iterdir():
    if entry.is_dir() and entry != path and any((entry / f).exists() for f in RUN_FILES[:4]):
      runs.append(entry)
  runs.sort(key=lambda p: p.stat().st_mtime, reverse=True)
  return [str(p) for p in runs[:limit]]


def _nearby_text(output_dir) -> str:
  runs = nearby_runs(output_dir)
  if not runs:
    return f"No run directories were found next to it (in {Path(output_dir).absolute().parent})."
  return "Run directories next to it, newest first:\n  " + "\n  ".join(runs)


def checkpoint_rounds(output_dir: str | os.PathLike) -> list[int]:
  """Rounds of the committed checkpoints in ``<output_dir>/checkpoints`` (unverified)."""
  directory = Path(output_dir) / "checkpoints"
  if not directory.is_dir():
    return []
  return sorted(int(p.name) for p in directory.iterdir() if p.is_dir() and p.name.isdigit())


def run_state(output_dir: str | os.PathLike) -> str:
  """``"empty"``, ``"finished"`` (summary.json present) or ``"unfinished"`` (other run files)."""
  path = Path(output_dir)
  if (path / "summary.json").is_file():
    return "finished"
  if any((path / f).exists() for f in RUN_FILES):
    return "unfinished"
  return "empty"


EXTEND_HINT = "--resume --rounds=<more> to extend it"


def _runs_inside(output_dir: str | os.PathLike) -> list[str]:
  """Names of the run directories inside ``output_dir``, newest first (its own runs' folder)."""
  path = Path(output_dir)
  runs = [p for p in path.iterdir() if p.is_dir() and any((p / f).exists() for f in RUN_FILES[:4])]
  runs.sort(key=lambda p: p.stat().st_mtime, reverse=True)
  return [p.name for p in runs]


def _held_text(output_dir: str | os.PathLike, state: str) -> str:
  """What a directory without a checkpoint holds, as --resume's refusal says it."""
  if state != "empty":
    return "holds run files but no checkpoint"
  others = sorted(p.name for p in Path(output_dir).iterdir())
  if not others:
    return "is empty"
  shown = ", ".join(others[:5]) + (f" and {len(others) - 5} more" if len(others) > 5 else "")
  return f"holds no run files ({RUN_FILES[0]}, checkpoints/, ...), only {shown}"


def check_run_dir(
  output_dir: str | os.PathLike, *, resume: bool, overwrite: bool, extend: str | None = EXTEND_HINT
) -> str:
  """Refuses to start where a run would be lost, or to resume from nothing.

  Args:
    output_dir: the run directory.
    resume: the run continues the directory's newest checkpoint.
    overwrite: a new run may replace what the directory holds.
    extend: how a finished run with checkpoints is extended (None: it cannot be; a continual
      run's tasks are fixed).

  Returns:
    :func:`run_state` of the directory.

  Raises:
    RunDirError: ``resume`` without a checkpoint, both flags, or a new run over an existing one
      without ``overwrite``.
  """
  if resume and overwrite:
    raise RunDirError(
      "--resume continues the run in --output_dir and --overwrite replaces it; pass only one."
    )
  state = run_state(output_dir)
  if resume:
    if not Path(output_dir).is_dir():
      raise RunDirError(
        f"--resume: {output_dir} does not exist, so there is nothing to resume. Check the path. "
        + _nearby_text(output_dir)
      )
    if not checkpoint_rounds(output_dir):
      inner = _runs_inside(output_dir) if state == "empty" else []
      if inner:  # the folder of the runs, given for one of them
        shown = ", ".join(inner[:5]) + (f" and {len(inner) - 5} more" if len(inner) > 5 else "")
        raise RunDirError(
          f"--resume: {output_dir} is not a run directory but holds {len(inner)} of them "
          f"({shown}); pass the one to resume as --output_dir, e.g. "
          f"--output_dir={Path(output_dir) / inner[0]} --resume."
        )
      held = _held_text(output_dir, state)
      raise RunDirError(
        f"--resume: {output_dir} {held}, so there is nothing to resume; check the path, or drop "
        "--resume (with --overwrite if it holds files) to start from round 1. "
        + _nearby_text(output_dir)
      )
    return state
  if state != "empty" and not overwrite:
    path = Path(output_dir)
    if state == "finished":
      what = "a finished run (summary.json)"
    else:
      what = "an unfinished run (" + ", ".join(f for f in RUN_FILES if (path / f).exists()) + ")"
    fixes = ["pass --overwrite to replace it"]
    if checkpoint_rounds(output_dir) and (state != "finished" or extend):
      fixes.append(extend if state == "finished" else "--resume to continue it")
    fixes.append("choose another --output_dir")
    raise RunDirError(
      f"{output_dir} already holds {what}: {', '.join(fixes[:-1])}, or {fixes[-1]}."
    )
  return state


@contextlib.contextmanager
def held(
  output_dir: str | os.PathLike,
  *,
  resume: bool,
  overwrite: bool,
  extend: str | None = EXTEND_HINT,
  writer: bool = True,
):
  """Holds ``output_dir`` for a run: writable, locked (:class:`RunLock`), and holding nothing the
  run would silently replace (:func:`check_run_dir`; with ``overwrite`` the old run's files are
  cleared). Checked before any data is loaded; a ``resume`` target must already exist (a typo
  must not create it). A run refused before writing anything leaves no directory behind.

  ``writer=False`` (the other processes of a multi-process job) holds nothing.
  """
  if not writer:
    yield
    return
  created = not Path(output_dir).exists()
  if resume and not Path(output_dir).is_dir():
    check_run_dir(output_dir, resume=True, overwrite=overwrite)
  check_writable(output_dir)
  lock = RunLock(output_dir, log=lambda msg: print(msg, file=sys.stderr)).acquire()
  try:
    state = check_run_dir(output_dir, resume=resume, overwrite=overwrite, extend=extend)
    if state != "empty" and overwrite:
      print(f"--overwrite: replacing the {state} run in {output_dir}", file=sys.stderr)
      clear_run(output_dir)
    yield
  except BaseException:
    if created and run_state(output_dir) == "empty":
      lock.release()
      lock = None
      remove_empty(output_dir)
    raise
  finally:
    if lock is not None:
      lock.release()


def clear_run(output_dir: str | os.PathLike) -> None:
  """Deletes the run files of ``output_dir`` (for ``overwrite``); leaves anything else alone."""
  import shutil  # noqa: PLC0415

  path = Path(output_dir)
  for name in RUN_FILES:
    target = path / name
    if target.is_dir():
      shutil.rmtree(target)
    elif target.exists():
      target.unlink()


def remove_empty(output_dir: str | os.PathLike) -> None:
  """Removes ``output_dir`` if it holds nothing but this module's lock files."""
  path = Path(output_dir)
  if not path.is_dir() or any(p.name not in (LOCK_FILE, HOLDER_FILE) for p in path.iterdir()):
    return
  for name in (LOCK_FILE, HOLDER_FILE):
    with contextlib.suppress(FileNotFoundError):
      (path / name).unlink()
  with contextlib.suppress(OSError):
    path.rmdir()
