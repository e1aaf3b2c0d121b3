"""FedNTD: not-true distillation (Lee et al., "Preservation of the Global Knowledge by Not-True
Distillation in Federated Learning", NeurIPS 2022; code Lee-Gihun/FedNTD).

Client loss: CE + β·τ²·KL(σ(z̃_g/τ) ‖ σ(z̃_l/τ)), z̃ the logits without the true class, z_g from the
received global model (inference mode, a constant for the local step); τ = 1, β = 1
(docs/methods.md, "FedNTD"). Server: FedAvg.
"""

from __future__ import annotations

import optax

from fedjax_proj.algorithms import client as client_lib
from fedjax_proj.algorithms import losses
from fedjax_proj.algorithms.base import FederatedAlgorithm
from fedjax_proj.algorithms.fedavg import fedavg
from fedjax_proj.algorithms.registry import factory_spec
from fedjax_proj.core.types import Batch, Model


def not_true_distillation_loss(model: Model, beta: float, temperature: float):
  """``loss_fn`` for :func:`fedjax_proj.algorithms.client.local_training_client`."""

  def loss_fn(params, batch: Batch, ctx: client_lib.StepContext):
    out, ce = client_lib.train_forward(model, params, batch, ctx)
    teacher = model.apply(ctx.shared["variables"], batch.x, train=False).logits
    ntd = losses.not_true_kl(teacher, out.logits, batch.y, temperature, batch.mask)
    return ce + beta * ntd, client_lib.LossAux(out.logits, out.state)

  return loss_fn


def fedntd(
  model: Model,
  client_optimizer: optax.GradientTransformation,
  server_optimizer: optax.GradientTransformation | None = None,
  *,
  beta: float = 1.0,
  temperature: float = 1.0,
) -> FederatedAlgorithm:
  """Builds FedNTD: FedAvg whose clients add the not-true distillation term."""
  base = fedavg(model, client_optimizer, server_optimizer)
  program = client_lib.local_training_client(
    model, client_optimizer, not_true_distillation_loss(model, beta, temperature)
  )
  return base._replace(name="fedntd", client=program)


SPEC = factory_spec("fedntd", "fl", fedntd, ctx_kwargs=("server_optimizer",))
