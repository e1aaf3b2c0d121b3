"""FedDyn (feddyn.py) against the NumPy reference; per-client state; its refusals."""

from __future__ import annotations

import optax
import pytest

from fedjax_proj.algorithms import registry
from tests.algorithms.baselines_reference import (
  build,
  check_reference_is_not_fedavg,
  check_rounds_match_reference,
  check_unsampled_clients_state_unchanged,
  linear_model,
)


def test_toy_rounds_match_numpy_reference():
  check_rounds_match_reference("feddyn")


def test_reference_is_not_fedavg():
  check_reference_is_not_fedavg("feddyn")


def test_unsampled_clients_state_unchanged_in_first_round():
  check_unsampled_clients_state_unchanged("feddyn")


def test_bad_hyperparameters_fail_clearly():
  with pytest.raises(ValueError, match="alpha > 0"):
    build("feddyn", {"alpha": 0.0}, 0.0)


def test_feddyn_rejects_server_optimizer():
  ctx = registry.BuildContext(
    linear_model(),
    optax.sgd(0.1),
    lambda a: a,
    3,
    server_optimizer=optax.sgd(1.0),
  )
  with pytest.raises(ValueError, match="server_optimizer=none"):
    registry.build_algorithm("feddyn", ctx)
