"""FedDF (feddf.py): the server step is FedAvg followed by one hand-computed distillation step.

On a linear model (logits = x W + b) with one distillation step over the whole public set, the
server's new model is θ_avg − lr·g/(|g| + ε) (Adam's first step: m̂ = g, v̂ = g²), where θ_avg is
the n_k-weighted average, g the gradient of T²·KL(σ(z_t/T) ‖ σ(z_s/T)) (batch mean) at θ_avg, z_t
the mean of the clients' logits and z_s the student's; ∂/∂z_s = T·(σ(z_s/T) − σ(z_t/T))/P. All of
it is computed here in float64 NumPy and compared with both forms of the aggregate (traced and
host loop).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from fedjax_proj.algorithms.distillation.feddf import ensemble_distillation
from fedjax_proj.core.types import RoundData
from tests.algorithms.baselines_reference import linear_model

LR, TEMPERATURE, P = 0.01, 3.0, 6
SIZES = np.array([3.0, 1.0], np.float32)


def _softmax(z):
  e = np.exp(z - z.max(-1, keepdims=True))
  return e / e.sum(-1, keepdims=True)


def setup(seed=0):
  """Two clients' linear models, their round data and the public set."""
  rng = np.random.default_rng(seed)
  clients = {
    "w": rng.normal(size=(2, 3, 3)).astype(np.float32),
    "b": rng.normal(size=(2, 3)).astype(np.float32) * 0.5,
  }
  public = rng.normal(size=(P, 3)).astype(np.float32)
  x = np.zeros((4, 3), np.float32)
  rd = RoundData(
    jnp.asarray(x),
    jnp.zeros((4,), jnp.int32),
    jnp.asarray([0, 1], jnp.int32),
    jnp.zeros((2, 1, 2), jnp.int32),
    jnp.ones((2, 1, 2), bool),
    jnp.asarray(SIZES),
    {"public_images": jnp.asarray(public)},
  )
  outputs = {
    "variables": {"params": jax.tree.map(jnp.asarray, clients)},
    "metrics": {"train_loss": jnp.asarray([1.0, 2.0])},
  }
  return clients, public, rd, outputs


def hand_server_step(clients, public, teacher_logits):
  """(θ after the server step, the distillation loss at θ_avg), float64."""
  p_k = SIZES / SIZES.sum()
  avg = {k: np.tensordot(p_k, v.astype(np.float64), axes=1) for k, v in clients.items()}
  x = public.astype(np.float64)
  z_s = x @ avg["w"] + avg["b"]
  p_t, q_s = _softmax(teacher_logits / TEMPERATURE), _softmax(z_s / TEMPERATURE)
  loss = TEMPERATURE**2 * np.mean(np.sum(p_t * np.log(p_t / q_s), axis=-1))
  dz = TEMPERATURE * (q_s - p_t) / len(x)
  grads = {"w": x.T @ dz, "b": dz.sum(0)}
  new = {k: avg[k] - LR * g / (np.abs(g) + 1e-8) for k, g in grads.items()}
  return new, loss


def run_aggregate(alg, rd, outputs, form):
  variables = {"params": {"w": jnp.zeros((3, 3)), "b": jnp.zeros((3,))}}
  state = alg.init(variables, jax.random.key(0))
  aggregate = jax.jit(alg.aggregate.traced) if form == "traced" else alg.aggregate.host
  return aggregate(state, rd, outputs, jax.random.key(1))


def build(teacher="mean", name="feddf"):
  return ensemble_distillation(
    linear_model(),
    optax.sgd(0.1),
    lambda a: a,
    public_size=P,
    teacher=teacher,
    name=name,
    distill_epochs=1,
    distill_lr=LR,
    distill_batch_size=64,  # >= P: one step over the whole public set
    distill_temperature=TEMPERATURE,
  )


@pytest.mark.parametrize("form", ["traced", "host"])
def test_server_step_is_fedavg_then_one_hand_computed_distillation_step(form):
  clients, public, rd, outputs = setup()
  teacher = np.mean(
    [public.astype(np.float64) @ clients["w"][k] + clients["b"][k] for k in range(2)], axis=0
  )
  expected, loss = hand_server_step(clients, public, teacher)
  state, metrics = run_aggregate(build(), rd, outputs, form)
  for k in ("w", "b"):
    np.testing.assert_allclose(state.variables["params"][k], expected[k], atol=2e-6)
  np.testing.assert_allclose(metrics["distill_loss"], loss, rtol=1e-4)
  np.testing.assert_allclose(metrics["train_loss"], (3 * 1.0 + 2.0) / 4, rtol=1e-6)
  # The step moved the model: FedAvg alone is not the answer.
  p_k = SIZES / SIZES.sum()
  avg_w = np.tensordot(p_k, clients["w"], axes=1)
  assert np.abs(np.asarray(state.variables["params"]["w"]) - avg_w).max() > LR / 2
