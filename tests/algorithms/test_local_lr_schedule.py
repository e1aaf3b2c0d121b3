"""The local step learning-rate schedule (client.epoch_step_lr, the FedProj code's StepLR).

The loss is linear in the one parameter, so with plain SGD every step moves it by exactly the
learning rate in force: the per-step change reveals lr · γ^floor(epoch / step_epochs), per client
epoch (clients of different sizes, one padded step axis) and restarting every round.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from fedjax_proj.algorithms import client as client_lib
from fedjax_proj.core.engine import ClientEngine
from fedjax_proj.core.types import Batch
from fedjax_proj.data.federated import FederatedData
from fedjax_proj.training.config import base_config, validate_config
from fedjax_proj.training.optimizers import client_optimizer

LR, GAMMA, EPOCHS, STEP_EPOCHS, BATCH = 0.5, 0.1, 4, 2, 4
SIZES = (5, 12)  # ceil(n / B) = 2 and 3 steps per epoch; the step axis is padded to 12


def _linear_loss(params, batch, ctx):
  # d/dw = 1 whatever the batch: SGD moves w by -lr each step.
  return jnp.sum(params["w"]) + 0.0 * jnp.sum(batch.x), client_lib.LossAux(
    jnp.zeros((batch.x.shape[0], 2)), ctx.model_state
  )


def _record(grads, params, batch, ctx):
  """Keeps w before each step in ``extra`` = (history [S], next index)."""
  history, i = ctx.extra
  return grads, (history.at[i].set(params["w"][0]), i + 1)


def _program(num_steps: int):
  c = ml_collections.ConfigDict(base_config().to_dict())
  c.optimizer, c.lr, c.momentum, c.local_epochs = "sgd", LR, 0.0, EPOCHS
  c.lr_schedule, c.lr_step_epochs, c.lr_step_gamma = "step", STEP_EPOCHS, GAMMA
  validate_config(c)
  return client_lib.local_training_client(
    None,
    client_optimizer(c),
    _linear_loss,
    init_extra=lambda shared, ci, key: (jnp.zeros(num_steps + 1), 0),
    transform_grads=_record,
    finalize=lambda state: {"history": state.extra[0].at[state.extra[1]].set(state.params["w"][0])},
  )


def _expected_lrs(n: int) -> np.ndarray:
  per_epoch = -(-n // BATCH)
  steps = np.arange(EPOCHS * per_epoch)
  return LR * GAMMA ** ((steps // per_epoch) // STEP_EPOCHS)


@pytest.mark.parametrize("strategy", ["vmap_scan", "vmap_stepwise", "sequential"])
def test_step_lr_per_client_epoch_and_restarts_each_round(strategy):
  data = FederatedData([np.arange(5), np.arange(5, 17)], BATCH, EPOCHS)
  images = jnp.zeros((17, 1))
  labels = jnp.zeros(17, jnp.int32)
  batch_fn = lambda im, lb, idx, mask, key: Batch(im[idx], lb[idx], mask.astype(jnp.float32))
  engine = ClientEngine(_program(data.num_steps), batch_fn, strategy)
  w = jnp.zeros(1)
  for round_idx in range(2):
    idx, mask, _ = data.round_layout(np.array([0, 1]), round_idx, 0)
    shared = {"variables": {"params": {"w": w}}}
    keys = jax.random.split(jax.random.key(round_idx), 2)
    out = engine.run(shared, {}, images, labels, jnp.asarray(idx), jnp.asarray(mask), keys)
    for k, n in enumerate(SIZES):
      expected = _expected_lrs(n)
      history = np.asarray(out["history"][k])[: len(expected) + 1]
      np.testing.assert_allclose(-np.diff(history), expected, rtol=1e-5)
      # Round 2 starts from round 1's model, at the full lr again: the schedule restarted.
      assert history[0] == pytest.approx(float(w[0]))
    w = out["variables"]["params"]["w"][0]


def test_step_schedule_needs_a_positive_step():
  c = base_config()
  c.lr_schedule, c.local_epochs = "step", 1
  with pytest.raises(ValueError, match="--lr_step_epochs >= 1"):
    validate_config(c)
  c.lr_schedule = "cosine"
  with pytest.raises(ValueError, match="Unknown --lr_schedule 'cosine'"):
    validate_config(c)


def test_fednova_refuses_the_step_schedule():
  c = base_config()
  c.method, c.lr_schedule = "fednova", "step"
  with pytest.raises(ValueError, match="fednova.*--lr_schedule=constant"):
    validate_config(c)
