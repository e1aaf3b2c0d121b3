"""FedGKD: the teacher is the buffer's parameter average; FedGKD-VOTE's server weights."""

from __future__ import annotations

from types import SimpleNamespace

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import pytest

from fedjax_proj.algorithms import client as client_lib
from fedjax_proj.algorithms import losses, registry
from fedjax_proj.algorithms.base import make_round
from fedjax_proj.algorithms.distillation import fedgkd
from fedjax_proj.core import tree as T
from fedjax_proj.core.types import Batch
from fedjax_proj.data.federated import FederatedData
from fedjax_proj.data.pipeline import normalizer
from fedjax_proj.training.config import base_config, validate_config
from fedjax_proj.training.inputs import held_out, subset
from tests import helpers


@pytest.mark.parametrize("buffer_initial", [True, False])
def test_fedgkd_teacher_is_average_of_last_m_globals(buffer_initial):
  x, y = helpers.synthetic_data()
  model = helpers.tiny_model()
  fd = FederatedData(helpers.unequal_clients(len(x)), batch_size=8)
  alg = fedgkd.fedgkd(model, optax.sgd(0.1), buffer_size=3, buffer_initial=buffer_initial)
  variables = model.init(jax.random.key(0), jnp.asarray(x[:2]))
  state = alg.init(variables, jax.random.key(0))
  history = [variables]
  round_fn = make_round(alg, "vmap_scan", helpers.float_batch_fn())
  for r in range(4):
    shared, _ = jax.jit(alg.broadcast)(state, helpers.round_data(fd, x, y, round_idx=r), None)
    # buffer_initial=False (the authors' code): w_0 is never buffered, so once one aggregated
    # model exists the teacher averages aggregated models only (round 0's teacher is unused).
    kept = history if buffer_initial or r == 0 else history[1:]
    expected = jax.tree.map(lambda *v: sum(v) / len(v), *kept[-3:])
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
    alg = fedgkd.fedgkd(model, optax.sgd(0.1), gamma=gamma)
    state = alg.init(variables, jax.random.key(0))
    round_fn = make_round(alg, "vmap_scan", helpers.float_batch_fn())
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
  alg = fedgkd.fedgkd(model, optax.sgd(0.1), vote=True, buffer_size=2)
  state = alg.init(model.init(jax.random.key(0), jnp.asarray(x[:2])), jax.random.key(0))
  round_fn = make_round(alg, "vmap_scan", helpers.float_batch_fn())
  for r in range(3):
    state, metrics = round_fn(state, helpers.round_data(fd, x, y, round_idx=r), jax.random.key(r))
  assert int(state.count) == 2 and np.isfinite(float(metrics["train_loss"]))


# FedGKD-VOTE with the server's validation split (vote_validation="server"; 002 Parameter Setting).
LAM, VOTE_M = 0.1, 3


def _server_vote_setup():
  x, y = helpers.synthetic_data()
  model = helpers.tiny_model()
  fd = FederatedData(helpers.unequal_clients(len(x)), batch_size=8)
  alg = fedgkd.fedgkd(
    model,
    optax.sgd(0.1),
    vote=True,
    buffer_size=VOTE_M,
    lam=LAM,
    vote_validation="server",
    normalize=normalizer(0.0, 1.0),
    validation_batch_size=7,  # 52 held-out examples: the last forward batch is padded
  )
  variables = model.init(jax.random.key(0), jnp.asarray(x[:2]))
  return x, y, model, fd, alg, variables


def _with_validation(rd, vx, vy):
  return rd._replace(extra={"validation_images": jnp.asarray(vx), "validation_labels": vy})


def _run_server_vote(strategy, vx, vy, rounds=2):
  x, y, model, fd, alg, variables = _server_vote_setup()
  state = alg.init(variables, jax.random.key(0))
  round_fn = make_round(alg, strategy, helpers.float_batch_fn())
  for r in range(rounds):
    rd = _with_validation(helpers.round_data(fd, x, y, round_idx=r), vx, vy)
    state, _ = round_fn(state, rd, jax.random.key(r))
  return model, alg, state


