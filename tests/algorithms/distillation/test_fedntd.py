"""FedNTD (fedntd.py): with beta = 0 its round is FedAvg's, and the not-true term changes training
(the loss term itself: tests/algorithms/test_losses.py)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax

from fedjax_proj.algorithms.base import make_round
from fedjax_proj.algorithms.distillation import fedntd
from fedjax_proj.core import tree as T
from fedjax_proj.data.federated import FederatedData
from tests import helpers


def test_fedntd_round_equals_fedavg_when_beta_zero():
  x, y = helpers.synthetic_data()
  model = helpers.tiny_model()
  fd = FederatedData(helpers.unequal_clients(len(x)), batch_size=8)
  variables = model.init(jax.random.key(0), jnp.asarray(x[:2]))
  rd = helpers.round_data(fd, x, y)
  out = {}
  for beta in (0.0, 1.0):
    alg = fedntd.fedntd(model, optax.sgd(0.1), beta=beta)
    round_fn = make_round(alg, "vmap_scan", helpers.float_batch_fn())
    out[beta], _ = round_fn(alg.init(variables, jax.random.key(0)), rd, jax.random.key(1))
  from fedjax_proj.algorithms.fedavg import fedavg

  base = fedavg(model, optax.sgd(0.1))
  round_fn = make_round(base, "vmap_scan", helpers.float_batch_fn())
  ref, _ = round_fn(base.init(variables, jax.random.key(0)), rd, jax.random.key(1))
  np.testing.assert_allclose(
    T.tree_ravel(out[0.0].variables), T.tree_ravel(ref.variables), atol=1e-6
  )
  assert not np.allclose(T.tree_ravel(out[1.0].variables), T.tree_ravel(ref.variables), atol=1e-5)
