"""FedDF: FedAvg plus server ensemble distillation on public data (Lin et al., NeurIPS 2020).

Shares FedProj's server component (:mod:`.distill_server`) and settings, so
FedDF and FedProj differ only in the client projection (docs/methods.md, "FedDF and FedET"). FedDF's
own defaults (Adam 1e-3, T = 1, batch 128) are available through the keyword arguments; its early
stopping needs a validation split and is not implemented.
"""

from __future__ import annotations

import optax

from fedjax_proj.algorithms import client as client_lib
from fedjax_proj.algorithms.base import FederatedAlgorithm
from fedjax_proj.algorithms.distillation import distill
from fedjax_proj.algorithms.distillation.distill_server import distillation_server
from fedjax_proj.algorithms.registry import MethodSpec, factory_spec
from fedjax_proj.core.types import Model


def ensemble_distillation(
  model: Model,
  client_optimizer: optax.GradientTransformation,
  normalize,
  *,
  public_size: int,
  public_normalize=None,
  teacher: str = "mean",
  name: str = "feddf",
  distill_epochs: int = 1,
  distill_lr: float = 1e-4,
  distill_batch_size: int = 256,
  distill_temperature: float = 3.0,
  alpha: float = 0.0,
) -> FederatedAlgorithm:
  """FedAvg local training + server distillation from a ``teacher`` ensemble (mean/uncertainty).

  ``public_normalize`` (the run's, set under ``--normalization=code``) normalises the public set
  the server distils on, as FedProj's server does, so FedProj − FedDF stays the projection's effect
  (docs/fedproj.md); None: ``normalize``.
  """
  normalize = public_normalize or normalize
  cfg = distill.DistillConfig(
    distill_epochs, distill_batch_size, distill_lr, distill_temperature, alpha
  )
  init, aggregate = distillation_server(
    model, normalize, cfg, public_size=public_size, teacher=teacher
  )

  def broadcast(state, rd, key):
    del rd, key
    return {"variables": state.variables}, {}

  return FederatedAlgorithm(
    name=name,
    init=init,
    broadcast=broadcast,
    client=client_lib.local_training_client(
      model, client_optimizer, client_lib.cross_entropy_loss(model)
    ),
    aggregate=aggregate,
  )


def ensemble_spec(name: str, teacher: str) -> MethodSpec:
  """The registry entry of an ensemble-distillation method: ``name`` with its ``teacher`` fixed
  (FedDF's mean, FedET's uncertainty weighting); the rest are this factory's hyperparameters."""
  return factory_spec(
    name,
    "fl",
    ensemble_distillation,
    ctx_args=("model", "client_optimizer", "normalize"),
    ctx_kwargs=("public_size", "public_normalize"),
    fixed={"teacher": teacher, "name": name},
    needs_public=True,
  )


SPEC = ensemble_spec("feddf", "mean")
