"""SFedKD: multi-teacher DKD and its rounds (teacher choice: test_teacher_selection.py)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from fedjax_proj.algorithms.base import make_round
from fedjax_proj.algorithms.sequential import sfedkd as sfedkd_lib
from fedjax_proj.algorithms.sequential import teacher_selection
from fedjax_proj.algorithms.sequential.fedseq import fedseq
from fedjax_proj.algorithms.sequential.sfedkd import SFedKDConfig, multi_teacher_dkd, sfedkd
from fedjax_proj.core import random as random_lib
from fedjax_proj.core import tree as tree_lib
from fedjax_proj.core.chain import sequence_order
from fedjax_proj.data.federated import FederatedData
from tests import helpers
from tests.algorithms.sequential.test_base import LR, manual_chain

_greedy = jax.jit(teacher_selection.greedy_select, static_argnums=(1, 2))


def test_multi_teacher_dkd_is_weighted_sum_of_single_teacher_terms():
  rng = np.random.default_rng(5)
  t_logits = jnp.asarray(rng.normal(size=(3, 8, 5)) * 2, jnp.float32)
  s_logits = jnp.asarray(rng.normal(size=(8, 5)) * 2, jnp.float32)
  labels = jnp.asarray(rng.integers(0, 5, 8))
  mask = jnp.asarray((np.arange(8) < 6).astype(np.float32))
  g, h = jnp.array([0.2, 0.3, 0.5]), jnp.array([0.6, 0.3, 0.1])
  # helpers.dkd_loss gives DKD's two terms with its T² factor (mdistiller).
  single = [helpers.dkd_loss(t_logits[k], s_logits, labels, 3.0, mask) for k in range(3)]
  ref_n = sum(g[k] * single[k][1] for k in range(3))
  ref_t = sum(h[k] * single[k][0] for k in range(3))
  # Default: Eqs. 3-4 of paper 004, plain KL terms (no T²).
  cfg = SFedKDConfig(temperature=3.0)
  nckd, tckd = jax.jit(lambda *a: multi_teacher_dkd(*a, cfg))(
    t_logits, s_logits, labels, mask, g, h
  )
  np.testing.assert_allclose(nckd, ref_n / 9.0, rtol=1e-5)
  np.testing.assert_allclose(tckd, ref_t / 9.0, rtol=1e-5)
  # temperature_squared=True: DKD's code reading.
  cfg = SFedKDConfig(temperature=3.0, temperature_squared=True)
  nckd, tckd = jax.jit(lambda *a: multi_teacher_dkd(*a, cfg))(
    t_logits, s_logits, labels, mask, g, h
  )
  np.testing.assert_allclose(nckd, ref_n, rtol=1e-5)
  np.testing.assert_allclose(tckd, ref_t, rtol=1e-5)


# --- Rounds ---


@pytest.fixture(scope="module")
def setup():
  x, y = helpers.synthetic_data()
  model = helpers.tiny_model()
  fd = FederatedData(helpers.unequal_clients(len(x)), batch_size=5, local_epochs=2)
  variables = model.init(jax.random.key(0), jnp.asarray(x[:2]))
  return x, y, model, fd, variables


_CACHE: dict = {}


def _runs(setup, name, rounds=2):
  """(state, metrics) after each of ``rounds`` rounds of a named configuration, computed once."""
  if name not in _CACHE:
    x, y, model, fd, variables = setup
    bf = helpers.float_batch_fn()
    alg, strategy = {
      "kd_scan": (sfedkd(model, optax.sgd(LR), 3, SFedKDConfig(2)), "vmap_scan"),
      "kd_host": (sfedkd(model, optax.sgd(LR), 3, SFedKDConfig(2)), "sequential"),
      "kd_vmap": (
        sfedkd(model, optax.sgd(LR), 3, SFedKDConfig(2, teacher_forward="vmap")),
        "vmap_scan",
      ),
      "off_scan": (sfedkd(model, optax.sgd(LR), 3, SFedKDConfig(2, 0.0, 0.0)), "vmap_scan"),
      "random_scan": (
        sfedkd(model, optax.sgd(LR), 3, SFedKDConfig(2, selection="random")),
        "vmap_scan",
      ),
      "fedseq_scan": (fedseq(model, optax.sgd(LR)), "vmap_scan"),
    }[name]
    round_fn = make_round(alg, strategy, bf)
    state = alg.init(variables, jax.random.key(0))
    out = []
    for r in range(rounds):
      state, metrics = round_fn(
        state, helpers.round_data(fd, x, y, round_idx=r), jax.random.key(20 + r)
      )
      out.append((tree_lib.tree_copy(state), metrics))  # copies: the next round donates state
    _CACHE[name] = (out, round_fn)
  return _CACHE[name]


def test_first_round_is_fedseq_and_keeps_selected_models(setup):
  x, y, model, fd, variables = setup
  (state, metrics), *_ = _runs(setup, "kd_scan")[0]
  rd = helpers.round_data(fd, x, y, round_idx=0)
  order = np.asarray(sequence_order(jax.random.key(20), rd.idx.shape[0]))
  handed = manual_chain(model, variables["params"], x, y, rd, order)
  np.testing.assert_allclose(
    tree_lib.tree_ravel(state.variables), tree_lib.tree_ravel(handed[-1]), atol=1e-5
  )
  # Teachers = the models handed on by the greedily selected clients, with their distributions.
  fd_dists = np.stack(
    [np.bincount(y[fd.client_indices[c]], minlength=3) / fd.sizes[c] for c in order]
  )
  picks = np.asarray(_greedy(jnp.asarray(fd_dists), 2, "kl")).tolist()
  np.testing.assert_array_equal(metrics["teacher_clients"], np.asarray(rd.client_ids)[order][picks])
  np.testing.assert_allclose(state.teacher_dists, fd_dists[picks], atol=1e-6)
  for k, p in enumerate(picks):
    np.testing.assert_allclose(
      tree_lib.tree_ravel(tree_lib.index_clients(state.teachers, k)["params"]),
      tree_lib.tree_ravel(handed[p]),
      atol=1e-5,
    )
  assert bool(state.has_teachers)


def test_random_selection_keeps_the_models_the_end_key_draws(setup):
  """selection="random" (004 Table 3): the teachers are the clients that
  teacher_selection.random_select draws from the round's ``end`` key."""
  x, y, model, fd, variables = setup
  runs, _ = _runs(setup, "random_scan")
  for r, (_, metrics) in enumerate(runs):
    rd = helpers.round_data(fd, x, y, round_idx=r)
    key = jax.random.key(20 + r)
    order = np.asarray(sequence_order(key, rd.idx.shape[0]))
    picks = np.asarray(teacher_selection.random_select(random_lib.stream_key(key, "end"), 4, 2))
    np.testing.assert_array_equal(
      metrics["teacher_clients"], np.asarray(rd.client_ids)[order][picks]
    )


