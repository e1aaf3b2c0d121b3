"""Config-driven experiments: build data, model, algorithm and executor from one ConfigDict, run.

The experiment families (:mod:`fedjax_proj.configs`) own a ``get_config(preset)`` and parse flags
into it; this module only reads the config object it is given. The pieces live beside it:
:mod:`~fedjax_proj.training.config` (defaults, and ``validate_config``, which rejects impossible
settings before any data is loaded), :mod:`~fedjax_proj.training.processes` (multi-process
start-up), :mod:`~fedjax_proj.training.optimizers`, :mod:`~fedjax_proj.training.inputs` (subsets,
held-out and public data), :mod:`~fedjax_proj.training.placement` (the run's executor: strategy,
sharding and chunking) and :mod:`~fedjax_proj.training.estimate` (the time estimate). Data-dependent
checks (the partition, FedProj's memory against the public set) run before the model is built or
anything is compiled.

Each run's ``output_dir`` holds ``metrics.jsonl``, ``summary.json``, ``final_variables.npz``,
``checkpoints/`` (see :mod:`fedjax_proj.training.checkpoint`; ``resume=True`` continues from the
newest valid one) and, with ``tensorboard=True``, ``tensorboard/`` event files.

Several processes (hosts, or CPU processes on one machine): every process runs the same command
with its own ``process_id`` and the same ``coordinator_address``, ``num_processes`` and
``output_dir``; the round's client axis is sharded over the devices of all processes and only
process 0 writes outputs (docs/performance.md, "Several hosts").
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any, NamedTuple

import jax
import ml_collections
import numpy as np

from fedjax_proj.algorithms import registry
from fedjax_proj.data import pipeline
from fedjax_proj.data.federated import FederatedData
from fedjax_proj.data.partition import partition
from fedjax_proj.data.sources import load_dataset
from fedjax_proj.models import CONV_MODELS, get_model
from fedjax_proj.training import fields, setup
from fedjax_proj.training.config import no_validation_fix, resolved_hparams, validate_config
from fedjax_proj.training.estimate import (
  ETA_PROBE_MIN_STEPS,
  available_memory,
  estimate_memory,
  estimate_run,
  run_steps,
  time_client_step,
)
from fedjax_proj.training.evaluate import make_evaluator
from fedjax_proj.training.inputs import (
  check_dataset,
  held_out,
  public_inputs,
  public_normalizer,
  subset,
)
from fedjax_proj.training.loop import train
from fedjax_proj.training.optimizers import client_optimizer, make_server_optimizer
from fedjax_proj.training.placement import build_round, conv_impl_line
from fedjax_proj.training.processes import init_processes
from fedjax_proj.training.session import run_io
from fedjax_proj.training.text_inputs import is_text_run, text_loader, token_ids


def default_output_dir(method: str) -> str:
  return str(Path("runs") / f"{method}-{time.strftime('%Y%m%d-%H%M%S')}")


def check_batch_size(batch_size: int, parts, partition_spec: str) -> None:
  """Refuses a batch larger than every client's data, before the model is built.

  Each step then pads one batch of ``batch_size`` mostly with masked rows: the same updates as a
  batch of the client's size at many times the memory and time (and out of memory for large ones).
  """
  largest = max(len(p) for p in parts)
  if batch_size > largest:
    raise ValueError(
      f"--batch_size={batch_size} exceeds the largest client's data ({largest} examples under "
      f"--partition={partition_spec} over {len(parts)} clients): every step would pad one batch "
      f"of {batch_size} mostly with masked rows. Pass --batch_size <= {largest}."
    )


def run_experiment(c: ml_collections.ConfigDict, log=print) -> dict:
  """Runs one federated experiment described by ``c``; returns the summary dict.

  With ``num_processes != 1`` this joins the multi-process job first (before any JAX computation)
  and only process 0 logs and writes outputs; every process returns the same summary.
  """
  validate_config(c)
  # Resolved once: what the run reads (every field, parsed); ``c`` stays what it records.
  s = fields.resolve(c)
  if init_processes(s) and jax.process_index() != 0:
    log = lambda *args, **kwargs: None  # process 0 reports for the whole job
  output_dir = c.output_dir or default_output_dir(c.method)
  # Before any data is loaded: the directory is ours alone and holds nothing a new run would
  # silently replace (training/rundir.py); process 0 holds it for the job.
  with setup.held(s, output_dir, writer=jax.process_index() == 0):
    return _run(c, s, output_dir, log)


class _Prepared(NamedTuple):
  """What a run trains with, built and checked before anything trains (:func:`_prepare`)."""

  algorithm: Any
  executor: Any
  variables: dict
  fed: FederatedData
  train: tuple  # (images, labels) on the host
  test: tuple
  round_inputs: dict
  model: Any
  normalize: Any


def _prepare(c: ml_collections.ConfigDict, s: fields.Config, output_dir: str, log) -> _Prepared:
  """Loads the data and builds the model, algorithm and executor of ``c`` (its resolved fields
  ``s``); compiles nothing."""
  data_dir = c.data_dir or None
  text_run = is_text_run(c)
  # Text runs tokenise their splits (docs/nlp.md); the arrays they give are used as images are.
  load = text_loader(c) if text_run else load_dataset
  train_ds = load(c.dataset, "train", data_dir)
  test_ds = load(c.dataset, "test", data_dir)
  where = f"--data_dir={c.data_dir}" if c.data_dir else "the default source"
  check_dataset(train_ds, c.dataset, where)
  check_dataset(test_ds, c.dataset, where)
  train_x, train_y = subset(train_ds, c.train_subset, c.seed)
  test_x, test_y = subset(test_ds, c.test_subset, c.seed + 1)
  parts = partition(train_y, c.partition, c.num_clients, c.seed)
  check_batch_size(c.batch_size, parts, c.partition)
  fed = FederatedData(parts, c.batch_size, c.local_epochs)
  round_inputs, public_size = public_inputs(
    c, train_x, train_ds.num_classes, train_ds.name, load=load
  )
  # A preset's per-method defaults (e.g. FedProj's paper values), under explicit method_kwargs.
  hparams = resolved_hparams(c)
  validation_size = 0
  if registry.needs_validation(c.method, hparams):
    val_x, val_y = held_out(train_ds, c.train_subset, c.seed)
    if not len(val_y):
      raise ValueError(
        f"{c.method} with vote_validation=server needs held-out validation data, but "
        f"--train_subset={c.train_subset} keeps all {len(train_ds.labels)} training examples; "
        + no_validation_fix(c.method)
        + "."
      )
    round_inputs["validation_images"] = jax.device_put(val_x)
    round_inputs["validation_labels"] = jax.device_put(val_y)
    validation_size = len(val_y)
    log(f"validation split: the {validation_size} training examples --train_subset leaves out")

  model_kwargs = {**registry.model_kwargs(c.method), **dict(c.get("model_kwargs", {}))}
  if c.model in CONV_MODELS:
    # The backend's convolution implementation, unless --model_kwargs names one.
    log(conv_impl_line(model_kwargs))
  model = get_model(c.model, train_ds.num_classes, **model_kwargs)
  sample = pipeline.normalizer(0.0, 1.0)(np.asarray(train_x[:2], np.float32))
  normalize = (
    token_ids if text_run else pipeline.normalizer_for(c.dataset, train_x, s.normalization)
  )
  public_normalize = public_normalizer(s, round_inputs.get("public_images"))
  batch_fn = pipeline.make_batch_fn(normalize, augment=c.augment)
  if model_kwargs.get("checkpoint"):  # which pretrained weights this run starts from, on record
    from fedjax_proj.models.hf_checkpoint import describe  # noqa: PLC0415

    log(f"checkpoint: loaded {describe(model_kwargs['checkpoint'])}")
  variables, executor = setup.init_and_plan(s, model, sample, batch_fn, log)

  ctx = registry.BuildContext(
    model=model,
    client_optimizer=client_optimizer(s),
    executor=executor,
    normalize=normalize,
    num_clients=c.num_clients,
    server_optimizer=make_server_optimizer(c),
    public_size=public_size,
    num_classes=train_ds.num_classes,
    validation_size=validation_size,
    public_normalize=public_normalize,
  )
  for field in registry.config_kwargs(c.method):
    hparams.setdefault(field, c[field])
  algorithm = registry.build_algorithm(c.method, ctx, **hparams)
  caveat = registry.optimizer_caveat(c.method, c.optimizer)
  if caveat:
    log(f"warning: {caveat}")
  fields = [f"model={c.model}", setup.params(variables), f"clients={c.num_clients}"]
  fields += [f"per_round={c.clients_per_round}", f"rounds={c.rounds}"]
  fields += [f"local_epochs={c.local_epochs}", f"partition={c.partition}"]
  log(setup.header(c, executor, [*fields, f"output_dir={output_dir}"]))
  warning = estimate_memory(
    sum(x.nbytes for x in jax.tree.leaves(variables)),
    # One program holds the round's clients (or a chunk of them) at once; host loops one at a time.
    min(c.clients_per_round, executor.client_chunk or c.clients_per_round)
    if executor.one_program
    else 1,
    {"adam": 2}.get(c.optimizer, 1 if c.momentum else 0),
    train_x.nbytes + sum(getattr(x, "nbytes", 0) for x in jax.tree.leaves(round_inputs)),
    available_memory(),
  )
  if warning:
    log(warning)
  return _Prepared(
    algorithm,
    executor,
    variables,
    fed,
    (train_x, train_y),
    (test_x, test_y),
    round_inputs,
    model,
    normalize,
  )


def _step_seconds(p: _Prepared, c: ml_collections.ConfigDict) -> float:
  """Seconds per local step of ``c``'s method, timed now (estimate.time_client_step)."""
  images, labels = p.train
  return time_client_step(
    p.algorithm,
    p.executor,
    p.variables,
    p.fed,
    jax.device_put(images),
    jax.device_put(np.asarray(labels, np.int32)),
    p.round_inputs,
    c.clients_per_round,
    c.seed,
  )


