"""Continual-FL baselines for FOT's task-incremental setting: FL, EWC+FL, ER+FL and GPM+FL.

The comparison methods of Bakman et al., "Federated Orthogonal Training" (ICLR 2024), section 5:
each centralised continual-learning method runs on every client inside FedAvg.

* FL: FedAvg (McMahan et al., 2017) with a multi-head model; clients train the current task's head.
* EWC+FL (Kirkpatrick et al., PNAS 2017): after each task every client computes the diagonal
  empirical Fisher F_{k,t} of the global model on its task data (mean squared per-example
  gradient). With ``fisher="client"`` (the default; FOT paper F.2: "each client calculates and
  stores its own fisher information matrix and uses it in the local training process") client k
  keeps F_k ← F_k + F_{k,t} (per-client state [num_clients, ...]); with ``fisher="server"`` the
  server averages them (weights n_k) into one F shared by all. ``normalize=True`` scales each
  task's Fisher and the running sum to max 1 (so lr·λ, not the data, sets the stiffness; an
  earlier default of this project, kept as an option). The anchor θ* is the global model at the
  task's end. Local loss: CE + (λ/2) Σ F (θ − θ*)²; F.4 gives λ = 40 (PMNIST), 20 (CIFAR100).
* ER+FL (Chaudhry et al., 2019): each client keeps ``buffer_per_task`` examples of every past task
  it held (indices into the data store, per-client state [num_clients, T, P]); each local step adds
  the CE of the replay examples of one past task drawn uniformly (with that task's head). F.4
  stores 125 examples among all 125 PMNIST clients (50 among 50 for CIFAR100): one per client per
  task (docs/fot.md, "Paper settings").
* GPM+FL (Saha et al., ICLR 2021): each client keeps its OWN bases (per-client state
  [num_clients, d, d] per layer), projects its local gradients of every Dense/Conv kernel out of
  them (g ← g − U Uᵀ g), and after each task extends them from the SVD of its own residual layer
  inputs on ``gpm_samples`` examples with GPM's energy rule
  (‖X‖² − ‖R‖² + Σ_{j≤k} σ_j²) / ‖X‖² ≥ th.

A :class:`ContinualMethod` is a :class:`FederatedAlgorithm` (one training round; the current task
id arrives as ``RoundData.extra["task"]``) plus an optional host-side ``end_task`` hook run once
after each task on a layout of ALL clients' task data, with the execution strategy of the task
driver (the method never chooses one).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from fedjax_proj.algorithms import client as client_lib
from fedjax_proj.algorithms import gpse, losses
from fedjax_proj.algorithms.base import FederatedAlgorithm
from fedjax_proj.algorithms.fedavg import client_metrics
from fedjax_proj.algorithms.registry import BuildContext, MethodSpec
from fedjax_proj.core import tree as tree_lib
from fedjax_proj.core.engine import BatchFn, ClientEngine, ClientProgram
from fedjax_proj.core.types import Array, Model, PyTree, RoundData

EWC_FISHERS = ("client", "server")

# end_task(state, round_data_of_all_clients, key, task, strategy) -> (state, metrics); the task
# driver passes its resolved execution strategy for any client pass the hook runs.
EndTaskFn = Callable[[PyTree, RoundData, Array, int, str], tuple[PyTree, dict]]


class ContinualMethod(NamedTuple):
  """A continual-FL method: a round algorithm plus an optional end-of-task hook; meets
  :class:`~fedjax_proj.algorithms.families.ContinualFamily` (``"continual"``)."""

  algorithm: FederatedAlgorithm
  end_task: EndTaskFn | None = None


class ContinualState(NamedTuple):
  round: Array
  variables: dict
  method: PyTree  # method-specific server state


def task_forward(model: Model, params, model_state, x, task, *, train, key=None, mask=None):
  variables = client_lib.merge_variables(params, model_state)
  return model.apply(variables, x, train=train, rng=key, mask=mask, task=task)


def task_loss(model: Model, extra_loss: Callable | None = None) -> Callable:
  """CE on the task head ``shared["task"]`` plus an optional ``extra_loss(params, ctx)``."""

  def loss_fn(params, batch, ctx):
    task = ctx.shared["task"]
    out = task_forward(
      model, params, ctx.model_state, batch.x, task, train=True, key=ctx.key, mask=batch.mask
    )
    loss = losses.cross_entropy(out.logits, batch.y, batch.mask)
    if extra_loss is not None:
      loss = loss + extra_loss(params, ctx)
    return loss, client_lib.LossAux(out.logits, out.state)

  return loss_fn


def _task_of(rd: RoundData) -> Array:
  return jnp.asarray(rd.extra["task"], jnp.int32)


def _algorithm(name, init_method, broadcast_extra, program, batch_fn, post_avg=None):
  """A FedAvg-shaped algorithm with method state; ``post_avg`` may rewrite the average."""

  def init(variables, key):
    del key
    variables = tree_lib.tree_copy(variables)
    return ContinualState(jnp.zeros((), jnp.int32), variables, init_method(variables))

  def broadcast(state, rd, key):
    shared = {"variables": state.variables, "task": _task_of(rd)}
    client_inputs = {}
    if broadcast_extra is not None:
      more, client_inputs = broadcast_extra(state, rd, key)
      shared.update(more)
    return shared, client_inputs

  def aggregate(state, rd, outputs, key):
    del key
    averaged = tree_lib.weighted_mean(outputs["variables"], rd.num_examples)
    if post_avg is not None:
      averaged = post_avg(state, averaged)
    return ContinualState(state.round + 1, averaged, state.method), client_metrics(outputs, rd)

  return FederatedAlgorithm(name, init, broadcast, program, aggregate, batch_fn)


def fl(model: Model, optimizer: optax.GradientTransformation, batch_fn: BatchFn) -> ContinualMethod:
  """FL: FedAvg on the current task's head."""
  program = client_lib.local_training_client(model, optimizer, task_loss(model))
  return ContinualMethod(_algorithm("fl", lambda v: (), None, program, batch_fn))


