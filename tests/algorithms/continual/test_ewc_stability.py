"""EWC's local step is explicit Euler on its penalty: the stability bound lr·λ·F < 2.

docs/fot.md, "EWC's divergence at the cpu budget": the penalty (λ/2) Σ F (θ − θ*)² has gradient
λ F (θ − θ*), so one SGD step multiplies a deviation from the anchor by 1 − lr·λ·F, and a round
of S local steps on every sampled client followed by the n_k-weighted average multiplies it by
a = Σ_k w_k (1 − lr·λ·F_k)^{S_k}. studies/ewc_stability/study.py computes this a for the claims'
runs; the test holds our EWC round to it on one coordinate.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_proj.data.continual import task_partition
from fedjax_proj.data.federated import FederatedData
from fedjax_proj.training.continual import task_round_data
from tests import helpers

LR, LAM, DELTA = 0.05, 40.0, 100.0  # helpers.tiny_continual's SGD lr; the claims' λ


@pytest.fixture(scope="module")
def tiny_ewc():
  """Built and compiled once for the cases."""
  return helpers.tiny_continual("ewc", lam=LAM, fisher="client")


def _one_round(tiny_ewc, rho_per_client):
  """One EWC round from a global model DELTA away from the anchor on one head bias, each client
  k holding Fisher rho_k / (lr·λ) there (zero elsewhere): (ratio of the deviations after/before,
  the linear prediction Σ_k w_k (1 − rho_k)^{S_k})."""
  bench, cm, round_fn, _, variables = tiny_ewc
  state = cm.algorithm.init(variables, jax.random.key(0))
  rho = jnp.asarray(rho_per_client, jnp.float32)

  # Task 0's head bias, output 3 (the heads' bias is [tasks, classes]): its CE gradient is a mean
  # of p − y, within [−1, 1], so at a deviation of 100 the penalty's step (lr·λ·F·100) dwarfs the
  # CE's (lr·1).
  def at(tree, fn):
    return {**tree, "heads": {**tree["heads"], "bias": fn(tree["heads"]["bias"])}}

  fisher = at(state.method["fisher"], lambda f: f.at[:, 0, 3].set(rho / (LR * LAM)))
  anchor = state.method["anchor"]
  params = at(state.variables["params"], lambda p: p.at[0, 3].add(DELTA))
  state = state._replace(
    variables={**state.variables, "params": params}, method={"fisher": fisher, "anchor": anchor}
  )
  fed = FederatedData(task_partition(bench, 0, 4, iid=True, seed=0), 16, 1)
  sampled = np.arange(4, dtype=np.int32)
  rd = task_round_data(bench.images, bench.labels, fed, sampled, 0, 0, 0)
  state, _ = round_fn(state, rd, jax.random.key(1))
  # The round donates its input state: read the anchor the new state carries.
  bias = lambda tree: float(tree["heads"]["bias"][0, 3])
  after = bias(state.variables["params"]) - bias(state.method["anchor"])
  steps = np.asarray(jnp.sum(jnp.any(rd.mask, axis=-1), axis=-1))
  w = np.asarray(rd.num_examples) / np.sum(rd.num_examples)
  predicted = float(np.sum(w * (1.0 - np.asarray(rho_per_client)) ** steps))
  return after / DELTA, predicted, steps


@pytest.mark.parametrize(
  "rho",
  [
    (1.9, 1.9, 1.9, 1.9),  # below the bound on every client: the deviation shrinks
    (2.1, 2.1, 2.1, 2.1),  # above it on every client: it grows
    (2.6, 0.5, 0.5, 0.5),  # one client above, averaged with three stable ones
  ],
)
def test_ewc_round_multiplies_a_deviation_by_the_explicit_euler_factor(tiny_ewc, rho):
  ratio, predicted, steps = _one_round(tiny_ewc, rho)
  assert steps.min() >= 2  # several local steps, so the power is exercised
  # The CE's push is at most lr·S per round against a deviation of DELTA: 1e-2 relative covers it.
  assert ratio == pytest.approx(predicted, rel=1e-2, abs=1e-2)
  if max(rho) < 2:
    assert abs(ratio) < 1
  if min(rho) > 2:
    assert abs(ratio) > 1
