"""Two CPU processes on loopback (jax.distributed + gloo) run FedAvg with the client axis sharded
over both processes' devices; both end with identical global parameters equal to one process."""

from __future__ import annotations

import json
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_proj.algorithms.base import make_round
from fedjax_proj.algorithms.fedavg import fedavg
from fedjax_proj.core import distributed
from fedjax_proj.core import tree as tree_lib
from fedjax_proj.data.federated import FederatedData
from tests import helpers
from tests.core.multiprocess import free_port, run_processes

SETUP = textwrap.dedent(
  """
  x, y = helpers.synthetic_data(n=200)
  model = helpers.tiny_model()
  fd = FederatedData(np.array_split(np.arange(200), 8), batch_size=6, local_epochs=2)
  variables = model.init(jax.random.key(0), jnp.asarray(x[:2]))
  alg = fedavg(model, helpers.sgd())
  batch_fn = helpers.float_batch_fn()
  """
)

WORKER = (
  textwrap.dedent(
    """
  import json, sys
  import numpy as np
  from fedjax_proj.core import distributed
  pid, port = int(sys.argv[1]), sys.argv[2]
  assert distributed.initialize(f"127.0.0.1:{port}", 2, pid, cpu_collectives="gloo",
                                initialization_timeout=120)
  import jax, jax.numpy as jnp
  from fedjax_proj.algorithms.base import make_round
  from fedjax_proj.algorithms.fedavg import fedavg
  from fedjax_proj.core import tree as T
  from fedjax_proj.data.federated import FederatedData
  from tests import helpers
  """
  )
  + SETUP
  + textwrap.dedent(
    """
  assert jax.process_count() == 2 and jax.device_count() == 2 * jax.local_device_count()
  mesh = distributed.global_client_mesh()
  round_fn = make_round(alg, "vmap_scan", batch_fn)
  state = distributed.replicate(alg.init(variables, jax.random.key(0)), mesh)
  for r in range(2):
    rd = distributed.shard_round_data(helpers.round_data(fd, x, y, round_idx=r), mesh)
    # This process holds only its half of the clients.
    assert sum(s.data.shape[0] for s in rd.idx.addressable_shards) == 4, rd.idx.sharding
    state, metrics = round_fn(state, rd, distributed.replicate(jax.random.key(r), mesh))
  try:
    distributed.shard_round_data(helpers.round_data(fd, x, y, cpr=3), mesh)
  except ValueError as e:
    assert "multiple of 2" in str(e), e
  else:
    raise AssertionError("3 clients accepted on 2 devices")
  flat = distributed.fetch(T.tree_ravel(alg.global_variables(state)))
  loss = float(distributed.fetch(metrics["train_loss"]))
  print("RESULT " + json.dumps({"params": flat.tolist(), "loss": loss}), flush=True)
  distributed.shutdown()
  """
  )
)


def _single_process_reference():
  exec_globals = {"np": np, "jax": jax, "jnp": jnp, "FederatedData": FederatedData}
  exec_globals.update(helpers=helpers, fedavg=fedavg)
  exec(SETUP, exec_globals)
  alg, variables = exec_globals["alg"], exec_globals["variables"]
  x, y, fd = exec_globals["x"], exec_globals["y"], exec_globals["fd"]
  round_fn = make_round(alg, "vmap_scan", exec_globals["batch_fn"])
  state = alg.init(variables, jax.random.key(0))
  for r in range(2):
    state, metrics = round_fn(state, helpers.round_data(fd, x, y, round_idx=r), jax.random.key(r))
  return np.asarray(tree_lib.tree_ravel(state.variables)), float(metrics["train_loss"])


def test_two_processes_on_loopback_equal_single_process():
  port = str(free_port())
  outputs = run_processes([[sys.executable, "-c", WORKER, str(pid), port] for pid in (0, 1)])
  results = []
  for out, _ in outputs:
    line = next(ln for ln in out.splitlines() if ln.startswith("RESULT "))
    results.append(json.loads(line[len("RESULT ") :]))
  p0, p1 = (np.asarray(r["params"], np.float32) for r in results)
  np.testing.assert_array_equal(p0, p1)  # Replicated: bit-identical on both processes.
  ref_params, ref_loss = _single_process_reference()
  np.testing.assert_allclose(p0, ref_params, atol=1e-5)
  np.testing.assert_allclose(results[0]["loss"], ref_loss, atol=1e-5)
  # Training moved the parameters: the comparison is not between two untouched inits.
  init = np.asarray(tree_lib.tree_ravel(helpers.tiny_model().init(jax.random.key(0), None)))
  assert np.abs(p0 - init).max() > 1e-3


def test_initialize_single_process_is_noop_and_validates():
  assert distributed.initialize("127.0.0.1:1", 1, 0) is False
  assert distributed.initialize(None, 1, None) is False
  with pytest.raises(ValueError, match="together"):
    distributed.initialize("127.0.0.1:1234", 2, None)
  with pytest.raises(ValueError, match="process_id"):
    distributed.initialize("127.0.0.1:1234", 2, 2)
  with pytest.raises(ValueError, match="port"):
    distributed.initialize("127.0.0.1", 2, 0)


def test_single_process_global_placement_matches_plain_round():
  """shard_round_data/replicate on a one-process mesh change placement, not results."""
  x, y = helpers.synthetic_data(n=60)
  model = helpers.tiny_model()
  fd = FederatedData(np.array_split(np.arange(60), 4), batch_size=5)
  alg = fedavg(model, helpers.sgd())
  variables = model.init(jax.random.key(0), jnp.asarray(x[:2]))
  rd = helpers.round_data(fd, x, y)
  mesh = distributed.global_client_mesh()
  round_fn = make_round(alg, "vmap_scan", helpers.float_batch_fn())
  s1, _ = round_fn(alg.init(variables, jax.random.key(0)), rd, jax.random.key(1))
  s2, _ = round_fn(
    distributed.replicate(alg.init(variables, jax.random.key(0)), mesh),
    distributed.shard_round_data(rd, mesh),
    distributed.replicate(jax.random.key(1), mesh),
  )
  np.testing.assert_allclose(
    distributed.fetch(tree_lib.tree_ravel(s2.variables)),
    np.asarray(tree_lib.tree_ravel(s1.variables)),
    atol=1e-6,
  )