def _hand_weights(model, buffer, count, vx, vy):
  """λ·softmax(−L/β), β = 1/M, from each valid buffered model's mean CE in numpy."""
  losses_m = []
  for m in range(count):
    z = np.asarray(
      model.apply(T.index_clients(buffer, m), jnp.asarray(vx), train=False).logits, np.float64
    )
    log_p = z - z.max(1, keepdims=True)
    log_p -= np.log(np.exp(log_p).sum(1, keepdims=True))
    losses_m.append(-log_p[np.arange(len(vy)), vy].mean())
  e = np.exp(-np.array(losses_m) * VOTE_M)
  return np.concatenate([LAM * e / e.sum(), np.zeros(VOTE_M - count)])


def test_fedgkd_vote_server_weights_are_the_closed_form_of_validation_losses():
  x, y = helpers.synthetic_data()
  vx, vy = x[68:], y[68:]  # the 52 examples no client holds
  model, alg, state = _run_server_vote("vmap_scan", vx, vy)
  assert int(state.count) == 3
  expected = _hand_weights(model, state.buffer, 3, vx, vy)
  np.testing.assert_allclose(np.asarray(state.vote_weights), expected, rtol=1e-5, atol=1e-7)
  assert abs(float(jnp.sum(state.vote_weights)) - LAM) < 1e-6
  # The broadcast carries exactly these weights to every client.
  rd = helpers.round_data(FederatedData(helpers.unequal_clients(len(x)), 8), x, y, round_idx=2)
  shared, _ = jax.jit(alg.broadcast)(state, rd, None)
  np.testing.assert_array_equal(np.asarray(shared["vote_weights"]), np.asarray(state.vote_weights))


def test_fedgkd_vote_server_weights_come_from_held_out_data_not_the_private_batch():
  x, y = helpers.synthetic_data()
  vx, vy = x[68:], y[68:]
  _, _, state = _run_server_vote("vmap_scan", vx, vy)
  _, _, other = _run_server_vote("vmap_scan", vx[::-1] * 0.0 + 1.0, vy)  # other held-out data
  assert not np.allclose(np.asarray(state.vote_weights), np.asarray(other.vote_weights))
  # The client's KD term uses the broadcast weights whatever its batch: CE + Σ_m w_m KL_m.
  model = helpers.tiny_model()
  loss_fn = fedgkd.gkd_loss(model, 0.2, 1.0, True, LAM)
  shared = {
    "teachers": state.buffer,
    "valid": jnp.arange(VOTE_M) < state.count,
    "vote_weights": jnp.array([0.07, 0.02, 0.01]),
    "use_kd": jnp.array(True),
  }
  params = T.index_clients(state.buffer, 0)["params"]
  for rows in (slice(0, 8), slice(30, 38)):
    batch = Batch(jnp.asarray(x[rows]), jnp.asarray(y[rows]), jnp.ones(8))
    ctx = client_lib.StepContext({}, shared, (), jax.random.key(0))
    loss, aux = loss_fn(params, batch, ctx)
    kls = [
      losses.kl_from_logits(
        model.apply(T.index_clients(state.buffer, m), batch.x, train=False).logits,
        aux.logits,
        1.0,
        batch.mask,
      )
      for m in range(VOTE_M)
    ]
    ce = losses.cross_entropy(aux.logits, batch.y, batch.mask)
    expected = ce + sum(w * k for w, k in zip([0.07, 0.02, 0.01], kls, strict=True))
    np.testing.assert_allclose(float(loss), float(expected), rtol=1e-5)


def test_fedgkd_vote_server_sequential_equals_vmap_scan():
  x, y = helpers.synthetic_data()
  vx, vy = x[68:], y[68:]
  _, _, ref = _run_server_vote("vmap_scan", vx, vy)
  _, _, got = _run_server_vote("sequential", vx, vy)
  for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(ref), strict=True):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=2e-6)


