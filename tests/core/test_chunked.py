"""Chunked rounds with streaming aggregation equal the ordinary round; bad input is refused."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from fedjax_proj.algorithms.base import make_round
from fedjax_proj.algorithms.fedavg import fedavg
from fedjax_proj.core import tree as tree_lib
from fedjax_proj.core.chunked import auto_client_chunk, make_chunked_round
from fedjax_proj.data.federated import FederatedData
from tests import helpers

BATCH_FN = helpers.float_batch_fn()


@pytest.fixture(scope="module")
def setup():
  x, y = helpers.synthetic_data(n=150)
  model = helpers.tiny_model()
  # 10 clients of unequal size (so weights matter), 2 epochs of batch 4.
  sizes = (3, 7, 19, 11, 5, 23, 9, 14, 30, 8)
  fd = FederatedData(helpers.unequal_clients(len(x), sizes), batch_size=4, local_epochs=2)
  variables = model.init(jax.random.key(0), jnp.asarray(x[:2]))
  return x, y, model, fd, variables


def _run(round_fn, alg, variables, fd, x, y, rounds=2):
  state = alg.init(variables, jax.random.key(0))
  for r in range(rounds):
    state, metrics = round_fn(state, helpers.round_data(fd, x, y, round_idx=r), jax.random.key(r))
  return np.asarray(tree_lib.tree_ravel(state.variables)), metrics


_REFERENCE = {}


def _reference(setup, alg):
  """The ordinary one-round result of plain FedAvg, computed once for the module."""
  if not _REFERENCE:
    x, y, model, fd, variables = setup
    _REFERENCE["r"] = _run(
      make_round(alg, "vmap_scan", BATCH_FN), alg, variables, fd, x, y, rounds=1
    )
  return _REFERENCE["r"]


@pytest.mark.parametrize("server_opt", [None, "adam"])
def test_chunk_all_clients_equals_ordinary_round(setup, server_opt):
  x, y, model, fd, variables = setup
  server = optax.adam(0.05) if server_opt else None
  alg = fedavg(model, helpers.sgd(), server)
  ref, ref_m = _run(make_round(alg, "vmap_scan", BATCH_FN), alg, variables, fd, x, y)
  got, m = _run(
    make_chunked_round(alg, "vmap_scan", BATCH_FN, client_chunk=10), alg, variables, fd, x, y
  )
  np.testing.assert_allclose(got, ref, atol=1e-6)
  for k in ref_m:
    np.testing.assert_allclose(m[k], ref_m[k], atol=1e-6)
  assert np.abs(ref - np.asarray(tree_lib.tree_ravel(variables))).max() > 1e-3  # It trained.


@pytest.mark.parametrize(
  "strategy,chunk", [("vmap_scan", 3), ("vmap_stepwise", 4), ("sequential", 3)]
)
def test_chunk_sizes_and_strategies_equal_ordinary_round(setup, strategy, chunk):
  """Uneven chunks (padding in vmap_scan, a short last chunk on the host) change nothing."""
  x, y, model, fd, variables = setup
  alg = fedavg(model, helpers.sgd())
  ref, ref_m = _reference(setup, alg)
  got, m = _run(
    make_chunked_round(alg, strategy, BATCH_FN, chunk), alg, variables, fd, x, y, rounds=1
  )
  np.testing.assert_allclose(got, ref, atol=1e-5)
  for k in ref_m:
    np.testing.assert_allclose(m[k], ref_m[k], atol=1e-5)


def test_every_chunk_contributes(setup):
  """Sanity: chunk sums really cover every chunk (dropping the last chunk would differ)."""
  x, y, model, fd, variables = setup
  alg = fedavg(model, helpers.sgd())
  full, _ = _run(
    make_chunked_round(alg, "vmap_scan", BATCH_FN, client_chunk=4), alg, variables, fd, x, y, 1
  )
  rd = helpers.round_data(fd, x, y)
  part = rd._replace(
    client_ids=rd.client_ids[:8], idx=rd.idx[:8], mask=rd.mask[:8], num_examples=rd.num_examples[:8]
  )
  state, _ = make_round(alg, "vmap_scan", BATCH_FN)(
    alg.init(variables, jax.random.key(0)), part, jax.random.key(0)
  )
  assert np.abs(np.asarray(tree_lib.tree_ravel(state.variables)) - full).max() > 1e-4


def test_no_recompilation_after_first_round(setup):
  x, y, model, fd, variables = setup
  alg = fedavg(model, helpers.sgd())
  round_fn = make_chunked_round(alg, "vmap_scan", BATCH_FN, client_chunk=4)
  state = alg.init(variables, jax.random.key(0))
  state, _ = round_fn(state, helpers.round_data(fd, x, y, cpr=8), jax.random.key(0))
  before = round_fn._cache_size()
  for r in (1, 2):
    state, _ = round_fn(state, helpers.round_data(fd, x, y, round_idx=r, cpr=8), jax.random.key(r))
  assert round_fn._cache_size() == before == 1


def test_auto_chunk_rule():
  assert auto_client_chunk(100, param_bytes=1000, budget_bytes=10**9) == 100
  # 8 copies of 1 MB per client, 100 MB budget -> at most 12 clients per chunk; 1000 clients
  # -> 84 equal chunks of 12.
  chunk = auto_client_chunk(1000, param_bytes=10**6, budget_bytes=10**8)
  assert chunk <= 12 and np.ceil(1000 / chunk) == np.ceil(1000 / 12)
  assert auto_client_chunk(5, param_bytes=10**12, budget_bytes=1) == 1


def test_bad_input_is_refused(setup):
  x, y, model, fd, variables = setup
  alg = fedavg(model, helpers.sgd())
  with pytest.raises(ValueError, match="client_chunk"):
    make_chunked_round(alg, "vmap_scan", BATCH_FN, client_chunk=0)
  with pytest.raises(ValueError, match="streaming"):
    make_chunked_round(
      alg._replace(aggregate=alg.aggregate.direct, name="x"), "vmap_scan", BATCH_FN, 4
    )
  # A derived method with its own aggregate (e.g. FedNova) must not inherit FedAvg's streaming.
  with pytest.raises(ValueError, match="replaced its aggregate"):
    make_chunked_round(alg._replace(aggregate=lambda *a: None), "vmap_scan", BATCH_FN, 4)
  # Methods that only change the client (FedProx) keep a valid streaming aggregate.
  from fedjax_proj.algorithms.fedprox import fedprox

  make_chunked_round(fedprox(model, helpers.sgd(), mu=0.1), "vmap_scan", BATCH_FN, 4)
