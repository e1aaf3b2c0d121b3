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

import functools
import sys
import time
from collections.abc import Callable
from typing import NamedTuple

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
from fedjax_proj.training.loop import Hooks, run_rounds, to_device
from fedjax_proj.training.metrics import to_python
from fedjax_proj.training.session import RunIO, finish, open_session, run_io


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


class TaskSchedule(NamedTuple):
  """The tasks of a continual run, as rounds of one round loop, and each task's client layout.

  Attributes:
    rounds: rounds of each task (its length is the number of tasks); rounds are numbered across
      tasks, so round ``r`` of the run is a pure function of (seed, r) as in any run.
    num_clients: clients holding each task's data.
    clients_per_round: clients sampled per round.
    batch_size: local batch size.
    local_epochs: local epochs per round.
    iid: IID split of each task's data, else 2 label-sorted shards per client.
    end_task_batch_size: batch size of the end-of-task pass (0: ``batch_size``).
  """

  rounds: tuple[int, ...]
  num_clients: int
  clients_per_round: int
  batch_size: int
  local_epochs: int = 1
  iid: bool = True
  end_task_batch_size: int = 0

  def task_of(self, r: int) -> tuple[int, int]:
    """(task, round within the task) of round ``r`` of the run (both 0-based)."""
    for t, n in enumerate(self.rounds):
      if r < n:
        return t, r
      r -= n
    raise IndexError(f"round {r} is past the last task")

  def ends_task(self, done: int) -> bool:
    """Whether the run's ``done``-th round is the last of a task."""
    return done in np.cumsum(self.rounds)

  def where(self, done: int) -> str:
    t, r = self.task_of(done - 1)
    end = ", with its end-of-task pass" if r + 1 == self.rounds[t] else ""
    return f" (task {t + 1}/{len(self.rounds)}, round {r + 1}/{self.rounds[t]} of the task{end})"


def _task_hooks(
  method: ContinualFamily, round_fn, bench, evaluate, schedule, seed, eval_every, run
):
  """The continual run's :class:`~fedjax_proj.training.loop.Hooks`: a round of the current task;
  after the last round of a task, the method's end-of-task hook on ALL clients' task data and
  the accuracy matrix's column of that task."""
  algorithm, seed_key = method.algorithm, jax.random.key(seed)
  images, labels = to_device((bench.images, bench.labels))
  parts = functools.cache(
    lambda t: task_partition(bench, t, schedule.num_clients, iid=schedule.iid, seed=seed)
  )

  def test_acc(state, i):
    idx = bench.tasks[i].test_idx
    return evaluate(
      algorithm.global_variables(state), bench.test_images[idx], bench.test_labels[idx], i
    )

  def step(state, r):
    t, local = schedule.task_of(r)
    fed = FederatedData(parts(t), schedule.batch_size, schedule.local_epochs)
    sampled = fed.sample_clients(r, schedule.clients_per_round, seed)
    rd = task_round_data(images, labels, fed, sampled, r, seed, t)
    state, metrics = round_fn(state, rd, random_lib.round_key(seed_key, r))
    return state, {"task": t, "task_round": local + 1, **metrics}

  def after(state, r, record, carry):
    t, local = schedule.task_of(r)
    carry["train_seconds"] += record["round_seconds"]
    if local + 1 < schedule.rounds[t]:
      if eval_every and (local + 1) % eval_every == 0:
        record["current_task_accuracy"] = test_acc(state, t)
      return state, []
    end = {}
    if method.end_task is not None:
      t0 = time.perf_counter()
      fed_all = FederatedData(parts(t), schedule.end_task_batch_size or schedule.batch_size, 1)
      all_clients = np.arange(schedule.num_clients, dtype=np.int32)
      rd_all = task_round_data(images, labels, fed_all, all_clients, 10**6 + t, seed, t)
      key = random_lib.stream_key(random_lib.round_key(seed_key, t), "end_task")
      state, end = method.end_task(state, rd_all, key, t)
      end = {**to_python(end), "end_task_seconds": time.perf_counter() - t0}
      carry["end_task_seconds"] += end["end_task_seconds"]
    for i in range(t + 1):
      carry["acc_matrix"][i][t] = test_acc(state, i)
    return state, [
      {"task_end": t, "accuracies": [row[t] for row in carry["acc_matrix"][: t + 1]], **end}
    ]

  def line(record, plain):
    if not run.progress:
      return None
    if "task_end" in record:
      accs = record["accuracies"]
      mean = f" mean={np.mean(accs):.4f}"
      return (
        f"end of task {record['task_end'] + 1}: accuracies "
        + " ".join(f"{a:.4f}" for a in accs)
        + mean
      )
    t = record["task"]
    acc = f" acc={record['current_task_accuracy']:.4f}" if "current_task_accuracy" in record else ""
    return (
      f"task {t + 1}/{len(schedule.rounds)} round {record['task_round']}/{schedule.rounds[t]} "
      f"loss={record.get('train_loss') or float('nan'):.4f}{acc} ({record['round_seconds']:.1f}s)"
    )

  return Hooks(step, after, line, schedule.ends_task, schedule.where)


