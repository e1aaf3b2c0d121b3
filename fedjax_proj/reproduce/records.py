"""A claim run's files: its result JSON (checked, read, its state against a planned config) and
the record beside a stopped attempt's checkpoints that lets a later attempt continue it
(docs/reproduction.md, "Results")."""

from __future__ import annotations

import contextlib
import enum
import json
from pathlib import Path
from typing import Any

from fedjax_proj.reproduce.claims.common import Claim
from fedjax_proj.reproduce.resolve import fingerprint
from fedjax_proj.training.rundir import checkpoint_rounds

try:
  from enum import StrEnum
except ImportError:  # Python 3.10: a str mixin that prints and formats as its value, as StrEnum

  class StrEnum(str, enum.Enum):
    __str__ = str.__str__
    __format__ = str.__format__


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


def write_resume_record(work: Path, earlier: dict, seconds: float | None) -> None:
  """Records what a later attempt needs to continue this one: its config and code, and (after an
  attempt ends, ``seconds`` not None) the time spent so far."""
  record = {k: v for k, v in earlier.items() if k != "round"}
  if seconds is not None:
    record.update(seconds=record["seconds"] + seconds, sessions=record["sessions"] + 1)
  with contextlib.suppress(OSError):  # the folder is gone or unwritable: the next attempt starts
    (work / RESUME_RECORD).write_text(json.dumps(record) + "\n")  # afresh


def failed_in(marker: Path, attempt: str) -> bool:
  """Whether ``marker`` (``<method>-seed<k>.failed``) records a failure under ``attempt``."""
  try:
    return json.loads(marker.read_text()).get("attempt") == attempt
  except (OSError, ValueError, AttributeError):
    return False
