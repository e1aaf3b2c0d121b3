"""One (method, seed) run of a claim through the existing entry points, saved as one JSON file.

The config is resolved by the entry point's config module (``experiments/<name>.py`` runs
:mod:`fedjax_proj.configs`'s ``<name>``: its presets, ``resolve`` and ``prepare``) plus the claim's
budget overrides (:mod:`fedjax_proj.reproduce.claims`), and every kind of claim runs in this
process, as that module's own ``main`` would run it. Its fingerprint (SHA-256 of the resolved
config, with the ``{data}`` placeholder kept and run-management fields cleared) decides whether a
result on disk is ``done`` (same fingerprint: skipped), ``stale`` (another config: kept, rerun only
with ``rerun_stale``) or ``missing``. Result files:
``<results>/<claim>/<budget>/<method>-seed<k>.json`` (docs/reproduction.md, "Results"). A run that
stops before its result (a signal, a crash, a killed process) continues from its newest checkpoint
on the next attempt when its config and code are unchanged (:func:`resumable`).

The runner of each kind of claim is in :mod:`.runners`, what a result records of its code and
machine in :mod:`.provenance`; their names imported ``as`` themselves below are re-exported here
(callers use ``run.<name>``).
"""

from __future__ import annotations

import contextlib
import enum
import functools
import hashlib
import json
import os
import shutil
import signal
import time
from pathlib import Path
from typing import Any

from fedjax_proj.configs import all_fields
from fedjax_proj.reproduce.claims import Claim, budget_overrides
from fedjax_proj.reproduce.provenance import DATA_RECORD as DATA_RECORD
from fedjax_proj.reproduce.provenance import FULL_FLOAT32 as FULL_FLOAT32
from fedjax_proj.reproduce.provenance import (
  REPO_ROOT,
  arithmetic_deviations,
  code_fingerprint,
  data_deviations,
  git_commit,
  in_checkout,
  machine_info,
)
from fedjax_proj.reproduce.provenance import REPORT_ONLY as REPORT_ONLY
from fedjax_proj.reproduce.provenance import code_files as code_files
from fedjax_proj.reproduce.provenance import local_backend as local_backend
from fedjax_proj.reproduce.runners import CURVE_KEYS as CURVE_KEYS
from fedjax_proj.reproduce.runners import RUNNERS, Diverged, _read_curve, load_entry
from fedjax_proj.reproduce.runners import TINY_TRAIN as TINY_TRAIN
from fedjax_proj.reproduce.runners import TINY_WIDTH as TINY_WIDTH
from fedjax_proj.reproduce.runners import _run_continual as _run_continual
from fedjax_proj.reproduce.runners import _run_image as _run_image
from fedjax_proj.reproduce.runners import _run_pilot as _run_pilot
from fedjax_proj.reproduce.runners import tiny as tiny
from fedjax_proj.training.fields import UNSET, value_of
from fedjax_proj.training.rundir import checkpoint_rounds

try:
  from enum import StrEnum
except ImportError:  # Python 3.10: a str mixin that prints and formats as its value, as StrEnum

  class StrEnum(str, enum.Enum):
    __str__ = str.__str__
    __format__ = str.__format__


# Where results go without --results (docs/reproduction.md, "Results"; argued in docs/design.md,
# "The package and the checkout"): a checkout's committed results folder, which its code made and
# its docs cite, wherever the command runs from; for an installed package, ./fedjax_proj_results
# in the working directory (site-packages is no place for results: shared, maybe read-only, and
# replaced on upgrade).
CHECKOUT_RESULTS = REPO_ROOT / "benchmarks" / "results" / "reproduce"
INSTALLED_RESULTS = Path("fedjax_proj_results")
DEFAULT_RESULTS = CHECKOUT_RESULTS if in_checkout() else INSTALLED_RESULTS
# Every config field of the experiment families, each declared once with what it means for a
# result's fingerprint (fedjax_proj/training/fields.py, Field; the families' FIELDS).
FIELDS = all_fields()
# Fields that change how a run is managed, not what it computes (Field.run_management).
RUN_FIELDS = tuple(name for name, f in FIELDS.items() if f.run_management)


