"""The task loop of continual federated learning, and its metrics ACC and FGT.

Setting of FOT (Bakman et al., ICLR 2024): tasks arrive one after another; during task t only its
data is on the clients (:func:`fedjax_proj.data.continual.task_partition`); each task runs
``rounds_per_task`` rounds, then the method's end-of-task hook (FOT's GPSE round, EWC's Fisher,
ER's buffer update, GPM's local bases) on a layout of ALL clients' task data; then the global
model is evaluated on every task seen so far with that task's head.

Metrics (Lopez-Paz & Ranzato, 2017; Chaudhry et al., 2018), with a[i, t] the accuracy on task i
after training task t (K tasks):

  ACC = (1/K) Σ_i a[i, K−1],   FGT = (1/(K−1)) Σ_{i<K−1} (a[i, i] − a[i, K−1]).
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

from fedjax_proj.algorithms import losses
from fedjax_proj.algorithms.continual.base import ContinualMethod
from fedjax_proj.algorithms.families import ContinualFamily
from fedjax_proj.core import random as random_lib
from fedjax_proj.core.executor import Executor
from fedjax_proj.core.types import Model, RoundData
from fedjax_proj.data.continual import ContinualBenchmark, task_partition
from fedjax_proj.data.federated import FederatedData
from fedjax_proj.training import rundir
from fedjax_proj.training.checkpoint import save_variables
from fedjax_proj.training.metrics import MetricsWriter, to_python, write_json


def acc_fgt(acc_matrix: np.ndarray) -> tuple[float, float]:
  """ACC and FGT from a[i, t] (rows: task evaluated, columns: after training task t).

  Only entries with i ≤ t are read. FGT is 0 for a single task.
  """
  a = np.asarray(acc_matrix, np.float64)
  if a.ndim != 2 or a.shape[0] != a.shape[1] or a.shape[0] < 1:
    raise ValueError(f"accuracy matrix must be square [K, K], got shape {a.shape}")
  k = a.shape[0]
  final = a[:, k - 1]
  acc = float(np.mean(final))
  fgt = float(np.mean(np.diag(a)[: k - 1] - final[: k - 1])) if k > 1 else 0.0
  return acc, fgt


def make_task_evaluator(model: Model, normalize: Callable, batch_size: int = 500):
  """``evaluate(variables, images, labels, task) -> accuracy``; one program serves all tasks."""

  @jax.jit
  def batch_correct(variables, images, labels, mask, task):
    out = model.apply(variables, normalize(images), train=False, mask=mask, task=task)
    return losses.accuracy_count(out.logits, labels, mask)

  def evaluate(variables, images: np.ndarray, labels: np.ndarray, task: int) -> float:
    n = len(labels)
    correct = 0.0
    for start in range(0, n, batch_size):
      x, y = images[start : start + batch_size], labels[start : start + batch_size]
      pad = batch_size - len(y)
      mask = np.ones(batch_size, np.float32)
      if pad:
        x = np.concatenate([x, np.zeros((pad, *x.shape[1:]), x.dtype)])
        y = np.concatenate([y, np.zeros((pad,), y.dtype)])
        mask[batch_size - pad :] = 0
      correct += float(batch_correct(variables, x, y, mask, jnp.int32(task)))
    return correct / max(n, 1)

  return evaluate


def task_round_data(images, labels, fed: FederatedData, sampled, r, seed, task) -> RoundData:
  """Round ``r``'s layout of the ``sampled`` clients on task ``task`` (``extra["task"]``)."""
  return fed.round_data(images, labels, sampled, r, seed, {"task": jnp.int32(task)})


