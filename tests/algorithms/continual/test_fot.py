"""FOT's variants of 003 Table 6: FRZ (the first layer frozen after the first task)."""

from __future__ import annotations

import flax.linen as nn
import jax
import numpy as np
import pytest

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