def default_data_root() -> Path:
  """The shared data folder (fedjax_proj.data.sources.find_shared_data), else a folder named
  ``shared-data-not-found`` (configs still resolve; their paths then fail validation)."""
  from fedjax_proj.data.sources import find_shared_data

  return find_shared_data() or REPO_ROOT.parent / "shared-data-not-found"


def resolve_config(
  claim: Claim, budget: str, method: str, seed: int, data_root: Path | None = None
) -> dict[str, Any]:
  """The full config of one run, with ``{data}`` placeholders kept.

  Image and continual claims resolve through their entry point's own ``resolve`` (the budget's
  preset, the overrides, the entry point's ``prepare``), exactly as its flags do; the pilot merges
  the overrides into its ``default_config``. The entry point checks paths, so ``{data}`` is
  ``data_root`` (default :func:`default_data_root`) while it resolves, then put back.
  """
  if method not in claim.runnable:
    raise ValueError(
      f"Method {method!r} is not part of claim {claim.name!r}; choose from "
      f"{', '.join(claim.runnable)}."
    )
  overrides = budget_overrides(claim, budget, method)
  ablation = claim.ablations.get(method)
  method = ablation.base if ablation else method
  budget_model_options = dict(overrides.pop("model_options", {}))
  entry = load_entry(claim)
  if claim.kind == "pilot":
    config = {**entry.default_config(), **overrides, "method": method, "seed": seed}
    config.pop("output_dir", None)
    return config
  root = str(data_root or default_data_root())
  kwargs = overrides.pop("method_kwargs", {})
  fields = {**substitute_data(overrides, Path(root)), "method": method, "seed": seed}
  try:
    config = entry.resolve(claim.preset_of(budget), fields, kwargs, **claim.entry_kwargs)
  except ValueError as e:
    raise ValueError(
      f"{claim.name} {budget} {method}: {e} Fix the claim in fedjax_proj/reproduce/claims/."
    ) from e
  if "lmem_global" not in fields and "lmem_global" in config:
    # The reports plot it (report/, lmem_vs_accuracy.png and the diagnostics table).
    config.lmem_global = True
  out = config.to_dict()
  for field in RUN_FIELDS:  # set by the runner; not part of what a run computes
    out.pop(field, None)
  # The model options the run builds with beyond its preset's (the registry's for the method, e.g.
  # MOON's projection head, then the budget's): on record, so the fingerprint says which model the
  # run builds (training/experiment.py builds it from the same merge).
  from fedjax_proj.algorithms.registry import model_kwargs

  options = {**model_kwargs(method), **dict(out.get("model_kwargs", {})), **budget_model_options}
  if options:
    out["model_kwargs"] = options
  return {k: v.replace(root, "{data}") if isinstance(v, str) else v for k, v in out.items()}


def effective_hparams(config: dict[str, Any]) -> dict[str, Any]:
  """The method's hyperparameters a run uses: the registry defaults, then the preset's
  ``method_defaults`` for the method, then ``method_kwargs`` (training/config.method_hparams)."""
  from fedjax_proj.algorithms.registry import config_kwargs, declared_hparams

  # Hyperparameters read from config fields (e.g. FedProj's memory_size) show as those fields.
  fields = config_kwargs(config["method"])
  declared = declared_hparams(config["method"]) or {}
  declared = {k: v for k, v in declared.items() if k not in fields}
  defaults = dict(config.get("method_defaults", {}).get(config["method"], {}))
  return {**declared, **defaults, **dict(config.get("method_kwargs", {}))}