def test_fedgkd_vote_server_refuses_without_held_out_data():
  model = helpers.tiny_model()
  ctx = registry.BuildContext(model, optax.sgd(0.1), normalizer(0.0, 1.0), num_clients=4)
  with pytest.raises(ValueError, match="--train_subset=45000"):
    registry.build_algorithm("fedgkd_vote", ctx, vote_validation="server")
  with pytest.raises(ValueError, match="--method=fedgkd_vote"):
    fedgkd.fedgkd(model, optax.sgd(0.1), vote_validation="server")
  c = base_config()
  c.method, c.method_kwargs = (
    "fedgkd_vote",
    ml_collections.ConfigDict({"vote_validation": "server"}),
  )
  with pytest.raises(
    ValueError, match="--train_subset=0 trains on the whole.*--train_subset=45000"
  ):
    validate_config(c)


def test_held_out_is_what_train_subset_leaves_out():
  ds = SimpleNamespace(images=np.arange(50)[:, None], labels=np.arange(50) % 7)
  kept, _ = subset(ds, 45, 3)
  val_x, val_y = held_out(ds, 45, 3)
  assert len(val_y) == 5 and val_y.dtype == np.int32
  assert sorted(np.concatenate([kept[:, 0], val_x[:, 0]]).tolist()) == list(range(50))
  assert len(held_out(ds, 0, 3)[1]) == 0


# The regulariser switch (002 "Choice of Regularizer", Table 9).


def _np_log_softmax(z):
  z = z - z.max(1, keepdims=True)
  return z - np.log(np.exp(z).sum(1, keepdims=True))


def _loss_on_fixed_logits(distill_loss, gamma=0.2, temperature=2.0):
  """(the client loss, its CE, student logits, teacher logits, labels, mask) on one batch."""
  x, y = helpers.synthetic_data()
  model = helpers.tiny_model()
  student = model.init(jax.random.key(1), jnp.asarray(x[:2]))
  teacher = model.init(jax.random.key(2), jnp.asarray(x[:2]))
  mask = jnp.array([1.0] * 7 + [0.0])  # one padded example, which must not count
  batch = Batch(jnp.asarray(x[:8]), jnp.asarray(y[:8]), mask)
  shared = {"teacher": teacher, "use_kd": jnp.array(True)}
  ctx = client_lib.StepContext({}, shared, (), jax.random.key(0))
  loss_fn = fedgkd.gkd_loss(model, gamma, temperature, False, 0.1, distill_loss)
  loss, aux = loss_fn(student["params"], batch, ctx)
  zt = np.asarray(model.apply(teacher, batch.x, train=False).logits, np.float64)
  zs = np.asarray(aux.logits, np.float64)
  m = np.asarray(mask, bool)
  ce = -_np_log_softmax(zs)[np.arange(8), y[:8]][m].mean()
  return float(loss), ce, zs[m], zt[m]


def test_fedgkd_mse_regulariser_is_the_mean_squared_logit_difference():
  loss, ce, zs, zt = _loss_on_fixed_logits("mse")
  # (γ/2)·mean over real examples and classes of (z_s − z_t)²; no temperature (the code's).
  np.testing.assert_allclose(loss, ce + 0.1 * np.mean((zs - zt) ** 2), rtol=1e-5)
  np.testing.assert_allclose(
    float(fedgkd.logit_mse(jnp.asarray(zt), jnp.asarray(zs))), np.mean((zs - zt) ** 2), rtol=1e-5
  )


def test_fedgkd_kl_regulariser_is_t2_kl_of_tempered_softmaxes():
  loss, ce, zs, zt = _loss_on_fixed_logits("kl", temperature=2.0)
  log_p, log_q = _np_log_softmax(zt / 2.0), _np_log_softmax(zs / 2.0)
  kl = (np.exp(log_p) * (log_p - log_q)).sum(1).mean()
  np.testing.assert_allclose(loss, ce + 0.1 * 4.0 * kl, rtol=1e-5)
  assert loss > ce + 1e-4  # the term is active on these logits


