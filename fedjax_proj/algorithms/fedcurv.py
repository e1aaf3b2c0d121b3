"""FedCurv (Shoham et al., "Overcoming Forgetting in Federated Learning on Non-IID Data",
arXiv 1910.07796; a parallel-FL baseline of SFedKD, papers/004 Table 1).

FedCurv is EWC across clients: each client keeps its model close to the other clients' models in
the directions their data found important. What this module computes (docs/methods.md,
"FedCurv"):

* Client s of round r minimises CE(θ) + λ·Σ_j Σ_i F_{j,i}(θ_i − θ̂_{j,i})², the sum over the
  clients j of round r − 1, with θ̂_j client j's local model and F_j its diagonal Fisher. Expanded,
  the penalty is λ·Σ_i (U_i θ_i² − 2 V_i θ_i) + λ·W with U = Σ_j F_j, V = Σ_j F_j⊙θ̂_j and
  W = Σ_j Σ_i F_{j,i} θ̂_{j,i}², so the server sends three sums instead of every client's model
  (as the paper's Sect. 4 and OpenFL's implementation do). Its gradient is 2λ(U⊙θ − V).
* F_j is the empirical diagonal Fisher of client j's data measured along its local training: the
  mean over its local steps of the squared mini-batch cross-entropy gradient (CWC's measure,
  cwc.py, without its normalisation). The paper computes it at the final local model; measuring
  it along the trajectory needs no extra pass over the client's data.
* Server: FedAvg for the model (n_k-weighted, optional server optimiser); U, V, W are plain sums
  over the round's clients (unweighted, as the paper's Σ_j and OpenFL's aggregation).

Two readings where the paper assumes every client takes part in every round: the sums run over
the previous round's sampled clients, and a client sampled in two consecutive rounds keeps its own
term (the paper's Σ_{j≠s}; dropping it would keep each of the M clients' F_j and θ̂_j in the server
state, 2M model copies). In round 1 U = V = W = 0: FedAvg. Only ``params`` are penalised;
BatchNorm statistics are averaged as in FedAvg. The penalty enters through its analytic gradient
(``transform_grads``), so the CE gradient (the Fisher's input) stays separate and the reported
``train_loss`` is the CE alone. λ = 1 is our default: 004 gives no FedCurv setting.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import optax

from fedjax_proj.algorithms import client as client_lib
from fedjax_proj.algorithms.base import FederatedAlgorithm
from fedjax_proj.algorithms.fedavg import average_and_update, client_metrics, init_server
from fedjax_proj.algorithms.registry import factory_spec
from fedjax_proj.core import tree as tree_lib
from fedjax_proj.core.types import Array, Model, PyTree


class FedCurvState(NamedTuple):
  round: Array
  variables: dict
  server_opt_state: PyTree
  u: PyTree  # Σ_j F_j over the previous round's clients, shaped like params
  v: PyTree  # Σ_j F_j ⊙ θ̂_j
  w: Array  # Σ_j Σ_i F_{j,i} θ̂_{j,i}² (a scalar: it only shifts the loss)


def penalty(params: PyTree, u: PyTree, v: PyTree, w: Array, lam: float) -> Array:
  """λ·(Σ_i U_i θ_i² − 2 V_i θ_i) + λ·W = λ·Σ_j Σ_i F_{j,i}(θ_i − θ̂_{j,i})²."""
  terms = jax.tree.map(lambda p, uu, vv: jnp.sum(uu * jnp.square(p) - 2.0 * vv * p), params, u, v)
  return lam * (sum(jax.tree.leaves(terms)) + w)


def penalty_grad(params: PyTree, u: PyTree, v: PyTree, lam: float) -> PyTree:
  """∇_θ :func:`penalty` = 2λ(U⊙θ − V)."""
  return jax.tree.map(lambda p, uu, vv: 2.0 * lam * (uu * p - vv), params, u, v)


def fisher_terms(fisher: PyTree, local_params: PyTree) -> tuple[PyTree, PyTree, Array]:
  """One client's (F, F⊙θ̂, Σ F⊙θ̂²): its contribution to the server's U, V, W."""
  v = jax.tree.map(lambda f, p: f * p.astype(jnp.float32), fisher, local_params)
  w = jax.tree.map(
    lambda f, p: jnp.sum(f * jnp.square(p.astype(jnp.float32))), fisher, local_params
  )
  return fisher, v, sum(jax.tree.leaves(w))


def fedcurv(
  model: Model,
  client_optimizer: optax.GradientTransformation,
  lam: float = 1.0,
  server_optimizer: optax.GradientTransformation | None = None,
) -> FederatedAlgorithm:
  """Builds FedCurv.

  Args:
    model: the model as pure functions.
    client_optimizer: local optimiser.
    lam: λ ≥ 0, the penalty's weight (λ = 0 is FedAvg).
    server_optimizer: optional FedAvgM/FedAdam-style server optimiser (see fedavg).
  """
  if lam < 0:
    raise ValueError(f"FedCurv needs lam >= 0, got lam={lam}.")

  def init_extra(shared, client_input, key):
    del client_input, key
    return tree_lib.tree_zeros_like(shared["variables"]["params"])  # running Σ (∇CE)²

  def transform_grads(ce_grads, params, batch, ctx: client_lib.StepContext):
    del batch
    extra = jax.tree.map(lambda f, g: f + jnp.square(g), ctx.extra, ce_grads)
    pen = penalty_grad(params, ctx.shared["u"], ctx.shared["v"], lam)
    return jax.tree.map(jnp.add, ce_grads, pen), extra

  def finalize(state: client_lib.LocalState):
    steps = jnp.maximum(state.num_steps, 1).astype(jnp.float32)
    return {"fisher": tree_lib.tree_scale(1.0 / steps, state.extra)}

  program = client_lib.local_training_client(
    model,
    client_optimizer,
    client_lib.cross_entropy_loss(model),
    init_extra=init_extra,
    transform_grads=transform_grads,
    finalize=finalize,
  )

  def init(variables, key):
    del key
    variables, opt_state = init_server(variables, server_optimizer)
    # Two buffers, not one: rounds donate the state, and one buffer cannot be donated twice.
    u, v = (tree_lib.tree_zeros_like(variables["params"]) for _ in range(2))
    return FedCurvState(jnp.zeros((), jnp.int32), variables, opt_state, u, v, jnp.zeros(()))

  def broadcast(state: FedCurvState, rd, key):
    del rd, key
    return {"variables": state.variables, "u": state.u, "v": state.v}, {}

  def aggregate(state: FedCurvState, rd, outputs, key):
    del key
    u, v, w = jax.vmap(fisher_terms)(outputs["fisher"], outputs["variables"]["params"])
    variables, opt_state = average_and_update(
      state.variables, state.server_opt_state, outputs, rd, server_optimizer
    )
    u, v = tree_lib.sum_clients(u), tree_lib.sum_clients(v)
    metrics = client_metrics(outputs, rd)
    metrics["fisher_sum"] = jnp.sum(tree_lib.tree_ravel(u))
    return FedCurvState(state.round + 1, variables, opt_state, u, v, jnp.sum(w)), metrics

  return FederatedAlgorithm(
    name="fedcurv", init=init, broadcast=broadcast, client=program, aggregate=aggregate
  )


SPEC = factory_spec("fedcurv", "fl", fedcurv, ctx_kwargs=("server_optimizer",))
