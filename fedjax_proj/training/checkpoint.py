"""Checkpoints of a federated run (orbax-checkpoint), verified on restore, and resume helpers.

What a checkpoint holds: the algorithm's whole server state (global parameters, server optimiser
state, stacked per-client state, memory/ensemble state, FIFO buffers, the round counter: all of it
lives in the algorithm's NamedTuple state) plus a JSON record of the round index, the config
fingerprint, the package version and the last evaluation. Nothing else is needed to continue
bit-exactly: client sampling, batch shuffling and every PRNG key are pure functions of
(seed, round) (:mod:`fedjax_proj.core.random`, :mod:`fedjax_proj.data.federated`).

Layout under ``<output_dir>/checkpoints``: one orbax step directory per saved round (orbax writes to
a temporary directory and renames it when complete, so a crash mid-save never touches the previous
checkpoints) holding ``state/``, ``meta/`` and our ``fedjax_manifest.json``: the SHA-256 of every
file of the step, written (atomically) after orbax commits. A step without a manifest or whose files
do not match it is treated as corrupt: it is moved aside to ``corrupt-<round>`` with a warning and
the previous checkpoint is used.

Several processes (``jax.distributed``; :mod:`fedjax_proj.core.distributed`): every process calls
the same methods in the same order with the same (global) state and the same directory, which must
be on a filesystem all of them see (NFS, GCS, or one machine's disk). Orbax coordinates the array
writes; the manifest and any deletion or quarantine are done by process 0 between barriers.

Wall-clock fields (:data:`WALL_CLOCK_FIELDS`) are the only part of ``metrics.jsonl`` that differs
between an uninterrupted and a resumed (or repeated) run; :func:`comparable_metrics` drops them.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import numpy as np

import fedjax_proj
from fedjax_proj.core import distributed
from fedjax_proj.training.fields import resumable_fields
from fedjax_proj.training.metrics import read_metrics_lines, to_python

MANIFEST = "fedjax_manifest.json"
# Config fields a resumed run may change (``Field.resumable`` in training/fields.py, which says why
# for each): excluded from the fingerprint, so e.g. a run can be resumed with another progress
# setting, checkpoint interval, process layout or number of rounds.
NON_SEMANTIC_FIELDS = resumable_fields()
# metrics.jsonl fields that measure time and so differ between otherwise identical runs: the
# round's, and those of a continual run's task end (the end-of-task pass, FOT's client and server
# parts of it). Every such field ends in "_seconds" (comparable_metrics drops them all).
WALL_CLOCK_FIELDS = ("round_seconds", "end_task_seconds", "client_seconds", "server_seconds")


class CheckpointError(RuntimeError):
  """A checkpoint cannot be used for this run (other config or version, or none is readable)."""


def config_fingerprint(config: dict, exclude: tuple[str, ...] = NON_SEMANTIC_FIELDS) -> dict:
  """The semantic config and its SHA-256: what a checkpoint must match to be resumed."""
  semantic = {k: v for k, v in to_python(dict(config)).items() if k not in exclude}
  text = json.dumps(semantic, sort_keys=True)
  return {"hash": hashlib.sha256(text.encode()).hexdigest(), "config": semantic}


def _describe_diff(old: dict, new: dict) -> str:
  keys = sorted(set(old) | set(new))
  diff = [f"{k}: {old.get(k)!r} -> {new.get(k)!r}" for k in keys if old.get(k) != new.get(k)]
  return "; ".join(diff[:8]) + (" ..." if len(diff) > 8 else "")


def _sha256(path: Path) -> str:
  h = hashlib.sha256()
  with open(path, "rb") as f:
    for block in iter(lambda: f.read(1 << 20), b""):
      h.update(block)
  return h.hexdigest()


def _file_digests(step_dir: Path) -> dict[str, str]:
  return {
    str(p.relative_to(step_dir)): _sha256(p)
    for p in sorted(step_dir.rglob("*"))
    if p.is_file() and p.name != MANIFEST
  }


def _atomic_write(path: Path, text: str) -> None:
  tmp = path.with_name(path.name + ".tmp")
  with open(tmp, "w") as f:
    f.write(text)
    f.flush()
    os.fsync(f.fileno())
  os.replace(tmp, path)


# Typed PRNG keys cannot be serialised: store their raw key data and re-wrap on restore. Orbax
# refuses zero-size arrays (e.g. FedDF's empty memory buffer): store a one-element placeholder and
# take the (empty) array from the restore template.
def _is_key(x) -> bool:
  return hasattr(x, "dtype") and jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key)


def _is_empty(x) -> bool:
  return hasattr(x, "size") and not _is_key(x) and x.size == 0


def _storable_leaf(x):
  if _is_key(x):
    return jax.random.key_data(x)
  if _is_empty(x):
    return np.zeros((1,), x.dtype)
  return x


def _to_storable(tree):
  return jax.tree.map(_storable_leaf, tree)


def _from_storable(tree, template):
  def restore_leaf(x, t):
    if _is_key(t):
      return jax.random.wrap_key_data(x, impl=jax.random.key_impl(t))
    return t if _is_empty(t) else x

  return jax.tree.map(restore_leaf, tree, template)


class Checkpointer:
  """Saves and restores a run's server state every few rounds, keeping the last ``keep``.

  Args:
    directory: the checkpoint directory (``<output_dir>/checkpoints``).
    fingerprint: :func:`config_fingerprint` of the run's config; restore refuses other configs.
    keep: how many checkpoints to keep (older ones are deleted after a successful save).
  """

  def __init__(self, directory: str | os.PathLike, fingerprint: dict, keep: int = 3):
    import orbax.checkpoint as ocp  # imported here: a second or so, only for runs that save

    if keep < 1:
      raise ValueError(f"keep_checkpoints must be >= 1, got {keep}.")
    self._ocp = ocp
    self.directory = Path(directory).absolute()
    self.fingerprint = fingerprint
    self.keep = keep
    self._manager = None

  def _open(self):
    if self._manager is None:
      options = self._ocp.CheckpointManagerOptions(
        max_to_keep=self.keep, enable_async_checkpointing=False, create=True
      )
      self._manager = self._ocp.CheckpointManager(self.directory, options=options)
    return self._manager

  def _reopen(self) -> None:
    if self._manager is not None:
      self._manager.close()
      self._manager = None

  def steps(self) -> list[int]:
    """Committed rounds on disk, oldest first (verified or not)."""
    if not self.directory.exists():
      return []
    return sorted(int(p.name) for p in self.directory.iterdir() if p.is_dir() and p.name.isdigit())

  def newest_meta(self) -> dict | None:
    """The JSON record of the newest checkpoint as its manifest states it (not verified)."""
    for step in reversed(self.steps()):
      try:
        return json.loads((self.directory / str(step) / MANIFEST).read_text())["meta"]
      except (OSError, ValueError, KeyError):
        continue
    return None

  def clear(self) -> None:
    """Deletes every checkpoint (a new run replaces a finished one in the same directory)."""
    self._reopen()
    distributed.barrier("fedjax_checkpoint_clear_start")  # every process has read the directory
    if jax.process_index() == 0:
      shutil.rmtree(self.directory, ignore_errors=True)
    distributed.barrier("fedjax_checkpoint_clear_done")

  def save(self, round_idx: int, state, meta: dict | None = None) -> Path:
    """Saves ``state`` as the checkpoint after ``round_idx`` completed rounds, with its manifest."""
    manager = self._open()
    record = {
      "round": int(round_idx),
      "config_hash": self.fingerprint["hash"],
      "config": self.fingerprint["config"],
      "package_version": fedjax_proj.__version__,
      **to_python(meta or {}),
    }
    if round_idx in manager.all_steps():  # e.g. the final round saved twice; keep the first
      return self.directory / str(round_idx)
    storable = _to_storable(state)
    _check_free_space(self.directory, storable)
    try:
      manager.save(
        round_idx,
        args=self._ocp.args.Composite(
          state=self._ocp.args.StandardSave(storable),
          meta=self._ocp.args.JsonSave(record),
        ),
      )
      manager.wait_until_finished()
    except ValueError as e:  # tensorstore reports a full disk as a ValueError
      if "No space left on device" in str(e) or "RESOURCE_EXHAUSTED" in str(e):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(self.directory)) from e
      raise
    step_dir = self.directory / str(round_idx)
    if jax.process_index() == 0:  # orbax has committed every process's files by now
      manifest = {"round": int(round_idx), "meta": record, "files": _file_digests(step_dir)}
      _atomic_write(step_dir / MANIFEST, json.dumps(manifest, sort_keys=True, indent=1))
    return step_dir

  def _verify(self, step: int) -> dict | None:
    """The manifest of ``step`` if every file matches it, else None (with the reason warned)."""
    step_dir = self.directory / str(step)
    try:
      manifest = json.loads((step_dir / MANIFEST).read_text())
    except (OSError, ValueError) as e:
      reason = f"no readable manifest ({e.__class__.__name__})"
    else:
      files = _file_digests(step_dir)
      if files == manifest.get("files"):
        return manifest
      bad = sorted(
        k for k in set(files) | set(manifest["files"]) if files.get(k) != manifest["files"].get(k)
      )
      reason = f"files differ from the manifest: {bad[:3]}"
    self._quarantine(step, reason)
    return None

  def _quarantine(self, step: int, reason: str, prefix: str = "corrupt") -> None:
    """Moves the checkpoint of ``step`` aside to ``<prefix>-<step>-<time>`` (never deleted)."""
    src = self.directory / str(step)
    dst = self.directory / f"{prefix}-{step}-{time.strftime('%Y%m%d-%H%M%S')}"
    self._reopen()
    # Every process judged the same files; process 0 moves them once all have looked.
    distributed.barrier(f"fedjax_checkpoint_quarantine_{step}_start")
    if jax.process_index() == 0:
      what = "is corrupt or incomplete" if prefix == "corrupt" else "cannot be continued"
      warnings.warn(
        f"Checkpoint of round {step} in {self.directory} {what} ({reason}); "
        f"moved it to {dst.name} and falling back to the previous checkpoint.",
        RuntimeWarning,
        stacklevel=3,
      )
      shutil.move(str(src), str(dst))
    distributed.barrier(f"fedjax_checkpoint_quarantine_{step}_done")

  def _check_compatible(self, meta: dict) -> None:
    if meta.get("package_version") != fedjax_proj.__version__:
      raise CheckpointError(
        f"The checkpoints in {self.directory} were written by fedjax_proj "
        f"{meta.get('package_version')}, this is {fedjax_proj.__version__}; resume with that "
        "version or start a new run in another --output_dir."
      )
    if meta.get("config_hash") != self.fingerprint["hash"]:
      raise CheckpointError(
        f"The checkpoints in {self.directory} belong to another config "
        f"({_describe_diff(meta.get('config', {}), self.fingerprint['config'])}); pass the "
        "original flags to resume, or choose another --output_dir for a new run."
      )

  def restore_latest(
    self, template, accept: Callable[[dict], str | None] | None = None
  ) -> tuple[Any, dict] | None:
    """Restores the newest valid checkpoint into the structure of ``template``.

    Corrupt or incomplete checkpoints are moved aside (with a warning) and older ones tried.

    Args:
      template: the state's structure.
      accept: ``accept(meta)`` is None for a checkpoint the run can continue from, else the reason
        it cannot (e.g. ``metrics.jsonl`` lost records written before it). Such a checkpoint is
        skipped for an older one; once an older one restores, the skipped ones are moved aside
        to ``unrecorded-<round>-*``, so that later saves and resumes never meet them.

    Returns:
      (state, meta) or None when the directory holds no checkpoint.

    Raises:
      CheckpointError: the newest valid checkpoint comes from another config or package version;
        or checkpoints exist but none is readable or accepted (starting afresh would discard the
        run without a word).
    """
    steps, skipped = self.steps(), []
    for step in reversed(steps):
      manifest = self._verify(step)
      if manifest is None:
        continue
      self._check_compatible(manifest["meta"])
      reason = accept(manifest["meta"]) if accept is not None else None
      if reason is not None:
        skipped.append((step, reason))
        continue
      try:
        out = self._open().restore(
          step,
          args=self._ocp.args.Composite(
            state=self._ocp.args.StandardRestore(_to_storable(template)),
            meta=self._ocp.args.JsonRestore(),
          ),
        )
      except Exception as e:  # noqa: BLE001 (orbax/tensorstore raise many types for bad data)
        self._quarantine(step, f"orbax could not read it: {e}")
        continue
      for newer, why in skipped:
        self._quarantine(newer, why, prefix="unrecorded")
      return _from_storable(out.state, template), dict(out.meta)
    if skipped:
      oldest, why = skipped[-1]  # even the oldest lacks records: so does every newer one
      raise CheckpointError(
        f"No checkpoint in {self.directory} (rounds {sorted(s for s, _ in skipped)}) can be "
        f"continued: the oldest, round {oldest}, needs records that are lost ({why}). Nothing "
        "was changed. Pass --overwrite to run it again from round 1, or put the lost records "
        "back from a copy and resume."
      )
    if steps:
      raise CheckpointError(
        f"Every checkpoint in {self.directory} (rounds {steps}) is unreadable; each was moved "
        "aside to corrupt-<round>-*. Pass --overwrite to run it again from round 1, or choose "
        "another --output_dir."
      )
    return None

  def close(self) -> None:
    self._reopen()


EVAL_FIELDS = ("test_accuracy", "test_loss")


def _check_free_space(directory: Path, tree, slack: float = 1.2) -> None:
  """Raises ENOSPC before orbax starts a checkpoint that cannot fit on the disk.

  Orbax writes from background threads; a full disk mid-write prints their tracebacks and leaves a
  temporary directory (ignored on resume). The state's bytes plus 20% for metadata is a close
  bound of the checkpoint's size.
  """
  need = int(sum(getattr(x, "nbytes", 0) for x in jax.tree.leaves(tree)) * slack) + (1 << 16)
  probe = directory if directory.exists() else directory.parent
  free = shutil.disk_usage(probe).free
  if free < need:
    raise OSError(
      errno.ENOSPC,
      f"No space left on device (the checkpoint needs about {need / 2**20:.1f} MiB, "
      f"{free / 2**20:.1f} MiB are free)",
      str(directory),
    )


def record_rounds(path: str | os.PathLike) -> list[int] | None:
  """The round each intact record of ``metrics.jsonl`` belongs to (None: no such file).

  A line without a ``round`` (a continual run's task end) belongs to the round of the line before
  it, as in :func:`truncate_metrics`; a torn last line is no record.
  """
  path = Path(path)
  if not path.is_file():
    return None
  rounds, round_idx = [], 0
  for record, _ in read_metrics_lines(path)[0]:
    round_idx = record.get("round", round_idx)
    rounds.append(round_idx)
  return rounds


def unrecorded(rounds: list[int] | None, meta: dict, path: str | os.PathLike) -> str | None:
  """Why the records in ``path`` (their :func:`record_rounds`) cannot back the checkpoint whose
  record is ``meta``, or None when they hold every record written up to it.

  A resume keeps the records up to the checkpoint and appends the rounds after it, so a record
  lost at or before the checkpoint (a deleted file, a torn line in the checkpoint's own round)
  would be lost for good. ``meta["metrics_records"]`` (the records written up to the checkpoint)
  also catches a lost task-end line; checkpoints written before it was recorded are checked by
  their rounds alone.
  """
  last = int(meta["round"])
  if rounds is None:
    return f"{path} is missing, so the records of rounds 1-{last} are gone"
  kept = [r for r in rounds if r <= last]
  lacking = sorted(set(range(1, last + 1)) - set(kept))
  if lacking:
    span = f"{lacking[0]}" if len(lacking) == 1 else f"{lacking[0]}-{lacking[-1]}"
    return (
      f"{path} lacks the record{'s' * (len(lacking) > 1)} of round{'s' * (len(lacking) > 1)} {span}"
    )
  expected = meta.get("metrics_records")
  if expected is not None and len(kept) < int(expected):
    return f"{path} holds {len(kept)} of the {expected} records written up to round {last}"
  return None


def truncate_metrics(path: str | os.PathLike, last_round: int, drop_eval_of: bool = False) -> str:
  """Keeps the lines of ``metrics.jsonl`` up to round ``last_round`` byte for byte (atomically).

  A line without a ``round`` (a continual run's task end) belongs to the round of the line before
  it. With ``drop_eval_of`` the line of ``last_round`` loses its evaluation fields (a run extended
  past its former last round would not have evaluated there); the other lines stay byte for byte.
  A torn last line (a crash or a full disk while it was written) is dropped like the other lines
  after the checkpoint.

  Returns:
    The torn last line that was dropped ('' if none), for the caller to report.

  Raises:
    ValueError: a line before the last is unreadable (:func:`read_metrics_lines`).
  """
  path = Path(path)
  if not path.exists():
    return ""
  records, torn = read_metrics_lines(path)
  kept, round_idx = [], 0
  for record, line in records:
    round_idx = record.get("round", round_idx)
    if round_idx > last_round:
      continue
    if drop_eval_of and record.get("round") == last_round and any(k in record for k in EVAL_FIELDS):
      line = (
        json.dumps({k: v for k, v in record.items() if k not in EVAL_FIELDS}, sort_keys=True) + "\n"
      )
    kept.append(line)
  _atomic_write(path, "".join(kept))
  return torn


def comparable_metrics(path: str | os.PathLike) -> str:
  """``metrics.jsonl`` without its wall-clock fields (:data:`WALL_CLOCK_FIELDS`, any field ending in
  ``_seconds``), for comparing runs byte for byte."""
  path = Path(path)
  if path.is_dir():
    path = path / "metrics.jsonl"
  lines = []
  for line in path.read_text().splitlines():
    record = json.loads(line)
    for field in [k for k in record if k in WALL_CLOCK_FIELDS or k.endswith("_seconds")]:
      record.pop(field)
    lines.append(json.dumps(record, sort_keys=True))
  return "\n".join(lines) + "\n"


def save_variables(path: str | os.PathLike, variables) -> None:
  """Writes a variables pytree as npz (keys are the leaves' pytree paths), atomically."""
  path = Path(path)
  flat = {
    jax.tree_util.keystr(k): np.asarray(v)
    for k, v in jax.tree_util.tree_leaves_with_path(variables)
  }
  tmp = path.with_name(path.name + ".tmp.npz")
  np.savez(tmp, **flat)
  os.replace(tmp, path)


def load_variables(path: str | os.PathLike) -> dict[str, np.ndarray]:
  """Reads :func:`save_variables` output as ``{pytree path: array}``."""
  with np.load(path) as data:
    return {k: data[k] for k in data.files}
