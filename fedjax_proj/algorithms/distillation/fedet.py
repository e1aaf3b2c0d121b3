"""FedET (approximation): server distillation from an uncertainty-weighted teacher ensemble.

Cho et al., "Heterogeneous Ensemble Knowledge Transfer for Training Large Models in Federated
Learning" (IJCAI 2022). No official code exists; the ensemble rule implemented here is documented
in :func:`.distill.uncertainty_weighted_teacher` (per sample and class,
confidence-weighted logits whose weights sharpen where clients agree). Everything else is FedDF's
(:mod:`.feddf`). The heterogeneous-model part of FedET is out of scope.
"""

from __future__ import annotations

from fedjax_proj.algorithms.distillation.feddf import ensemble_spec

# FedDF's factory and hyperparameters: the two differ only in the teacher each name fixes.
SPEC = ensemble_spec("fedet", "uncertainty")
