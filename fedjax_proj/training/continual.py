"""The continual run: the task loop and the config-driven experiment around it.

The continual twin of the one-task path (docs/design.md, "The round loop"): what a user calls is
:func:`run_continual_experiment` (config ``c`` -> summary, as
:func:`fedjax_proj.training.experiment.run_experiment`), which sets the run up with the steps every
run shares (:mod:`fedjax_proj.training.setup`: the run directory, the model, the executor and its
chunk, the header line) and drives :func:`train_continual`, the task loop (as
:func:`fedjax_proj.training.loop.train`) on the round loop. The per-task rounds, the schedule and
ACC/FGT are the runner's, :mod:`fedjax_proj.training.task_rounds` (setting of FOT, Bakman et al.,
ICLR 2024; docs/fot.md).
"""

from __future__ import annotations

import sys
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_proj.algorithms.continual.base import ContinualMethod
from fedjax_proj.algorithms.families import ContinualFamily
from fedjax_proj.core import random as random_lib
from fedjax_proj.core.executor import Executor
from fedjax_proj.core.types import Model
from fedjax_proj.data.continual import ContinualBenchmark, heterogeneous_num_clients
from fedjax_proj.training import fields as fields_lib
from fedjax_proj.training import setup
from fedjax_proj.training.loop import run_rounds
from fedjax_proj.training.session import RunIO, finish, open_session, run_io
from fedjax_proj.training.task_rounds import (
  TaskSchedule,
  acc_fgt,
  make_task_evaluator,
  single_task_acc,
  single_task_key,
  task_hooks,
  task_round_data,
)