def train_continual(
  method: ContinualFamily,
  round_fn: Callable,
  bench: ContinualBenchmark,
  evaluate: Callable,
  init_variables: dict,
  *,
  num_clients: int,
  clients_per_round: int,
  rounds_per_task: int | list[int],
  batch_size: int,
  local_epochs: int,
  iid: bool,
  seed: int,
  num_tasks: int | None = None,
  end_task_batch_size: int = 0,
  eval_every: int = 0,
  output_dir: str | Path | None = None,
  summary_extra: dict | None = None,
  log: Callable[[str], None] | None = print,
) -> tuple[object, dict]:
  """Runs the task sequence; returns (final state, summary with ``acc``, ``fgt``, ``acc_matrix``).

  Args:
    method: the continual method (round algorithm + end-of-task hook).
    round_fn: the compiled round (:func:`fedjax_proj.algorithms.base.make_round`, on the executor
      the method was built with).
    bench: the benchmark.
    evaluate: from :func:`make_task_evaluator`.
    init_variables: initial global model.
    num_clients: clients holding each task's data.
    clients_per_round: clients sampled per round.
    rounds_per_task: rounds per task (an int, or one per task).
    batch_size: local batch size.
    local_epochs: local epochs per round.
    iid: IID split of each task's data, else 2 label-sorted shards per client.
    seed: run seed.
    num_tasks: first ``num_tasks`` tasks only (default: all).
    end_task_batch_size: batch size of the end-of-task pass (default: ``batch_size``).
    eval_every: also evaluate the current task every k rounds (0: only at task ends).
    output_dir: ``metrics.jsonl`` (one line per round and per task end), ``summary.json`` and
      ``final_variables.npz`` (the final global model).
    summary_extra: extra summary fields.
    log: progress printer (None: silent).
  """
  algorithm = method.algorithm
  k_tasks = num_tasks or bench.num_tasks
  if not 1 <= k_tasks <= bench.num_tasks:
    raise ValueError(f"num_tasks must be in [1, {bench.num_tasks}], got {k_tasks}")
  rounds = [rounds_per_task] * k_tasks if isinstance(rounds_per_task, int) else rounds_per_task
  if len(rounds) < k_tasks or min(rounds[:k_tasks]) < 1:
    raise ValueError(f"rounds_per_task needs {k_tasks} positive entries, got {rounds_per_task}")
  log = log or (lambda s: None)
  seed_key = jax.random.key(seed)
  state = algorithm.init(init_variables, random_lib.stream_key(seed_key, "init"))
  images = jax.device_put(bench.images)
  labels = jax.device_put(bench.labels.astype(np.int32))
  acc = np.full((k_tasks, k_tasks), np.nan)
  writer = MetricsWriter(output_dir) if output_dir is not None else None
  start = time.perf_counter()
  global_round = 0
  timings = {"train_seconds": 0.0, "end_task_seconds": 0.0}
  try:
    for t in range(k_tasks):
      parts = task_partition(bench, t, num_clients, iid=iid, seed=seed)
      fed = FederatedData(parts, batch_size, local_epochs)
      test_idx = bench.tasks[t].test_idx
      for r in range(rounds[t]):
        t0 = time.perf_counter()
        sampled = fed.sample_clients(global_round, clients_per_round, seed)
        rd = task_round_data(images, labels, fed, sampled, global_round, seed, t)
        state, metrics = round_fn(state, rd, random_lib.round_key(seed_key, global_round))
        record = {"task": t, "round": global_round + 1, "task_round": r + 1, **to_python(metrics)}
        record["round_seconds"] = time.perf_counter() - t0
        timings["train_seconds"] += record["round_seconds"]
        loss = record.get("train_loss")
        if loss is None or not math.isfinite(loss):
          raise FloatingPointError(f"task {t} round {r + 1}: non-finite train loss {loss}")
        if eval_every and (r + 1) % eval_every == 0 and r + 1 < rounds[t]:
          record["current_task_accuracy"] = evaluate(
            algorithm.global_variables(state),
            bench.test_images[test_idx],
            bench.test_labels[test_idx],
            t,
          )
        if writer:
          writer.write(record)
        global_round += 1
        log(
          f"task {t + 1}/{k_tasks} round {r + 1}/{rounds[t]} loss={loss:.4f}"
          + (
            f" acc={record['current_task_accuracy']:.4f}"
            if "current_task_accuracy" in record
            else ""
          )
          + f" ({record['round_seconds']:.1f}s)"
        )
      end_metrics = {}
      if method.end_task is not None:
        t0 = time.perf_counter()
        all_clients = np.arange(num_clients, dtype=np.int32)
        fed_all = FederatedData(parts, end_task_batch_size or batch_size, 1)
        rd_all = task_round_data(images, labels, fed_all, all_clients, 10**6 + t, seed, t)
        key = random_lib.stream_key(random_lib.round_key(seed_key, t), "end_task")
        state, end_metrics = method.end_task(state, rd_all, key, t)
        end_metrics = {**to_python(end_metrics), "end_task_seconds": time.perf_counter() - t0}
        timings["end_task_seconds"] += end_metrics["end_task_seconds"]
      variables = algorithm.global_variables(state)
      for i in range(t + 1):
        idx = bench.tasks[i].test_idx
        acc[i, t] = evaluate(variables, bench.test_images[idx], bench.test_labels[idx], i)
      row = {"task_end": t, "accuracies": acc[: t + 1, t].tolist(), **end_metrics}
      if writer:
        writer.write(row)
      log(
        f"end of task {t + 1}: accuracies "
        + " ".join(f"{a:.4f}" for a in acc[: t + 1, t])
        + f" mean={np.mean(acc[: t + 1, t]):.4f}"
      )
      sys.stdout.flush()
  finally:
    if writer:
      writer.close()
  acc_value, fgt_value = acc_fgt(np.nan_to_num(acc))
  summary = {
    "method": algorithm.name,
    "acc": acc_value,
    "fgt": fgt_value,
    "acc_matrix": [[None if np.isnan(v) else float(v) for v in row] for row in acc],
    "num_tasks": k_tasks,
    "rounds_per_task": rounds[:k_tasks],
    "wall_seconds": time.perf_counter() - start,
    **timings,
    **(summary_extra or {}),
  }
  if output_dir is not None:
    write_json(Path(output_dir) / "summary.json", summary)
    # The final global model, as the parallel-FL loop saves it (docs/design.md, "Checkpoints").
    save_variables(Path(output_dir) / "final_variables.npz", algorithm.global_variables(state))
  return state, summary


