"""FOT's variants of 003 Table 6: FRZ (the first layer frozen after the first task) and the
Gaussian mechanism calibrated to (ε, δ) (Appendix H)."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_proj.algorithms.continual import gpse
from fedjax_proj.data.continual import task_partition
from fedjax_proj.data.federated import FederatedData
from fedjax_proj.training.continual import task_round_data
from tests import helpers

# The tiny backbone's first projected layer (helpers.TinyBackbone: Dense 36 -> 16 -> 16).
FIRST = "backbone/Dense_0"


def _split(state) -> tuple[list[np.ndarray], list[np.ndarray]]:
  """(the first layer's parameters, every other parameter) of the global model."""
  first, rest = [], []
  for path, leaf in jax.tree_util.tree_leaves_with_path(state.variables["params"]):
    name = "/".join(k.key for k in path[:2])
    (first if name == FIRST else rest).append(np.asarray(leaf))
  return first, rest


def _run(freeze_first: bool):
  """One round of task 0, its GPSE, then three rounds of task 1: (states after each round of
  task 1, the state at task 0's end, the GPSE metrics)."""
  bench, cm, round_fn, _, variables = helpers.tiny_continual(
    "fot", eps=0.9, freeze_first=freeze_first
  )
  key = jax.random.key(0)
  state = cm.algorithm.init(variables, key)

  def layout(task):
    return FederatedData(task_partition(bench, task, 4, iid=True, seed=0), 16, 1)

  def one_round(state, r, task):
    rd = task_round_data(bench.images, bench.labels, layout(task), np.array([r % 4, 3]), r, 0, task)
    return round_fn(state, rd, jax.random.fold_in(key, r))[0]

  # Rounds donate their input state: every snapshot is copied to the host when it is made.
  host = lambda state: jax.tree.map(np.array, state)
  initial = host(variables)
  state = one_round(state, 0, 0)
  everyone = np.arange(4, dtype=np.int32)
  rd_all = task_round_data(bench.images, bench.labels, layout(0), everyone, 99, 0, 0)
  state, metrics = cm.end_task(state, rd_all, jax.random.fold_in(key, 99), 0)
  after_task0, later = host(state), []
  for r in (1, 2, 3):
    state = one_round(state, r, 1)
    later.append(host(state))
  return initial, after_task0, later, metrics


@pytest.fixture(scope="module")
def runs():
  return {on: _run(on) for on in (True, False)}


def test_frz_keeps_the_first_layer_bitwise_after_task_one_and_trains_the_rest(runs):
  initial, after_task0, later, metrics = runs[True]
  first0, rest0 = _split(after_task0)
  # The first layer trains on task 0 (it is frozen only after it).
  init_first = [np.asarray(x) for x in jax.tree.leaves(initial["params"]["backbone"]["Dense_0"])]
  assert any(not np.array_equal(a, b) for a, b in zip(first0, init_first, strict=True))
  previous_rest = rest0
  for state in later:
    first, rest = _split(state)
    for a, b in zip(first, first0, strict=True):
      np.testing.assert_array_equal(a, b)  # bitwise, every round of task 1
    assert any(not np.allclose(a, b) for a, b in zip(rest, previous_rest, strict=True))
    previous_rest = rest
  # GPSE never sketches the raw samples: the first layer has no basis, the inner one has.
  assert f"rank/{FIRST}" not in metrics and metrics["rank/backbone/Dense_1"] > 0
  assert not np.any(np.asarray(after_task0.bases[FIRST]))


def test_without_frz_the_first_layer_keeps_training_and_is_sketched(runs):
  _, after_task0, later, metrics = runs[False]
  first0, _ = _split(after_task0)
  first, _ = _split(later[-1])
  assert any(not np.allclose(a, b) for a, b in zip(first, first0, strict=True))
  assert metrics[f"rank/{FIRST}"] > 0 and np.any(np.asarray(after_task0.bases[FIRST]))


def test_frz_needs_a_second_layer():
  with pytest.raises(ValueError, match="freeze_first.*use a deeper model or freeze_first=False"):
    helpers.tiny_continual("fot", backbone=_OneDense(), freeze_first=True)


class _OneDense(nn.Module):
  @nn.compact
  def __call__(self, x, train, mask=None):
    return None, nn.Dense(8)(x.reshape(x.shape[0], -1))


@pytest.mark.parametrize("clients", [1, 50])
def test_gaussian_sigma_is_appendix_h_and_the_classical_bound(clients):
  eps, delta = 5.0, 1e-5  # 003 Table 6
  # Appendix H: σ² = log(1.25/δ) / (ε² C) at the clip L = 1.
  paper = gpse.gaussian_sigma(eps, delta, 1.0, clients)
  assert paper**2 == pytest.approx(np.log(1.25 / delta) / (eps**2 * clients), rel=1e-12)
  # Dwork and Roth, Thm A.1: the sum's noise N(0, C σ²) has std L·sqrt(2 log(1.25/δ))/ε.
  classical = gpse.gaussian_sigma(eps, delta, 2.0, clients, "classical")
  assert np.sqrt(clients) * classical == pytest.approx(2.0 * np.sqrt(2 * np.log(1.25e5)) / 5.0)
  # The noise scales with the clip (the sum's sensitivity).
  assert gpse.gaussian_sigma(eps, delta, 3.0, clients) == pytest.approx(3.0 * paper)
  for bad in ({"epsilon": 0.0}, {"delta": 1.0}, {"sensitivity": 0.0}, {"num_clients": 0}):
    args = {"epsilon": eps, "delta": delta, "sensitivity": 1.0, "num_clients": 1, **bad}
    with pytest.raises(ValueError, match="epsilon > 0, 0 < delta < 1, a clip > 0"):
      gpse.gaussian_sigma(**args)
  with pytest.raises(ValueError, match="unknown DP calibration 'rdp'"):
    gpse.gaussian_sigma(eps, delta, calibration="rdp")


def test_the_noise_goes_on_the_clipped_sketch():
  """Eq. (14): CLIP(A | L) + G with G ~ N(0, σ²): the message less the clipped sketch is the
  noise, of std σ."""
  a = jnp.full((40, 50), 3.0)
  zero = jnp.zeros(())
  state = gpse.SketchState({"l": a}, {"l": zero}, {"l": zero}, zero)
  out = np.asarray(
    gpse.finish_sketch(state, jax.random.key(0), dp_clip=1.0, dp_noise=0.5)["a"]["l"]
  )
  clipped = np.asarray(a) / np.linalg.norm(np.asarray(a))  # Frobenius norm 1
  noise = out - clipped
  assert noise.std() == pytest.approx(0.5, rel=0.1) and abs(noise.mean()) < 0.05


def test_fot_calibrates_its_noise_from_epsilon_delta_and_refuses_ambiguity():
  bench, cm, _, _, variables = helpers.tiny_continual(
    "fot", eps=0.9, dp_epsilon=5.0, dp_delta=1e-5, dp_clip=1.0
  )
  state = cm.algorithm.init(variables, jax.random.key(0))
  fed = FederatedData(task_partition(bench, 0, 4, iid=True, seed=0), 16, 1)
  rd = task_round_data(bench.images, bench.labels, fed, np.arange(4, dtype=np.int32), 99, 0, 0)
  _, metrics = cm.end_task(state, rd, jax.random.key(1), 0)
  # tiny_continual's 4 clients: C = 4.
  assert metrics["dp_noise"] == pytest.approx(np.sqrt(np.log(1.25e5) / (25 * 4)))
  with pytest.raises(ValueError, match="pass dp_clip > 0 .* and leave dp_noise at 0"):
    helpers.tiny_continual("fot", dp_epsilon=5.0)
  with pytest.raises(ValueError, match="pass dp_clip > 0 .* and leave dp_noise at 0"):
    helpers.tiny_continual("fot", dp_epsilon=5.0, dp_clip=1.0, dp_noise=0.1)
