"""FedCIL+FL: the ACGAN losses, replay through the old tasks' heads, the server's FedAvg and
consolidation, the end-of-task hook, and the client round's strategies."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_proj.algorithms.base import make_round
from fedjax_proj.algorithms.continual import fedcil as fc
from fedjax_proj.core import tree as tree_lib
from fedjax_proj.core.executor import Executor
from fedjax_proj.data.continual import input_transform, task_model, task_partition
from fedjax_proj.data.federated import FederatedData
from fedjax_proj.data.pipeline import make_batch_fn, normalizer
from fedjax_proj.models import multi_head
from fedjax_proj.models.generator import ConditionalGenerator, conditional_noise
from fedjax_proj.training.continual import task_round_data
from tests import helpers

SMALL = {"md_iter": 2, "gen_batch_size": 8, "gen_arch": "mlp", "gen_hidden": (16,)}


def _bce(logit, target):
  p = 1.0 / (1.0 + np.exp(-logit))
  return -(target * np.log(p) + (1 - target) * np.log(1 - p))


def _ce(logits, y):
  z = logits - logits.max(-1, keepdims=True)
  logp = z - np.log(np.exp(z).sum(-1, keepdims=True))
  return -logp[np.arange(len(y)), y]


def test_critic_loss_is_the_acgan_discriminator_loss_by_hand():
  rng = np.random.default_rng(0)
  logits, f_logits = rng.normal(size=(3, 4)), rng.normal(size=(3, 4))
  rf, f_rf = rng.normal(size=3), rng.normal(size=3)
  y, fy, mask = np.array([0, 3, 1]), np.array([2, 2, 0]), np.array([1.0, 1.0, 0.0])
  real = (jnp.asarray(logits), jnp.asarray(rf), jnp.asarray(y), jnp.asarray(mask))
  fake = (jnp.asarray(f_logits), jnp.asarray(f_rf), jnp.asarray(fy))
  real_term = (_bce(rf, 1.0) * mask).sum() / 2 + (_ce(logits, y) * mask).sum() / 2
  fake_term = _bce(f_rf, 0.0).mean() + _ce(f_logits, fy).mean()
  got = fc.critic_loss(real, fake, jnp.bool_(True))
  np.testing.assert_allclose(got, real_term + fake_term, rtol=1e-5)
  np.testing.assert_allclose(fc.critic_loss(real, fake, jnp.bool_(False)), real_term, rtol=1e-5)
  # train_a_batch's mixture with the replayed batch, and without one.
  np.testing.assert_allclose(fc.replay_mix(2.0, 6.0, jnp.bool_(True), 0.5), 4.0)
  np.testing.assert_allclose(fc.replay_mix(2.0, 6.0, jnp.bool_(True), 0.25), 5.0)
  np.testing.assert_allclose(fc.replay_mix(2.0, 6.0, jnp.bool_(False), 0.5), 2.0)


def test_kl_is_torch_kldiv_batchmean():
  rng = np.random.default_rng(1)
  p = jax.nn.softmax(jnp.asarray(rng.normal(size=(5, 3))))
  log_q = jax.nn.log_softmax(jnp.asarray(rng.normal(size=(5, 3))))
  want = np.sum(np.asarray(p) * (np.log(np.asarray(p)) - np.asarray(log_q))) / 5
  np.testing.assert_allclose(fc.kl_batchmean(p, log_q), want, rtol=1e-5)
  assert float(fc.kl_batchmean(p, jnp.log(p))) == pytest.approx(0.0, abs=1e-6)


def test_labels_noise_and_generator_shapes():
  allowed = jnp.zeros(20).at[jnp.asarray([3, 17])].set(1.0)
  lab, valid = fc.draw_labels(jax.random.key(0), allowed, 200)
  assert bool(valid) and set(np.unique(np.asarray(lab)).tolist()) == {3, 17}
  _, none = fc.draw_labels(jax.random.key(0), jnp.zeros(20), 4)
  assert not bool(none)
  z = conditional_noise(jax.random.key(1), jnp.asarray([2, 5]), 30, 20)
  np.testing.assert_array_equal(np.asarray(z[:, :20]), np.eye(20)[[2, 5]])
  assert float(jnp.std(z[:, 20:])) > 0.5
  with pytest.raises(ValueError, match="one-hot"):
    conditional_noise(jax.random.key(1), jnp.asarray([2]), 10, 20)
  # 28x28 MNIST comes from the 32x32 transposed-conv stack, centre-cropped; flat inputs from MLP.
  for shape in ((28, 28, 1), (784,)):
    gen = ConditionalGenerator(shape, hidden=(8,), channels=2, low=-0.5, high=2.5)
    params = gen.init(jax.random.key(2), z)
    x = gen.apply(params, z)
    assert x.shape == (2, *shape)
    assert float(x.min()) >= -0.5 and float(x.max()) <= 2.5


def test_server_picks_clients_in_proportion_to_their_pooled_samples():
  # Client 0 holds labels {0, 1}, client 1 only {0}: pooling B draws each, label 0 has B/2 samples
  # from client 0 and B from client 1.
  current = jnp.asarray([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
  probs = np.asarray(fc.client_pick_probs(current))
  np.testing.assert_allclose(probs[:, 0], [1 / 3, 2 / 3], rtol=1e-6)
  np.testing.assert_allclose(probs[:, 1], [1.0, 0.0])
  np.testing.assert_allclose(probs[:, 2], [0.0, 0.0])


@functools.cache
def _tiny(**hparams):
  return helpers.tiny_continual("fedcil", **{**SMALL, **hparams})


def _model_and_state():
  bench, cm, _, _, variables = _tiny()
  return bench, cm, cm.algorithm.init(variables, jax.random.key(0))


def test_replayed_labels_go_through_their_own_task_heads():
  bench, _, state = _model_and_state()
  variables = _tiny()[4]
  model = task_model(multi_head(helpers.TinyBackbone(), 2, 10), input_transform(bench))
  critic = fc.Critic(model, 10, 2)
  dparams = {"model": variables["params"], "rf": state.method["rf"]}
  x = jax.random.normal(jax.random.key(3), (4, 6, 6, 1))
  labels = jnp.asarray([3, 12, 19, 0])  # (task, class): (0, 3), (1, 2), (1, 9), (0, 0)
  logits, rf, cls = critic.labelled(dparams, {}, x, labels, jax.random.key(4))
  np.testing.assert_array_equal(np.asarray(cls), [3, 2, 9, 0])
  # Without batch statistics the batch takes one pass with a task per example; one masked pass
  # per task (the path of models with batch statistics) gives the same rows.
  per_logits, per_rf = critic.per_task(dparams, {}, x, labels // 10, jax.random.key(4))
  for i, task in enumerate([0, 1, 1, 0]):
    want, want_rf, _ = critic.one_task(dparams, {}, x[i : i + 1], task, jax.random.key(5))
    for got, got_rf in ((logits, rf), (per_logits, per_rf)):
      np.testing.assert_allclose(got[i], want[0], rtol=1e-5, atol=1e-6)
      np.testing.assert_allclose(got_rf[i], want_rf[0], rtol=1e-5, atol=1e-6)


def _round_data(bench, task, clients=(0, 1)):
  fed = FederatedData(task_partition(bench, task, 4, iid=True, seed=0), 16, 1)
  return task_round_data(bench.images, bench.labels, fed, np.asarray(clients, np.int32), 0, 0, task)


def _fake_outputs(state, num):
  """Client outputs whose classifier, rf head and generator are the global ones shifted by k."""
  one = {"model": state.variables, "rf": state.method["rf"], "gen": state.method["gen"]}
  shift = lambda k: jax.tree.map(lambda a: a + 0.01 * k, one)
  metrics = {
    "train_loss": jnp.ones(num),
    "train_accuracy": jnp.ones(num),
    "gen_loss": jnp.ones(num),
  }
  stacked = tree_lib.stack_clients([shift(k) for k in range(num)])
  return {"variables": stacked, "num_steps": jnp.ones(num, jnp.int32), "metrics": metrics}


def test_server_averages_classifier_and_generator_then_consolidates():
  bench, _, _, _, variables = _tiny()
  rd = _round_data(bench, 0)
  rd = rd._replace(num_examples=jnp.asarray([1.0, 3.0]))
  means = {}
  for md_iter in (0, 1):
    _, cm, _, _, _ = _tiny(md_iter=md_iter)
    state = cm.algorithm.init(variables, jax.random.key(0))
    outputs = _fake_outputs(state, 2)
    new, metrics = cm.algorithm.aggregate(state, rd, outputs, jax.random.key(1))
    want = tree_lib.weighted_mean(outputs["variables"], rd.num_examples)
    means[md_iter] = (new, want)
    assert int(new.method["round_in_task"]) == 1
  new, want = means[0]  # no consolidation: FedAvg of both networks (weights 1:3)
  for a, b in zip(jax.tree.leaves(new.variables), jax.tree.leaves(want["model"]), strict=True):
    np.testing.assert_allclose(a, b, rtol=1e-6)
  for a, b in zip(jax.tree.leaves(new.method["gen"]), jax.tree.leaves(want["gen"]), strict=True):
    np.testing.assert_allclose(a, b, rtol=1e-6)
  new, want = means[1]  # one consolidation step moves classifier, rf head and generator
  for key, got in (("model", new.variables), ("rf", new.method["rf"]), ("gen", new.method["gen"])):
    diff = tree_lib.tree_ravel(got) - tree_lib.tree_ravel(want[key])
    assert float(jnp.max(jnp.abs(diff))) > 0, key
  assert "server_d_loss" in metrics and np.isfinite(metrics["server_d_loss"])


def test_end_task_keeps_the_generator_and_each_clients_labels():
  bench, cm, state = _model_and_state()
  rd = _round_data(bench, 1, clients=(0, 1, 2, 3))
  state = state._replace(method=dict(state.method, round_in_task=jnp.int32(7)))
  new, metrics = cm.end_task(state, rd, jax.random.key(0), 1)
  for a, b in zip(jax.tree.leaves(new.method["old_gen"]), jax.tree.leaves(state.method["gen"])):
    np.testing.assert_array_equal(a, b)
  past = np.asarray(new.method["past"])
  assert past[:, :10].sum() == 0  # task 0's columns untouched
  labels = np.asarray(rd.labels)[np.asarray(rd.idx)]
  for c in range(4):
    held = np.unique(labels[c][np.asarray(rd.mask)[c]])
    np.testing.assert_array_equal(np.flatnonzero(past[c, 10:]), held)
  assert int(new.method["round_in_task"]) == 0 and metrics["replay_labels"] == past.sum()


def _two_rounds(strategy, **hparams):
  bench, cm, _, _, variables = _tiny(**hparams)
  normalize = normalizer(0.0, 255.0)
  round_fn = make_round(cm.algorithm, Executor(strategy, make_batch_fn(normalize)))
  state = cm.algorithm.init(variables, jax.random.key(0))
  states = []
  for r in range(2):
    state, _ = round_fn(state, _round_data(bench, 0, clients=(r, r + 2)), jax.random.key(r))
    states.append(jax.tree.map(np.asarray, state))  # the next round donates ``state``
  return states


def test_vmap_scan_equals_sequential_and_consistency_waits_for_round_two():
  scan = _two_rounds("vmap_scan", consistency=1.0)
  seq = _two_rounds("sequential", consistency=1.0)
  for a, b in zip(jax.tree.leaves(scan[1]), jax.tree.leaves(seq[1]), strict=True):
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=2e-5)
  # Consistency enforcement is off in a task's first round (the code's glob_iter_ != 0), so its
  # weight changes nothing there and changes round two.
  plain = _two_rounds("vmap_scan")
  first = [tree_lib.tree_ravel(s[0].variables) for s in (scan, plain)]
  np.testing.assert_allclose(first[0], first[1], rtol=1e-6, atol=1e-7)
  second = [tree_lib.tree_ravel(s[1].variables) for s in (scan, plain)]
  assert float(jnp.max(jnp.abs(second[0] - second[1]))) > 1e-4


def test_bad_hyperparameters_fail_with_their_name():
  with pytest.raises(ValueError, match="gen_batch_size"):
    _tiny(gen_batch_size=0)
  with pytest.raises(ValueError, match="new_task_weight"):
    _tiny(new_task_weight=1.5)
  with pytest.raises(ValueError, match="gen_arch"):
    _tiny(gen_arch="resnet")
