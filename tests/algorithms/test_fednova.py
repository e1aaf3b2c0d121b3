"""FedNova (fednova.py): rounds against the NumPy reference; a_k for SGD, momentum and Adam."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import optax
import pytest

from fedjax_proj.algorithms import fednova
from tests.algorithms.baselines_reference import (
  check_reference_is_not_fedavg,
  check_rounds_match_reference,
  np_counter_sum,
)


@pytest.mark.parametrize("case", ["fednova_sgd", "fednova_momentum"])
def test_toy_rounds_match_numpy_reference(case):
  check_rounds_match_reference(case)


def test_reference_is_not_fedavg():
  check_reference_is_not_fedavg("fednova_sgd")


@pytest.mark.parametrize("momentum", [0.0, 0.5, 0.9])
def test_fednova_a_k_equals_momentum_counter_rule(momentum):
  table = np.asarray(fednova.unit_gradient_displacement(optax.sgd(0.3, momentum or None), 6))
  expected = [np_counter_sum(t, momentum) for t in range(7)]
  np.testing.assert_allclose(table / table[1], expected, rtol=1e-5)


def test_fednova_a_k_for_adam_is_step_count_and_ignores_weight_decay():
  adam = optax.adam(1e-3)
  steps = jnp.array([0, 1, 4, 7])
  np.testing.assert_allclose(fednova.normalized_steps(adam, steps, 7), [0, 1, 4, 7], rtol=1e-5)
  sgdw = optax.chain(optax.add_decayed_weights(0.1), optax.sgd(0.1, momentum=0.9))
  np.testing.assert_allclose(
    fednova.normalized_steps(sgdw, steps, 7),
    [np_counter_sum(int(t), 0.9) for t in steps],
    rtol=1e-5,
  )
