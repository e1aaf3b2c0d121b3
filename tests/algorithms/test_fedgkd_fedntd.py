"""FedGKD's teacher is the buffer's parameter average; FedNTD ignores the true class."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax

from fedjax_proj.algorithms import fedgkd, fedntd, losses
from fedjax_proj.algorithms.base import make_round
from fedjax_proj.core import tree as T
from fedjax_proj.data.federated import FederatedData
from tests import helpers


def test_fedgkd_teacher_is_average_of_last_m_globals():
  x, y = helpers.synthetic_data()
  model = helpers.tiny_model()
  fd = FederatedData(helpers.unequal_clients(len(x)), batch_size=8)
  alg = fedgkd.fedgkd(model, optax.sgd(0.1), helpers.float_batch_fn(), buffer_size=3)
  variables = model.init(jax.random.key(0), jnp.asarray(x[:2]))
  state = alg.init(variables, jax.random.key(0))
  history = [variables]
  round_fn = make_round(alg, "vmap_scan")
  for r in range(4):
    shared, _ = jax.jit(alg.broadcast)(state, helpers.round_data(fd, x, y, round_idx=r), None)
    expected = jax.tree.map(lambda *v: sum(v) / len(v), *history[-3:])
    np.testing.assert_allclose(T.tree_ravel(shared["teacher"]), T.tree_ravel(expected), atol=1e-6)
    assert bool(shared["use_kd"]) == (r > 0)
    state, _ = round_fn(state, helpers.round_data(fd, x, y, round_idx=r), jax.random.key(r))
    history.append(T.tree_copy(state.fedavg.variables))  # the round donates its input state


def test_fedgkd_distillation_changes_training_only_after_round0():
  x, y = helpers.synthetic_data()
  model = helpers.tiny_model()
  fd = FederatedData(helpers.unequal_clients(len(x)), batch_size=8)
  variables = model.init(jax.random.key(0), jnp.asarray(x[:2]))
  finals = {}
  for gamma in (0.0, 5.0):
    alg = fedgkd.fedgkd(model, optax.sgd(0.1), helpers.float_batch_fn(), gamma=gamma)
    state = alg.init(variables, jax.random.key(0))
    round_fn = make_round(alg, "vmap_scan")
    per_round = []
    for r in range(2):
      state, _ = round_fn(state, helpers.round_data(fd, x, y, round_idx=r), jax.random.key(r))
      per_round.append(T.tree_ravel(state.fedavg.variables))
    finals[gamma] = per_round
  np.testing.assert_allclose(finals[0.0][0], finals[5.0][0], atol=1e-6)  # round 0: no KD
  assert not np.allclose(finals[0.0][1], finals[5.0][1], atol=1e-4)


def test_fedgkd_vote_runs_and_weights_teachers():
  x, y = helpers.synthetic_data()
  model = helpers.tiny_model()
  fd = FederatedData(helpers.unequal_clients(len(x)), batch_size=8)
  alg = fedgkd.fedgkd(model, optax.sgd(0.1), helpers.float_batch_fn(), vote=True, buffer_size=2)
  state = alg.init(model.init(jax.random.key(0), jnp.asarray(x[:2])), jax.random.key(0))
  round_fn = make_round(alg, "vmap_scan")
  for r in range(3):
    state, metrics = round_fn(state, helpers.round_data(fd, x, y, round_idx=r), jax.random.key(r))
  assert int(state.count) == 2 and np.isfinite(float(metrics["train_loss"]))


def _softmax(z):
  e = np.exp(z - z.max(-1, keepdims=True))
  return e / e.sum(-1, keepdims=True)


def test_not_true_kl_matches_numpy_and_masks_true_class():
  rng = np.random.default_rng(0)
  zt, zs = rng.normal(size=(5, 6)), rng.normal(size=(5, 6))
  labels = rng.integers(0, 6, 5)
  tau = 2.0
  expected = []
  for i in range(5):
    keep = np.arange(6) != labels[i]
    p, q = _softmax(zt[i, keep] / tau), _softmax(zs[i, keep] / tau)
    expected.append(np.sum(p * np.log(p / q)))
  got = losses.not_true_kl(jnp.asarray(zt), jnp.asarray(zs), jnp.asarray(labels), tau)
  np.testing.assert_allclose(got, tau**2 * np.mean(expected), rtol=1e-5)
  # moving the true-class logits of teacher and student changes nothing
  bump = jax.nn.one_hot(labels, 6) * 7.0
  got2 = losses.not_true_kl(
    jnp.asarray(zt) + bump, jnp.asarray(zs) - bump, jnp.asarray(labels), tau
  )
  np.testing.assert_allclose(got2, got, rtol=1e-5)
  grad = jax.grad(lambda s: losses.not_true_kl(jnp.asarray(zt), s, jnp.asarray(labels), tau))(
    jnp.asarray(zs, jnp.float32)
  )
  assert np.all(np.isfinite(grad))
  np.testing.assert_array_equal(np.asarray(grad)[np.arange(5), labels], 0.0)


def test_fedntd_round_equals_fedavg_when_beta_zero():
  x, y = helpers.synthetic_data()
  model = helpers.tiny_model()
  fd = FederatedData(helpers.unequal_clients(len(x)), batch_size=8)
  variables = model.init(jax.random.key(0), jnp.asarray(x[:2]))
  rd = helpers.round_data(fd, x, y)
  out = {}
  for beta in (0.0, 1.0):
    alg = fedntd.fedntd(model, optax.sgd(0.1), helpers.float_batch_fn(), beta=beta)
    out[beta], _ = jax.jit(alg.apply)(alg.init(variables, jax.random.key(0)), rd, jax.random.key(1))
  from fedjax_proj.algorithms.fedavg import fedavg

  base = fedavg(model, optax.sgd(0.1), helpers.float_batch_fn())
  ref, _ = jax.jit(base.apply)(base.init(variables, jax.random.key(0)), rd, jax.random.key(1))
  np.testing.assert_allclose(
    T.tree_ravel(out[0.0].variables), T.tree_ravel(ref.variables), atol=1e-6
  )
  assert not np.allclose(T.tree_ravel(out[1.0].variables), T.tree_ravel(ref.variables), atol=1e-5)