def test_fedgkd_without_regulariser_is_fedavg():
  loss, ce, _, _ = _loss_on_fixed_logits("none")
  np.testing.assert_allclose(loss, ce, rtol=1e-6)
  # Whole rounds: from round 1 on the teacher is active for "kl", never for "none" (= FedAvg).
  x, y = helpers.synthetic_data()
  model = helpers.tiny_model()
  fd = FederatedData(helpers.unequal_clients(len(x)), batch_size=8)
  variables = model.init(jax.random.key(0), jnp.asarray(x[:2]))
  finals = {}
  for name, alg in (
    ("fedavg", registry.build_algorithm("fedavg", _ctx(model))),
    ("none", fedgkd.fedgkd(model, optax.sgd(0.1), gamma=5.0, distill_loss="none")),
    ("kl", fedgkd.fedgkd(model, optax.sgd(0.1), gamma=5.0)),
  ):
    state = alg.init(variables, jax.random.key(0))
    round_fn = make_round(alg, "vmap_scan", helpers.float_batch_fn())
    for r in range(2):
      state, _ = round_fn(state, helpers.round_data(fd, x, y, round_idx=r), jax.random.key(r))
    finals[name] = T.tree_ravel(alg.global_variables(state))
  np.testing.assert_allclose(finals["none"], finals["fedavg"], atol=1e-6)
  assert not np.allclose(finals["kl"], finals["fedavg"], atol=1e-4)


def _ctx(model):
  return registry.BuildContext(model, optax.sgd(0.1), normalizer(0.0, 1.0), num_clients=4)


def test_fedgkd_distill_loss_is_checked_before_building():
  model = helpers.tiny_model()
  with pytest.raises(ValueError, match=r"distill_loss must be one of \('none', 'mse', 'kl'\)"):
    fedgkd.fedgkd(model, optax.sgd(0.1), distill_loss="l2")
  with pytest.raises(ValueError, match="not one of fedgkd's distill_loss values"):
    registry.check_hparams("fedgkd", {"distill_loss": "KL"})
  with pytest.raises(ValueError, match="--method=fedgkd or drop distill_loss"):
    fedgkd.fedgkd(model, optax.sgd(0.1), vote=True, distill_loss="mse")
  with pytest.raises(ValueError, match="unknown key.s. distill_loss for --method=fedgkd_vote"):
    registry.check_hparams("fedgkd_vote", {"distill_loss": "mse"})


def test_fedgkd_plus_is_fedgkd_on_moons_projection_head_network():
  """002 "Evaluation Methods": FedGKD+ adds MOON's projection layer to FedGKD's network."""
  from fedjax_proj.algorithms import moon
  from fedjax_proj.models import get_model

  # What distinguishes it: the run builds its model with MOON's head (experiment.py merges the
  # spec's model options), logits from the 256-wide projection; hyperparameters are FedGKD's.
  assert registry.model_kwargs("fedgkd_plus") == moon.MODEL_KWARGS
  assert registry.model_kwargs("fedgkd") == {}
  assert registry.declared_hparams("fedgkd_plus") == registry.declared_hparams("fedgkd")
  model = get_model("mlp", 3, hidden=(8,), **registry.model_kwargs("fedgkd_plus"))
  x, y = helpers.synthetic_data()
  fd = FederatedData(helpers.unequal_clients(len(x)), batch_size=8)
  variables = model.init(jax.random.key(0), jnp.asarray(x[:2]))
  assert variables["params"]["head"]["kernel"].shape == (256, 3)
  ctx = _ctx(model)
  finals = {}
  for name in ("fedgkd_plus", "fedgkd"):
    alg = registry.build_algorithm(name, ctx, gamma=5.0)
    assert alg.name == name
    state = alg.init(variables, jax.random.key(0))
    round_fn = make_round(alg, "vmap_scan", helpers.float_batch_fn())
    for r in range(2):
      state, _ = round_fn(state, helpers.round_data(fd, x, y, round_idx=r), jax.random.key(r))
    finals[name] = T.tree_ravel(alg.global_variables(state))
  # On the same network the two names compute the same rounds (the KD term active in round 1).
  np.testing.assert_allclose(finals["fedgkd_plus"], finals["fedgkd"], atol=1e-6)
