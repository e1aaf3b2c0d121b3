"""The round loop: sample clients, lay out their batches, run the compiled round, evaluate, log.

Library code: every input is an explicit argument (no flags). Experiments build these arguments from
their config (see :mod:`fedjax_proj.training.experiment`).
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from tqdm.auto import tqdm

from fedjax_proj.algorithms.base import FederatedAlgorithm
from fedjax_proj.core import random as random_lib
from fedjax_proj.core.types import RoundData
from fedjax_proj.data.federated import FederatedData
from fedjax_proj.training.metrics import MetricsWriter, to_python, write_json


class NonFiniteError(FloatingPointError):
  """Raised when a round produces a non-finite loss or non-finite global parameters."""


def _finite(metrics: dict) -> bool:
  return all(
    v is None or not isinstance(v, float) or math.isfinite(v)
    for v in to_python(metrics).values()
    if not isinstance(v, list | dict)
  )


def train(
  algorithm: FederatedAlgorithm,
  round_fn: Callable,
  fed_data: FederatedData,
  train_set: tuple[np.ndarray, np.ndarray],
  test_set: tuple[np.ndarray, np.ndarray] | None,
  evaluate: Callable[[dict, jax.Array, jax.Array], dict] | None,
  init_variables: dict,
  *,
  rounds: int,
  clients_per_round: int,
  seed: int,
  eval_every: int = 1,
  output_dir: str | Path | None = None,
  round_inputs: dict | None = None,
  extra_metrics: Callable[[object], dict] | None = None,
  summary_extra: dict | None = None,
  progress: bool = True,
) -> tuple[object, dict]:
  """Runs ``rounds`` federated rounds.

  Args:
    algorithm: the algorithm (for ``init`` and ``global_variables``).
    round_fn: the compiled round from :func:`fedjax_proj.algorithms.base.make_round`.
    fed_data: client partition, batch size and local epochs.
    train_set: (images, labels) of the whole training set; put on device once.
    test_set: (images, labels) for evaluation, or None.
    evaluate: ``evaluate(variables, images, labels) -> {"accuracy", "loss"}``.
    init_variables: the initial global model.
    rounds: number of rounds.
    clients_per_round: clients sampled per round.
    seed: the run's seed; every random draw derives from it and the round index.
    eval_every: evaluate the global model every k rounds (and after the last round).
    output_dir: where ``metrics.jsonl`` and ``summary.json`` go (None: no files).
    round_inputs: device arrays every round needs (e.g. the public set), in ``RoundData.extra``.
    extra_metrics: ``extra_metrics(state) -> dict`` logged each round (e.g. FedProj's L_mem).
    summary_extra: fields added to the summary (method, config).
    progress: show a progress bar with ETA.

  Returns:
    (final server state, summary dict).
  """
  if rounds < 1:
    raise ValueError(f"rounds must be >= 1, got {rounds}.")
  seed_key = jax.random.key(seed)
  state = algorithm.init(init_variables, random_lib.stream_key(seed_key, "init"))
  images, labels = jax.device_put(train_set[0]), jax.device_put(np.asarray(train_set[1], np.int32))
  if test_set is not None:
    test_images = jax.device_put(test_set[0])
    test_labels = jax.device_put(np.asarray(test_set[1], np.int32))
  extra = dict(round_inputs or {})
  writer = MetricsWriter(output_dir) if output_dir is not None else None
  start = time.perf_counter()
  last_eval: dict = {}
  bar = tqdm(
    range(rounds), desc=algorithm.name, disable=not progress, file=sys.stderr, unit="round"
  )
  try:
    for r in bar:
      t0 = time.perf_counter()
      sampled = fed_data.sample_clients(r, clients_per_round, seed)
      idx, mask, n = fed_data.round_layout(sampled, r, seed)
      rd = RoundData(
        images,
        labels,
        jnp.asarray(sampled),
        jnp.asarray(idx),
        jnp.asarray(mask),
        jnp.asarray(n),
        extra,
      )
      state, metrics = round_fn(state, rd, random_lib.round_key(seed_key, r))
      record = {"round": r + 1, **to_python(metrics)}
      if extra_metrics is not None:
        record.update(to_python(extra_metrics(state)))
      record["round_seconds"] = time.perf_counter() - t0
      if not _finite(record):
        raise NonFiniteError(
          f"Round {r + 1} of {algorithm.name} produced a non-finite value: {record}. "
          "Lower the learning rate or check the inputs."
        )
      if (
        test_set is not None
        and evaluate is not None
        and ((r + 1) % eval_every == 0 or r + 1 == rounds)
      ):
        ev = evaluate(algorithm.global_variables(state), test_images, test_labels)
        record["test_accuracy"], record["test_loss"] = ev["accuracy"], ev["loss"]
        last_eval = ev
        if not math.isfinite(ev["loss"]):
          raise NonFiniteError(f"Round {r + 1} of {algorithm.name}: non-finite test loss.")
        bar.write(
          f"round {r + 1}/{rounds}  test_accuracy={ev['accuracy']:.4f}  "
          f"train_loss={record.get('train_loss', float('nan')):.4f}"
        )
      if writer is not None:
        writer.write(record)
      bar.set_postfix(loss=f"{record.get('train_loss', float('nan')):.3f}")
  finally:
    if writer is not None:
      writer.close()
    bar.close()
  summary = {
    "method": algorithm.name,
    "rounds": rounds,
    "seed": seed,
    "final_test_accuracy": last_eval.get("accuracy"),
    "final_test_loss": last_eval.get("loss"),
    "wall_seconds": time.perf_counter() - start,
    **(summary_extra or {}),
  }
  if output_dir is not None:
    write_json(Path(output_dir) / "summary.json", summary)
  return state, summary