def build_continual_method(
  name: str,
  model: Model,
  optimizer,
  executor: Executor,
  *,
  variables: dict,
  sample_x,
  num_clients: int,
  num_tasks: int,
  **hparams,
) -> ContinualMethod:
  """Builds a continual method of the registry (:mod:`fedjax_proj.algorithms.registry`) on the
  run's ``executor`` (its end-of-task client passes run on it)."""
  from fedjax_proj.algorithms import registry

  continual = registry.methods(("continual",))
  if name not in continual:
    raise ValueError(f"Unknown continual method {name!r}; choose one of {', '.join(continual)}.")
  ctx = registry.BuildContext(
    model=model,
    client_optimizer=optimizer,
    executor=executor,
    normalize=lambda x: x,  # continual methods read no public set
    num_clients=num_clients,
    variables=variables,
    sample_x=sample_x,
    num_tasks=num_tasks,
  )
  return registry.build_algorithm(name, ctx, **hparams)


def rounds_schedule(method: str, rounds_per_task: int, num_tasks: int, fl_later_rounds: int = 0):
  """Rounds of each task: ``rounds_per_task`` each, except FL with ``fl_later_rounds`` > 0.

  FOT paper F.4: "we run vanilla FL for 1100 rounds in total, where first task is run for 200 and
  the others for 100 rounds. All of the other methods' total communication round is set to 2000,
  divided equally to the tasks" (PMNIST).
  """
  if method == "fl" and fl_later_rounds > 0:
    return [rounds_per_task] + [fl_later_rounds] * (num_tasks - 1)
  return [rounds_per_task] * num_tasks


def torch_sgd(lr: float, momentum: float = 0.0, weight_decay: float = 0.0):
  """SGD with optional momentum and L2 weight decay added to the gradient (as torch's SGD)."""
  import optax

  sgd = optax.sgd(lr, momentum=momentum or None)
  return optax.chain(optax.add_decayed_weights(weight_decay), sgd) if weight_decay else sgd