def _run_all_clients(engine: ClientEngine, shared, rd: RoundData, key, client_inputs=None):
  keys = jax.random.split(key, rd.idx.shape[0])
  inputs = client_inputs if client_inputs is not None else {}
  return engine.run(shared, inputs, rd.images, rd.labels, rd.idx, rd.mask, keys)


def ewc(
  model: Model,
  optimizer: optax.GradientTransformation,
  batch_fn: BatchFn,
  *,
  num_clients: int,
  lam: float = 40.0,
  fisher: str = "client",
  normalize: bool = False,
) -> ContinualMethod:
  """EWC+FL (see the module docstring).

  Args:
    model: a multi-head model.
    optimizer: client optimiser.
    batch_fn: the engine's batch builder.
    num_clients: clients holding data (the per-client Fishers' leading axis).
    lam: regularisation coefficient λ (F.4: 40 PMNIST, 20 CIFAR100).
    fisher: "client" (each client's own accumulated Fisher, F.2) or "server" (one n_k-weighted
      average shared by all clients).
    normalize: scale each task's Fisher and the accumulated one to max 1.

  Returns:
    The :class:`ContinualMethod`.
  """
  if fisher not in EWC_FISHERS:
    raise ValueError(f"EWC fisher must be one of {EWC_FISHERS}, got {fisher!r}")
  if lam < 0:
    raise ValueError(f"EWC lam must be >= 0, got {lam}")
  per_client = fisher == "client"

  def penalty(params, ctx):
    f_tree = ctx.extra["fisher"] if per_client else ctx.shared["fisher"]
    anchor = ctx.shared["anchor"]
    terms = jax.tree.map(lambda f, p, a: jnp.sum(f * jnp.square(p - a)), f_tree, params, anchor)
    return 0.5 * lam * sum(jax.tree.leaves(terms))

  program = client_lib.local_training_client(
    model,
    optimizer,
    task_loss(model, penalty),
    init_extra=(lambda sh, ci, k: ci) if per_client else None,
  )

  def init_method(variables):
    params = variables["params"]
    if per_client:
      zeros = jax.tree.map(lambda p: jnp.zeros((num_clients, *p.shape), p.dtype), params)
    else:
      zeros = tree_lib.tree_zeros_like(params)
    # A copy: the round donates its state, and one buffer may not be donated twice.
    return {"fisher": zeros, "anchor": tree_lib.tree_copy(params)}

  def broadcast_extra(state, rd, key):
    if per_client:
      own = tree_lib.index_clients(state.method["fisher"], rd.client_ids)
      return {"anchor": state.method["anchor"]}, {"fisher": own}
    return {"fisher": state.method["fisher"], "anchor": state.method["anchor"]}, {}

  def fisher_init(shared, client_input, key):
    return (tree_lib.tree_zeros_like(shared["variables"]["params"]), jnp.zeros((), jnp.float32))

  def fisher_step(shared, state, batch, key):
    params, model_state = client_lib.split_variables(shared["variables"])

    def ce_one(p, x, y):
      out = task_forward(model, p, model_state, x[None], shared["task"], train=False)
      return losses.cross_entropy(out.logits, y[None])

    # Empirical Fisher: mean over the client's examples of the squared per-example gradient,
    # accumulated one example at a time (a vmap over examples would hold B x params gradients
    # for every client at once).
    def one(acc, xym):
      x, y, m = xym
      g = jax.grad(ce_one)(params, x, y)
      return jax.tree.map(lambda f, gi: f + m * jnp.square(gi), acc, g), None

    acc, _ = jax.lax.scan(one, state[0], (batch.x, batch.y, batch.mask))
    m = batch.mask
    return acc, state[1] + jnp.sum(m)

  fisher_program = ClientProgram(
    fisher_init,
    fisher_step,
    lambda s: {"fisher": jax.tree.map(lambda f: f / jnp.maximum(s[1], 1.0), s[0])},
  )
  engines: dict[str, ClientEngine] = {}  # one per strategy the driver asks for, built once

  def to_max_one(tree, client_axis: bool):
    # Divide by the max over every parameter (one max per client with ``client_axis``).
    leaves = jax.tree.leaves(tree)
    if client_axis:
      peak = jnp.max(jnp.stack([f.reshape(f.shape[0], -1).max(axis=1) for f in leaves]), axis=0)
      return jax.tree.map(
        lambda f: f / jnp.maximum(peak, 1e-12).reshape(-1, *(1,) * (f.ndim - 1)), tree
      )
    peak = jnp.max(jnp.stack([jnp.max(f) for f in leaves]))
    return jax.tree.map(lambda f: f / jnp.maximum(peak, 1e-12), tree)

  def norm(tree, client_axis: bool):
    return to_max_one(tree, client_axis) if normalize else tree

  def end_task(state, rd, key, task, strategy):
    if strategy not in engines:
      engines[strategy] = ClientEngine(fisher_program, batch_fn, strategy)
    shared = {"variables": state.variables, "task": jnp.int32(task)}
    out = _run_all_clients(engines[strategy], shared, rd, key)
    if per_client:
      f_t = norm(out["fisher"], True)  # [clients of rd, ...]
      ids = jnp.asarray(rd.client_ids)
      fisher = jax.tree.map(lambda f, g: f.at[ids].add(g), state.method["fisher"], f_t)
      fisher = norm(fisher, True)
      summary = tree_lib.weighted_mean(f_t, rd.num_examples)
    else:
      f_t = tree_lib.weighted_mean(out["fisher"], rd.num_examples)
      f_t = norm(f_t, False)
      fisher = norm(tree_lib.tree_add(state.method["fisher"], f_t), False)
      summary = f_t
    method = {"fisher": fisher, "anchor": tree_lib.tree_copy(state.variables["params"])}
    return state._replace(method=method), {"fisher_mean": float(tree_lib.tree_norm(summary))}

  algorithm = _algorithm("ewc", init_method, broadcast_extra, program, batch_fn)
  return ContinualMethod(algorithm, end_task)


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

  algorithm = _algorithm("er", init_method, broadcast_extra, program, batch_fn)
  return ContinualMethod(algorithm, end_task)


