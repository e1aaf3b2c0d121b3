"""FedAvg's server optimiser: SGD(1) is plain averaging; momentum and Adam move as optax says."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax

from fedjax_proj.algorithms.base import make_round
from fedjax_proj.algorithms.fedavg import fedavg
from fedjax_proj.core import tree as T
from fedjax_proj.data.federated import FederatedData
from tests import helpers


def _run(server_optimizer, rounds=2):
  x, y = helpers.synthetic_data()
  model = helpers.tiny_model()
  fd = FederatedData(helpers.unequal_clients(len(x)), batch_size=8)
  alg = fedavg(model, optax.sgd(0.1), server_optimizer)
  variables = model.init(jax.random.key(0), jnp.asarray(x[:2]))
  state = alg.init(variables, jax.random.key(0))
  apply = make_round(alg, "vmap_scan", helpers.float_batch_fn())
  trajectory = [T.tree_copy(state.variables["params"])]
  for r in range(rounds):
    state, _ = apply(state, helpers.round_data(fd, x, y, round_idx=r), jax.random.key(r))
    trajectory.append(T.tree_copy(state.variables["params"]))
  return trajectory


def test_server_sgd_lr1_equals_plain_averaging():
  plain = _run(None)
  sgd1 = _run(optax.sgd(1.0))
  for a, b in zip(plain, sgd1):
    np.testing.assert_allclose(T.tree_ravel(a), T.tree_ravel(b), atol=1e-6)


def test_fedavgm_applies_server_momentum():
  plain = _run(None, rounds=1)
  momentum = _run(optax.sgd(1.0, momentum=0.9), rounds=1)
  # round 1: no momentum history yet, identical to averaging
  np.testing.assert_allclose(T.tree_ravel(momentum[1]), T.tree_ravel(plain[1]), atol=1e-6)
  delta = T.tree_ravel(plain[1]) - T.tree_ravel(plain[0])
  half = _run(optax.sgd(0.5), rounds=1)
  np.testing.assert_allclose(T.tree_ravel(half[1]), T.tree_ravel(plain[0]) + 0.5 * delta, atol=1e-6)


def test_fedadam_step_is_sign_like_on_first_round():
  plain = _run(None, rounds=1)
  adam = _run(optax.adam(0.01), rounds=1)
  delta = np.asarray(T.tree_ravel(plain[1]) - T.tree_ravel(plain[0]))
  step = np.asarray(T.tree_ravel(adam[1]) - T.tree_ravel(adam[0]))
  moved = np.abs(delta) > 1e-6
  # Adam's first update is lr * g / (|g| + eps): magnitude ~lr in the direction of the average
  np.testing.assert_allclose(np.abs(step[moved]), 0.01, rtol=1e-2)
  assert np.all(np.sign(step[moved]) == np.sign(delta[moved]))
