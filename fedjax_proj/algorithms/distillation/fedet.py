"""FedET (approximation): server distillation from an uncertainty-weighted teacher ensemble.

Cho et al., "Heterogeneous Ensemble Knowledge Transfer for Training Large Models in Federated
Learning" (IJCAI 2022). No official code exists; the ensemble rule implemented here is documented
in :func:`.distill.uncertainty_weighted_teacher` (per sample and class,
confidence-weighted logits whose weights sharpen where clients agree). Everything else is FedDF's
(:mod:`.feddf`). The heterogeneous-model part of FedET is out of scope.
"""

from __future__ import annotations

from fedjax_proj.algorithms.base import FederatedAlgorithm
from fedjax_proj.algorithms.distillation import feddf
from fedjax_proj.algorithms.distillation.feddf import ensemble_distillation
from fedjax_proj.algorithms.registry import MethodSpec


def build(ctx, **hp) -> FederatedAlgorithm:
  """Registry entry."""
  return ensemble_distillation(
    ctx.model,
    ctx.client_optimizer,
    ctx.normalize,
    public_size=ctx.public_size,
    teacher="uncertainty",
    name="fedet",
    **hp,
  )


# FedDF's hyperparameters: the two differ only in the teacher each registered name fixes.
SPEC = MethodSpec("fedet", "fl", build, needs_public=True, hparams=feddf.SPEC.hparams)
