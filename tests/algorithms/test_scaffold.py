"""SCAFFOLD (scaffold.py) against the NumPy reference; per-client control variates; its
optimiser caveat."""

from __future__ import annotations

from tests.algorithms.baselines_reference import (
  check_reference_is_not_fedavg,
  check_rounds_match_reference,
  check_unsampled_clients_state_unchanged,
)


def test_toy_rounds_match_numpy_reference():
  check_rounds_match_reference("scaffold")


def test_reference_is_not_fedavg():
  check_reference_is_not_fedavg("scaffold")


def test_unsampled_clients_state_unchanged_in_first_round():
  check_unsampled_clients_state_unchanged("scaffold")


def test_optimizer_caveat_flags_scaffold_with_adam_only():
  from fedjax_proj.algorithms import registry

  caveat = registry.optimizer_caveat("scaffold", "adam")
  assert caveat is not None and "--optimizer=sgd" in caveat
  assert registry.optimizer_caveat("scaffold", "sgd") is None
  assert registry.optimizer_caveat("fedavg", "adam") is None
