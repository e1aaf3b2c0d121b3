"""Which execution strategy wins where: samples/s of one FedAvg round per strategy and model.

    python benchmarks/strategies.py [--clients 4] [--steps 8] [--models mlp,cnn,resnet8]

Every strategy runs the same round (same clients, batches and keys); the table also reports the
largest parameter difference to ``vmap_scan`` (they must agree) and the strategy ``auto`` picks.
The facts behind ``auto`` (DESIGN.md): on XLA:CPU convolutions inside ``lax.scan`` and vmapped
convolutions are slow, so conv models run fastest as a host loop of jitted steps.
"""

from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
from common import cifar10, header, write_results

from fedjax_proj.algorithms.base import make_round
from fedjax_proj.algorithms.fedavg import fedavg
from fedjax_proj.core import engine as engine_lib
from fedjax_proj.core import tree as tree_lib
from fedjax_proj.core.types import RoundData
from fedjax_proj.data.federated import FederatedData
from fedjax_proj.data.pipeline import make_batch_fn, normalizer_for
from fedjax_proj.models import get_model

STRATEGIES = ("vmap_scan", "vmap_stepwise", "sequential")


def bench_model(name, x, y, args):
  model = get_model(name, 10)
  normalize = normalizer_for("cifar10")
  alg = fedavg(model, optax.sgd(0.01, momentum=0.9), make_batch_fn(normalize))
  sample = normalize(jnp.asarray(x[:2]))
  variables = model.init(jax.random.key(0), sample)
  has_conv = engine_lib.has_convolution(
    lambda v, z: model.apply(v, z, train=False).logits, variables, sample
  )
  fd = FederatedData(np.array_split(np.arange(len(y)), args.clients), args.batch)
  idx, mask, n = fd.round_layout(np.arange(args.clients), 0, 0)
  rd = RoundData(
    jnp.asarray(x),
    jnp.asarray(y, jnp.int32),
    jnp.arange(args.clients, dtype=jnp.int32),
    jnp.asarray(idx),
    jnp.asarray(mask),
    jnp.asarray(n),
    {},
  )
  samples = int(mask.sum())
  rows, ref = [], None
  for strategy in STRATEGIES:
    round_fn = make_round(alg, strategy)
    t0 = time.perf_counter()
    state, _ = round_fn(alg.init(variables, jax.random.key(0)), rd, jax.random.key(1))
    jax.block_until_ready(state)
    first = time.perf_counter() - t0
    times = []
    for _ in range(args.repeats):
      t0 = time.perf_counter()
      out, _ = round_fn(alg.init(variables, jax.random.key(0)), rd, jax.random.key(1))
      jax.block_until_ready(out)
      times.append(time.perf_counter() - t0)
    flat = np.asarray(tree_lib.tree_ravel(out.variables))
    ref = flat if ref is None else ref
    rows.append(
      {
        "model": name,
        "strategy": strategy,
        "first_round_s": first,
        "round_s": min(times),
        "samples_per_s": samples / min(times),
        "max_abs_diff_vs_vmap_scan": float(np.abs(flat - ref).max()),
      }
    )
  auto = engine_lib.choose_strategy("auto", has_conv=has_conv)
  best = max(rows, key=lambda r: r["samples_per_s"])["strategy"]
  for r in rows:
    r["auto_picks"], r["fastest"] = auto, best
  return rows


def main():
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--clients", type=int, default=4)
  p.add_argument("--steps", type=int, default=8)
  p.add_argument("--batch", type=int, default=32)
  p.add_argument("--repeats", type=int, default=2)
  p.add_argument("--models", default="mlp,cnn,resnet8")
  args = p.parse_args()
  x, y = cifar10(args.clients * args.steps * args.batch)
  print(header(), f"clients={args.clients} steps/client={args.steps} batch={args.batch}")
  rows = []
  for name in args.models.split(","):
    rows += bench_model(name, x, y, args)
  print(f"{'model':8s} {'strategy':14s} {'samples/s':>10s} {'1st round s':>11s} {'max|diff|':>10s}")
  for r in rows:
    print(
      f"{r['model']:8s} {r['strategy']:14s} {r['samples_per_s']:10.0f} {r['first_round_s']:11.2f} "
      f"{r['max_abs_diff_vs_vmap_scan']:10.2e}"
    )
  for name in args.models.split(","):
    r = next(r for r in rows if r["model"] == name)
    verdict = "agrees" if r["auto_picks"] == r["fastest"] else "DISAGREES"
    print(f"{name}: auto picks {r['auto_picks']}, fastest measured {r['fastest']} ({verdict})")
  print(f"wrote {write_results('strategies', {'args': vars(args), 'rows': rows})}")


if __name__ == "__main__":
  main()