def gpm(
  model: Model,
  optimizer: optax.GradientTransformation,
  batch_fn: BatchFn,
  *,
  variables: dict,
  sample_x: Array,
  num_clients: int,
  threshold: float = 0.97,
  threshold_inc: float = 0.0,
  gpm_samples: int = 125,
) -> ContinualMethod:
  """GPM+FL: local gradient projection memory on every client (see the module docstring)."""
  specs = gpse.find_layers(model, variables, sample_x, task=0)

  def transform_grads(grads, params, batch, ctx):
    return gpse.fed_project(grads, specs, ctx.extra), ctx.extra

  program = client_lib.local_training_client(
    model,
    optimizer,
    task_loss(model),
    init_extra=lambda sh, ci, k: ci,
    transform_grads=transform_grads,
  )

  def init_method(v):
    return {s.key: jnp.zeros((num_clients, s.in_dim, s.in_dim), jnp.float32) for s in specs}

  def broadcast_extra(state, rd, key):
    return {}, tree_lib.index_clients(state.method, rd.client_ids)

  @jax.jit
  def client_rows(variables, images, labels, idx, mask, task):
    b = batch_fn(images, labels, idx, mask, jax.random.key(0))
    _, cap = gpse.capture_inputs(model, variables, b.x, mask=b.mask, task=task)
    return {s.key: gpse.input_rows(s, cap[s.path][1].astype(jnp.float32), b.mask) for s in specs}

  def end_task(state, rd, key, task, strategy):
    del strategy  # one jitted forward per client, whatever the round's strategy
    # Hundreds of small per-client SVDs: single-threaded BLAS (see gpse.blas_threads).
    with gpse.blas_threads(1):
      return _end_task(state, rd, key, task)

  def _end_task(state, rd, key, task):
    th = threshold + threshold_inc * task
    idx = np.asarray(rd.idx).reshape(rd.idx.shape[0], -1)
    mask = np.asarray(rd.mask).reshape(rd.idx.shape[0], -1)
    ids = np.asarray(rd.client_ids)
    bases = {k: np.array(v) for k, v in state.method.items()}
    ranks = {s.key: [] for s in specs}
    for c in range(idx.shape[0]):
      own = idx[c][mask[c]][:gpm_samples]
      sel = np.zeros(gpm_samples, np.int32)
      m = np.zeros(gpm_samples, bool)
      sel[: len(own)], m[: len(own)] = own, True
      rows = client_rows(state.variables, rd.images, rd.labels, sel, m, jnp.int32(task))
      for s in specs:
        x = np.asarray(rows[s.key], np.float64)
        u_old = bases[s.key][ids[c]]
        rank = int(np.sum(np.linalg.norm(u_old, axis=0) > 0.5))
        r = gpse.residual(x, u_old)
        total, res = float(np.sum(x * x)), float(np.sum(r * r))
        if total <= 0 or rank >= s.in_dim:
          ranks[s.key].append(rank)
          continue
        u, sv, _ = np.linalg.svd(r.T, full_matrices=False)
        frac = (total - res + np.cumsum(sv**2)) / total
        k = int(np.flatnonzero(frac >= th)[0]) + 1 if np.any(frac >= th) else len(sv)
        if total - res >= th * total:
          k = 0
        new, new_rank = gpse.expand_basis(u_old, rank, u[:, :k])
        bases[s.key][ids[c]] = new
        ranks[s.key].append(new_rank)
    method = {k: jnp.asarray(v) for k, v in bases.items()}
    metrics = {f"mean_rank/{k}": float(np.mean(v)) for k, v in ranks.items()}
    return state._replace(method=method), metrics

  algorithm = _algorithm("gpm", init_method, broadcast_extra, program, batch_fn)
  return ContinualMethod(algorithm, end_task)


