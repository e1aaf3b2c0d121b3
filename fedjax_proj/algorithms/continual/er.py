"""ER+FL: experience replay from per-client buffers inside FedAvg.

Compared with FOT in Bakman et al., "Federated Orthogonal Training" (ICLR 2024), section 5
(paper 003; docs/methods.md "FOT"): each centralised continual-learning method runs on every
client inside FedAvg (:mod:`fedjax_proj.algorithms.continual.base`).

* ER+FL (Chaudhry et al., 2019): each client keeps ``buffer_per_task`` examples of every past task
  it held (indices into the data store, per-client state [num_clients, T, P]); each local step adds
  the CE of the replay examples of one past task drawn uniformly (with that task's head). F.4
  stores 125 examples among all 125 PMNIST clients (50 among 50 for CIFAR100): one per client per
  task (docs/fot.md, "Paper settings").
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax

from fedjax_proj.algorithms import client as client_lib
from fedjax_proj.algorithms import losses
from fedjax_proj.algorithms.continual.base import (
  ContinualMethod,
  task_algorithm,
  task_forward,
  task_loss,
)
from fedjax_proj.algorithms.registry import BuildContext, MethodSpec
from fedjax_proj.core import tree as tree_lib
from fedjax_proj.core.engine import BatchFn
from fedjax_proj.core.types import Model


def er(
  model: Model,
  optimizer: optax.GradientTransformation,
  batch_fn: BatchFn,
  *,
  num_clients: int,
  num_tasks: int,
  buffer_per_task: int = 1,
  replay_weight: float = 1.0,
) -> ContinualMethod:
  """ER+FL with per-client replay buffers (see the module docstring)."""
  p = buffer_per_task

  def replay_loss(params, ctx):
    buf = ctx.extra
    valid = jnp.any(buf["mask"] > 0, axis=-1)  # [T]
    logits = jnp.where(valid, 0.0, -jnp.inf)
    tau = jax.random.categorical(
      jax.random.fold_in(ctx.key, 7), jnp.where(valid.any(), logits, 0.0)
    )
    x, y, m = buf["x"][tau], buf["y"][tau], buf["mask"][tau]
    out = task_forward(model, params, ctx.model_state, x, tau, train=True, key=ctx.key, mask=m)
    return replay_weight * losses.cross_entropy(out.logits, y, m) * valid.any()

  program = client_lib.local_training_client(
    model, optimizer, task_loss(model, replay_loss), init_extra=lambda sh, ci, k: ci
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
    b = batch_fn(rd.images, rd.labels, idx.reshape(-1), mask.reshape(-1), key)
    x = b.x.reshape(c, num_tasks, p, *b.x.shape[1:])
    return {}, {"x": x, "y": b.y.reshape(c, num_tasks, p), "mask": mask}

  def end_task(state, rd, key, task, strategy):
    del strategy  # a host-side buffer update, no client pass
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

  algorithm = task_algorithm("er", init_method, broadcast_extra, program, batch_fn)
  return ContinualMethod(algorithm, end_task)


def _build_er(ctx: BuildContext, **hparams) -> ContinualMethod:
  return er(
    ctx.model,
    ctx.client_optimizer,
    ctx.batch_fn,
    num_clients=ctx.num_clients,
    num_tasks=ctx.num_tasks,
    **hparams,
  )


SPEC = MethodSpec("er", "continual", _build_er)
