"""Engine strategies agree with each other and with a hand-written per-client loop."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_proj.algorithms.base import make_round
from fedjax_proj.algorithms.fedavg import fedavg
from fedjax_proj.core import engine as engine_lib
from fedjax_proj.core import tree as tree_lib
from fedjax_proj.data.federated import FederatedData
from tests import helpers

BATCH_FN = helpers.float_batch_fn()


@pytest.fixture(scope="module")
def setup():
  x, y = helpers.synthetic_data()
  model = helpers.tiny_model()
  fd = FederatedData(helpers.unequal_clients(len(x)), batch_size=5, local_epochs=2)
  alg = fedavg(model, helpers.sgd())
  variables = model.init(jax.random.key(0), jnp.asarray(x[:2]))
  rd = helpers.round_data(fd, x, y)
  return x, y, model, fd, alg, variables, rd


@pytest.mark.parametrize("strategy", ["vmap_stepwise", "sequential"])
def test_strategies_equal_vmap_scan(setup, strategy):
  *_, alg, variables, rd = setup
  key = jax.random.key(1)
  ref_state, ref_metrics = make_round(alg, "vmap_scan", BATCH_FN)(alg.init(variables, key), rd, key)
  state, metrics = make_round(alg, strategy, BATCH_FN)(alg.init(variables, key), rd, key)
  np.testing.assert_allclose(
    tree_lib.tree_ravel(state.variables), tree_lib.tree_ravel(ref_state.variables), atol=1e-5
  )
  for k in ref_metrics:
    np.testing.assert_allclose(metrics[k], ref_metrics[k], atol=1e-5)


def test_fedavg_equals_manual_loop(setup):
  """Per-client plain-Python SGD loop + weighted average equals the vmapped round."""
  x, y, model, fd, alg, variables, rd = setup
  key = jax.random.key(1)
  state, _ = make_round(alg, "vmap_scan", BATCH_FN)(alg.init(variables, key), rd, key)

  import optax

  opt = helpers.sgd()
  locals_, weights = [], []
  for c in range(rd.idx.shape[0]):
    params = variables["params"]
    opt_state = opt.init(params)
    for s in range(rd.idx.shape[1]):
      m = np.asarray(rd.mask[c, s])
      if not m.any():
        continue
      ii = np.asarray(rd.idx[c, s])[m]

      def loss(p, ii=ii):
        logits = model.apply({"params": p}, jnp.asarray(x[ii]), train=True).logits
        return optax.softmax_cross_entropy_with_integer_labels(logits, jnp.asarray(y[ii])).mean()

      g = jax.grad(loss)(params)
      upd, opt_state = opt.update(g, opt_state, params)
      params = optax.apply_updates(params, upd)
    locals_.append(params)
    weights.append(float(rd.num_examples[c]))
  w = np.array(weights) / sum(weights)
  expected = jax.tree.map(lambda *ps: sum(wi * p for wi, p in zip(w, ps)), *locals_)
  np.testing.assert_allclose(
    tree_lib.tree_ravel(state.variables["params"]), tree_lib.tree_ravel(expected), atol=1e-5
  )


def test_padded_steps_are_noops(setup):
  """A client whose step axis is padded ends where its unpadded run ends (to round-off)."""
  x, y, model, fd, alg, variables, rd = setup
  key = jax.random.key(3)
  keys = jax.random.split(key, rd.idx.shape[0])
  shared, _ = alg.broadcast(alg.init(variables, key), rd, key)
  run = lambda idx, mask: engine_lib.run_vmap_scan(
    alg.client, BATCH_FN, shared, {}, rd.images, rd.labels, idx, mask, keys
  )
  out = run(rd.idx, rd.mask)
  pad = lambda a: jnp.concatenate([a, jnp.zeros_like(a[:, :3])], axis=1)
  out_padded = run(pad(rd.idx), pad(rd.mask))
  # A longer scan is another compiled program: equal to round-off (the padded steps are masked).
  np.testing.assert_allclose(
    tree_lib.tree_ravel(out["variables"]),
    tree_lib.tree_ravel(out_padded["variables"]),
    rtol=1e-6,
    atol=1e-7,
  )


def test_no_recompilation_on_second_round(setup):
  x, y, model, fd, alg, variables, rd = setup
  round_fn = make_round(alg, "vmap_scan", BATCH_FN)
  key = jax.random.key(0)
  state = alg.init(variables, key)
  state, _ = round_fn(state, rd, key)
  rd2 = helpers.round_data(fd, x, y, round_idx=1)
  before = round_fn._cache_size()
  state, _ = round_fn(state, rd2, jax.random.key(1))
  assert round_fn._cache_size() == before


def test_choose_strategy_and_conv_detection():
  conv = lambda x: jax.lax.conv_general_dilated(
    x, jnp.ones((3, 3, 1, 2)), (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC")
  )
  assert engine_lib.has_convolution(conv, jnp.ones((1, 5, 5, 1)))
  assert not engine_lib.has_convolution(lambda x: x @ x.T, jnp.ones((2, 2)))
  # Not in the table (no GPU measurement yet): the design, vmap_scan, for every model kind.
  assert engine_lib.choose_strategy("auto", backend="gpu", has_conv=True) == "vmap_scan"
  assert engine_lib.choose_strategy("sequential", backend="gpu") == "sequential"
  with pytest.raises(ValueError, match="vmap_scan"):
    engine_lib.choose_strategy("bogus")


def test_auto_follows_the_committed_strategy_table():
  """Every bucket of fedjax_proj/core/strategy_table.json, at and just past its upper bound."""
  table = engine_lib.load_strategy_table()
  assert table["rules"]["cpu"]["conv"], "the CPU rule for conv models is missing"
  for backend, kinds in table["rules"].items():
    assert backend in table["measurements"], f"{backend}: rule without its measurement record"
    # The writer's command as it ran: the file path before the benchmarks were shelved, the
    # module (python -m benchmarks.perf.strategies) since.
    command = table["measurements"][backend]["command"]
    assert any(
      f"{writer} --write_table" in command
      for writer in ("benchmarks/strategies.py", "benchmarks.perf.strategies")
    ), command
    for kind, buckets in kinds.items():
      assert buckets[-1][0] is None, "the last bucket must be open"
      lo = 1
      for max_clients, strategy in buckets:
        for c in (lo, max_clients) if max_clients is not None else (lo, 10_000):
          got = engine_lib.choose_strategy(
            "auto", backend=backend, has_conv=kind == "conv", num_clients=c
          )
          assert got == strategy, (backend, kind, c, got, strategy)
        lo = (max_clients or 0) + 1


def test_auto_rule_buckets_and_forced_vmap_scan():
  table = {
    "rules": {"cpu": {"dense": [[8, "sequential"], [32, "vmap_stepwise"], [None, "vmap_scan"]]}}
  }
  pick = lambda c, **kw: engine_lib.choose_strategy(
    "auto", backend="cpu", num_clients=c, table=table, **kw
  )
  assert [pick(c) for c in (1, 8, 9, 32, 33, 1000)] == [
    "sequential",
    "sequential",
    "vmap_stepwise",
    "vmap_stepwise",
    "vmap_scan",
    "vmap_scan",
  ]
  assert pick(None) == "vmap_scan"  # unknown cohort: the largest-cohort bucket
  # A kind the backend's rule does not list: vmap_scan.
  assert pick(4, has_conv=True) == "vmap_scan"
  # Sharded rounds need the one-program round whatever the table says.
  assert pick(4, sharded=True) == "vmap_scan"


def _flag_program(seen: list) -> engine_lib.ClientProgram:
  """A client that sums its batches, doubled when the round-level flag ``double`` is on; its step
  records the type of the flag it was traced with (a Python bool on the host loops)."""

  def step(shared, state, batch, key):
    del key
    on = shared["double"]
    seen.append(type(on))
    scale = (2.0 if on else 1.0) if isinstance(on, bool) else jnp.where(on, 2.0, 1.0)
    return state + scale * jnp.sum(batch.x * batch.mask[:, None]) + shared["bias"]

  return engine_lib.ClientProgram(
    init=lambda shared, client_input, key: jnp.zeros(()),
    step=step,
    final=lambda state: state,
    static_shared=("double",),
  )


@pytest.mark.parametrize("strategy", ["sequential", "vmap_stepwise"])
def test_host_loops_build_one_step_per_static_shared_value(setup, strategy):
  """A program's ``static_shared`` flag reaches a host-looped step as a Python bool, one jitted
  step per value, reused in later rounds; results equal the one-program round's traced flag."""
  *_, rd = setup
  keys = jax.random.split(jax.random.key(4), rd.idx.shape[0])
  seen = []
  engine = engine_lib.ClientEngine(_flag_program(seen), BATCH_FN, strategy)
  got = {}
  for flag in (True, False, True, False):
    shared = {"double": jnp.asarray(flag), "bias": jnp.asarray(0.5)}
    got[flag] = engine.run(shared, {}, rd.images, rd.labels, rd.idx, rd.mask, keys)
    ref = engine_lib.run_vmap_scan(
      _flag_program([]), BATCH_FN, shared, {}, rd.images, rd.labels, rd.idx, rd.mask, keys
    )
    np.testing.assert_allclose(got[flag], ref, rtol=1e-6)
  assert not np.allclose(got[True], got[False])
  assert set(engine.step_variants) == {(True,), (False,)}
  assert all(step._cache_size() == 1 for step in engine.step_variants.values())
  assert seen == [bool, bool]  # traced once per value, never again


