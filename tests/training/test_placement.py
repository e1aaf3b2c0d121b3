"""training.placement: the one place a run decides its execution (strategy, mesh, chunk)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_proj.algorithms.fedavg import fedavg
from fedjax_proj.core.chunked import auto_client_chunk, tree_bytes
from fedjax_proj.core.engine import choose_strategy
from fedjax_proj.data.federated import FederatedData
from fedjax_proj.training import placement
from fedjax_proj.training.config import base_config
from fedjax_proj.training.placement import build_round, plan_execution
from tests import helpers

BATCH_FN = helpers.float_batch_fn()
# 160 kB of variables: 8 copies per client, so about 840 clients fit the 1 GiB CPU budget.
BIG = {"w": np.zeros(40_000, np.float32)}


def _plan(variables=BIG, shard=True, **overrides):
  c = base_config()
  c.update(overrides)
  logs = []
  executor = plan_execution(
    c, BATCH_FN, has_conv=False, variables=variables, log=logs.append, shard=shard
  )
  return executor, logs


def test_auto_strategy_and_chunk_are_decided_here():
  ex, _ = _plan(clients_per_round=10)
  assert ex.strategy == choose_strategy("auto", has_conv=False, num_clients=10)
  assert ex.mesh is None and ex.client_chunk is None  # 10 clients fit: the ordinary round
  expected = auto_client_chunk(1000, tree_bytes(BIG))
  assert expected < 1000, "the budget changed: make BIG larger so 1000 clients do not fit"
  ex, _ = _plan(clients_per_round=1000, strategy="vmap_scan")
  assert (ex.strategy, ex.client_chunk, ex.chunk_optional) == ("vmap_scan", expected, True)


def test_a_chunk_the_user_asks_for_is_kept_and_logged():
  ex, _ = _plan(clients_per_round=6, client_chunk="4", strategy="sequential")
  assert (ex.strategy, ex.client_chunk, ex.chunk_optional) == ("sequential", 4, False)
  none, _ = _plan(clients_per_round=1000, client_chunk="none")
  assert none.client_chunk is None
  x, y = helpers.synthetic_data(n=40)
  model = helpers.tiny_model()
  alg = fedavg(model, helpers.sgd())
  logs = []
  round_fn = build_round(alg, ex, logs.append)
  assert logs == ["clients run in chunks of 4 with streaming aggregation"]
  fd = FederatedData(helpers.unequal_clients(40, (5, 6, 7, 8, 4, 3)), batch_size=4)
  variables = model.init(jax.random.key(0), jnp.asarray(x[:2]))
  state, metrics = round_fn(
    alg.init(variables, jax.random.key(0)), helpers.round_data(fd, x, y), jax.random.key(1)
  )
  assert np.isfinite(float(metrics["train_loss"]))


def test_a_chunk_larger_than_the_round_is_the_round_and_logged_so():
  ex, _ = _plan(clients_per_round=2, client_chunk="50", strategy="sequential")
  assert (ex.client_chunk, ex.chunk_optional) == (2, False)
  logs = []
  build_round(fedavg(helpers.tiny_model(), helpers.sgd()), ex, logs.append)
  assert logs == ["clients run in chunks of 2 with streaming aggregation"]


def test_cpu_convolutions_are_onednn_where_it_loads_and_xla_elsewhere():
  """The CPU placement picks oneDNN's convolutions where its handler loads (the fallback to
  gemm_grad, with the extra hidden, is tests/models/test_conv.py's
  test_onednn_missing_says_so_in_one_line_and_computes_gemm_grad); other backends keep XLA's; the
  run's log line names the implementation, and --model_kwargs overrides it."""
  from fedjax_proj.models import onednn

  assert placement.conv_impl_choice("gpu") == ("xla", None)
  assert placement.conv_impl_for("tpu") == "xla"
  if reason := onednn.unavailable_reason():
    pytest.skip(reason)
  assert placement.conv_impl_choice("cpu") == ("onednn", None)
  assert placement.conv_impl_for("cpu") == "onednn"
  kwargs = {"dropout": 0.1}
  assert placement.conv_impl_line(kwargs) == "convolutions: conv_impl=onednn"
  assert kwargs == {"dropout": 0.1, "conv_impl": "onednn"}
  kwargs = {"conv_impl": "gemm_grad"}
  assert placement.conv_impl_line(kwargs) == "convolutions: conv_impl=gemm_grad (--model_kwargs)"
  assert kwargs == {"conv_impl": "gemm_grad"}


def test_several_cpu_devices_keep_xla_convolutions_and_say_why(monkeypatch):
  """oneDNN's FFI calls have no partitioning rule, so a process with several CPU devices (whose
  clients may be sharded) gets gemm_grad, and the log line says why and how to override it."""
  monkeypatch.setattr(jax, "device_count", lambda: 4)
  impl, why = placement.conv_impl_choice("cpu")
  assert impl == "gemm_grad" and why.startswith("4 CPU devices: oneDNN's convolutions"), why
  assert "--model_kwargs=conv_impl=onednn" in why and "\n" not in why
  assert placement.conv_impl_choice("gpu") == ("xla", None)
