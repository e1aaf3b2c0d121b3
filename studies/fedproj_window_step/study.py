"""FedProj's client phase out of and in the projection window: the select path vs the skip.

    JAX_PLATFORMS=cpu taskset -c 0 python -m studies.fedproj_window_step.study

On the host-looped strategies the engine jits one client step per value of the program's
``static_shared`` flags (fedjax_proj/core/engine.py); FedProj declares its window flags, so outside
the window its step has no memory pass ("skip"). Without the declaration every step computes the
memory gradient and a select drops it ("select": XLA:CPU's behaviour before; docs/fedproj.md,
"What runs where"). FedAvg's client phase is the floor the skip can reach.

Defaults are the parity budget's shapes (docs/fedproj.md, "Parity with the authors' code"): our
``cnn``, 5 clients of 200 CIFAR-10 images, 2 local epochs of batch 64 (8 steps each), a memory of
512 CIFAR-100 images in mini-batches of 256 (``paper_code``'s FedProj client settings). The three
client phases run alternated in one process, ``repeats`` times each, timed in CPU seconds of this
process (``getrusage``; pin it to one core) and wall seconds; the medians and their ratios are
written to results/fedproj_window_step.json.
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax

from benchmarks.common import cifar10, cifar100_public, header
from benchmarks.results_io import RESULTS_DIR, write_results
from fedjax_proj.algorithms.distillation.fedproj import fedproj
from fedjax_proj.algorithms.fedavg import fedavg
from fedjax_proj.core import engine as engine_lib
from fedjax_proj.core.types import RoundData
from fedjax_proj.data.federated import FederatedData
from fedjax_proj.data.pipeline import make_batch_fn, normalizer_for
from fedjax_proj.models import get_model


def _cpu() -> float:
  r = resource.getrusage(resource.RUSAGE_SELF)
  return r.ru_utime + r.ru_stime


def main():
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--model", default="cnn")
  p.add_argument("--clients", type=int, default=5)
  p.add_argument("--examples", type=int, default=200, help="per client")
  p.add_argument("--epochs", type=int, default=2)
  p.add_argument("--batch", type=int, default=64)
  p.add_argument("--public", type=int, default=512, help="public set = the memory")
  p.add_argument("--memory_batch", type=int, default=256)
  p.add_argument("--repeats", type=int, default=5)
  p.add_argument("--strategy", default="sequential", choices=("sequential", "vmap_stepwise"))
  p.add_argument("--out", default="fedproj_window_step")
  args = p.parse_args()

  n = args.clients * args.examples
  x, y = cifar10(n)
  public = jnp.asarray(cifar100_public(args.public))
  parts = np.array_split(np.arange(n), args.clients)
  idx, mask, num = FederatedData(parts, args.batch, args.epochs).round_layout(
    np.arange(args.clients), 0, 0
  )
  rd = RoundData(
    jnp.asarray(x),
    jnp.asarray(y, jnp.int32),
    jnp.arange(args.clients, dtype=jnp.int32),
    jnp.asarray(idx),
    jnp.asarray(mask),
    jnp.asarray(num),
    {"public_images": public},
  )
  model = get_model(args.model, 10)
  normalize = normalizer_for("cifar10")
  batch_fn = make_batch_fn(normalize)
  variables = model.init(jax.random.key(0), normalize(jnp.asarray(x[:2])))
  opt = optax.adam(1e-3)
  alg = fedproj(
    model,
    opt,
    normalize,
    public_size=args.public,
    memory_size=args.public,
    memory_batch_size=args.memory_batch,
    temperature=3.0,
    max_coef=10.0,
    memory_order="shuffle",
    memory_cond=False,
  )
  plain = fedavg(model, opt)
  outside = alg.init(variables, jax.random.key(0))  # round 0: no ensemble, out of the window
  inside = outside._replace(
    has_memory=jnp.ones((), bool),
    memory_logits=jax.random.normal(jax.random.key(1), outside.memory_logits.shape),
  )
  keys = jax.random.split(jax.random.key(2), args.clients)
  engines = {
    "select": engine_lib.ClientEngine(
      alg.client._replace(static_shared=()), batch_fn, args.strategy
    ),
    "skip": engine_lib.ClientEngine(alg.client, batch_fn, args.strategy),
    "fedavg": engine_lib.ClientEngine(plain.client, batch_fn, args.strategy),
  }
  shareds = {
    "out": alg.broadcast(outside, rd, jax.random.key(0)),
    "in": alg.broadcast(inside, rd, jax.random.key(0)),
    "fedavg": plain.broadcast(plain.init(variables, jax.random.key(0)), rd, jax.random.key(0)),
  }
  cases = [
    ("select", "out"),
    ("skip", "out"),
    ("fedavg", "fedavg"),
    ("select", "in"),
    ("skip", "in"),
  ]

  def run(engine, window):
    shared, inputs = shareds[window]
    out = engines[engine].run(shared, inputs, rd.images, rd.labels, rd.idx, rd.mask, keys)
    return jax.block_until_ready(out)

  print(header(), f"strategy={args.strategy} model={args.model} load={os.getloadavg()}")
  for case in cases:  # compile every step program first
    run(*case)
  cpu = {f"{e}/{w}": [] for e, w in cases}
  wall = {f"{e}/{w}": [] for e, w in cases}
  for r in range(args.repeats):
    order = cases[r % len(cases) :] + cases[: r % len(cases)]  # rotate who runs first
    for e, w in order:
      c0, t0 = _cpu(), time.perf_counter()
      run(e, w)
      cpu[f"{e}/{w}"].append(_cpu() - c0)
      wall[f"{e}/{w}"].append(time.perf_counter() - t0)
    print(f"repeat {r}: " + "  ".join(f"{k} {v[-1]:.2f}" for k, v in cpu.items()), flush=True)
  med = {k: float(np.median(v)) for k, v in cpu.items()}
  ratios = {
    "skip/select out of the window": med["skip/out"] / med["select/out"],
    "skip/fedavg out of the window": med["skip/out"] / med["fedavg/fedavg"],
    "skip/select in the window": med["skip/in"] / med["select/in"],
  }
  # The parity budget's 8 rounds: out of the window in rounds 0 and 7, inside in rounds 1-6.
  before = 2 * med["select/out"] + 6 * med["select/in"]
  after = 2 * med["skip/out"] + 6 * med["skip/in"]
  ratios["client CPU saved over 8 rounds with 2 outside (fraction)"] = 1 - after / before
  for k, v in ratios.items():
    print(f"{k}: {v:.3f}")
  payload = {
    "args": vars(args),
    "argv": sys.argv,
    "cpus": sorted(os.sched_getaffinity(0)),
    "header": header(),
    "steps_per_client": int(np.asarray(rd.mask).any(-1).sum(-1).max()),
    "cpu_seconds_per_client_phase": cpu,
    "wall_seconds_per_client_phase": wall,
    "median_cpu_seconds": med,
    "ratios": ratios,
    "load_average_end": os.getloadavg(),
  }
  path = write_results(
    RESULTS_DIR / f"{args.out}.json", payload, indent=2, sort_keys=True, default=float
  )
  print(f"wrote {path}")


if __name__ == "__main__":
  main()