def run_continual_experiment(
  c, bench: ContinualBenchmark, model: Model, log=print, *, shared_head: bool = False
) -> dict:
  """Runs one continual experiment described by config ``c`` (see ``experiments/pmnist.py``).

  Prints the header line ``backend=... devices=... strategy=...``, per-round progress, and writes
  ``metrics.jsonl``, ``summary.json`` (``acc``, ``fgt``, ``acc_matrix``) and
  ``final_variables.npz`` to ``c.output_dir``, holding its run lock; a directory that already
  holds a run is refused (a ``rundir.RunDirError``) unless ``c.overwrite`` is set.
  """
  if not c.output_dir:
    return _run_continual(c, bench, model, log, shared_head)
  # One writer per directory, and never over a run without --overwrite (training/rundir.py).
  rundir.check_writable(c.output_dir)
  with rundir.RunLock(c.output_dir, log=lambda msg: print(msg, file=sys.stderr)):
    if rundir.check_run_dir(c.output_dir, resume=False, overwrite=c.get("overwrite", False)) != (
      "empty"
    ):
      rundir.clear_run(c.output_dir)
    return _run_continual(c, bench, model, log, shared_head)


def _run_continual(c, bench: ContinualBenchmark, model: Model, log, shared_head: bool) -> dict:
  from fedjax_proj.core import engine as engine_lib
  from fedjax_proj.data import pipeline
  from fedjax_proj.data.continual import input_transform, task_model
  from fedjax_proj.models.base import count_params
  from fedjax_proj.training.placement import build_round, plan_execution

  model = task_model(model, input_transform(bench), shared_head=shared_head)
  normalize = pipeline.normalizer_for(bench.normalizer_name, bench.images)
  batch_fn = pipeline.make_batch_fn(normalize, augment=False)
  sample = normalize(jnp.asarray(bench.images[:2]))
  variables = model.init(jax.random.key(c.seed), sample)
  has_conv = engine_lib.has_convolution(
    lambda v, x: model.apply(v, x, train=False).logits, variables, sample
  )
  # The task driver does not place its rounds' inputs on devices: no sharding.
  executor = plan_execution(
    c, batch_fn, has_conv=has_conv, variables=variables, log=log, shard=False
  )
  optimizer = torch_sgd(c.lr, c.momentum, c.get("weight_decay", 0.0))
  num_tasks = c.num_tasks or bench.num_tasks
  rounds = rounds_schedule(c.method, c.rounds_per_task, num_tasks, c.get("fl_later_rounds", 0))
  method = build_continual_method(
    c.method,
    model,
    optimizer,
    executor,
    variables=variables,
    sample_x=sample,
    num_clients=c.num_clients,
    num_tasks=num_tasks,
    **dict(c.method_kwargs),
  )
  round_fn = build_round(method.algorithm, executor, log)
  log(
    f"backend={jax.default_backend()} devices={jax.device_count()} strategy={executor.strategy} "
    f"method={c.method} benchmark={bench.name} tasks={num_tasks} params={count_params(variables)} "
    f"clients={c.num_clients} per_round={c.clients_per_round} rounds_per_task={rounds} "
    f"local_epochs={c.local_epochs} {'iid' if c.iid else 'noniid'} output_dir={c.output_dir}"
  )
  sys.stdout.flush()
  _, summary = train_continual(
    method,
    round_fn,
    bench,
    make_task_evaluator(model, normalize, c.eval_batch_size),
    variables,
    num_clients=c.num_clients,
    clients_per_round=c.clients_per_round,
    rounds_per_task=rounds,
    batch_size=c.batch_size,
    local_epochs=c.local_epochs,
    iid=c.iid,
    seed=c.seed,
    num_tasks=num_tasks,
    end_task_batch_size=c.get("end_task_batch_size", 0),
    eval_every=c.eval_every,
    output_dir=c.output_dir or None,
    summary_extra={
      "strategy": executor.strategy,
      "config": c.to_dict(),
      "acc_matrix_layout": "acc_matrix[i][t] = accuracy on task i after task t",
    },
    log=log,
  )
  log(
    f"ACC={summary['acc']:.4f} FGT={summary['fgt']:.4f} wall_seconds={summary['wall_seconds']:.1f}"
  )
  return summary
