"""FedET (fedet.py): FedDF's server with the uncertainty-weighted ensemble teacher.

The server step equals test_feddf.py's hand-computed step with the teacher replaced by
:func:`distill.uncertainty_weighted_teacher` of the clients' logits, and its distillation loss
differs from FedDF's on the same round (Adam's first step is nearly sign-only, so the loss, not the
parameters, tells the two teachers apart): the registry's ``fedet`` really changes the teacher.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import optax

from fedjax_proj.algorithms import registry
from fedjax_proj.algorithms.distillation import distill
from tests.algorithms.baselines_reference import linear_model
from tests.algorithms.distillation.test_feddf import (
  LR,
  TEMPERATURE,
  P,
  build,
  hand_server_step,
  run_aggregate,
  setup,
)


def test_server_step_distils_from_the_uncertainty_weighted_teacher():
  clients, public, rd, outputs = setup()
  client_logits = jnp.stack(
    [jnp.asarray(public) @ clients["w"][k] + clients["b"][k] for k in range(2)]
  )
  teacher = np.asarray(distill.uncertainty_weighted_teacher(client_logits), np.float64)
  assert not np.allclose(teacher, np.asarray(client_logits).mean(0), atol=1e-3)
  expected, loss = hand_server_step(clients, public, teacher)
  fedet = build(teacher="uncertainty", name="fedet")
  state, metrics = run_aggregate(fedet, rd, outputs, "traced")
  for k in ("w", "b"):
    np.testing.assert_allclose(state.variables["params"][k], expected[k], atol=2e-6)
  np.testing.assert_allclose(metrics["distill_loss"], loss, rtol=1e-4)
  _, feddf_metrics = run_aggregate(build(), rd, outputs, "traced")
  assert abs(float(metrics["distill_loss"]) - float(feddf_metrics["distill_loss"])) > 1e-3


def test_registry_builds_fedet_with_the_uncertainty_teacher():
  ctx = registry.BuildContext(linear_model(), optax.sgd(0.1), lambda a: a, 2, public_size=P)
  hp = {"distill_lr": LR, "distill_batch_size": 64, "distill_temperature": TEMPERATURE}
  fedet = registry.build_algorithm("fedet", ctx, **hp)
  assert fedet.name == "fedet"
  _, _, rd, outputs = setup()
  got, _ = run_aggregate(fedet, rd, outputs, "traced")
  want, _ = run_aggregate(build(teacher="uncertainty", name="fedet"), rd, outputs, "traced")
  for k in ("w", "b"):
    np.testing.assert_array_equal(got.variables["params"][k], want.variables["params"][k])
