"""ER+FL: experience replay from per-client buffers inside FedAvg.

Compared with FOT in Bakman et al., "Federated Orthogonal Training" (ICLR 2024), section 5
(paper 003; docs/methods.md "FOT"): each centralised continual-learning method runs on every
client inside FedAvg (:mod:`fedjax_proj.algorithms.continual.base`).

* ER+FL (Chaudhry et al., 2019): each client keeps ``buffer_per_task`` examples of every past task
  it held (indices into the data store, per-client state [num_clients, T, P]). Each local step
  draws a replay sample of up to B stored examples (B the local batch size; all of them when the
  memory holds fewer), uniformly without replacement, and minimises the mean CE over the union of
  the batch and that sample, every stored example through its own task's head: Chaudhry et al.'s
  SGD step on B ∪ B_M, and 003 F.2's "local training with stored samples and new tasks' samples
  together", whose loss is "equally contributed". F.4 stores 125 examples among all 125 PMNIST
  clients (50 among 50 for CIFAR100): one per client per task (docs/fot.md, "Paper settings").

A replayed example weighs exactly as much as a current one. An earlier version added the replay
sample's mean CE at the weight of the whole batch; with one stored example per task that gave a
single example B times a current one's weight, and at the cpu budget's SGD lr 0.05 on standardised
PMNIST one such step moved the logits by about lr·‖x‖² ≈ 40, which diverged by the second round of
task 2 (docs/fot.md, "ER's replay weight").
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax

from fedjax_proj.algorithms import client as client_lib
from fedjax_proj.algorithms.continual.base import ContinualMethod, task_algorithm, task_forward
from fedjax_proj.algorithms.registry import factory_spec
from fedjax_proj.core import tree as tree_lib
from fedjax_proj.core.executor import Executor
from fedjax_proj.core.types import Array, Model

# How a replay step weighs its examples (:func:`union_replay_loss`).
REPLAY_WEIGHTINGS = ("uniform", "gradient_compensation")


def compensation_weights(ce: Array, mask: Array) -> Array:
  """GLFC's class-aware gradient compensation weights of one group of examples (a constant).

  |∇_i| = 1 − p_i(y_i) = 1 − exp(−CE_i) is the size of the CE gradient at example i's true-class
  logit; the weight is |∇_i| over the group's mean of it (Dong et al., CVPR 2022, L_GC), so the
  group's weights average 1 and its larger-gradient examples weigh more. A group whose mean is 0
  (no example, or all fitted exactly) keeps weight 1.
  """
  g = jax.lax.stop_gradient(1.0 - jnp.exp(-ce)) * mask
  mean = jnp.sum(g) / jnp.maximum(jnp.sum(mask), 1.0)
  return jnp.where(mean > 0, g / jnp.where(mean > 0, mean, 1.0), 1.0)


def union_replay_loss(
  model: Model, replay_batch: int | None = None, weighting: str = "uniform"
) -> Callable:
  """ER's step loss: mean CE over the local batch together with a sample of the client's memory.

  Args:
    model: the task-conditioned model (``apply(..., task=t)``).
    replay_batch: how many stored examples one step replays, drawn uniformly without replacement
      among the stored ones (Gumbel top-k); None: the local batch size, as Chaudhry et al.'s
      |B_M| = |B|. A memory with fewer examples is replayed whole.
    weighting: "uniform" (ER: every example alike) or "gradient_compensation" (GLFC+FL, glfc.py:
      from the second task on, each example's CE times :func:`compensation_weights` within its
      group, the current batch and the replayed sample).

  Returns:
    ``loss_fn(params, batch, ctx)`` for :func:`client_lib.local_training_client`; ``ctx.extra``
    holds the client's memory ``x`` [T, P, ...], ``y`` [T, P], ``mask`` [T, P] (1 = stored).
  """

  if weighting not in REPLAY_WEIGHTINGS:
    raise ValueError(f"unknown replay weighting {weighting!r}; choose one of {REPLAY_WEIGHTINGS}")

  def loss_fn(params, batch, ctx):
    task = ctx.shared["task"]
    out = task_forward(
      model, params, ctx.model_state, batch.x, task, train=True, key=ctx.key, mask=batch.mask
    )
    m_b = jnp.ones(batch.y.shape, jnp.float32) if batch.mask is None else batch.mask
    ce_b = optax.softmax_cross_entropy_with_integer_labels(out.logits.astype(jnp.float32), batch.y)
    memory = ctx.extra
    num_tasks, per_task = memory["mask"].shape
    k = min(replay_batch or batch.y.shape[0], num_tasks * per_task)
    stored = memory["mask"].reshape(-1) > 0
    scores = jnp.where(
      stored, jax.random.gumbel(jax.random.fold_in(ctx.key, 7), stored.shape), -jnp.inf
    )
    top, where = jax.lax.top_k(scores, k)
    chosen = jnp.zeros(stored.shape, jnp.float32).at[where].set(jnp.isfinite(top))
    chosen = chosen.reshape(num_tasks, per_task)

    def task_sum(x, y, m, t, key):  # one past task's chosen examples, through that task's head
      # A task with none chosen still runs on a full mask, so batch-dependent layers see finite
      # statistics; its examples are weighted 0 below.
      fwd_mask = jnp.where(m.any(), m, jnp.ones_like(m))
      o = task_forward(model, params, ctx.model_state, x, t, train=True, key=key, mask=fwd_mask)
      ce = optax.softmax_cross_entropy_with_integer_labels(o.logits.astype(jnp.float32), y)
      return jnp.where(m > 0, ce, 0.0)

    keys = jax.random.split(jax.random.fold_in(ctx.key, 8), num_tasks)
    ce_r = jax.vmap(task_sum)(memory["x"], memory["y"], chosen, jnp.arange(num_tasks), keys)
    if weighting == "gradient_compensation":
      # From the second task on, as GLFC's code weighs only once classes have been learned
      # (its efficient_old_class_weight); the first task keeps weight 1.
      later = task > 0
      ce_b = ce_b * jnp.where(later, compensation_weights(ce_b, m_b), 1.0)
      ce_r = ce_r * jnp.where(later, compensation_weights(ce_r, chosen), 1.0)
    replay_sum = ce_r.sum(-1).sum()
    count = jnp.sum(m_b) + jnp.sum(chosen)
    loss = (jnp.sum(ce_b * m_b) + replay_sum) / jnp.maximum(count, 1.0)
    return loss, client_lib.LossAux(out.logits, out.state)

  return loss_fn


def er(
  model: Model,
  optimizer: optax.GradientTransformation,
  executor: Executor,
  *,
  num_clients: int,
  num_tasks: int,
  buffer_per_task: int = 1,
  replay_batch: int | None = None,
) -> ContinualMethod:
  """ER+FL with per-client replay buffers (see the module docstring)."""
  loss = union_replay_loss(model, replay_batch)
  return replay_method(
    "er", model, optimizer, executor, loss, num_clients, num_tasks, buffer_per_task
  )


def replay_method(
  name: str,
  model: Model,
  optimizer: optax.GradientTransformation,
  executor: Executor,
  loss: Callable,
  num_clients: int,
  num_tasks: int,
  buffer_per_task: int,
) -> ContinualMethod:
  """A FedAvg method whose clients keep ER's per-task buffers and train on ``loss`` (ER's
  :func:`union_replay_loss`, or GLFC+FL's weighting of it)."""
  p = buffer_per_task
  program = client_lib.local_training_client(
    model, optimizer, loss, init_extra=lambda sh, ci, k: ci
  )

  def init_method(variables):
    return {
      "idx": jnp.zeros((num_clients, num_tasks, p), jnp.int32),
      "mask": jnp.zeros((num_clients, num_tasks, p), jnp.float32),
    }

  def broadcast_extra(state, rd, key):
    idx = tree_lib.index_clients(state.method["idx"], rd.client_ids)  # [C, T, P]
    mask = tree_lib.index_clients(state.method["mask"], rd.client_ids)
    c = idx.shape[0]
    b = executor.batch_fn(rd.images, rd.labels, idx.reshape(-1), mask.reshape(-1), key)
    x = b.x.reshape(c, num_tasks, p, *b.x.shape[1:])
    return {}, {"x": x, "y": b.y.reshape(c, num_tasks, p), "mask": mask}

  def end_task(state, rd, key, task):  # a host-side buffer update, no client pass
    idx = np.asarray(rd.idx).reshape(rd.idx.shape[0], -1)
    mask = np.asarray(rd.mask).reshape(rd.idx.shape[0], -1)
    rng = np.random.default_rng(np.asarray(jax.random.key_data(key)).ravel()[-1])
    new_idx = np.zeros((idx.shape[0], p), np.int32)
    new_mask = np.zeros((idx.shape[0], p), np.float32)
    for c in range(idx.shape[0]):
      own = idx[c][mask[c]]
      pick = rng.choice(own, min(p, len(own)), replace=False)
      new_idx[c, : len(pick)] = pick
      new_mask[c, : len(pick)] = 1.0
    ids = jnp.asarray(rd.client_ids)
    method = {
      "idx": state.method["idx"].at[ids, task].set(jnp.asarray(new_idx)),
      "mask": state.method["mask"].at[ids, task].set(jnp.asarray(new_mask)),
    }
    return state._replace(method=method), {"buffer_examples": float(new_mask.sum())}

  algorithm = task_algorithm(name, init_method, broadcast_extra, program)
  return ContinualMethod(algorithm, end_task)


SPEC = factory_spec(
  "er",
  "continual",
  er,
  ctx_args=("model", "client_optimizer", "executor"),
  ctx_kwargs=("num_clients", "num_tasks"),
  requires=("executor",),
)