def test_uniform_weight_switches_reach_the_clients(setup):
  """uniform_g / uniform_h (004 Table 2) change the per-client weights the client program holds."""
  x, y, model, fd, variables = setup
  rd = helpers.round_data(fd, x, y)
  dists = sfedkd_lib.client_distributions(rd, 3)
  shared = {"variables": variables, "teacher_dists": dists[:2]}
  g, h = teacher_selection.teacher_weights(dists[:2], dists[3])
  assert abs(float(g[0] - g[1])) > 0.01 and abs(float(h[0] - h[1])) > 0.01  # not uniform already
  for uniform_g, want in ((True, ([0.5, 0.5], h)), (False, (g, [0.5, 0.5]))):
    cfg = SFedKDConfig(2, uniform_g=uniform_g, uniform_h=not uniform_g)
    alg = sfedkd(model, optax.sgd(LR), 3, cfg)
    state = alg.client.init(shared, {"dist": dists[3]}, jax.random.key(0), jnp.int32(1))
    np.testing.assert_allclose(state.extra[0], want[0], rtol=1e-6)
    np.testing.assert_allclose(state.extra[1], want[1], rtol=1e-6)


def test_zero_kd_weights_equal_fedseq_and_kd_changes_training(setup):
  ravel = lambda name: tree_lib.tree_ravel(_runs(setup, name)[0][-1][0].variables)
  np.testing.assert_allclose(ravel("off_scan"), ravel("fedseq_scan"), atol=1e-5)
  assert np.abs(np.asarray(ravel("kd_scan") - ravel("fedseq_scan"))).max() > 1e-3


def test_host_loop_equals_scan_with_teachers(setup):
  scan, round_fn = _runs(setup, "kd_scan")
  host, _ = _runs(setup, "kd_host")
  for (a, ma), (b, mb) in zip(scan, host):
    np.testing.assert_allclose(
      tree_lib.tree_ravel(a.variables), tree_lib.tree_ravel(b.variables), atol=1e-4
    )
    np.testing.assert_allclose(
      tree_lib.tree_ravel(a.teachers), tree_lib.tree_ravel(b.teachers), atol=1e-4
    )
    np.testing.assert_array_equal(ma["teacher_clients"], mb["teacher_clients"])
    np.testing.assert_allclose(ma["train_loss"], mb["train_loss"], rtol=1e-4)
  assert round_fn._cache_size() == 1  # rounds with and without teachers share one program


def test_vmapped_and_unrolled_teacher_forward_agree(setup):
  """``teacher_forward="vmap"`` (one vmapped forward over the stacked teachers) == unrolled."""
  (a, _), (b, _) = _runs(setup, "kd_scan")[0][-1], _runs(setup, "kd_vmap")[0][-1]
  np.testing.assert_allclose(
    tree_lib.tree_ravel(a.variables), tree_lib.tree_ravel(b.variables), atol=1e-5
  )


def test_too_many_teachers_is_a_clear_error(setup):
  x, y, model, fd, variables = setup
  alg = sfedkd(model, helpers.sgd(), 3, SFedKDConfig(num_teachers=5))
  with pytest.raises(ValueError, match="exceeds the 4 clients per round"):
    make_round(alg, "vmap_scan", helpers.float_batch_fn())(
      alg.init(variables, jax.random.key(0)), helpers.round_data(fd, x, y), jax.random.key(0)
    )
  with pytest.raises(ValueError, match="Unknown distribution metric"):
    sfedkd(model, helpers.sgd(), 3, SFedKDConfig(metric="cos"))
  with pytest.raises(ValueError, match="Unknown teacher_forward"):
    sfedkd(model, helpers.sgd(), 3, SFedKDConfig(teacher_forward="x"))
  with pytest.raises(ValueError, match="Unknown teacher selection"):
    sfedkd(model, helpers.sgd(), 3, SFedKDConfig(selection="best"))
