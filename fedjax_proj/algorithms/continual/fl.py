"""FL: FedAvg with a multi-head model, the continual baseline without memory.

Compared with FOT in Bakman et al., "Federated Orthogonal Training" (ICLR 2024), section 5
(paper 003; docs/methods.md "FOT"): each centralised continual-learning method runs on every
client inside FedAvg (:mod:`fedjax_proj.algorithms.continual.base`).

* FL: FedAvg (McMahan et al., 2017) with a multi-head model; clients train the current task's head.
"""

from __future__ import annotations

import optax

from fedjax_proj.algorithms import client as client_lib
from fedjax_proj.algorithms.continual.base import (
  ContinualMethod,
  task_algorithm,
  task_loss,
)
from fedjax_proj.algorithms.registry import factory_spec
from fedjax_proj.core.types import Model


def fl(model: Model, optimizer: optax.GradientTransformation) -> ContinualMethod:
  """FL: FedAvg on the current task's head."""
  program = client_lib.local_training_client(model, optimizer, task_loss(model))
  return ContinualMethod(task_algorithm("fl", lambda v: (), None, program))


SPEC = factory_spec("fl", "continual", fl)