def test_a_bool_and_an_int_flag_of_equal_value_get_their_own_steps(setup):
  """True == 1 in Python; a step specialised on the bool is not reused for the integer."""
  *_, rd = setup
  keys = jax.random.split(jax.random.key(4), rd.idx.shape[0])
  seen = []
  engine = engine_lib.ClientEngine(_flag_program(seen), BATCH_FN, "sequential")
  for flag in (jnp.asarray(True), jnp.asarray(1, jnp.int32)):
    shared = {"double": flag, "bias": jnp.asarray(0.5)}
    engine.run(shared, {}, rd.images, rd.labels, rd.idx, rd.mask, keys)
  assert seen == [bool, int]


def test_static_shared_refuses_what_it_cannot_specialise_on(setup):
  """A missing key, a float or a non-scalar value is refused before any step runs."""
  *_, rd = setup
  engine = engine_lib.ClientEngine(_flag_program([]), BATCH_FN, "sequential")
  keys = jax.random.split(jax.random.key(4), rd.idx.shape[0])
  run = lambda shared: engine.run(shared, {}, rd.images, rd.labels, rd.idx, rd.mask, keys)  # noqa: E731
  with pytest.raises(ValueError, match="holding every declared key"):
    run({"bias": jnp.asarray(0.5)})
  with pytest.raises(ValueError, match="bool or integer scalar"):
    run({"double": jnp.asarray(1.0), "bias": jnp.asarray(0.5)})
  with pytest.raises(ValueError, match="bool or integer scalar"):
    run({"double": jnp.asarray([True, False]), "bias": jnp.asarray(0.5)})
  assert engine.step_variants == {}