# Config fields added after results were first recorded, with the value that reproduces the runs
# made before them (Field.added). A field at this value is left out of the fingerprint, so adding
# an option does not turn every committed result stale; set to anything else it counts like any
# other field.
ADDED_FIELDS = {
  name: f.added for name, f in FIELDS.items() if f.added is not UNSET and not f.added_family
}
# Config fields added to one method family's entry points after its results were first recorded,
# where other families had them all along (and their results' fingerprints hold them): family ->
# {field: the value every earlier run of the family computed with} (Field.added_family), left out
# of the fingerprint of that family's configs at that value, as ADDED_FIELDS.
ADDED_FAMILY_FIELDS = {
  family: {
    name: f.added for name, f in FIELDS.items() if f.added is not UNSET and f.added_family == family
  }
  for family in sorted({f.added_family for f in FIELDS.values() if f.added_family})
}
# Method hyperparameters added after results were first recorded, with the value every earlier run
# of that method computed with: left out of the fingerprint at that value, as ADDED_FIELDS.
ADDED_HPARAMS = {
  # FOT's threshold rule (docs/fot.md): every FOT run before the setting used the authors' rule.
  ("fot", "threshold_rule"): "authors",
}
# Model options a method's runs built without recording them, with the value they built: left out
# of the fingerprint at that value, as ADDED_FIELDS. MOON's runs before the parity fix
# (docs/parity.md, "What the rows found", MOON) computed the logits from the encoder's features
# and recorded no model_kwargs.
ADDED_MODEL_KWARGS = {
  ("moon", "projection_dim"): 256,
  ("moon", "classifier_on_projection"): False,
}
# Fields that only choose method hyperparameters' defaults, which the resolved ``method_kwargs``
# (or ``method_defaults``) already hold, or only choose what a run writes (TensorBoard event
# files): they compute nothing themselves (Field.fingerprint). Unlike RUN_FIELDS, results record
# them.
DEFAULT_ONLY_FIELDS = tuple(
  name for name, f in FIELDS.items() if not f.fingerprint and not f.run_management
)


def _added_fields(method: str | None) -> dict[str, Any]:
  """:data:`ADDED_FIELDS`, with :data:`ADDED_FAMILY_FIELDS` of ``method``'s family."""
  from fedjax_proj.algorithms.registry import methods

  family = {
    k: v
    for fam, fields in ADDED_FAMILY_FIELDS.items()
    if method in methods((fam,))
    for k, v in fields.items()
  }
  return {**ADDED_FIELDS, **family}


def canonical(config: dict[str, Any]) -> dict[str, Any]:
  """What a config computes: the preset's ``method_defaults`` for the run's method folded into
  ``method_kwargs`` (the other methods' defaults dropped), :data:`DEFAULT_ONLY_FIELDS` dropped,
  and :data:`ADDED_FIELDS`, :data:`ADDED_FAMILY_FIELDS`, :data:`ADDED_HPARAMS` and
  :data:`ADDED_MODEL_KWARGS` at their earlier value left out."""
  c = {k: v for k, v in config.items() if k not in DEFAULT_ONLY_FIELDS}
  defaults = c.pop("method_defaults", None)
  if defaults is not None:
    c["method_kwargs"] = {
      **dict(defaults.get(c.get("method"), {})),
      **dict(c.get("method_kwargs", {})),
    }
  if "method_kwargs" in c:
    c["method_kwargs"] = {
      k: v
      for k, v in dict(c["method_kwargs"]).items()
      if ADDED_HPARAMS.get((c.get("method"), k), object()) != v
    }
  method = c.get("method")
  if "model_kwargs" in c and any(m == method for m, _ in ADDED_MODEL_KWARGS):
    kept = {
      k: v
      for k, v in dict(c["model_kwargs"]).items()
      if ADDED_MODEL_KWARGS.get((method, k), object()) != v
    }
    if kept:
      c["model_kwargs"] = kept
    else:  # those runs recorded no model_kwargs at all
      del c["model_kwargs"]
  added = _added_fields(method)
  return {k: v for k, v in c.items() if k not in added or v != added[k]}


