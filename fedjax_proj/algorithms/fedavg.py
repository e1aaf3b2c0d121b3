"""FedAvg (McMahan et al., 2017) with an optional optax server optimiser (FedAvgM, FedAdam).

Server: θ ← Σ_k (n_k / Σ_j n_j) θ_k over the sampled clients; BatchNorm statistics are averaged the
same way. With a server optimiser (Reddi et al., 2021) the averaged change is a pseudo-gradient: g =
θ − Σ_k p_k θ_k, and θ ← θ + server_opt(g). Local training: E epochs of mini-batch steps with the
client optimiser (docs/methods.md, "FedAvg"). The aggregate is a ``StreamingAggregate``: the same
average as sums over clients lets a large cohort run in chunks
(:mod:`fedjax_proj.core.chunked`).
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import optax

from fedjax_proj.algorithms import client as client_lib
from fedjax_proj.algorithms.base import FederatedAlgorithm
from fedjax_proj.algorithms.registry import factory_spec
from fedjax_proj.core import tree as tree_lib
from fedjax_proj.core.rounds import StreamingAggregate
from fedjax_proj.core.types import Array, Model, PyTree, RoundData


class FedAvgState(NamedTuple):
  round: Array
  variables: dict
  server_opt_state: PyTree


def client_metrics(outputs: dict, rd: RoundData) -> dict:
  """Example-weighted means of the clients' reported metrics."""
  return {k: tree_lib.weighted_mean(v, rd.num_examples) for k, v in outputs["metrics"].items()}


def weighted_sums(outputs: dict, rd: RoundData) -> dict:
  """Σ_k n_k θ_k, Σ_k n_k and Σ_k n_k m_k over a chunk of clients (float32), for streaming."""
  w = jnp.asarray(rd.num_examples, jnp.float32)
  wsum = lambda x: jnp.tensordot(w, x.astype(jnp.float32), axes=1)
  return {
    "variables": jax.tree.map(wsum, outputs["variables"]),
    "metrics": {k: wsum(v) for k, v in outputs["metrics"].items()},
    "weight": jnp.sum(w),
  }


def from_weighted_sums(sums: dict, like: dict) -> tuple[dict, dict]:
  """(averaged variables cast like ``like``, averaged metrics) from :func:`weighted_sums`."""
  total = sums["weight"]
  averaged = jax.tree.map(lambda s, x: (s / total).astype(x.dtype), sums["variables"], like)
  return averaged, {k: v / total for k, v in sums["metrics"].items()}


def server_update(
  variables: dict,
  averaged: dict,
  server_optimizer: optax.GradientTransformation | None,
  opt_state: PyTree,
) -> tuple[dict, PyTree]:
  """Moves the global parameters to the client average (directly or via a server optimiser).

  Non-parameter collections (BatchNorm statistics) always take the average.
  """
  if server_optimizer is None:
    return averaged, opt_state
  params = variables["params"]
  pseudo_grad = tree_lib.tree_sub(params, averaged["params"])
  updates, opt_state = server_optimizer.update(pseudo_grad, opt_state, params)
  return {**averaged, "params": optax.apply_updates(params, updates)}, opt_state


def init_server(
  variables: dict, server_optimizer: optax.GradientTransformation | None
) -> tuple[dict, PyTree]:
  """FedAvg's initial server state: (a private copy of ``variables``, the server optimiser's
  state, or () without one). The copy matters because rounds donate the state's buffers."""
  variables = tree_lib.tree_copy(variables)
  opt_state = server_optimizer.init(variables["params"]) if server_optimizer else ()
  return variables, opt_state


def average_and_update(
  variables: dict,
  opt_state: PyTree,
  outputs: dict,
  rd: RoundData,
  server_optimizer: optax.GradientTransformation | None,
) -> tuple[dict, PyTree]:
  """FedAvg's server step: the n_k-weighted mean of the client models, then :func:`server_update`.

  Returns:
    (the new global variables, the new server optimiser state).
  """
  averaged = tree_lib.weighted_mean(outputs["variables"], rd.num_examples)
  return server_update(variables, averaged, server_optimizer, opt_state)


def fedavg(
  model: Model,
  client_optimizer: optax.GradientTransformation,
  server_optimizer: optax.GradientTransformation | None = None,
) -> FederatedAlgorithm:
  """Builds FedAvg.

  Args:
    model: the model as pure functions.
    client_optimizer: local optimiser, e.g. ``optax.sgd(0.01, momentum=0.9)``.
    server_optimizer: ``None`` for plain averaging; ``optax.sgd(lr, momentum)`` gives FedAvgM and
      ``optax.adam(lr)`` FedAdam.
  """
  # The masked mean cross-entropy and the model's masked normalisation ignore padded rows, so a
  # partial batch may run trimmed (ClientProgram.trim_padding: large streamed sequential cohorts).
  program = client_lib.local_training_client(
    model, client_optimizer, client_lib.cross_entropy_loss(model)
  )._replace(trim_padding=True)

  def init(variables, key):
    del key
    variables, opt_state = init_server(variables, server_optimizer)
    return FedAvgState(jnp.zeros((), jnp.int32), variables, opt_state)

  def broadcast(state, rd, key):
    del rd, key
    return {"variables": state.variables}, {}

  def aggregate(state, rd, outputs, key):
    del key
    variables, opt_state = average_and_update(
      state.variables, state.server_opt_state, outputs, rd, server_optimizer
    )
    new_state = FedAvgState(state.round + 1, variables, opt_state)
    return new_state, client_metrics(outputs, rd)

  def finish(state, rd, sums, key):
    del rd, key
    averaged, metrics = from_weighted_sums(sums, state.variables)
    variables, opt_state = server_update(
      state.variables, averaged, server_optimizer, state.server_opt_state
    )
    return FedAvgState(state.round + 1, variables, opt_state), metrics

  return FederatedAlgorithm(
    name="fedavg",
    init=init,
    broadcast=broadcast,
    client=program,
    aggregate=StreamingAggregate(
      lambda state, rd, outputs: weighted_sums(outputs, rd), finish, direct=aggregate
    ),
  )


SPEC = factory_spec("fedavg", "fl", fedavg, ctx_kwargs=("server_optimizer",))
