"""FedDistill+: the per-class logit tables, their count-weighted aggregation, the client loss."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from fedjax_proj.algorithms import client as client_lib
from fedjax_proj.algorithms import registry
from fedjax_proj.algorithms.base import make_round
from fedjax_proj.algorithms.distillation import feddistill
from fedjax_proj.core import tree as T
from fedjax_proj.core.chunked import make_chunked_round
from fedjax_proj.core.types import Batch
from fedjax_proj.data.federated import FederatedData
from fedjax_proj.data.pipeline import normalizer
from tests import helpers

K = 3


def _np_log_softmax(z):
  z = z - z.max(1, keepdims=True)
  return z - np.log(np.exp(z).sum(1, keepdims=True))


def _clients(y):
  """Client 0 holds classes 0 and 1, client 1 only class 1, client 2 only class 0; no client holds
  class 2. Sizes not multiples of the batch, so last batches are padded."""
  c0 = np.flatnonzero(y < 2)[:10]
  c1 = np.flatnonzero(y == 1)[10:25]
  c2 = np.flatnonzero(y == 0)[10:15]
  return [c0, c1, c2]


def test_global_logits_are_count_weighted_class_means_of_the_clients_training_logits():
  # lr = 0: every local step's logits are the initial model's, so the tables are computable here.
  x, y = helpers.synthetic_data()
  model = helpers.tiny_model()
  clients = _clients(y)
  fd = FederatedData(clients, batch_size=4, local_epochs=2)
  alg = feddistill.feddistill_plus(model, optax.sgd(0.0), K, beta=0.5)
  variables = model.init(jax.random.key(0), jnp.asarray(x[:2]))
  state = alg.init(variables, jax.random.key(0))
  round_fn = make_round(alg, "vmap_scan", helpers.float_batch_fn())
  state, _ = round_fn(state, helpers.round_data(fd, x, y, round_idx=0), jax.random.key(0))
  z = np.asarray(model.apply(variables, jnp.asarray(x), train=False).logits, np.float64)
  held = np.concatenate(clients)
  expected = np.stack([z[held][y[held] == c].mean(0) for c in (0, 1)])
  got = np.asarray(state.global_logits)
  np.testing.assert_allclose(got[:2], expected, rtol=1e-5, atol=1e-6)
  # Weighted by counts, not the plain mean of the clients' per-class averages (which differs).
  per_client = [z[c][y[c] == 1].mean(0) for c in clients[:2]]
  assert not np.allclose(got[1], np.mean(per_client, 0), atol=1e-3)
  # Class 2: no client holds it, so it has no target yet (its row stays the initial zeros).
  np.testing.assert_array_equal(np.asarray(state.known), [True, True, False])
  np.testing.assert_array_equal(got[2], 0.0)
  # A round where only client 1 (class 1) trains: class 0 keeps its global logit.
  fd1 = FederatedData([clients[1]], batch_size=4)
  state, _ = round_fn(state, helpers.round_data(fd1, x, y, round_idx=1), jax.random.key(1))
  new = np.asarray(state.global_logits)
  np.testing.assert_array_equal(new[0], got[0])
  np.testing.assert_allclose(new[1], z[clients[1]].mean(0), rtol=1e-5, atol=1e-6)


def test_global_class_logits_keep_classes_no_client_held():
  rng = np.random.default_rng(0)
  previous = rng.normal(size=(4, 4)).astype(np.float32)
  sums = rng.normal(size=(4, 4)).astype(np.float32)
  counts = np.array([0.0, 3.0, 5.0, 0.0], np.float32)
  known = np.array([True, False, True, False])
  logits, new_known = feddistill.global_class_logits(
    jnp.asarray(sums), jnp.asarray(counts), jnp.asarray(previous), jnp.asarray(known)
  )
  expected = previous.copy()
  expected[1:3] = sums[1:3] / counts[1:3, None]
  np.testing.assert_allclose(np.asarray(logits), expected, rtol=1e-6)
  np.testing.assert_array_equal(np.asarray(new_known), [True, True, True, False])


def test_client_loss_is_ce_plus_beta_t2_kl_to_the_class_logits_of_known_classes():
  x, y = helpers.synthetic_data()
  model = helpers.tiny_model()
  params = model.init(jax.random.key(1), jnp.asarray(x[:2]))["params"]
  rng = np.random.default_rng(3)
  g = rng.normal(size=(K, K)).astype(np.float32) * 2
  known = np.array([True, False, True])
  mask = np.array([1.0] * 7 + [0.0], np.float32)  # one padded example
  batch = Batch(jnp.asarray(x[:8]), jnp.asarray(y[:8]), jnp.asarray(mask))
  shared = {"global_logits": jnp.asarray(g), "known": jnp.asarray(known)}
  ctx = client_lib.StepContext({}, shared, (), jax.random.key(0))
  beta, t = 0.3, 2.0
  loss, aux = feddistill.feddistill_loss(model, beta, t, K)(params, batch, ctx)
  zs = np.asarray(aux.logits, np.float64)
  yy = y[:8]
  ce = -_np_log_softmax(zs)[np.arange(8), yy][mask > 0].mean()
  log_p, log_q = _np_log_softmax(g[yy] / t), _np_log_softmax(zs / t)
  kl = (np.exp(log_p) * (log_p - log_q)).sum(1)
  use = (mask > 0) & known[yy]
  assert 0 < use.sum() < 7  # the batch has examples of a known and of an unknown class
  np.testing.assert_allclose(float(loss), ce + beta * t**2 * kl[use].mean(), rtol=1e-5)


def _run(alg, model, x, y, fd, round_fn=None, rounds=2):
  variables = model.init(jax.random.key(0), jnp.asarray(x[:2]))
  state = alg.init(variables, jax.random.key(0))
  round_fn = round_fn or make_round(alg, "vmap_scan", helpers.float_batch_fn())
  out = []
  for r in range(rounds):
    state, _ = round_fn(state, helpers.round_data(fd, x, y, round_idx=r), jax.random.key(r))
    out.append(T.tree_ravel(alg.global_variables(state)))
  return state, out


def test_feddistill_plus_is_fedavg_in_round0_and_at_beta0_and_chunks_alike():
  x, y = helpers.synthetic_data()
  model = helpers.tiny_model()
  fd = FederatedData(helpers.unequal_clients(len(x)), batch_size=8)
  _, avg = _run(registry.build_algorithm("fedavg", _ctx(model)), model, x, y, fd)
  _, off = _run(feddistill.feddistill_plus(model, optax.sgd(0.1), K, beta=0.0), model, x, y, fd)
  alg = feddistill.feddistill_plus(model, optax.sgd(0.1), K, beta=2.0)
  state, on = _run(alg, model, x, y, fd)
  np.testing.assert_allclose(off[1], avg[1], atol=1e-6)
  np.testing.assert_allclose(on[0], avg[0], atol=1e-6)  # no global logits before round 1
  assert not np.allclose(on[1], avg[1], atol=1e-4)
  chunked = make_chunked_round(alg, "vmap_scan", helpers.float_batch_fn(), client_chunk=3)
  got, _ = _run(alg, model, x, y, fd, round_fn=chunked)
  for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(state), strict=True):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)


def _ctx(model):
  return registry.BuildContext(
    model, optax.sgd(0.1), normalizer(0.0, 1.0), num_clients=4, num_classes=K
  )


def test_feddistill_plus_refuses_bad_settings():
  model = helpers.tiny_model()
  with pytest.raises(ValueError, match="num_classes >= 2, got 1"):
    feddistill.feddistill_plus(model, optax.sgd(0.1), 1)
  with pytest.raises(ValueError, match="temperature > 0, got 0"):
    feddistill.feddistill_plus(model, optax.sgd(0.1), K, temperature=0.0)
  assert registry.declared_hparams("feddistill_plus") == {"beta": 0.1, "temperature": 1.0}
  assert registry.build_algorithm("feddistill_plus", _ctx(model)).name == "feddistill_plus"