def fingerprint(config: dict[str, Any], deviations: tuple[str, ...] | list[str] = ()) -> str:
  """SHA-256 (16 hex digits) of :func:`canonical` of the resolved config, and of the run's
  deviations of arithmetic or data (:func:`arithmetic_deviations`, :func:`data_deviations`) when
  it has any: a result's ``fingerprint`` says what it computed, while ``status`` and the report
  compare the config's alone (a deviating run is the budget's run, labelled and paired only with
  runs of the same deviations, report/)."""
  content: dict[str, Any] = canonical(config)
  if deviations:
    content = {"config": content, "deviations": sorted(deviations)}
  text = json.dumps(content, sort_keys=True, default=str)
  return hashlib.sha256(text.encode()).hexdigest()[:16]


def substitute_data(config: dict[str, Any], data_root: Path) -> dict[str, Any]:
  """Replaces ``{data}`` in string values by the shared data folder."""
  return {
    k: v.replace("{data}", str(data_root)) if isinstance(v, str) else v for k, v in config.items()
  }


def result_path(results: Path, claim: str, budget: str, method: str, seed: int) -> Path:
  return results / claim / budget / f"{method}-seed{seed}.json"


REQUIRED_KEYS = ("claim", "budget", "method", "seed", "metrics", "curve", "config")


def check_result(result: Any) -> str | None:
  """Why ``result`` is not a usable result (missing keys, an empty curve, a metric that is not a
  number), or None when it is. A diverged result has no metrics and the curve up to its last
  finite round (maybe none)."""
  if not isinstance(result, dict):
    return "not a JSON object"
  missing = [k for k in REQUIRED_KEYS if k not in result]
  if missing:
    return f"missing {', '.join(missing)}"
  if result.get("diverged"):
    ok = isinstance(result["diverged"], dict) and "error" in result["diverged"]
    return None if ok and result["metrics"] == {} else "diverged without its error, or with metrics"
  if not isinstance(result["curve"], list) or not result["curve"]:
    return "empty curve"
  metrics = result["metrics"]
  if not isinstance(metrics, dict) or not metrics:
    return "no metrics"
  bad = [k for k, v in metrics.items() if not isinstance(v, int | float) or v != v]
  if bad:
    return f"metric {', '.join(bad)} is not a number"
  return None


def read_result(path: Path) -> tuple[dict | None, str | None]:
  """(result, None), or (None, why it is corrupt)."""
  try:
    result = json.loads(path.read_text())
  except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
    return None, f"unreadable ({type(e).__name__}: {e})"
  problem = check_result(result)
  return (None, problem) if problem else (result, None)


class RunState(StrEnum):
  """The state of a planned run's result file (:func:`status`); a ``str``, so it prints and
  compares as its value."""

  DONE = "done"  # a valid result of the planned config
  STALE = "stale"  # a valid result of another config: kept, rerun only with rerun_stale
  CORRUPT = "corrupt"  # unreadable, or failing check_result: kept aside and rerun
  MISSING = "missing"  # no result file


def status(path: Path, fp: str) -> RunState:
  """``done`` (a valid result of the config with fingerprint ``fp``), ``stale`` (a valid result
  of another config), ``corrupt`` (unreadable, or failing :func:`check_result`) or ``missing``."""
  if not path.is_file():
    return RunState.MISSING
  result, _ = read_result(path)
  if result is None:
    return RunState.CORRUPT
  return RunState.DONE if fingerprint(result["config"]) == fp else RunState.STALE


