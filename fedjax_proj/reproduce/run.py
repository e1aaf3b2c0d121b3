"""One (method, seed) run of a claim through the existing entry points, saved as one JSON file.

The config is resolved from the entry point's ``get_config("paper")`` (``experiments/*.py``,
loaded by file path from the source checkout) plus the claim's budget overrides
(:mod:`fedjax_proj.reproduce.claims`). Its fingerprint (SHA-256 of the resolved config, with the
``{data}`` placeholder kept and run-management fields cleared) decides whether a result on disk is
``done`` (same fingerprint: skipped), ``stale`` (another config: kept, rerun only with
``rerun_stale``) or ``missing``. Result files: ``<results>/<claim>/<budget>/<method>-seed<k>.json``
(docs/reproduction.md, "Results").
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

from fedjax_proj.reproduce.claims import Claim, budget_overrides

REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_RESULTS = REPO_ROOT / "benchmarks" / "results" / "reproduce"
# Fields that change how a run is managed, not what it computes.
RUN_FIELDS = (
  "output_dir",
  "progress",
  "resume",
  "overwrite",
  "checkpoint_every",
  "keep_checkpoints",
)
# Per-round keys kept in the curve (when the method logs them).
CURVE_KEYS = (
  "round",
  "test_accuracy",
  "test_loss",
  "train_loss",
  "round_seconds",
  "lmem_global",
  "lmem_before",
  "lmem_after",
  "projected_fraction",
  "mean_cos",
  "global_accuracy",
  "client_accuracy_all_data",
  "task",
)


def load_entry(claim: Claim, repo_root: Path = REPO_ROOT) -> ModuleType:
  """Imports the claim's entry point (``experiments/*.py``) by file path."""
  path = repo_root / claim.entry
  if not path.is_file():
    raise FileNotFoundError(
      f"{path} not found: the reproduce tool needs a source checkout of fedjax_proj (it reads "
      "the experiments' presets from experiments/*.py). Run it from a git clone of the "
      "repository, e.g. `cd <clone> && python -m fedjax_proj.reproduce ...`."
    )
  sys.path.insert(0, str(path.parent))  # the entry points import their sibling `common`
  spec = importlib.util.spec_from_file_location(f"_reproduce_entry_{path.stem}", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def _apply(config, overrides: dict[str, Any]):
  """Sets ``overrides`` on a ConfigDict (unknown fields are an error naming the claim fix)."""
  for key, value in overrides.items():
    if key == "method_kwargs":
      for k, v in value.items():
        config.method_kwargs[k] = v
      continue
    if key not in config:
      raise ValueError(
        f"Config field {key!r} does not exist in the entry point's config; fix the claim in "
        "fedjax_proj/reproduce/claims.py."
      )
    config[key] = value
  return config


def resolve_config(claim: Claim, budget: str, method: str, seed: int) -> dict[str, Any]:
  """The full config of one run, with ``{data}`` placeholders kept."""
  if method not in claim.runnable:
    raise ValueError(
      f"Method {method!r} is not part of claim {claim.name!r}; choose from "
      f"{', '.join(claim.runnable)}."
    )
  overrides = budget_overrides(claim, budget, method)
  ablation = claim.ablations.get(method)
  method = ablation.base if ablation else method
  entry = load_entry(claim)
  if claim.kind == "pilot":
    config = {**entry.default_config(), **overrides, "method": method, "seed": seed}
    config.pop("output_dir", None)
    return config
  config = entry.get_config("paper", **claim.entry_kwargs)
  config.method = method
  config.seed = seed
  _apply(config, overrides)
  if claim.kind == "continual":
    config.method_kwargs = {**entry.method_defaults(config), **dict(config.method_kwargs)}
  out = config.to_dict()
  for field in RUN_FIELDS:  # set by the runner; not part of what a run computes
    out.pop(field, None)
  return out


# Config fields added after results were first recorded, with the value that reproduces the runs
# made before them. A field at this value is left out of the fingerprint, so adding an option does
# not turn every committed result stale; set to anything else it counts like any other field.
ADDED_FIELDS = {
  "lr_schedule": "constant",
  "lr_step_epochs": 0,
  "lr_step_gamma": 0.1,
}


def fingerprint(config: dict[str, Any]) -> str:
  """SHA-256 (16 hex digits) of the resolved config, without :data:`ADDED_FIELDS` at default."""
  kept = {k: v for k, v in config.items() if k not in ADDED_FIELDS or v != ADDED_FIELDS[k]}
  return hashlib.sha256(json.dumps(kept, sort_keys=True, default=str).encode()).hexdigest()[:16]


def substitute_data(config: dict[str, Any], data_root: Path) -> dict[str, Any]:
  """Replaces ``{data}`` in string values by the shared data folder."""
  return {
    k: v.replace("{data}", str(data_root)) if isinstance(v, str) else v for k, v in config.items()
  }


def result_path(results: Path, claim: str, budget: str, method: str, seed: int) -> Path:
  return results / claim / budget / f"{method}-seed{seed}.json"


def status(path: Path, fp: str) -> str:
  """``done`` (a result with fingerprint ``fp``), ``stale`` (another config) or ``missing``."""
  if not path.is_file():
    return "missing"
  try:
    return "done" if json.loads(path.read_text()).get("fingerprint") == fp else "stale"
  except json.JSONDecodeError:
    return "stale"


def git_commit(repo_root: Path = REPO_ROOT) -> str:
  try:
    out = subprocess.run(
      ["git", "-C", str(repo_root), "rev-parse", "HEAD"], capture_output=True, text=True, check=True
    ).stdout.strip()
    dirty = subprocess.run(
      ["git", "-C", str(repo_root), "status", "--porcelain", "--untracked-files=no"],
      capture_output=True,
      text=True,
      check=True,
    ).stdout.strip()
    return out + ("-dirty" if dirty else "")
  except (OSError, subprocess.CalledProcessError):
    return "unknown"


def _read_curve(metrics_file: Path) -> list[dict]:
  curve = []
  for line in metrics_file.read_text().splitlines():
    record = json.loads(line)
    kept = {k: record[k] for k in CURVE_KEYS if k in record}
    if kept:
      curve.append(kept)
  return curve


def _run_image(claim: Claim, config: dict, work: Path, log) -> tuple[dict, list[dict]]:
  import ml_collections

  from fedjax_proj.training.experiment import run_experiment

  c = ml_collections.ConfigDict({**config, "method_kwargs": config.get("method_kwargs", {})})
  c.output_dir, c.progress, c.checkpoint_every = str(work), False, 0
  summary = run_experiment(c, log=log)
  return {"test_accuracy": 100 * summary["final_test_accuracy"]}, _read_curve(
    work / "metrics.jsonl"
  )


def _run_continual(claim: Claim, config: dict, work: Path, log) -> tuple[dict, list[dict]]:
  entry = load_entry(claim)
  argv = ["--preset=paper", "--iid" if config["iid"] else "--noniid", f"--output_dir={work}"]
  for key, value in config.items():
    if key not in ("iid", "method_kwargs", "output_dir"):
      argv.append(f"--{key}={value}")
  kwargs = ",".join(f"{k}={v}" for k, v in config["method_kwargs"].items())
  argv.append(f"--method_kwargs={kwargs}")
  if entry.main(argv) != 0:
    raise RuntimeError(f"{claim.entry} {' '.join(argv)} failed (see its error above).")
  summary = json.loads((work / "summary.json").read_text())
  metrics = {"acc": 100 * summary["acc"], "fgt": 100 * summary["fgt"]}
  # The accuracy matrix separates plasticity (its diagonal) from forgetting (the drop below it).
  metrics["acc_matrix"] = summary["acc_matrix"]
  return metrics, _read_curve(work / "metrics.jsonl")


def _run_pilot(claim: Claim, config: dict, work: Path, log) -> tuple[dict, list[dict]]:
  entry = load_entry(claim)
  history = entry.run_config(config)
  metrics = {
    "global_accuracy": 100 * history[-1]["global_accuracy"],
    "client_accuracy": 100 * float(np.mean([h["client_accuracy_all_data"] for h in history])),
  }
  curve = [{k: h[k] for k in CURVE_KEYS if k in h} for h in history]
  return metrics, curve


def _run_nlp(claim: Claim, config: dict, work: Path, log) -> tuple[dict, list[dict]]:
  """The image runner after experiments/nlp.py's ``prepare`` (text flags -> model_kwargs, text)."""
  import ml_collections

  c = ml_collections.ConfigDict({**config, "method_kwargs": config.get("method_kwargs", {})})
  return _run_image(claim, load_entry(claim).prepare(c).to_dict(), work, log)


RUNNERS = {
  "image": _run_image,
  "continual": _run_continual,
  "pilot": _run_pilot,
  "nlp": _run_nlp,
}


def run_one(
  claim: Claim,
  budget: str,
  method: str,
  seed: int,
  *,
  results: Path,
  data_root: Path,
  config: dict | None = None,
  log=print,
) -> dict:
  """Runs one (method, seed) and writes its result JSON; returns the result."""
  config = config or resolve_config(claim, budget, method, seed)
  path = result_path(results, claim.name, budget, method, seed)
  work = path.with_suffix(".work")
  shutil.rmtree(work, ignore_errors=True)
  work.mkdir(parents=True, exist_ok=True)
  start = time.time()
  metrics, curve = RUNNERS[claim.kind](claim, substitute_data(config, data_root), work, log)
  # What a runner returns beyond the claim's metrics (e.g. the continual accuracy matrix).
  detail = {k: metrics.pop(k) for k in list(metrics) if k not in claim.metrics}
  result = {
    "claim": claim.name,
    "budget": budget,
    "method": method,
    "seed": seed,
    "metrics": metrics,
    "curve": curve,
    "detail": detail,
    "wall_seconds": time.time() - start,
    "fingerprint": fingerprint(config),
    "config": config,
    "git_commit": git_commit(),
    "load_average": list(os.getloadavg()),
    "finished": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
  }
  path.write_text(json.dumps(result, indent=1, default=str) + "\n")
  shutil.rmtree(work, ignore_errors=True)
  return result
