"""The pre-run time estimate: one local step timed now, times the run's number of local steps."""

from __future__ import annotations

import time

import jax
import numpy as np
import optax

from fedjax_proj.data.federated import FederatedData

# Runs with fewer local steps than this start without a timing probe (seconds to run anyway).
ETA_PROBE_MIN_STEPS = 2000


def time_local_step(model, optimizer, normalize, images, labels, batch_size: int, repeats=3):
  """Seconds per local training step (forward, backward, update) of one batch, measured now.

  Compiles one plain cross-entropy step and times ``repeats`` calls (the median); the
  per-method local loss terms and the server side are not included.
  """
  from fedjax_proj.algorithms.client import (  # noqa: PLC0415
    ROUND_STEPS_ARG,
    forward,
    split_variables,
  )

  n = min(batch_size, len(labels))
  x = normalize(jax.numpy.asarray(images[:n]))
  y = jax.numpy.asarray(np.asarray(labels[:n], np.int32))
  variables = model.init(jax.random.key(0), x[:2])
  params, model_state = split_variables(variables)
  opt_state = optimizer.init(params)

  @jax.jit
  def step(params, opt_state, key):
    def loss(p):
      logits = forward(model, p, model_state, x, train=True, key=key).logits
      return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()

    grads = jax.grad(loss)(params)
    # A per-epoch schedule (client.epoch_step_lr) needs the round's step count; any will do here.
    updates, opt_state = optimizer.update(grads, opt_state, params, **{ROUND_STEPS_ARG: 1})
    return optax.apply_updates(params, updates), opt_state

  key = jax.random.key(1)
  jax.block_until_ready(step(params, opt_state, key))  # compile
  times = []
  for _ in range(repeats):
    t0 = time.perf_counter()
    jax.block_until_ready(step(params, opt_state, key))
    times.append(time.perf_counter() - t0)
  return float(np.median(times))


def _format_duration(seconds: float) -> str:
  if seconds < 120:
    return f"{seconds:.0f} s"
  if seconds < 7200:
    return f"{seconds / 60:.0f} min"
  return f"{seconds / 3600:.1f} h"


def estimate_run(
  c, fed: FederatedData, step_seconds: float | None, start_round: int = 0, padded: bool = True
) -> str:
  """The pre-round-1 estimate line(s) for ``c`` given a measured time per local step.

  The step timed is a plain cross-entropy step, so the estimate is a lower bound for methods with
  more local or server work: at the cpu budget of ``fedproj-cifar10-dir0.3`` FedProj's line said
  "about 5 min" and the run took 14 (FedAvg: 4 min estimated, 5 taken; docs/reproduction.md).
  The progress bar's ETA, timed from whole rounds, includes everything.

  ``padded``: every client runs the longest client's step count (vmap_scan's fixed shapes);
  otherwise each runs its own, and the mean client's count is used.
  """
  per_client = fed.num_steps if padded else float(np.mean([fed.steps_for(n) for n in fed.sizes]))
  steps = int(round((c.rounds - start_round) * c.clients_per_round * per_client))
  if step_seconds is None:
    return ""
  total = steps * step_seconds
  text = (
    f"estimated time: about {_format_duration(total)} for {c.rounds - start_round} rounds "
    f"({steps:,} local steps of batch {c.batch_size} at {step_seconds * 1e3:.1f} ms each, "
    f"timed now on {jax.default_backend()}; {c.method}'s extra local and server work comes on "
    "top, so this is a lower bound; the progress bar's ETA is timed from whole rounds)"
  )
  if total > 3600 and jax.default_backend() == "cpu":
    text += (
      f"\nwarning: this run needs more than an hour on CPU (about {_format_duration(total)}); "
      "--preset=cpu runs a reduced budget of this experiment in minutes, --preset=smoke in "
      "under one."
    )
  return text