def missing_text_data(config: dict[str, Any], data_root: Path) -> list[str]:
  """What an NLP run's config reads that is not on this machine, each with where it was looked
  for and how to provide it (empty: all there). The claim runner checks every run's before the
  first starts, so a missing local file or an unprepared TFDS set offline is one line, not a
  failed run's traceback."""
  from fedjax_proj.algorithms.registry import needs_public
  from fedjax_proj.data.sources import text
  from fedjax_proj.data.sources.common import looks_like_path

  c = substitute_data(config, data_root)
  missing = []

  def check(name: str, data_dir: str, splits: tuple[str, ...], what: str) -> None:
    if data_dir:
      lacking = [s for s in splits if text.find_text_file(data_dir, name, s) is None]
      if lacking:
        files = ", ".join(f"{s}{'|'.join(text.TEXT_SUFFIXES)}" for s in lacking)
        missing.append(
          f"the {what} {name!r} is not in {data_dir} (no {files} there or in {name}/): put it "
          'there (docs/nlp.md, "Text data") or pass --data=<the shared data folder holding it>'
        )
      return
    tfds_name = text.TEXT_DATASETS[name].tfds_name
    if not tfds_has(tfds_name):
      missing.append(
        f"the {what} {name!r} (TFDS {tfds_name}) is not prepared here and TFDS cannot download "
        "it (offline): prepare it on a machine with internet and point $TFDS_DATA_DIR at it"
      )

  check(c["dataset"], value_of(c, "data_dir"), ("train", "test"), "private set")
  public = value_of(c, "public_data")
  if public and needs_public(c["method"]):
    if looks_like_path(public) or public.endswith(text.TEXT_SUFFIXES):
      if not Path(public).is_file():
        missing.append(f"the public set {public} does not exist")
    elif public in text.TEXT_DATASETS:
      check(public, "", ("train",), "public set")
  return missing


# Kinds whose runs checkpoint (training/loop.py) and so continue where a stopped attempt ended.
RESUMABLE_KINDS = ("image", "nlp", "continual")
RESUME_RECORD = "claim_run.json"


def resumable(work: Path, claim: Claim, config_fp: str, code_fp: str) -> tuple[dict | None, str]:
  """(the record of a stopped attempt that ``work`` can continue, with its newest checkpoint's
  ``round``, "") or (None, why not: "" where no attempt left checkpoints there).

  An attempt is continued only when it ran the same config and the same code (code fingerprint):
  a checkpoint of other code would splice two computations into one result. The checkpoint itself
  is verified when restored (training/checkpoint.py).
  """
  rounds = checkpoint_rounds(work)
  if not rounds:
    return None, ""
  if claim.kind not in RESUMABLE_KINDS:
    return None, f"{claim.kind} runs are not continued"
  try:
    record = json.loads((work / RESUME_RECORD).read_text())
  except (OSError, ValueError):
    return None, f"no readable {RESUME_RECORD} beside its checkpoints"
  if record.get("fingerprint") != config_fp:
    return None, f"its checkpoints are of another config ({record.get('fingerprint')})"
  if record.get("code") != code_fp:
    return None, (
      f"its checkpoints are of other code (fingerprint {record.get('code')}, now {code_fp}: "
      "the source files changed since it stopped)"
    )
  return {**record, "round": rounds[-1]}, ""


def _write_resume_record(work: Path, earlier: dict, seconds: float | None) -> None:
  """Records what a later attempt needs to continue this one: its config and code, and (after an
  attempt ends, ``seconds`` not None) the time spent so far."""
  record = {k: v for k, v in earlier.items() if k != "round"}
  if seconds is not None:
    record.update(seconds=record["seconds"] + seconds, sessions=record["sessions"] + 1)
  with contextlib.suppress(OSError):  # the folder is gone or unwritable: the next attempt starts
    (work / RESUME_RECORD).write_text(json.dumps(record) + "\n")  # afresh


def _failed_in(marker: Path, attempt: str) -> bool:
  """Whether ``marker`` (``<method>-seed<k>.failed``) records a failure under ``attempt``."""
  try:
    return json.loads(marker.read_text()).get("attempt") == attempt
  except (OSError, ValueError, AttributeError):
    return False


