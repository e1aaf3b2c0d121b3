"""FedGen: the generator, the server's teacher and diversity terms, the client loss."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from fedjax_proj.algorithms import client as client_lib
from fedjax_proj.algorithms import registry
from fedjax_proj.algorithms.base import make_round
from fedjax_proj.algorithms.distillation import fedgen
from fedjax_proj.core import tree as T
from fedjax_proj.core.types import Batch
from fedjax_proj.data.federated import FederatedData
from fedjax_proj.data.pipeline import normalizer
from fedjax_proj.models import get_model
from tests import helpers

K, HIDDEN, NOISE = 3, 16, 5


def _np_log_softmax(z):
  z = z - z.max(-1, keepdims=True)
  return z - np.log(np.exp(z).sum(-1, keepdims=True))


def test_server_terms_match_numpy():
  rng = np.random.default_rng(0)
  eps, feats = rng.uniform(size=(6, NOISE)), rng.normal(size=(6, 4))
  noise = ((eps[:, None] - eps[None]) ** 2).mean(-1)
  layer = np.abs(feats[:, None] - feats[None]).mean(-1)
  np.testing.assert_allclose(
    float(fedgen.diversity_loss(jnp.asarray(eps), jnp.asarray(feats))),
    np.exp(-(noise * layer).mean()),
    rtol=1e-5,
  )
  counts = np.array([[4.0, 0.0, 2.0], [1.0, 0.0, 0.0]])  # 2 clients; no one holds class 1
  weights, held = fedgen.label_weights(jnp.asarray(counts))
  np.testing.assert_allclose(np.asarray(weights), ((counts + 1) / (counts + 1).sum(0)).T)
  np.testing.assert_array_equal(np.asarray(held), [True, False, True])
  heads = {"kernel": rng.normal(size=(2, 4, K)), "bias": rng.normal(size=(2, K))}
  labels = np.array([0, 2, 2, 0, 1, 2])
  got = fedgen.teacher_loss(
    jax.tree.map(jnp.asarray, heads), jnp.asarray(feats), jnp.asarray(labels), weights
  )
  w = ((counts + 1) / (counts + 1).sum(0)).T
  expected = 0.0
  for k in range(2):
    ce = -_np_log_softmax(feats @ heads["kernel"][k] + heads["bias"][k])[np.arange(6), labels]
    expected += (ce * w[labels, k]).mean()
  np.testing.assert_allclose(float(got), expected, rtol=1e-5)


@functools.cache
def _setup():
  """One model and its variables for the whole module (each build would compile anew)."""
  x, y = helpers.synthetic_data()
  model = get_model("mlp", K, hidden=(8,))
  variables = model.init(jax.random.key(0), jnp.asarray(x[:2]))
  return x, y, model, variables


def _alg(model, **kw):
  kw = {"hidden_dim": HIDDEN, "noise_dim": NOISE, "gen_batch_size": 6, "generator_steps": 5, **kw}
  return fedgen.fedgen(model, optax.sgd(0.1), K, **kw)


@functools.cache
def _initial_state():
  _, _, model, variables = _setup()
  return _alg(model).init(variables, jax.random.key(0))


def test_generator_is_the_two_layer_mlp_with_batchnorm():
  x, _, model, variables = _setup()
  state = _initial_state()
  g = jax.tree.map(np.asarray, state.generator)
  labels = jnp.array([0, 2, 1])
  feats, eps, _ = fedgen.generate_features(
    state.generator,
    jax.random.key(3),
    labels,
    False,
    hidden_dim=HIDDEN,
    num_classes=K,
    noise_dim=NOISE,
  )
  p, s = g["params"], g["batch_stats"]["bn"]
  z = np.concatenate([np.asarray(eps), np.eye(K)[np.asarray(labels)]], 1)
  z = z @ p["fc"]["kernel"] + p["fc"]["bias"]
  z = (z - s["mean"]) / np.sqrt(s["var"] + 1e-5) * p["bn"]["scale"] + p["bn"]["bias"]
  z = np.maximum(z, 0) @ p["representation"]["kernel"] + p["representation"]["bias"]
  np.testing.assert_allclose(np.asarray(feats), z, rtol=1e-5, atol=1e-6)
  assert feats.shape == (3, variables["params"]["head"]["kernel"].shape[0])
  assert float(eps.min()) >= 0 and float(eps.max()) < 1  # ε ~ U[0, 1), as the FedGen code


def test_client_loss_matches_numpy():
  x, y, model, variables = _setup()
  state = _initial_state()
  mask = jnp.array([1.0] * 7 + [0.0])
  batch = Batch(jnp.asarray(x[:8]), jnp.asarray(y[:8]), mask)
  key, t, alpha, beta = jax.random.key(5), 3, 2.0, 0.5
  shared = {"variables": variables, "generator": state.generator, "round": jnp.asarray(t)}
  ctx = client_lib.StepContext({}, shared, (), key)
  loss_fn = fedgen.fedgen_loss(model, K, alpha, beta, HIDDEN, NOISE, 6)
  params = variables["params"]
  loss, aux = loss_fn(params, batch, ctx)
  gen = dict(hidden_dim=HIDDEN, num_classes=K, noise_dim=NOISE)
  k_same, k_y, k_gen = fedgen.client_keys(key)
  g_same = np.asarray(fedgen.generate_features(state.generator, k_same, batch.y, False, **gen)[0])
  y_hat = np.asarray(jax.random.randint(k_y, (6,), 0, K))
  g = np.asarray(
    fedgen.generate_features(state.generator, k_gen, jnp.asarray(y_hat), False, **gen)[0]
  )
  head = jax.tree.map(lambda v: np.asarray(v, np.float64), params["head"])
  h = lambda f: f @ head["kernel"] + head["bias"]
  z, m, yy = np.asarray(aux.logits, np.float64), np.asarray(mask) > 0, y[:8]
  ce = -_np_log_softmax(z)[np.arange(8), yy][m].mean()
  teach = -_np_log_softmax(h(g))[np.arange(6), y_hat].mean()
  log_p, log_q = _np_log_softmax(h(g_same)), _np_log_softmax(z)
  kl = (np.exp(log_p) * (log_p - log_q)).sum(1)[m].mean()
  a, b = alpha * 0.98**t, beta * 0.98**t
  np.testing.assert_allclose(float(loss), ce + (6 / 8) * a * teach + b * kl, rtol=1e-5)
  # Round 0: the generator is untrained, the loss is FedAvg's CE.
  ctx0 = ctx._replace(shared={**shared, "round": jnp.asarray(0)})
  np.testing.assert_allclose(float(loss_fn(params, batch, ctx0)[0]), ce, rtol=1e-5)


def test_round0_is_fedavg_then_the_generator_trains_and_regularises():
  x, y, model, variables = _setup()
  fd = FederatedData(helpers.unequal_clients(len(x)), batch_size=8)
  runs = {}
  for name, alg in (("fedavg", None), ("fedgen", _alg(model, alpha=5.0))):
    alg = alg or registry.build_algorithm("fedavg", _ctx(model))
    state = alg.init(variables, jax.random.key(0))
    gen0 = T.tree_copy(getattr(state, "generator", {}))
    round_fn = make_round(alg, "vmap_scan", helpers.float_batch_fn())
    out = []
    for r in range(2):
      state, metrics = round_fn(state, helpers.round_data(fd, x, y, round_idx=r), jax.random.key(r))
      out.append(T.tree_ravel(alg.global_variables(state)))
      if name == "fedgen" and r == 0:
        assert np.isfinite(float(metrics["generator_teacher_loss"]))
        moved = T.tree_ravel(state.generator["params"]) - T.tree_ravel(gen0["params"])
        assert float(jnp.abs(moved).max()) > 1e-4  # the server's steps moved the generator
    runs[name] = out
  np.testing.assert_allclose(runs["fedgen"][0], runs["fedavg"][0], atol=1e-6)
  assert not np.allclose(runs["fedgen"][1], runs["fedavg"][1], atol=1e-4)


def _ctx(model):
  return registry.BuildContext(
    model, optax.sgd(0.1), normalizer(0.0, 1.0), num_clients=4, num_classes=K
  )


def test_fedgen_refuses_bad_settings():
  x, _, _, _ = _setup()
  tiny = helpers.tiny_model()  # its classifier is not a ``head`` layer
  with pytest.raises(ValueError, match=r"classifier layer params\['head'\]"):
    _alg(tiny).init(tiny.init(jax.random.key(0), jnp.asarray(x[:2])), jax.random.key(0))
  with pytest.raises(ValueError, match="num_classes >= 2, got 1"):
    fedgen.fedgen(tiny, optax.sgd(0.1), 1)
  with pytest.raises(ValueError, match="hidden_dim >= 1, got 0"):
    fedgen.fedgen(tiny, optax.sgd(0.1), K, hidden_dim=0)
  with pytest.raises(ValueError, match="generator_steps"):
    registry.check_hparams("fedgen", {"generator_steps": 0})