def train_continual(
  method: ContinualFamily,
  round_fn: Callable,
  bench: ContinualBenchmark,
  evaluate: Callable,
  init_variables: dict,
  schedule: TaskSchedule,
  *,
  seed: int,
  eval_every: int = 0,
  summary_extra: dict | None = None,
  run: RunIO | None = None,
) -> tuple[object, dict]:
  """Runs the task sequence on the round loop; returns (final state, summary with ``acc``,
  ``fgt``, ``acc_matrix``), from the newest checkpoint when ``run.resume``.

  A checkpoint holds the method's whole state (FOT's and GPM's bases, EWC's Fishers and anchor,
  ER's buffer) and the carry (the accuracy matrix so far), so a resumed run, mid-task or at a
  task's end, equals the uninterrupted one bit for bit.

  Args:
    method: the continual method (round algorithm + end-of-task hook).
    round_fn: its compiled round (:func:`fedjax_proj.algorithms.base.make_round`, on the executor
      the method was built with).
    bench: the benchmark (its first ``len(schedule.rounds)`` tasks run).
    evaluate: from :func:`make_task_evaluator`.
    init_variables: initial global model.
    schedule: the tasks' rounds and client layout (:class:`TaskSchedule`).
    seed: run seed.
    eval_every: also evaluate the current task every k rounds (0: only at task ends).
    summary_extra: extra summary fields.
    run: files, checkpoints, resume and signals (:class:`~fedjax_proj.training.session.RunIO`;
      ``metrics.jsonl`` has one line per round and per task end).
  """
  run, k = run or RunIO(), len(schedule.rounds)
  if not 1 <= k <= bench.num_tasks or min(schedule.rounds) < 1:
    raise ValueError(
      f"num_tasks must be in [1, {bench.num_tasks}] with >= 1 round each, got rounds per task "
      f"{list(schedule.rounds)}"
    )
  algorithm, total = method.algorithm, sum(schedule.rounds)
  state = algorithm.init(init_variables, random_lib.stream_key(jax.random.key(seed), "init"))
  carry = {
    "acc_matrix": [[None] * k for _ in range(k)],
    "train_seconds": 0.0,
    "end_task_seconds": 0.0,
  }
  state, start, carry = open_session(state, run, total, carry)
  hooks = _task_hooks(method, round_fn, bench, evaluate, schedule, seed, eval_every, run)
  state, carry = run_rounds(state, algorithm, hooks, run, start=start, rounds=total, carry=carry)
  acc_value, fgt_value = acc_fgt(np.nan_to_num(np.array(carry["acc_matrix"], np.float64)))
  summary = {
    "method": algorithm.name,
    "acc": acc_value,
    "fgt": fgt_value,
    "acc_matrix": carry["acc_matrix"],
    "num_tasks": k,
    "rounds_per_task": list(schedule.rounds),
    **{f: carry[f] for f in ("wall_seconds", "train_seconds", "end_task_seconds")},
    "resumed_from_round": start,  # 0: one uninterrupted session (as training/loop.py's train)
    **(summary_extra or {}),
  }
  finish(state, run, algorithm.global_variables, summary)
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
  ``metrics.jsonl``, ``summary.json`` (``acc``, ``fgt``, ``acc_matrix``), ``final_variables.npz``
  and ``checkpoints/`` to ``c.output_dir``, holding it as every run does
  (:func:`fedjax_proj.training.rundir.held`): a directory that already holds a run is refused
  unless ``c.overwrite`` (replace it) or ``c.resume`` (continue it from its newest checkpoint).
  """
  if not c.output_dir:
    return _run_continual(c, bench, model, log, shared_head)
  # A continual run's tasks are fixed by its config: a finished one cannot be extended.
  resume, overwrite = c.get("resume", False), c.get("overwrite", False)
  with rundir.held(c.output_dir, resume=resume, overwrite=overwrite, extend=None):
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
  schedule = TaskSchedule(
    tuple(rounds),
    c.num_clients,
    c.clients_per_round,
    c.batch_size,
    c.local_epochs,
    c.iid,
    c.get("end_task_batch_size", 0),
  )
  _, summary = train_continual(
    method,
    round_fn,
    bench,
    make_task_evaluator(model, normalize, c.eval_batch_size),
    variables,
    schedule,
    seed=c.seed,
    eval_every=c.eval_every,
    summary_extra={
      "strategy": executor.strategy,
      "config": c.to_dict(),
      "acc_matrix_layout": "acc_matrix[i][t] = accuracy on task i after task t",
    },
    run=run_io(c, c.output_dir or None),
  )
  log(
    f"ACC={summary['acc']:.4f} FGT={summary['fgt']:.4f} wall_seconds={summary['wall_seconds']:.1f}"
  )
  return summary