def time_step_estimate(c: ml_collections.ConfigDict, log=print) -> dict:
  """The time ``c``'s run needs for its local steps, from one step timed now; trains nothing.

  Loads the data and builds everything as :func:`run_experiment` would (the same checks, the same
  executor), times the method's own local step (estimate.time_client_step), and counts the run's
  steps (estimate.run_steps). Writes nothing: ``output_dir`` is neither created nor held. Returns
  ``{"step_seconds", "steps", "seconds"}``; the server's work (aggregation, distillation) and the
  first compile come on top, as in the entry points' estimate line.
  """
  validate_config(c)
  p = _prepare(c, fields.resolve(c), c.output_dir or default_output_dir(c.method), log)
  step = _step_seconds(p, c)
  steps = run_steps(c, p.fed, padded=p.executor.one_program)
  return {"step_seconds": step, "steps": steps, "seconds": step * steps}


def _run(c: ml_collections.ConfigDict, s: fields.Config, output_dir: str, log) -> dict:
  """The body of :func:`run_experiment` once the output directory is held."""
  p = _prepare(c, s, output_dir, log)
  if run_steps(c, p.fed) >= ETA_PROBE_MIN_STEPS and not s.resume:
    # Compiling and timing a large model's step is silent for up to minutes on a CPU: say so.
    log("timing one local step for the time estimate (compiles the client step first) ...")
    log(estimate_run(c, p.fed, _step_seconds(p, c), padded=p.executor.one_program))
  round_fn = build_round(p.algorithm, p.executor, log)
  sys.stdout.flush()
  _, summary = train(
    p.algorithm,
    round_fn,
    p.fed,
    p.train,
    p.test,
    make_evaluator(p.model, p.normalize, c.eval_batch_size),
    p.variables,
    rounds=c.rounds,
    clients_per_round=c.clients_per_round,
    seed=c.seed,
    eval_every=c.eval_every,
    round_inputs=p.round_inputs,
    summary_extra=setup.summary_extra(c, p.executor, output_dir=output_dir),
    run=run_io(c, output_dir, s),
  )
  log(
    f"final_test_accuracy={summary['final_test_accuracy']:.4f} "
    f"wall_seconds={summary['wall_seconds']:.1f} output_dir={output_dir}"
  )
  return summary
