"""Sequential FL (FedSeq): equals a plain Python chain; strategies agree; wiring and errors."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from fedjax_proj.algorithms import registry
from fedjax_proj.algorithms.base import make_round
from fedjax_proj.algorithms.sequential.fedseq import fedseq
from fedjax_proj.core import tree as tree_lib
from fedjax_proj.core.chain import sequence_order
from fedjax_proj.core.executor import Executor
from tests import helpers

LR = 0.1


def manual_chain(model, params, x, y, rd, order, step_fn=None):
  """Plain Python: each client in ``order`` runs plain SGD from the previous client's params.

  Returns the list of models handed on (one per client, in sequence order).
  ``step_fn(params, anchor, xb, yb) -> grads`` overrides the plain cross-entropy gradient.
  """

  def ce_grad(p, anchor, xb, yb):
    del anchor

    def loss(q):
      logits = model.apply({"params": q}, xb, train=True).logits
      return optax.softmax_cross_entropy_with_integer_labels(logits, yb).mean()

    return jax.grad(loss)(p)

  step_fn = jax.jit(step_fn or ce_grad)
  handed = []
  for c in np.asarray(order).tolist():
    anchor = params
    for s in range(rd.idx.shape[1]):
      m = np.asarray(rd.mask[c, s])
      if not m.any():
        continue
      ii = np.asarray(rd.idx[c, s])[m]
      g = step_fn(params, anchor, jnp.asarray(x[ii]), jnp.asarray(y[ii]))
      params = jax.tree.map(lambda p, gi: p - LR * gi, params, g)
    handed.append(params)
  return handed


@pytest.fixture(scope="module")
def setup():
  return helpers.sequential_setup()


def test_round_equals_plain_python_chain(setup):
  x, y, model, fd, variables = setup
  alg = fedseq(model, optax.sgd(LR))
  rd = helpers.round_data(fd, x, y)
  key = jax.random.key(7)
  round_fn = make_round(alg, "vmap_scan", helpers.float_batch_fn())
  state, _ = round_fn(alg.init(variables, key), rd, key)
  order = sequence_order(key, rd.idx.shape[0])
  expected = manual_chain(model, variables["params"], x, y, rd, order)[-1]
  np.testing.assert_allclose(
    tree_lib.tree_ravel(state.variables["params"]), tree_lib.tree_ravel(expected), atol=1e-5
  )
  # The order matters: the chain in sorted order ends elsewhere (non-IID clients).
  other = manual_chain(model, variables["params"], x, y, rd, np.arange(rd.idx.shape[0]))[-1]
  if not np.array_equal(np.asarray(order), np.arange(rd.idx.shape[0])):
    assert np.abs(tree_lib.tree_ravel(other) - tree_lib.tree_ravel(expected)).max() > 1e-4


@pytest.mark.parametrize("strategy", ["sequential", "vmap_stepwise"])
def test_host_loop_equals_scan(setup, strategy):
  x, y, model, fd, variables = setup
  alg = fedseq(model, helpers.sgd())
  states = {}
  for s in ("vmap_scan", strategy):
    round_fn = make_round(alg, s, helpers.float_batch_fn())
    state = alg.init(variables, jax.random.key(0))
    for r in range(2):
      state, metrics = round_fn(
        state, helpers.round_data(fd, x, y, round_idx=r), jax.random.key(10 + r)
      )
    states[s] = (state, metrics)
  (a, ma), (b, mb) = states["vmap_scan"], states[strategy]
  np.testing.assert_allclose(
    tree_lib.tree_ravel(a.variables), tree_lib.tree_ravel(b.variables), atol=1e-5
  )
  for k in ma:
    np.testing.assert_allclose(ma[k], mb[k], atol=1e-5)
  assert int(a.round) == int(b.round) == 2


def test_order_is_a_permutation_pure_in_key():
  a = np.asarray(sequence_order(jax.random.key(3), 10))
  assert sorted(a.tolist()) == list(range(10))
  np.testing.assert_array_equal(a, np.asarray(sequence_order(jax.random.key(3), 10)))
  orders = {tuple(np.asarray(sequence_order(jax.random.key(r), 10)).tolist()) for r in range(5)}
  assert len(orders) > 1


def test_scan_round_does_not_recompile(setup):
  x, y, model, fd, variables = setup
  alg = fedseq(model, helpers.sgd())
  key = jax.random.key(1)
  rd = helpers.round_data(fd, x, y)
  round_fn = make_round(alg, "vmap_scan", helpers.float_batch_fn())
  s2, _ = round_fn(alg.init(variables, key), rd, key)
  before = round_fn._cache_size()
  round_fn(s2, helpers.round_data(fd, x, y, round_idx=1), jax.random.key(2))
  assert round_fn._cache_size() == before == 1


def test_registry_and_errors(setup):
  x, y, model, fd, variables = setup
  ctx = registry.BuildContext(
    model=model,
    client_optimizer=helpers.sgd(),
    executor=Executor("vmap_scan", helpers.float_batch_fn()),
    normalize=lambda a: a,
    num_clients=4,
    num_classes=3,
  )
  assert registry.build_algorithm("fedseq", ctx).name == "fedseq"
  with pytest.raises(ValueError, match="server_optimizer=none"):
    registry.build_algorithm("fedseq", ctx._replace(server_optimizer=optax.sgd(1.0)))
  with pytest.raises(
    ValueError, match=r"unknown key\(s\) mu for --method=fedseq; fedseq accepts: \(none\)"
  ):
    registry.build_algorithm("fedseq", ctx, mu=0.1)
  with pytest.raises(ValueError, match="auto"):
    make_round(registry.build_algorithm("fedseq", ctx), "auto", ctx.executor.batch_fn)


def test_run_experiment_end_to_end(tmp_path):
  """The config-driven runner (registry -> base.make_round dispatch -> train) runs SFedKD."""
  from fedjax_proj.training.config import base_config
  from fedjax_proj.training.experiment import run_experiment

  for method, kwargs in (("sfedkd", {"num_teachers": 2}),):
    c = base_config()
    c.update(
      method=method,
      dataset="digits",
      model="mlp",
      num_clients=6,
      clients_per_round=3,
      rounds=3,
      local_epochs=3,
      batch_size=32,
      partition="iid",
      optimizer="adam",
      lr=3e-3,
      eval_every=1,
      progress=False,
      output_dir=str(tmp_path / method),
    )
    c.method_kwargs.update(kwargs)
    summary = run_experiment(c, log=lambda *_: None)
    assert summary["method"] == method
    # IID digits (10 classes): far above chance after 3 rounds; the run wrote its files.
    assert summary["final_test_accuracy"] > 0.5
    assert (tmp_path / method / "metrics.jsonl").exists()


def test_experiment_configs():
  """experiments/sequential.py's presets (fedjax_proj/configs/sequential.py): per-dataset paper
  settings, presets, and a clear bad-name error."""
  from fedjax_proj.configs import sequential as mod

  assert mod.get_config("paper", "cifar10").partition == "exdir:2:0.5"
  assert mod.get_config("paper", "cifar100").partition == "exdir:20:1.0"
  paper = mod.get_config("paper", "fashion_mnist")
  assert (paper.clients_per_round, paper.local_epochs, paper.lr) == (10, 5, 0.01)
  smoke = mod.get_config("smoke", "cifar10")
  assert "num_teachers" not in smoke.method_kwargs  # every method of the entry point accepts it
  with pytest.raises(ValueError, match="Unknown --dataset"):
    mod.get_config("paper", "svhn")
