"""The per-task rounds of a continual run: its schedule, its hooks on the round loop, its metrics.

Setting of FOT (Bakman et al., ICLR 2024; paper 003, docs/fot.md): tasks arrive one after another;
during task t only its data is on the clients (:func:`fedjax_proj.data.continual.task_partition`);
each task runs ``rounds_per_task`` rounds (:class:`TaskSchedule`), then the method's end-of-task
hook (FOT's GPSE round, EWC's Fisher, ER's buffer update, GPM's local bases) on a layout of ALL
clients' task data; then the global model is evaluated on every task seen so far with that task's
head. :func:`task_hooks` puts this on the round loop (:mod:`fedjax_proj.training.loop`), which
:func:`fedjax_proj.training.continual.train_continual`, the task loop, drives.

Metrics (Lopez-Paz & Ranzato, 2017; Chaudhry et al., 2018), with a[i, t] the accuracy on task i
after training task t (K tasks):

  ACC = (1/K) Σ_i a[i, K−1],   FGT = (1/(K−1)) Σ_{i<K−1} (a[i, i] − a[i, K−1]).

Three settings of FOT's appendix are switches of :class:`TaskSchedule` (docs/fot.md, "Appendix
settings"): ``total_clients`` > ``num_clients`` (task heterogeneity, 003 G.1 / Table 10),
``centralised`` (one client holding the pooled task, 003 Appendix A / Table 7) and
``single_task`` (a fresh model per task, 003 Table 11: ACC = (1/K) Σ_t a[t, t], FGT not
applicable).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_proj.algorithms import losses
from fedjax_proj.algorithms.families import ContinualFamily
from fedjax_proj.core import random as random_lib
from fedjax_proj.core.types import Model, RoundData
from fedjax_proj.data.continual import centralised_partition, task_holders, task_partition
from fedjax_proj.data.federated import FederatedData
from fedjax_proj.training.loop import Hooks, to_device
from fedjax_proj.training.metrics import to_python


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


def single_task_acc(acc_matrix: np.ndarray) -> float:
  """003 Table 11's Single Task ACC: the mean over tasks of a[t, t], task t's accuracy on the
  model trained on task t alone ("a different model for each task"); FGT does not apply."""
  a = np.asarray(acc_matrix, np.float64)
  if a.ndim != 2 or a.shape[0] != a.shape[1] or a.shape[0] < 1:
    raise ValueError(f"accuracy matrix must be square [K, K], got shape {a.shape}")
  return float(np.mean(np.diag(a)))


def single_task_key(seed: int, task: int):
  """The key of task ``task``'s fresh model in a single-task run (003 Table 11): task 0 starts
  from the run's initial model (``jax.random.key(seed)``, as every run's,
  :func:`fedjax_proj.training.setup.init_and_plan`), task t > 0 from a named stream of the run
  key folded with t."""
  key = jax.random.key(seed)
  if task == 0:
    return key
  return random_lib.stream_key(random_lib.round_key(key, task), "single_task_init")


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
    total_clients: the client population (0: ``num_clients``). Larger: task heterogeneity (003
      G.1), each task's data held by ``num_clients`` of them
      (:func:`~fedjax_proj.data.continual.task_holders`), each round sampling
      ``clients_per_round`` among the current task's holders, per-client method state indexed
      by the population's ids.
    centralised: one client holding all of each task's data
      (:func:`~fedjax_proj.data.continual.centralised_partition`; 003 Appendix A); needs
      ``num_clients`` = ``clients_per_round`` = 1.
    single_task: a fresh model at each task's start (003 Table 11) and each task evaluated only
      on its own model, right after its training: ``acc_matrix`` holds the diagonal.
  """

  rounds: tuple[int, ...]
  num_clients: int
  clients_per_round: int
  batch_size: int
  local_epochs: int = 1
  iid: bool = True
  end_task_batch_size: int = 0
  total_clients: int = 0
  centralised: bool = False
  single_task: bool = False

  @property
  def population(self) -> int:
    """Clients in all: ``total_clients``, or ``num_clients`` when unset."""
    return self.total_clients or self.num_clients

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


def task_hooks(
  method: ContinualFamily,
  round_fn,
  bench,
  evaluate,
  schedule,
  seed,
  eval_every,
  run,
  fresh_variables: Callable[[int], dict] | None = None,
):
  """The continual run's :class:`~fedjax_proj.training.loop.Hooks`: a round of the current task;
  after the last round of a task, the method's end-of-task hook on ALL clients' task data and
  the accuracy matrix's column of that task.

  With ``schedule.single_task``, ``fresh_variables(t)`` is the model task t > 0 starts from; the
  state's ``variables`` are replaced by it before the task's first round."""
  algorithm, seed_key = method.algorithm, jax.random.key(seed)
  images, labels = to_device((bench.images, bench.labels))
  k = len(schedule.rounds)
  if schedule.centralised:
    if schedule.num_clients != 1 or schedule.clients_per_round != 1 or schedule.total_clients > 1:
      raise ValueError(
        "a centralised schedule has one client holding each task's data: set num_clients=1, "
        f"clients_per_round=1 and total_clients=0, got {schedule.num_clients}, "
        f"{schedule.clients_per_round} and {schedule.total_clients}"
      )
    parts = functools.cache(lambda t: centralised_partition(bench, t))
  else:
    parts = functools.cache(
      lambda t: task_partition(bench, t, schedule.num_clients, iid=schedule.iid, seed=seed)
    )
  if schedule.single_task and fresh_variables is None:
    raise ValueError("a single_task schedule needs fresh_variables(task) -> the task's model")
  # Task heterogeneity: part j of task t is client holders[t][j]'s; at M = N the identity.
  heterogeneous = schedule.population != schedule.num_clients
  holders = task_holders(k, schedule.num_clients, schedule.population, seed)

  def with_ids(rd, t, local_ids):
    if not heterogeneous:
      return rd
    return rd._replace(client_ids=jnp.asarray(holders[t][np.asarray(local_ids)]))

  def test_acc(state, i):
    idx = bench.tasks[i].test_idx
    return evaluate(
      algorithm.global_variables(state), bench.test_images[idx], bench.test_labels[idx], i
    )

  def step(state, r):
    t, local = schedule.task_of(r)
    if schedule.single_task and local == 0 and t > 0:
      # Table 11: every task trains its own model from a fresh initialisation. Done at the
      # task's first round, so a run resumed at a task's end re-initialises as the original.
      state = state._replace(variables=fresh_variables(t))
    fed = FederatedData(parts(t), schedule.batch_size, schedule.local_epochs)
    # Sampled among the task's holders only (G.1: "the number of clients that have data for each
    # task is the same as before", so a round trains as many clients as the main setting's).
    sampled = fed.sample_clients(r, schedule.clients_per_round, seed)
    rd = with_ids(task_round_data(images, labels, fed, sampled, r, seed, t), t, sampled)
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
      rd_all = with_ids(rd_all, t, all_clients)
      key = random_lib.stream_key(random_lib.round_key(seed_key, t), "end_task")
      state, end = method.end_task(state, rd_all, key, t)
      end = {**to_python(end), "end_task_seconds": time.perf_counter() - t0}
      carry["end_task_seconds"] += end["end_task_seconds"]
    # Single task: task t's model is evaluated on task t only (the earlier tasks' models are gone).
    seen = [t] if schedule.single_task else range(t + 1)
    for i in seen:
      carry["acc_matrix"][i][t] = test_acc(state, i)
    return state, [{"task_end": t, "accuracies": [carry["acc_matrix"][i][t] for i in seen], **end}]

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