def _build_fl(ctx: BuildContext, **hparams) -> ContinualMethod:
  return fl(ctx.model, ctx.client_optimizer, ctx.batch_fn, **hparams)


def _build_ewc(ctx: BuildContext, **hparams) -> ContinualMethod:
  return ewc(
    ctx.model,
    ctx.client_optimizer,
    ctx.batch_fn,
    num_clients=ctx.num_clients,
    **hparams,
  )


def _build_er(ctx: BuildContext, **hparams) -> ContinualMethod:
  return er(
    ctx.model,
    ctx.client_optimizer,
    ctx.batch_fn,
    num_clients=ctx.num_clients,
    num_tasks=ctx.num_tasks,
    **hparams,
  )


def _build_gpm(ctx: BuildContext, **hparams) -> ContinualMethod:
  return gpm(
    ctx.model,
    ctx.client_optimizer,
    ctx.batch_fn,
    variables=ctx.variables,
    sample_x=ctx.sample_x,
    num_clients=ctx.num_clients,
    **hparams,
  )


FL_SPEC = MethodSpec("fl", "continual", _build_fl)
EWC_SPEC = MethodSpec("ewc", "continual", _build_ewc)
ER_SPEC = MethodSpec("er", "continual", _build_er)
GPM_SPEC = MethodSpec("gpm", "continual", _build_gpm)
