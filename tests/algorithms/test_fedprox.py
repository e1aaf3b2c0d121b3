"""FedProx (fedprox.py) against the NumPy reference of baselines_reference.py."""

from __future__ import annotations

import pytest

from tests.algorithms.baselines_reference import (
  build,
  check_reference_is_not_fedavg,
  check_rounds_match_reference,
)


def test_toy_rounds_match_numpy_reference():
  check_rounds_match_reference("fedprox")


def test_reference_is_not_fedavg():
  check_reference_is_not_fedavg("fedprox")


def test_bad_hyperparameters_fail_clearly():
  with pytest.raises(ValueError, match="mu must be >= 0, got -1.0"):
    build("fedprox", {"mu": -1.0}, 0.0)
