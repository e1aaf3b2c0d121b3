"""The runners of a claim's runs, one per kind of claim (:data:`RUNNERS`): each runs a resolved
config in this process as its entry point's ``main`` would, and returns its metrics and curve;
and :func:`tiny`, the test hook that shrinks a config to its first rounds on tiny data."""

from __future__ import annotations

import json
from pathlib import Path
from types import ModuleType
from typing import Any

import ml_collections
import numpy as np

from fedjax_proj.algorithms.sequential.sfedkd import SFedKDConfig
from fedjax_proj.configs import for_entry
from fedjax_proj.reproduce.claims.common import Claim
from fedjax_proj.training.config import resolved_hparams

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


def load_entry(claim: Claim) -> ModuleType:
  """The config module of the claim's entry point: ``experiments/<name>.py`` runs
  ``fedjax_proj/configs/<name>.py``, whose presets and ``resolve`` the claim uses."""
  return for_entry(claim.entry)


class Diverged(FloatingPointError):
  """A run stopped on a non-finite loss or non-finite parameters (training/loop.py).

  An outcome of the run, not a failure to retry (retrying until a run does not diverge would
  choose results): the runner records it as a result with ``diverged`` and no metrics, and the
  report names it (docs/reproduction.md, "Results": diverged runs)."""


