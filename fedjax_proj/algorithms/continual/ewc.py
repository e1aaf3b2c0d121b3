"""EWC+FL: elastic weight consolidation on every client inside FedAvg.

Compared with FOT in Bakman et al., "Federated Orthogonal Training" (ICLR 2024), section 5
(paper 003; docs/methods.md "FOT"): each centralised continual-learning method runs on every
client inside FedAvg (:mod:`fedjax_proj.algorithms.continual.base`).

* EWC+FL (Kirkpatrick et al., PNAS 2017): after each task every client computes the diagonal
  empirical Fisher F_{k,t} of the global model on its task data (mean squared per-example
  gradient). With ``fisher="client"`` (the default; FOT paper F.2: "each client calculates and
  stores its own fisher information matrix and uses it in the local training process") client k
  keeps F_k ← F_k + F_{k,t} (per-client state [num_clients, ...]); with ``fisher="server"`` the
  server averages them (weights n_k) into one F shared by all. ``normalize=True`` scales each
  task's Fisher and the running sum to max 1 (so lr·λ, not the data, sets the stiffness; an
  earlier default of this project, kept as an option). The anchor θ* is the global model at the
  task's end. Local loss: CE + (λ/2) Σ F (θ − θ*)²; F.4 gives λ = 40 (PMNIST), 20 (CIFAR100).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax

from fedjax_proj.algorithms import client as client_lib
from fedjax_proj.algorithms import losses
from fedjax_proj.algorithms.continual.base import (
  ContinualMethod,
  run_all_clients,
  task_algorithm,
  task_forward,
  task_loss,
)
from fedjax_proj.algorithms.registry import factory_spec
from fedjax_proj.core import tree as tree_lib
from fedjax_proj.core.engine import ClientProgram
from fedjax_proj.core.executor import Executor
from fedjax_proj.core.types import Model

EWC_FISHERS = ("client", "server")


def ewc(
  model: Model,
  optimizer: optax.GradientTransformation,
  executor: Executor,
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
    executor: the run's executor, which runs the end-of-task Fisher pass over the clients (the
      same one the run builds its rounds on).
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
  fisher_pass = executor.clients(fisher_program)

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

  def end_task(state, rd, key, task):
    shared = {"variables": state.variables, "task": jnp.int32(task)}
    out = run_all_clients(fisher_pass, shared, rd, key)
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

  algorithm = task_algorithm("ewc", init_method, broadcast_extra, program)
  return ContinualMethod(algorithm, end_task)


SPEC = factory_spec(
  "ewc",
  "continual",
  ewc,
  ctx_args=("model", "client_optimizer", "executor"),
  ctx_kwargs=("num_clients",),
  requires=("executor",),
)