class RunLocked(RuntimeError):
  """Another process holds the lock of this (claim, budget, method, seed)."""


@functools.cache
def tfds_has(name: str) -> bool:
  """Whether TFDS can give ``name`` now: prepared on disk, or downloadable (network reachable);
  asked once per process."""
  try:
    import tensorflow_datasets as tfds

    from fedjax_proj.data.sources.tfds_source import network_available

    return tfds.builder(name).is_prepared() or network_available()
  except Exception:  # noqa: BLE001 - any failure means TFDS cannot serve it here
    return False


@functools.cache
def _dataset_size(path: str) -> int:
  from fedjax_proj.data.sources import load_dataset

  return len(load_dataset(path, "train").labels)


def public_fallback(
  config: dict[str, Any], data_root: Path, fallback: str
) -> tuple[dict[str, Any], list[str]]:
  """The config a run can use here, and its deviations from the resolved one.

  A TFDS public set with a split other than ``train`` (the paper budgets' CIFAR-100 train +
  test) that TFDS cannot give here (offline, not prepared) becomes the ``fallback`` file
  (``{data}`` placeholder kept) with the memory capped at its size, so the run goes on and the
  report states the deviation instead of the run failing on ``memory_size > public set``.
  """
  name, split = value_of(config, "public_data"), value_of(config, "public_split")
  if not name or split == "train" or "/" in name or tfds_has(name):
    return config, []
  size = _dataset_size(fallback.replace("{data}", str(data_root)))
  out = {**config, "public_data": fallback, "public_split": "train"}
  notes = [
    f"public set: {name} {split} is not available from TFDS here (offline, not prepared); "
    f"used {fallback} ({size:,} images)"
  ]
  if out.get("public_size", 0) and out["public_size"] > size:
    out["public_size"] = 0
  if out.get("memory_size", 0) > size:
    notes.append(f"memory_size {out['memory_size']:,} capped at the public set's {size:,}")
    out["memory_size"] = size
  return out, notes


def run_one(
  claim: Claim,
  budget: str,
  method: str,
  seed: int,
  *,
  results: Path,
  data_root: Path,
  config: dict | None = None,
  deviations: list[str] | None = None,
  log=print,
  on_start=None,
  attempt: str | None = None,
) -> dict:
  """Runs one (method, seed) and writes its result JSON; returns the result.

  The run first takes ``<method>-seed<k>.lock`` (a second process on the same run gets
  :class:`RunLocked` and touches nothing), then re-checks the result (finished by another process
  meanwhile: :class:`RunLocked` too), and only then prepares its work folder
  (``<method>-seed<k>.work``): an earlier attempt's checkpoints are continued when that attempt ran
  the same config and code (:func:`resumable`; the result then records ``resumed_from_round`` and
  ``wall_seconds`` counts every attempt), anything else there is cleared. The result is checked
  (:func:`check_result`) before it is written, atomically, so a file on disk is a whole valid
  result; a corrupt file in its place is kept as ``<name>.corrupt``.

  ``attempt`` names the command this run belongs to, shared by its ``--jobs`` workers: a run that
  failed (raised, other than a stop request) leaves ``<method>-seed<k>.failed`` with it, and
  another worker of the same command leaves that run alone (:class:`RunLocked`), so a failing run
  is tried once per command and listed once; a later command retries it.

  The phases: :func:`_lock_run`, :func:`_claim_run` and :func:`_prepare_work` (lock, re-check,
  resume), :func:`_execute` (the entry point's run), :func:`_result_record` and
  :func:`_write_result` (record, write).
  """
  config = config or resolve_config(claim, budget, method, seed, data_root)
  path = result_path(results, claim.name, budget, method, seed)
  lock = _lock_run(path)
  try:
    fp = fingerprint(config)
    failed = _claim_run(path, fp, attempt)
    if on_start is not None:  # the run is this process's now (the runner announces it)
      on_start()
    work = path.with_suffix(".work")
    code = code_fingerprint()  # of the source files as the run starts
    earlier = _prepare_work(work, claim, fp, code, log)
    start = time.time()
    metrics, curve, diverged = _execute(
      claim, config, data_root, work, earlier, start, failed, attempt, log
    )
    result = _result_record(
      claim, budget, method, seed, config, data_root, deviations, code, earlier, start,
      metrics, curve, diverged,
    )  # fmt: skip
    _write_result(path, result, work, failed, lock)
    return result
  finally:
    lock.release()