# The runner's names, importable from here as before the split (tests, benchmarks, docs).
__all__ = [
  "TaskSchedule",
  "acc_fgt",
  "build_continual_method",
  "make_task_evaluator",
  "rounds_schedule",
  "run_continual_experiment",
  "single_task_acc",
  "single_task_key",
  "task_round_data",
  "train_continual",
]


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
  fresh_variables: Callable[[int], dict] | None = None,
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
    evaluate: from :func:`~fedjax_proj.training.task_rounds.make_task_evaluator`.
    init_variables: initial global model.
    schedule: the tasks' rounds and client layout
      (:class:`~fedjax_proj.training.task_rounds.TaskSchedule`).
    seed: run seed.
    eval_every: also evaluate the current task every k rounds (0: only at task ends).
    summary_extra: extra summary fields.
    run: files, checkpoints, resume and signals (:class:`~fedjax_proj.training.session.RunIO`;
      ``metrics.jsonl`` has one line per round and per task end).
    fresh_variables: ``schedule.single_task`` only: task t's fresh model (t > 0; 003 Table 11).
      The summary's ``acc`` is then the mean of a[t, t] and ``fgt`` is None (not applicable).
  """
  run, k = run or RunIO(), len(schedule.rounds)
  if not 1 <= k <= bench.num_tasks or min(schedule.rounds) < 1:
    raise ValueError(
      f"num_tasks must be in [1, {bench.num_tasks}] with >= 1 round each, got rounds per task "
      f"{list(schedule.rounds)}"
    )
  algorithm, total = method.algorithm, sum(schedule.rounds)
  if schedule.single_task and algorithm.name != "fl":
    raise ValueError(
      f"single_task trains each task's own model with plain FL (003 Table 11); method "
      f"{algorithm.name!r} carries state between tasks: use the fl method"
    )
  state = algorithm.init(init_variables, random_lib.stream_key(jax.random.key(seed), "init"))
  carry = {
    "acc_matrix": [[None] * k for _ in range(k)],
    "train_seconds": 0.0,
    "end_task_seconds": 0.0,
  }
  state, start, carry = open_session(state, run, total, carry)
  hooks = task_hooks(
    method, round_fn, bench, evaluate, schedule, seed, eval_every, run, fresh_variables
  )
  state, carry = run_rounds(state, algorithm, hooks, run, start=start, rounds=total, carry=carry)
  matrix = np.nan_to_num(np.array(carry["acc_matrix"], np.float64))
  if schedule.single_task:  # one model per task: no task is revisited, so no forgetting
    acc_value, fgt_value = single_task_acc(matrix), None
  else:
    acc_value, fgt_value = acc_fgt(matrix)
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


def rounds_schedule(
  method: str,
  rounds_per_task: int,
  num_tasks: int,
  fl_later_rounds: int = 0,
  single_task: bool = False,
):
  """Rounds of each task: ``rounds_per_task`` each, except FL with ``fl_later_rounds`` > 0.

  FOT paper F.4: "we run vanilla FL for 1100 rounds in total, where first task is run for 200 and
  the others for 100 rounds. All of the other methods' total communication round is set to 2000,
  divided equally to the tasks" (PMNIST). A single-task run (003 Table 11) trains every task from
  a fresh model, as FL's first: ``rounds_per_task`` each (our reading; docs/fot.md).
  """
  if method == "fl" and fl_later_rounds > 0 and not single_task:
    return [rounds_per_task] + [fl_later_rounds] * (num_tasks - 1)
  return [rounds_per_task] * num_tasks


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
  # Resolved once: what the run reads (the shared fields a continual config lacks at their
  # defaults, every field parsed); ``c`` stays what it records.
  s = fields_lib.resolve(c)
  if not c.output_dir:
    return _run_continual(c, s, bench, model, log, shared_head)
  # A continual run's tasks are fixed by its config: a finished one cannot be extended.
  with setup.held(s, c.output_dir, extend=None):
    return _run_continual(c, s, bench, model, log, shared_head)


def _run_continual(
  c, s: fields_lib.Config, bench: ContinualBenchmark, model: Model, log, shared_head: bool
) -> dict:
  from fedjax_proj.data import pipeline
  from fedjax_proj.data.continual import input_transform, task_model
  from fedjax_proj.training.optimizers import make_optimizer
  from fedjax_proj.training.placement import build_round

  model = task_model(model, input_transform(bench), shared_head=shared_head)
  normalize = pipeline.normalizer_for(bench.normalizer_name, bench.images)
  batch_fn = pipeline.make_batch_fn(normalize, augment=False)
  sample = normalize(jnp.asarray(bench.images[:2]))
  # The task driver does not place its rounds' inputs on devices: no sharding.
  variables, executor = setup.init_and_plan(s, model, sample, batch_fn, log, shard=False)
  # SGD with L2 weight decay added to the gradient, as torch's SGD (the authors' trainers).
  optimizer = make_optimizer("sgd", c.lr, c.momentum, c.get("weight_decay", 0.0))
  num_tasks = c.num_tasks or bench.num_tasks
  single_task = bool(c.get("single_task", False))
  rounds = rounds_schedule(
    c.method, c.rounds_per_task, num_tasks, c.get("fl_later_rounds", 0), single_task
  )
  layout = client_layout(c)
  method = build_continual_method(
    c.method,
    model,
    optimizer,
    executor,
    variables=variables,
    sample_x=sample,
    num_clients=layout["population"],
    num_tasks=num_tasks,
    **dict(c.method_kwargs),
  )
  round_fn = build_round(method.algorithm, executor, log)
  fields = [f"benchmark={bench.name}", f"tasks={num_tasks}", setup.params(variables)]
  fields += [f"clients={layout['num_clients']}", f"per_round={layout['clients_per_round']}"]
  fields += [f"rounds_per_task={rounds}", f"local_epochs={c.local_epochs}"]
  # The appendix settings (docs/fot.md), named only when on: a default run's header is as before.
  if layout["population"] != layout["num_clients"]:
    fields += [f"task_fraction={c.task_fraction}", f"total_clients={layout['population']}"]
  fields += ["centralised"] * layout["centralised"] + ["single_task"] * single_task
  log(
    setup.header(c, executor, [*fields, "iid" if c.iid else "noniid", f"output_dir={c.output_dir}"])
  )
  sys.stdout.flush()
  schedule = TaskSchedule(
    tuple(rounds),
    layout["num_clients"],
    layout["clients_per_round"],
    c.batch_size,
    c.local_epochs,
    c.iid,
    c.get("end_task_batch_size", 0),
    total_clients=0 if layout["population"] == layout["num_clients"] else layout["population"],
    centralised=layout["centralised"],
    single_task=single_task,
  )
  matrix_layout = "acc_matrix[i][t] = accuracy on task i after task t"
  if single_task:
    matrix_layout += " (single task: only i = t, on task t's own model)"
  _, summary = train_continual(
    method,
    round_fn,
    bench,
    make_task_evaluator(model, normalize, c.eval_batch_size),
    variables,
    schedule,
    seed=c.seed,
    eval_every=c.eval_every,
    summary_extra=setup.summary_extra(c, executor, acc_matrix_layout=matrix_layout),
    run=run_io(c, c.output_dir or None, s),
    fresh_variables=(lambda t: model.init(single_task_key(c.seed, t), sample))
    if single_task
    else None,
  )
  fgt = "n/a (single task)" if summary["fgt"] is None else f"{summary['fgt']:.4f}"
  log(f"ACC={summary['acc']:.4f} FGT={fgt} wall_seconds={summary['wall_seconds']:.1f}")
  return summary


def client_layout(c) -> dict:
  """Who holds each task's data under config ``c``'s appendix switches (docs/fot.md, "Appendix
  settings"): ``num_clients`` (holding each task), ``clients_per_round``, ``population`` (all
  clients, the size of per-client method state) and ``centralised``.

  * ``centralised`` (003 Appendix A, Table 7): one client holding the pooled task, every round.
  * ``task_fraction`` < 1 (003 G.1, Table 10): ``num_clients`` hold each task among
    :func:`~fedjax_proj.data.continual.heterogeneous_num_clients` clients.
  * neither: ``num_clients`` clients hold every task (the main setting).
  """
  fraction = float(c.get("task_fraction", 1.0))
  if c.get("centralised", False):
    if fraction != 1.0:
      raise ValueError(
        f"--centralised pools each task on one client, so --task_fraction={fraction} (which "
        "tasks a client holds) does not apply; pass one of them"
      )
    return {"num_clients": 1, "clients_per_round": 1, "population": 1, "centralised": True}
  return {
    "num_clients": c.num_clients,
    "clients_per_round": c.clients_per_round,
    "population": heterogeneous_num_clients(c.num_clients, fraction),
    "centralised": False,
  }
