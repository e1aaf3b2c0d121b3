"""The example method of docs/design.md ("Writing a new method") builds, registers and trains.

The example is FedAvg with an L2 penalty wd·‖θ‖² on the local loss, so with wd = 0 it must give
FedAvg's round, and with wd > 0 the local models (and their average) must have a smaller norm.
"""

from __future__ import annotations

import re
import types
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax

from fedjax_proj.algorithms import registry
from fedjax_proj.algorithms.base import make_round
from fedjax_proj.algorithms.fedavg import fedavg
from fedjax_proj.core import tree as tree_lib
from fedjax_proj.data.federated import FederatedData
from tests import helpers

DESIGN = Path(__file__).resolve().parents[1] / "docs" / "design.md"


def _example_module() -> types.ModuleType:
  text = DESIGN.read_text()
  section = text[text.index("## Writing a new method") :]
  blocks = re.findall(r"```python\n(.*?)```", section, flags=re.S)
  assert len(blocks) == 1, "docs/design.md 'Writing a new method' should hold one python example"
  module = types.ModuleType("design_example")
  exec(compile(blocks[0], str(DESIGN), "exec"), module.__dict__)
  return module


def _one_round(alg, model, x, y):
  fd = FederatedData(helpers.unequal_clients(len(x)), batch_size=8)
  rd = helpers.round_data(fd, x, y)
  variables = model.init(jax.random.key(0), jnp.asarray(x[:2]))
  state = alg.init(variables, jax.random.key(1))
  state, metrics = make_round(alg, "vmap_scan", helpers.float_batch_fn())(
    state, rd, jax.random.key(2)
  )
  return alg.global_variables(state)["params"], metrics


def test_design_example_is_fedavg_at_zero_penalty_and_shrinks_with_it():
  ex = _example_module()
  model = helpers.tiny_model()
  x, y = helpers.synthetic_data()
  ref, _ = _one_round(fedavg(model, optax.sgd(0.1)), model, x, y)
  zero, metrics = _one_round(ex.l2_fedavg(model, optax.sgd(0.1), wd=0.0), model, x, y)
  for a, b in zip(jax.tree.leaves(ref), jax.tree.leaves(zero)):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6, atol=1e-7)
  assert np.isfinite(float(metrics["train_loss"]))
  shrunk, _ = _one_round(ex.l2_fedavg(model, optax.sgd(0.1), wd=1.0), model, x, y)
  assert float(tree_lib.tree_sq_norm(shrunk)) < float(tree_lib.tree_sq_norm(ref))


def test_design_example_builds_through_the_registry():
  ex = _example_module()
  model = helpers.tiny_model()
  ctx = registry.BuildContext(
    model=model,
    client_optimizer=optax.sgd(0.1),
    normalize=lambda v: v,
    num_clients=4,
  )
  registry.register(ex.SPEC)
  try:
    assert "l2_fedavg" in registry.methods()
    assert registry.declared_hparams("l2_fedavg") == {"wd": 1e-4}
    alg = registry.build_algorithm("l2_fedavg", ctx, wd=0.5)
    assert alg.name == "l2_fedavg"
    assert not registry.needs_public("l2_fedavg")
  finally:
    registry.unregister("l2_fedavg")
  assert "l2_fedavg" not in registry.methods()
