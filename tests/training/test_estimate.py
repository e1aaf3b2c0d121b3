"""training.estimate: the pre-run probe times the method's own client step on the largest client."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import pytest

from fedjax_proj.algorithms.fedavg import fedavg
from fedjax_proj.algorithms.sequential.fedseq import fedseq
from fedjax_proj.core.executor import Executor
from fedjax_proj.data.federated import FederatedData
from fedjax_proj.training.estimate import time_client_step
from tests import helpers


def _setup():
  model = helpers.tiny_model()
  x, y = helpers.synthetic_data(n=68)
  fed = FederatedData(helpers.unequal_clients(68), batch_size=4)  # 2, 5, 8 and 3 steps
  variables = model.init(jax.random.key(0), jnp.asarray(x[:2]))
  return model, jnp.asarray(x), jnp.asarray(y), fed, variables


def _counting(alg, calls: list):
  def step(shared, state, batch, key):
    jax.debug.callback(lambda: calls.append(1))
    return alg.client.step(shared, state, batch, key)

  return alg._replace(client=alg.client._replace(step=step))


def test_probe_runs_the_methods_own_step_on_the_largest_client():
  model, x, y, fed, variables = _setup()
  # The probe host-loops one client whatever the run's strategy.
  executor = Executor("vmap_scan", helpers.float_batch_fn())
  for max_steps, expected in ((20, 8), (6, 6)):
    calls = []
    alg = _counting(fedavg(model, helpers.sgd()), calls)
    seconds = time_client_step(alg, executor, variables, fed, x, y, {}, 4, 0, max_steps, 2)
    # One compiling run and two timed ones, each over the largest client's first steps (8 of
    # them: the smallest client has 2).
    assert len(calls) == 3 * expected
    assert math.isfinite(seconds) and seconds > 0


def test_probe_starts_a_sequential_chain_with_begin():
  model, x, y, fed, variables = _setup()
  # The probe host-loops one client whatever the run's strategy.
  executor = Executor("vmap_scan", helpers.float_batch_fn())
  calls = []
  alg = _counting(fedseq(model, helpers.sgd()), calls)
  seconds = time_client_step(alg, executor, variables, fed, x, y, {}, 3, 0, 4, 1)
  assert len(calls) == 2 * 4 and seconds > 0


def test_memory_estimate_warns_only_when_the_state_alone_nears_what_is_available():
  from fedjax_proj.training.estimate import available_memory, estimate_memory

  mib = 2**20
  # 10 clients x 4 MiB x (model, gradient, 2 Adam slots) + 4 MiB global + 1 MiB data = 165 MiB.
  assert estimate_memory(4 * mib, 10, 2, 1 * mib, 1000 * mib) == ""
  text = estimate_memory(4 * mib, 10, 2, 1 * mib, 150 * mib)
  assert text.startswith("warning: this run needs at least 0.2 GiB (10 clients at once")
  assert "--clients_per_round" in text
  assert estimate_memory(4 * mib, 10, 2, 0, None) == ""  # unknown: no guess
  assert (available_memory() or 1) > 0


def test_time_step_estimate_times_the_runs_steps_and_writes_nothing(tmp_path):
  import numpy as np

  from fedjax_proj.data.partition import partition
  from fedjax_proj.data.sources import load_dataset
  from fedjax_proj.training import experiment
  from fedjax_proj.training.config import base_config

  c = base_config()
  c.update(
    dataset="digits", model="mlp", num_clients=10, clients_per_round=3, rounds=7, local_epochs=2,
    batch_size=16, progress=False, output_dir=str(tmp_path / "run"), method="fedavg",
  )  # fmt: skip
  t = experiment.time_step_estimate(c, log=lambda *a: None)
  # The run's steps: every round's clients each run the longest client's count (one program, as
  # the run's executor plans on a CPU for an MLP) or each its own (host-looped): 7 rounds x 3
  # clients x 2 epochs of batches of 16.
  labels = load_dataset("digits", "train").labels
  steps = [2 * -(-len(p) // 16) for p in partition(labels, c.partition, 10, c.seed)]
  assert t["steps"] in (7 * 3 * max(steps), round(7 * 3 * float(np.mean(steps))))
  assert math.isfinite(t["step_seconds"]) and t["step_seconds"] > 0
  assert t["seconds"] == pytest.approx(t["step_seconds"] * t["steps"])
  assert not (tmp_path / "run").exists()  # neither created nor held
  # The same checks as a run, before anything is timed.
  c.batch_size = 100_000
  with pytest.raises(ValueError, match="exceeds the largest client's data"):
    experiment.time_step_estimate(c, log=lambda *a: None)
