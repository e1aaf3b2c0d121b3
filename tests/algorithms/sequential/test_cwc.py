"""CWC: the consolidation rule against a hand-written chain; λ = 0 is FedSeq; strategies agree."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from fedjax_proj.algorithms import registry
from fedjax_proj.algorithms.base import make_round
from fedjax_proj.algorithms.sequential.cwc import cwc
from fedjax_proj.algorithms.sequential.fedseq import fedseq
from fedjax_proj.core import tree as tree_lib
from fedjax_proj.core.chain import sequence_order
from tests import helpers
from tests.algorithms.sequential.test_base import LR


@pytest.fixture(scope="module")
def setup():
  return helpers.sequential_setup()


def _run(alg, strategy, fd, x, y, variables, rounds=2, cpr=None):
  round_fn = make_round(alg, strategy, helpers.float_batch_fn())
  state = alg.init(variables, jax.random.key(0))
  for r in range(rounds):
    rd = helpers.round_data(fd, x, y, round_idx=r, cpr=cpr)
    state, metrics = round_fn(state, rd, jax.random.key(30 + r))
  return state, metrics


def test_rule_equals_hand_written_chain(setup):
  """Ω ← σΩ at round start; each client: SGD on CE + (λ/2)Σ Ω(θ − θ_in)²; Ω += max-normalised
  mean squared CE gradient. Checked over 2 rounds of 2 clients against plain Python."""
  x, y, model, fd, variables = setup
  lam, decay = 3.0, 0.5
  alg = cwc(model, optax.sgd(LR), lam=lam, decay=decay)
  state, _ = _run(alg, "vmap_scan", fd, x, y, variables, rounds=2, cpr=2)

  @jax.jit
  def ce_grad(p, xb, yb):
    def loss(q):
      logits = model.apply({"params": q}, xb, train=True).logits
      return optax.softmax_cross_entropy_with_integer_labels(logits, yb).mean()

    return jax.grad(loss)(p)

  params = variables["params"]
  omega = jax.tree.map(jnp.zeros_like, params)
  for r in range(2):
    rd = helpers.round_data(fd, x, y, round_idx=r, cpr=2)
    omega = jax.tree.map(lambda o: decay * o, omega)
    for c in np.asarray(sequence_order(jax.random.key(30 + r), 2)).tolist():
      anchor, fisher, steps = params, jax.tree.map(jnp.zeros_like, params), 0
      for s in range(rd.idx.shape[1]):
        m = np.asarray(rd.mask[c, s])
        if not m.any():
          continue
        ii = np.asarray(rd.idx[c, s])[m]
        g = ce_grad(params, jnp.asarray(x[ii]), jnp.asarray(y[ii]))
        fisher = jax.tree.map(lambda f, gi: f + gi**2, fisher, g)
        steps += 1
        params = jax.tree.map(
          lambda p, gi, a, o: p - LR * (gi + lam * o * (p - a)), params, g, anchor, omega
        )
      # Mean over the client's steps, then normalised to a maximum of 1.
      mean = jax.tree.map(lambda f, n=steps: f / n, fisher)
      scale = 1.0 / max(float(jnp.max(f)) for f in jax.tree.leaves(mean))
      omega = jax.tree.map(lambda o, f, k=scale: o + f * k, omega, mean)
  np.testing.assert_allclose(
    tree_lib.tree_ravel(state.variables["params"]), tree_lib.tree_ravel(params), atol=1e-5
  )
  np.testing.assert_allclose(
    tree_lib.tree_ravel(state.omega), tree_lib.tree_ravel(omega), rtol=1e-4, atol=1e-6
  )
  # Each client adds an importance whose maximum is 1; round 1's sum is decayed by σ in round 2.
  assert 1.0 <= float(jnp.max(tree_lib.tree_ravel(state.omega))) <= 2.0 * decay + 2.0


_CACHE: dict = {}


def _cached(setup, name):
  """Two-round final (state, metrics) of a named configuration, computed once per module."""
  if name not in _CACHE:
    x, y, model, fd, variables = setup
    alg, strategy = {
      "fedseq": (fedseq(model, helpers.sgd()), "vmap_scan"),
      "off": (cwc(model, helpers.sgd(), lam=0.0), "vmap_scan"),
      "on": (cwc(model, helpers.sgd(), lam=5.0), "vmap_scan"),
      "on_host": (cwc(model, helpers.sgd(), lam=5.0), "sequential"),
    }[name]
    _CACHE[name] = _run(alg, strategy, fd, x, y, variables)
  return _CACHE[name]


def test_zero_lambda_is_fedseq_and_penalty_changes_training(setup):
  ravel = lambda name: tree_lib.tree_ravel(_cached(setup, name)[0].variables)
  np.testing.assert_allclose(ravel("off"), ravel("fedseq"), atol=1e-5)
  assert np.abs(np.asarray(ravel("on") - ravel("fedseq"))).max() > 1e-3


def test_host_loop_equals_scan(setup):
  (a, ma), (b, mb) = _cached(setup, "on"), _cached(setup, "on_host")
  np.testing.assert_allclose(
    tree_lib.tree_ravel(a.variables), tree_lib.tree_ravel(b.variables), atol=1e-5
  )
  np.testing.assert_allclose(tree_lib.tree_ravel(a.omega), tree_lib.tree_ravel(b.omega), atol=1e-5)
  for k in ma:
    np.testing.assert_allclose(ma[k], mb[k], rtol=1e-5, atol=1e-6)


def test_bad_hyperparameters(setup):
  _, _, model, _, _ = setup
  with pytest.raises(ValueError, match="decay must be in"):
    cwc(model, helpers.sgd(), decay=1.5)
  with pytest.raises(ValueError, match="lam must be"):
    cwc(model, helpers.sgd(), lam=-1.0)
  ctx = registry.BuildContext(
    model=model,
    client_optimizer=helpers.sgd(),
    normalize=lambda a: a,
    num_clients=4,
    num_classes=3,
  )
  with pytest.raises(ValueError, match="cwc accepts: lam=1.0, decay=0.5"):
    registry.build_algorithm("cwc", ctx, mu=0.1)
  assert registry.build_algorithm("cwc", ctx, lam=2.0).name == "cwc"
