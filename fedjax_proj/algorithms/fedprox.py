"""FedProx (Li et al., "Federated Optimization in Heterogeneous Networks", MLSys 2020).

Client objective (docs/methods.md, "FedProx"): CE(f(x; θ), y) + (μ/2)‖θ − θ_g‖², μ = 0.01, where θ_g
is the global model received this round. Only parameters are penalised; BatchNorm statistics are
model state, not parameters. The server is FedAvg (n_k-weighted mean, optional server optimiser), so
the reported ``train_loss`` is the full proximal objective.

Per-client state: none.
"""

from __future__ import annotations

import optax

from fedjax_proj.algorithms import client as client_lib
from fedjax_proj.algorithms.base import FederatedAlgorithm
from fedjax_proj.algorithms.fedavg import fedavg
from fedjax_proj.algorithms.registry import factory_spec
from fedjax_proj.core import tree as tree_lib
from fedjax_proj.core.types import Batch, Model


def proximal_loss(model: Model, mu: float):
  """``loss_fn(params, batch, ctx)``: masked CE plus (μ/2)‖θ − θ_g‖² against ``ctx.shared``."""

  def loss_fn(params, batch: Batch, ctx: client_lib.StepContext):
    out, ce = client_lib.train_forward(model, params, batch, ctx)
    global_params = ctx.shared["variables"]["params"]
    prox = 0.5 * mu * tree_lib.tree_sq_norm(tree_lib.tree_sub(params, global_params))
    return ce + prox, client_lib.LossAux(out.logits, out.state)

  return loss_fn


def fedprox(
  model: Model,
  client_optimizer: optax.GradientTransformation,
  mu: float = 0.01,
  server_optimizer: optax.GradientTransformation | None = None,
) -> FederatedAlgorithm:
  """Builds FedProx.

  Args:
    model: the model as pure functions.
    client_optimizer: local optimiser.
    mu: proximal coefficient μ (≥ 0; μ = 0 is FedAvg).
    server_optimizer: optional FedAvgM/FedAdam-style server optimiser (see fedavg).
  """
  if mu < 0:
    raise ValueError(f"FedProx needs mu >= 0, got mu={mu}.")
  base = fedavg(model, client_optimizer, server_optimizer)
  program = client_lib.local_training_client(model, client_optimizer, proximal_loss(model, mu))
  return base._replace(name="fedprox", client=program)


SPEC = factory_spec("fedprox", "fl", fedprox, ctx_kwargs=("server_optimizer",))
