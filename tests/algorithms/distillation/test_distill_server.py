"""FedProj's memory Z_ens taken from the mean teacher equals the clients' mean on the memory rows.

distill_server.py reads the next round's memory logits off the combined (plain-mean) teacher
instead of averaging the clients' logits on the memory subset again (docs/performance.md, FedProj's
server cost); this must not change a single bit, on the traced and on the host path.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_proj.algorithms.distillation import distill
from fedjax_proj.algorithms.distillation.distill_server import MemoryBuffer, distillation_server
from fedjax_proj.data.federated import FederatedData
from tests import helpers


@pytest.mark.parametrize(("path", "memory_size"), [("traced", 48), ("host", 20)])
def test_memory_logits_equal_the_clients_mean_on_the_memory_rows(path, memory_size):
  model = helpers.tiny_model()
  x, y = helpers.synthetic_data(n=68)
  public = jnp.asarray(helpers.synthetic_data(n=48, seed=5)[0])
  variables = model.init(jax.random.key(0), jnp.asarray(x[:2]))
  cfg = distill.DistillConfig(epochs=1, batch_size=16, lr=1e-2, teacher_batch_size=7)
  init, aggregate = distillation_server(
    model,
    lambda z: z,
    cfg,
    public_size=48,
    memory=MemoryBuffer(memory_size),
    lmem_metric=True,
  )
  clients = 3
  # Distinct client models: the global one plus client-specific noise.
  stacked = jax.tree.map(
    lambda v: v[None] + 0.3 * jax.random.normal(jax.random.key(7), (clients, *v.shape)),
    variables,
  )
  outputs = {
    "variables": stacked,
    "metrics": {"train_loss": jnp.ones(clients)},
  }
  fd = FederatedData(helpers.unequal_clients(len(x)), batch_size=6)
  rd = helpers.round_data(fd, x, y, 0, cpr=clients)._replace(extra={"public_images": public})
  agg = jax.jit(aggregate) if path == "traced" else aggregate.host
  state, metrics = agg(init(variables, jax.random.key(1)), rd, outputs, jax.random.key(2))
  logits = distill.client_logits_scan(model, stacked, lambda z: z, public, 7)  # [C, P, K]
  expected = distill.mean_teacher(logits[:, state.memory_idx])
  assert state.memory_logits.shape == (memory_size, 3)
  # Two programs (the server's gather-then-average and this test's average of gathered rows) may
  # reduce in different orders on XLA:CPU: equal to float round-off, not bit for bit.
  np.testing.assert_allclose(
    np.asarray(state.memory_logits), np.asarray(expected), rtol=1e-6, atol=1e-6
  )
  assert np.isfinite(float(metrics["lmem_global"]))
  assert len(set(np.asarray(state.memory_idx).tolist())) == memory_size


@pytest.mark.parametrize("path", ["traced", "host"])
def test_without_a_memory_buffer_the_state_holds_an_empty_one(path):
  """FedDF and FedET (``memory=None``): the same state structure as FedProj's, with a [0] buffer
  that passes through the round unchanged and no drift metric."""
  model = helpers.tiny_model()
  x, y = helpers.synthetic_data(n=68)
  public = jnp.asarray(helpers.synthetic_data(n=48, seed=5)[0])
  variables = model.init(jax.random.key(0), jnp.asarray(x[:2]))
  cfg = distill.DistillConfig(epochs=1, batch_size=16, lr=1e-2, teacher_batch_size=7)
  init, aggregate = distillation_server(model, lambda z: z, cfg, public_size=48, lmem_metric=True)
  state = init(variables, jax.random.key(1))
  assert state.memory_idx.shape == (0,) and state.memory_idx.dtype == jnp.int32
  assert state.memory_logits.shape == (0, 3) and state.memory_logits.dtype == jnp.float32
  clients = 2
  outputs = {
    "variables": jax.tree.map(lambda v: jnp.stack([v] * clients), variables),
    "metrics": {"train_loss": jnp.ones(clients)},
  }
  fd = FederatedData(helpers.unequal_clients(len(x)), batch_size=6)
  rd = helpers.round_data(fd, x, y, 0, cpr=clients)._replace(extra={"public_images": public})
  agg = jax.jit(aggregate) if path == "traced" else aggregate.host
  new_state, metrics = agg(state, rd, outputs, jax.random.key(2))
  assert new_state.memory_idx.shape == (0,) and new_state.memory_logits.shape == (0, 3)
  assert "lmem_global" not in metrics and bool(new_state.has_memory)
