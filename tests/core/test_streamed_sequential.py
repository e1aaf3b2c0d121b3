"""The ``sequential`` round streams large cohorts into the aggregate's sums, client by client."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_proj.algorithms.base import make_round
from fedjax_proj.algorithms.fedavg import fedavg
from fedjax_proj.core import rounds
from fedjax_proj.core import tree as tree_lib
from fedjax_proj.core.engine import choose_strategy, load_strategy_table
from fedjax_proj.data.federated import FederatedData
from tests import helpers

BATCH_FN = helpers.float_batch_fn()


@pytest.fixture(scope="module")
def setup():
  x, y = helpers.synthetic_data(n=150)
  model = helpers.tiny_model()
  sizes = (3, 7, 19, 11, 5, 23, 9, 14, 30, 8)  # unequal, so the weights matter
  fd = FederatedData(helpers.unequal_clients(len(x), sizes), batch_size=4, local_epochs=2)
  variables = model.init(jax.random.key(0), jnp.asarray(x[:2]))
  return x, y, model, fd, variables


def _run(alg, setup, rounds_=2):
  x, y, _, fd, variables = setup
  round_fn = make_round(alg, "sequential", BATCH_FN)
  state = alg.init(variables, jax.random.key(0))
  for r in range(rounds_):
    state, metrics = round_fn(state, helpers.round_data(fd, x, y, round_idx=r), jax.random.key(r))
  return np.asarray(tree_lib.tree_ravel(state.variables)), jax.device_get(metrics)


def _plain(alg):
  """``alg`` whose aggregate is a plain function: no streaming form, so never streamed."""
  return alg._replace(aggregate=lambda *a: alg.aggregate(*a))


def test_below_threshold_is_bit_identical_to_the_stacked_round(setup):
  alg = fedavg(setup[2], helpers.sgd())
  assert rounds.STREAM_MIN_CLIENTS > 10
  got, m = _run(alg, setup)
  ref, ref_m = _run(_plain(alg), setup)
  np.testing.assert_array_equal(got, ref)
  for k in ref_m:
    np.testing.assert_array_equal(m[k], ref_m[k])


def test_streamed_equals_stacked_mean(setup, monkeypatch):
  """Streaming adds n_k θ_k client by client and divides by N once; the stacked round normalises
  the weights first. Both are float32 sums of 10 terms, so they differ by a few ulps of the
  parameters (|θ| < 1 here: ~1e-7 each), far below the 1e-5 asserted; two rounds of training
  let the difference grow through the second round's local steps, still well below it."""
  alg = fedavg(setup[2], helpers.sgd())
  ref, ref_m = _run(_plain(alg), setup)
  monkeypatch.setattr(rounds, "STREAM_MIN_CLIENTS", 2)
  got, m = _run(alg, setup)
  np.testing.assert_allclose(got, ref, atol=1e-5)
  for k in ref_m:
    np.testing.assert_allclose(m[k], ref_m[k], atol=1e-5)
  assert np.abs(ref - np.asarray(tree_lib.tree_ravel(setup[4]))).max() > 1e-3  # it trained


def test_streamed_round_keeps_one_accumulator(setup, monkeypatch):
  """No client output is kept or stacked: the fold sees every client once, in order, and its
  accumulator has the model's shapes (no cohort axis)."""
  x, y, model, fd, variables = setup
  alg = fedavg(model, helpers.sgd())
  monkeypatch.setattr(rounds, "STREAM_MIN_CLIENTS", 2)

  def no_stack(trees):
    raise AssertionError("the streamed round stacked client outputs")

  monkeypatch.setattr(tree_lib, "stack_clients", no_stack)
  engine_cls = rounds.ClientEngine
  seen, shapes = [], []
  original = engine_cls.run_folded

  def spy(self, *args):
    *rest, fold, acc = args

    def watched(acc, client_state, c):
      seen.append(c)
      acc = fold(acc, client_state, c)
      shapes.append(jax.tree.map(jnp.shape, acc["variables"]))
      return acc

    return original(self, *rest, watched, acc)

  monkeypatch.setattr(engine_cls, "run_folded", spy)
  round_fn = make_round(alg, "sequential", BATCH_FN)
  state = alg.init(variables, jax.random.key(0))
  state, _ = round_fn(state, helpers.round_data(fd, x, y, round_idx=0), jax.random.key(0))
  assert seen == list(range(10))
  model_shapes = jax.tree.map(jnp.shape, variables)
  assert all(s == model_shapes for s in shapes)


def test_auto_picks_the_streamed_sequential_round_for_large_conv_cohorts():
  """On XLA:CPU ``auto`` takes ``sequential`` for a CNN at 500 clients a round (the measured
  table), and 500 is past the streaming threshold, so such a round holds one accumulator."""
  table = load_strategy_table()
  assert choose_strategy("auto", backend="cpu", has_conv=True, num_clients=500,
                         table=table) == "sequential"  # fmt: skip
  assert rounds.STREAM_MIN_CLIENTS <= 500


def test_streamed_round_trims_partial_batches(setup, monkeypatch):
  """FedAvg's program declares ``trim_padding``: a streamed round runs a partial batch of 16 cut
  to its valid rows rounded up to 8, and equals the untrimmed streamed round up to float order
  (the masked mean over fewer zero rows; same 1e-5 bound as above)."""
  x, y, model, _, variables = setup
  sizes = (3, 7, 19, 11, 5, 23, 9, 14, 30, 8)  # partial last batches of 3..15 rows
  fd = FederatedData(helpers.unequal_clients(len(x), sizes), batch_size=16, local_epochs=2)
  monkeypatch.setattr(rounds, "STREAM_MIN_CLIENTS", 2)
  seen = set()

  def recording_batch_fn(images, labels, idx, mask, key):
    seen.add(idx.shape[0])  # at trace time: one entry per compiled batch size
    return BATCH_FN(images, labels, idx, mask, key)

  def run(alg):
    round_fn = make_round(alg, "sequential", recording_batch_fn)
    state = alg.init(variables, jax.random.key(0))
    for r in range(2):
      state, _ = round_fn(state, helpers.round_data(fd, x, y, round_idx=r), jax.random.key(r))
    return np.asarray(tree_lib.tree_ravel(state.variables))

  alg = fedavg(model, helpers.sgd())
  assert alg.client.trim_padding
  untrimmed = run(alg._replace(client=alg.client._replace(trim_padding=False)))
  assert seen == {16}
  trimmed = run(alg)
  assert seen == {8, 16}
  # Masked rows add exact zeros, so here the two agree even bit for bit; the bound allows another
  # summation order. ``seen`` above proves the trimmed steps ran.
  np.testing.assert_allclose(trimmed, untrimmed, atol=1e-5)