def _lock_run(path: Path):
  """Takes the run's lock ``<method>-seed<k>.lock`` without waiting; returns the held
  ``filelock.FileLock``. Raises :class:`RunLocked` where another process holds it."""
  from filelock import FileLock, Timeout

  path.parent.mkdir(parents=True, exist_ok=True)
  lock = FileLock(str(path.with_suffix(".lock")))
  try:
    lock.acquire(timeout=0)
  except Timeout:
    raise RunLocked(
      f"{path.name} is being run by another process (lock {path.with_suffix('.lock')}); left to it"
    ) from None
  return lock


def _claim_run(path: Path, fp: str, attempt: str | None) -> Path:
  """Under the lock, checks that the run is still due: not finished by another process meanwhile,
  not failed in another job of the same ``attempt`` (either: :class:`RunLocked`); keeps a corrupt
  result aside as ``<name>.json.corrupt``. Returns the run's ``.failed`` marker path."""
  state = status(path, fp)
  if state == RunState.DONE:  # another process finished it while this one waited in its queue
    raise RunLocked(f"{path.name} was finished by another process meanwhile")
  failed = path.with_suffix(".failed")
  if attempt is not None and _failed_in(failed, attempt):
    raise RunLocked(f"{path.name} failed in another job of this command; a rerun retries it")
  if state == RunState.CORRUPT:
    path.replace(path.with_suffix(".json.corrupt"))
  return failed


def _prepare_work(work: Path, claim: Claim, fp: str, code: str, log) -> dict:
  """The work folder of a run about to start: a stopped attempt's checkpoints continued where
  :func:`resumable` allows (logged), else the folder cleared and a fresh resume record written.
  Returns the attempt record (``fingerprint``, ``code``, ``seconds`` and ``sessions`` so far, and
  ``round`` when continuing)."""
  earlier, why_not = resumable(work, claim, fp, code)
  if earlier is None:
    if why_not:
      log(f"{work.stem}: a stopped attempt is not continued, {why_not}; starting afresh")
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True, exist_ok=True)
    earlier = {"fingerprint": fp, "code": code, "seconds": 0.0, "sessions": 0}
    _write_resume_record(work, earlier, None)  # a killed attempt (no handler ran) resumes too
  else:
    log(
      f"resuming {work.stem} from its checkpoint after round {earlier['round']} in {work} "
      f"(same config and code; {earlier['seconds']:.0f} s spent in {earlier['sessions']} "
      "earlier session(s))"
    )
  return earlier


