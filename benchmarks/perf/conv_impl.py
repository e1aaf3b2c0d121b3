"""Throughput of the convolution implementations (``conv_impl``) in three execution strategies.

Times an SGD train step (softmax cross-entropy, BatchNorm state carried) of FedDF's ResNet-8 and
the FedAvg CNN on CIFAR-shaped synthetic data for each ``conv_impl`` of
:mod:`fedjax_proj.models.conv`:

- ``loop``: one jitted step, called from a Python loop (``steps`` calls);
- ``scan``: ``steps`` steps inside one jitted ``lax.scan``;
- ``vmap+scan``: ``vmap`` over ``clients`` clients (stacked parameters) of that scan.

Why: on XLA:CPU the kernel-gradient convolution collapses inside a loop body (jax-ml/jax issue
12868) and vmap over per-client kernels becomes a grouped convolution; docs/design.md ("Measured
facts about XLA:CPU") records the measurements that motivated the patch-based implementations. The
im2col formulation is Chellapilla et al., "High Performance Convolutional Neural Networks for
Document Processing" (IWFHR 2006).

Prints a table of samples/s (median over ``--reps`` timed runs, after one compile run) and writes
JSON (with compile times, load averages and, per impl, the largest parameter difference from the
``xla`` result after the same steps) to ``results/conv_impl.json``.

Usage: ``python -m benchmarks.perf.conv_impl [--models resnet8,cnn] [--batch 32] [--reps 3]``.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax

from benchmarks import flag_checks
from benchmarks.results_io import RESULTS_DIR, write_results
from fedjax_proj.models import CONV_IMPLS, get_model

SETTINGS = ("loop", "scan", "vmap+scan")


def _train_step(model, opt):
  """One SGD step as a scan body: carry (params, state, opt_state), batch (x, y) -> loss."""

  def step(carry, batch):
    params, state, opt_state = carry
    x, y = batch

    def loss_fn(p):
      out = model.apply({"params": p, **state}, x, train=True)
      loss = optax.softmax_cross_entropy_with_integer_labels(out.logits, y).mean()
      return loss, out.state

    (loss, new_state), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
    updates, opt_state = opt.update(grads, opt_state, params)
    return (optax.apply_updates(params, updates), new_state, opt_state), loss

  return step


def _runners(model, opt):
  """{setting: (jitted fn, function of (carry, xs, cs, xs_c) giving its arguments)}."""
  step = _train_step(model, opt)
  jit_step = jax.jit(step)

  def loop(carry, xs):
    # Host loop: each call is a separate dispatch of the same compiled step.
    for i in range(xs[0].shape[0]):
      carry, _ = jit_step(carry, (xs[0][i], xs[1][i]))
    return carry

  scan = jax.jit(lambda carry, xs: jax.lax.scan(step, carry, xs)[0])
  vmap_scan = jax.jit(jax.vmap(lambda carry, xs: jax.lax.scan(step, carry, xs)[0]))
  return {"loop": loop, "scan": scan, "vmap+scan": vmap_scan}


def _time(fn, args, reps):
  t0 = time.perf_counter()
  out = jax.block_until_ready(fn(*args))
  first = time.perf_counter() - t0
  times = []
  for _ in range(reps):
    t0 = time.perf_counter()
    jax.block_until_ready(fn(*args))
    times.append(time.perf_counter() - t0)
  return out, first, statistics.median(times)


def run(model_name, impl, batch, steps, clients, reps, lr=0.01):
  model = get_model(model_name, 10, conv_impl=impl)
  opt = optax.sgd(lr)
  rng = np.random.default_rng(0)
  x = jnp.asarray(rng.standard_normal((clients, steps, batch, 32, 32, 3)), jnp.float32)
  y = jnp.asarray(rng.integers(0, 10, (clients, steps, batch)), jnp.int32)
  variables = model.init(jax.random.key(0), x[0, 0, :1])
  params = variables["params"]
  state = {k: v for k, v in variables.items() if k != "params"}
  carry = (params, state, opt.init(params))
  carries = jax.tree_util.tree_map(lambda a: jnp.broadcast_to(a, (clients, *a.shape)), carry)

  results = {}
  finals = {}
  for setting, fn in _runners(model, opt).items():
    if setting == "vmap+scan":
      args, samples = (carries, (x, y)), clients * steps * batch
    else:
      args, samples = (carry, (x[0], y[0])), steps * batch
    load_before = os.getloadavg()[0]
    out, first, median = _time(fn, args, reps)
    finals[setting] = (
      out[0] if setting != "vmap+scan" else jax.tree_util.tree_map(lambda a: a[0], out[0])
    )
    results[setting] = {
      "samples_per_s": samples / median,
      "median_s": median,
      "first_call_s": first,
      "samples": samples,
      "load_avg_1m": [load_before, os.getloadavg()[0]],
    }
  return results, finals


def _max_diff(a, b):
  return max(
    float(jnp.max(jnp.abs(u - v)))
    for u, v in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b))
  )


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--models", default="resnet8,cnn")
  parser.add_argument("--impls", default=",".join(CONV_IMPLS))
  parser.add_argument("--batch", type=int, default=32)
  parser.add_argument("--steps", type=int, default=10)
  parser.add_argument("--clients", type=int, default=4)
  parser.add_argument("--reps", type=int, default=3)
  parser.add_argument("--out", default=str(RESULTS_DIR / "conv_impl.json"))
  args = parser.parse_args(argv)

  from fedjax_proj.models.registry import MODELS

  # Each model and conv_impl once and known, the counts positive, before anything compiles.
  models = flag_checks.names(parser, "--models", args.models, MODELS)
  impls = flag_checks.names(parser, "--impls", args.impls, CONV_IMPLS)
  flag_checks.at_least(parser, args, 1, "batch", "steps", "clients", "reps")

  rows = []
  for model_name in models:
    reference = None
    for impl in impls:
      results, finals = run(model_name, impl, args.batch, args.steps, args.clients, args.reps)
      if reference is None and impl == "xla":
        reference = finals
      diff = (
        {s: _max_diff(finals[s], reference[s]) for s in SETTINGS} if reference is not None else {}
      )
      rows.append(
        {"model": model_name, "conv_impl": impl, "settings": results, "max_param_diff_vs_xla": diff}
      )
      cells = "  ".join(f"{results[s]['samples_per_s']:>10.0f}" for s in SETTINGS)
      print(f"{model_name:<8} {impl:<13} {cells}", flush=True)

  header = f"{'model':<8} {'conv_impl':<13} " + "  ".join(f"{s:>10}" for s in SETTINGS)
  print(
    "\nsamples/s (median of",
    args.reps,
    "runs; batch",
    args.batch,
    "steps",
    args.steps,
    "clients",
    args.clients,
    ")",
  )
  print(header)
  for r in rows:
    cells = "  ".join(f"{r['settings'][s]['samples_per_s']:>10.0f}" for s in SETTINGS)
    print(f"{r['model']:<8} {r['conv_impl']:<13} {cells}")

  out = write_results(
    args.out,
    {
      "benchmark": "conv_impl",
      "config": vars(args),
      "environment": {
        "jax": jax.__version__,
        "backend": jax.default_backend(),
        "cpu_count": os.cpu_count(),
        "platform": platform.platform(),
        "xla_flags": os.environ.get("XLA_FLAGS", ""),
      },
      "rows": rows,
    },
    indent=2,
  )
  print("wrote", out)


if __name__ == "__main__":
  main()
