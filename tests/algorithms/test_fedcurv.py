"""FedCurv (fedcurv.py; 004 Table 1's baseline): the penalty and its gradient against a hand
computation over the clients' terms, and two rounds against a plain-Python reference."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from fedjax_proj.algorithms.base import make_round
from fedjax_proj.algorithms.fedavg import fedavg
from fedjax_proj.algorithms.fedcurv import fedcurv, fisher_terms, penalty, penalty_grad
from fedjax_proj.core import tree as tree_lib
from fedjax_proj.data.federated import FederatedData
from tests import helpers

LR, LAM = 0.1, 0.5


def test_penalty_and_gradient_match_the_sum_over_clients():
  """λ·Σ_j Σ_i F_{j,i}(θ_i − θ̂_{j,i})² from the server's sums U, V, W; its gradient is
  2λ·Σ_j F_j(θ − θ̂_j)."""
  rng = np.random.default_rng(0)
  shapes = {"a": (3, 2), "b": (4,)}
  theta = {k: rng.normal(size=s) for k, s in shapes.items()}
  clients = [
    (
      {k: rng.uniform(0, 2, s) for k, s in shapes.items()},
      {k: rng.normal(size=s) for k, s in shapes.items()},
    )
    for _ in range(3)
  ]
  ref = LAM * sum(np.sum(f[k] * (theta[k] - t[k]) ** 2) for f, t in clients for k in shapes)
  ref_grad = {k: 2 * LAM * sum(f[k] * (theta[k] - t[k]) for f, t in clients) for k in shapes}
  f32 = lambda tree: jax.tree.map(lambda a: jnp.asarray(a, jnp.float32), tree)
  terms = [fisher_terms(f32(f), f32(t)) for f, t in clients]
  u = jax.tree.map(lambda *a: sum(a), *[t[0] for t in terms])
  v = jax.tree.map(lambda *a: sum(a), *[t[1] for t in terms])
  w = sum(t[2] for t in terms)
  got = penalty(f32(theta), u, v, w, LAM)
  np.testing.assert_allclose(got, ref, rtol=1e-5)
  grad = penalty_grad(f32(theta), u, v, LAM)
  auto = jax.grad(lambda p: penalty(p, u, v, w, LAM))(f32(theta))
  for k in shapes:
    np.testing.assert_allclose(grad[k], ref_grad[k], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(auto[k], ref_grad[k], rtol=1e-5, atol=1e-6)


def _reference(model, params, x, y, rds, lam):
  """Plain Python FedCurv: SGD steps on CE + penalty, Fisher = mean of squared CE gradients."""

  @jax.jit
  def ce_grad(p, xb, yb):
    def loss(q):
      logits = model.apply({"params": q}, xb, train=True).logits
      return optax.softmax_cross_entropy_with_integer_labels(logits, yb).mean()

    return jax.grad(loss)(p)

  zeros = jax.tree.map(jnp.zeros_like, params)
  u, v = zeros, zeros
  for rd in rds:
    locals_, fishers = [], []
    for c in range(rd.idx.shape[0]):
      p, fsum, steps = params, zeros, 0
      for s in range(rd.idx.shape[1]):
        m = np.asarray(rd.mask[c, s])
        if not m.any():
          continue
        ii = np.asarray(rd.idx[c, s])[m]
        g = ce_grad(p, jnp.asarray(x[ii]), jnp.asarray(y[ii]))
        fsum = jax.tree.map(lambda f, gi: f + gi**2, fsum, g)
        p = jax.tree.map(lambda q, gi, uu, vv: q - LR * (gi + 2 * lam * (uu * q - vv)), p, g, u, v)
        steps += 1
      locals_.append(p)
      fishers.append(tree_lib.tree_scale(1.0 / max(steps, 1), fsum))
    n = np.asarray(rd.num_examples, np.float64)
    share = n / n.sum()
    params = jax.tree.map(lambda *ps, share=share: sum(w * q for w, q in zip(share, ps)), *locals_)
    u = jax.tree.map(lambda *fs: sum(fs), *fishers)
    weighted = [jax.tree.map(jnp.multiply, f, q) for f, q in zip(fishers, locals_)]
    v = jax.tree.map(lambda *a: sum(a), *weighted)
  return params, u


@pytest.fixture(scope="module")
def setup():
  x, y = helpers.synthetic_data()
  model = helpers.tiny_model()
  fd = FederatedData(helpers.unequal_clients(len(x)), batch_size=5, local_epochs=1)
  variables = model.init(jax.random.key(0), jnp.asarray(x[:2]))
  return x, y, model, fd, variables


def test_two_rounds_match_the_reference_and_lambda_zero_is_fedavg(setup):
  x, y, model, fd, variables = setup
  rds = [helpers.round_data(fd, x, y, round_idx=r) for r in range(2)]

  def run(alg):
    round_fn = make_round(alg, "vmap_scan", helpers.float_batch_fn())
    state = alg.init(variables, jax.random.key(0))
    for r, rd in enumerate(rds):
      state, _ = round_fn(state, rd, jax.random.key(r))
    return state

  state = run(fedcurv(model, optax.sgd(LR), lam=LAM))
  ref_params, ref_u = _reference(model, variables["params"], x, y, rds, LAM)
  np.testing.assert_allclose(
    tree_lib.tree_ravel(state.variables["params"]), tree_lib.tree_ravel(ref_params), atol=1e-5
  )
  np.testing.assert_allclose(
    tree_lib.tree_ravel(state.u), tree_lib.tree_ravel(ref_u), rtol=1e-4, atol=1e-7
  )
  avg = run(fedavg(model, optax.sgd(LR)))
  off = run(fedcurv(model, optax.sgd(LR), lam=0.0))
  np.testing.assert_allclose(
    tree_lib.tree_ravel(off.variables), tree_lib.tree_ravel(avg.variables), atol=1e-6
  )
  # The penalty acts in round 2 (U ≠ 0 after round 1).
  assert (
    np.abs(
      np.asarray(tree_lib.tree_ravel(state.variables) - tree_lib.tree_ravel(avg.variables))
    ).max()
    > 1e-4
  )


def test_negative_lambda_is_a_clear_error(setup):
  _, _, model, _, _ = setup
  with pytest.raises(ValueError, match="FedCurv needs lam >= 0"):
    fedcurv(model, optax.sgd(LR), lam=-1.0)