def _execute(
  claim: Claim,
  config: dict,
  data_root: Path,
  work: Path,
  earlier: dict,
  start: float,
  failed: Path,
  attempt: str | None,
  log,
) -> tuple[dict, list[dict], dict | None]:
  """Runs the claim's entry point (:data:`RUNNERS`) in ``work``; returns (metrics, curve,
  diverged), ``diverged`` None unless the run diverged (then no metrics and the curve it logged).

  A run that stops (a signal, a crash) keeps its checkpoints and the time spent for the next
  attempt; a stop request is re-raised naming the command that continues it, and a failure under
  ``attempt`` leaves the ``failed`` marker."""
  from fedjax_proj.training.signals import TrainingInterrupted

  runner_config = substitute_data(config, data_root)
  if earlier.get("round"):
    runner_config["resume"] = True  # a RUN_FIELD: the same computation, continued
  try:
    metrics, curve = RUNNERS[claim.kind](claim, runner_config, work, log)
  except Diverged as e:
    # Recorded, never retried (docs/reproduction.md, "Results"). The curve up to the last finite
    # round is what the run logged before it stopped.
    logged = work / "metrics.jsonl"
    curve = _read_curve(logged) if logged.is_file() else []
    return {}, curve, {"error": str(e), "last_finite_round": curve[-1]["round"] if curve else 0}
  except BaseException as e:
    # Stopped (a signal, a crash): what the checkpoints hold is kept for the next attempt,
    # with the time spent, so the result's wall_seconds counts every session.
    _write_resume_record(work, earlier, time.time() - start)
    if isinstance(e, TrainingInterrupted):
      # A stop request: the round loop saved a checkpoint after its round. The loop's message
      # names an entry point's --resume flag; here the same command continues it.
      after = f" after round {e.round}" if e.round else ""
      raise TrainingInterrupted(
        f"{signal.Signals(e.signum).name} received: {work.stem} stopped{after}; run the same "
        "command again to continue it from its newest checkpoint",
        e.round,
        e.signum,
        e.saved,
      ) from e
    if attempt is not None and isinstance(e, Exception):
      with contextlib.suppress(OSError):  # written under the run lock: no other job starts it
        failed.write_text(json.dumps({"attempt": attempt, "error": f"{type(e).__name__}: {e}"}))
    raise
  return metrics, curve, None


def _result_record(
  claim: Claim,
  budget: str,
  method: str,
  seed: int,
  config: dict,
  data_root: Path,
  deviations: list[str] | None,
  code: str,
  earlier: dict,
  start: float,
  metrics: dict,
  curve: list[dict],
  diverged: dict | None,
) -> dict:
  """The result of a finished (or diverged) run: its metrics, curve, config, deviations, code,
  machine and time over every session; checked by :func:`check_result` (a RuntimeError names
  what is invalid)."""
  # What a runner returns beyond the claim's metrics (e.g. the continual accuracy matrix).
  detail = {k: metrics.pop(k) for k in list(metrics) if k not in claim.metrics}
  commit = git_commit()
  machine = machine_info()
  deviations = list(  # the planned ones (the runner's queue) already hold the data's
    dict.fromkeys(
      [*(deviations or []), *data_deviations(config, data_root), *arithmetic_deviations(machine)]
    )
  )
  result = {
    "claim": claim.name,
    "budget": budget,
    "method": method,
    "seed": seed,
    "metrics": metrics,
    "curve": curve,
    "detail": detail,
    "wall_seconds": earlier["seconds"] + time.time() - start,  # every session of the run
    "fingerprint": fingerprint(config, deviations),
    "config": config,
    "deviations": deviations,
    "git_commit": commit,
    "code": {"git_commit": commit, "fingerprint": code},
    "load_average": list(os.getloadavg()),
    "machine": machine,
    **({"diverged": diverged} if diverged else {}),
    **({"resumed_from_round": earlier["round"]} if earlier.get("round") else {}),
    "finished": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
  }
  problem = check_result(result)
  if problem:
    raise RuntimeError(f"{claim.name} {budget} {method} seed {seed}: invalid result ({problem})")
  return result


def _write_result(path: Path, result: dict, work: Path, failed: Path, lock) -> None:
  """Writes ``result`` to ``path`` atomically, then clears the run's work folder, its ``.failed``
  marker and its lock file (the lock itself is released by the caller)."""
  tmp = path.with_suffix(".json.tmp")
  tmp.write_text(json.dumps(result, indent=1, default=str) + "\n")
  tmp.replace(path)
  shutil.rmtree(work, ignore_errors=True)
  failed.unlink(missing_ok=True)
  # Removed while still held: a process that opened it before finds the result done once it
  # gets the lock, and a later one makes a new file. A finished run leaves no empty .lock.
  Path(lock.lock_file).unlink(missing_ok=True)