def read_curve(metrics_file: Path) -> list[dict]:
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
  c.output_dir, c.progress = str(work), False
  # About ten checkpoints a run (and one on SIGINT/SIGTERM): a stopped or killed run continues
  # from the newest on the next attempt (run_one), losing at most a tenth of its rounds.
  c.checkpoint_every, c.keep_checkpoints = max(1, c.rounds // 10), 2
  from fedjax_proj.training.loop import NonFiniteError

  try:
    summary = run_experiment(c, log=log)
  except NonFiniteError as e:
    raise Diverged(str(e)) from e
  curve = read_curve(work / "metrics.jsonl")
  metrics = {"test_accuracy": 100 * summary["final_test_accuracy"]}
  evaluated = [r["test_accuracy"] for r in curve if "test_accuracy" in r]
  if evaluated:  # 002 Table 3 reports the best accuracy over the (evaluated) rounds
    metrics["best_test_accuracy"] = 100 * max(evaluated)
  return metrics, curve


def run_continual(claim: Claim, config: dict, work: Path, log) -> tuple[dict, list[dict]]:
  """Runs a continual claim in this process: the config module resolves ``config`` as its flags
  would (``--preset=paper`` plus every field), checks it and runs it into ``work``."""
  from fedjax_proj.training.loop import NonFiniteError

  entry = load_entry(claim)
  fields = {k: v for k, v in config.items() if k != "method_kwargs"}
  c = entry.resolve("paper", fields, config["method_kwargs"])
  c.output_dir = str(work)
  entry.check_run(c)
  from fedjax_proj.training import continual_tasks

  try:
    summary = continual_tasks.run(c, entry.BENCHMARK)
  except NonFiniteError as e:
    raise Diverged(str(e)) from e
  metrics = {"acc": 100 * summary["acc"], "fgt": 100 * summary["fgt"]}
  # The accuracy matrix separates plasticity (its diagonal) from forgetting (the drop below it).
  metrics["acc_matrix"] = summary["acc_matrix"]
  return metrics, read_curve(work / "metrics.jsonl")


def _run_pilot(claim: Claim, config: dict, work: Path, log) -> tuple[dict, list[dict]]:
  from fedjax_proj.training.pilot import run_config

  history = run_config(config)
  metrics = {
    "global_accuracy": 100 * history[-1]["global_accuracy"],
    "client_accuracy": 100 * float(np.mean([h["client_accuracy_all_data"] for h in history])),
  }
  curve = [{k: h[k] for k in CURVE_KEYS if k in h} for h in history]
  return metrics, curve


RUNNERS = {
  "image": _run_image,
  "continual": run_continual,
  "pilot": _run_pilot,
  "nlp": _run_image,  # experiments/nlp.py resolves to an image-runner config (token ids)
}


def _time_image(claim: Claim, config: dict) -> dict:
  """The run's local steps timed from one step now (experiment.time_step_estimate): the data
  loaded and the method's client step compiled and timed as the run would; nothing written."""
  from fedjax_proj.training.experiment import time_step_estimate

  c = ml_collections.ConfigDict({**config, "method_kwargs": config.get("method_kwargs", {})})
  c.progress = False
  return time_step_estimate(c, log=lambda *args, **kwargs: None)


# ``--no_run --time_step``'s timers by claim kind. Continual and pilot claims have none: a
# continual run's cost sits in its end-of-task passes (subspace extraction, Fisher, replay),
# which one local step does not show.
STEP_TIMERS = {"image": _time_image, "nlp": _time_image}


# The test hook of tests/reproduce/test_paper_first_round.py: fields :func:`tiny` shrinks. Only
# data sizes, round and task counts, the number of clients and the model's width change; the
# architecture, the method's hyperparameters and everything else stay as resolved, so a budget
# that cannot run fails in CI.
TINY_TRAIN = 600


TINY_WIDTH = {
  "resnet8": {"stem_features": 16, "stage_features": (16, 16, 16)},
  "resnet10": {"stem_features": 16, "stage_features": (16, 16, 16, 16)},
  "alexnet8": {"fc_features": 64},
}


def tiny(claim: Claim, config: dict[str, Any]) -> dict[str, Any]:
  """``config`` shrunk to its first rounds on tiny data (two rounds for image claims: FedProj
  skips its projection in round 0, so the second is its first projected round)."""
  c = dict(config)
  if claim.kind == "image":
    c.update(rounds=2, local_epochs=1, eval_every=1, test_subset=0, eval_batch_size=100)
    c["num_clients"] = min(c["num_clients"], 10)  # ExDir(2, .) needs 5+ to cover 10 classes
    # Two clients per round; SFedKD keeps as many as its K teachers, which are the previous
    # round's clients (sfedkd.cap_num_teachers), so that round 2 distils from all K.
    kept = 2
    if c.get("method") == "sfedkd":  # K as the run resolves it
      kept = max(kept, SFedKDConfig(**resolved_hparams(ml_collections.ConfigDict(c))).num_teachers)
    c["clients_per_round"] = min(c["clients_per_round"], kept)
    c["model_kwargs"] = {**dict(c.get("model_kwargs", {})), **TINY_WIDTH.get(c["model"], {})}
    if c.get("train_subset"):  # keep a held-out part where the budget has one
      c["train_subset"] = TINY_TRAIN * 9 // 10
  elif claim.kind == "nlp":
    # The hub checkpoint cannot be fetched offline: a random-init tiny encoder of the same family
    # (its loading is tested on a real checkpoint in tests/models/test_bert.py).
    c.update(rounds=2, local_epochs=1, eval_every=1, num_clients=4, clients_per_round=2)
    c.update(train_subset=0, test_subset=0, max_len=16, batch_size=8, eval_batch_size=100)
    kwargs = {k: v for k, v in dict(c.get("model_kwargs", {})).items() if k != "checkpoint"}
    c.update(checkpoint="", bert_size="tiny", model_kwargs={**kwargs, "size": "tiny"})
    if c.get("public_size"):
      c.update(public_size=32, memory_size=min(c.get("memory_size", 32), 32))
  elif claim.kind == "continual":
    c.update(num_clients=4, clients_per_round=2, rounds_per_task=1, local_epochs=1, num_tasks=2)
    c.update(train_per_task=TINY_TRAIN, test_per_task=100, fl_later_rounds=0)
  else:
    c.update(rounds=1, pretrain_steps=min(c.get("pretrain_steps", 0), 5))
  return c
