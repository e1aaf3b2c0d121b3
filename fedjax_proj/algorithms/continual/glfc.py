"""GLFC+FL: GLFC reduced to the task-incremental setting, as 003 F.2 adapts it.

Compared with FOT in Bakman et al., "Federated Orthogonal Training" (ICLR 2024), Table 1 (paper
003; docs/methods.md "Continual baselines").

* GLFC (Dong et al., "Federated Class-Incremental Learning", CVPR 2022) has three parts; 003 F.2
  keeps the first and drops the other two ("2 is not proper for task-continual setting and 3
  assumes there is an additional server"): clients "store some old tasks data and during the
  training of new tasks, old samples are also used with a normalization factor. This is very
  similar to ER ... with normalization difference." So each client keeps ER's buffer
  (``buffer_per_task`` examples of every past task it held; F.4 stores as many as for ER: 125
  among the PMNIST clients, 50 among the CIFAR100 ones, one per client per task) and replays it
  as ER+FL does (:mod:`.er`); the normalisation is GLFC's class-aware gradient compensation: each
  example's CE is weighted by |∇_i| / mean |∇| over its group, with |∇_i| = 1 − p_i(y_i) the CE
  gradient at its true-class logit (a constant) and the groups the current task's batch ("new
  classes") and the replayed examples ("old classes"; in the task-incremental setting every old
  class belongs to an old task), from the second task on (the first weighs every example 1, as
  GLFC's code, conditionWang/FCIL ``efficient_old_class_weight``, does before any class is
  learned). docs/fot.md, "GLFC+FL", gives the readings taken.
"""

from __future__ import annotations

import optax

from fedjax_proj.algorithms.continual.base import ContinualMethod
from fedjax_proj.algorithms.continual.er import replay_method, union_replay_loss
from fedjax_proj.algorithms.registry import factory_spec
from fedjax_proj.core.executor import Executor
from fedjax_proj.core.types import Model


def glfc(
  model: Model,
  optimizer: optax.GradientTransformation,
  executor: Executor,
  *,
  num_clients: int,
  num_tasks: int,
  buffer_per_task: int = 1,
  replay_batch: int | None = None,
) -> ContinualMethod:
  """GLFC+FL (see the module docstring).

  Args:
    model: a multi-head model.
    optimizer: client optimiser.
    executor: the run's executor (its batch builder lays out the stored examples).
    num_clients: clients holding data (the per-client buffers' leading axis).
    num_tasks: tasks of the benchmark (the buffers' second axis).
    buffer_per_task: examples each client stores of each task (F.4: 1).
    replay_batch: stored examples one step replays (None: the local batch size), as ER's.

  Returns:
    The :class:`ContinualMethod`.
  """
  loss = union_replay_loss(model, replay_batch, weighting="gradient_compensation")
  return replay_method(
    "glfc", model, optimizer, executor, loss, num_clients, num_tasks, buffer_per_task
  )


SPEC = factory_spec(
  "glfc",
  "continual",
  glfc,
  ctx_args=("model", "client_optimizer", "executor"),
  ctx_kwargs=("num_clients", "num_tasks"),
  requires=("executor",),
)
