"""Pilot of the ``drift`` budget: how much FedAvg's clients forget during local training.

FedProj's mechanism (001 Sec. 1 and Figure 1) is forgetting: a client that trains many local
epochs on its skewed shard loses accuracy on the global task that the global model it started
from had. This benchmark measures it on real CIFAR-10 for a candidate budget: every round it
evaluates the global model on the test set, then each sampled client's model after every
``--eval_every_epochs`` local epochs, and reports the forgetting

  F(e) = acc(global model at the round's start) - mean over clients of acc(client after e epochs),

in points of test accuracy. F near 0 means local training barely moves the clients away from the
global model (the mechanism is not in play); a large F means the clients forget what the global
model knew, which is what the memory loss and the projection are meant to stop.

The local training is plain FedAvg written out here (Adam, fresh optimiser state each round, the
library's model, partition and normaliser), so that the model can be evaluated between epochs; it
is the same computation as the library's FedAvg client with ``local_epochs=e``. The pilot's seeds
are never used by a verdict (docs/reproduction.md, "Drift budget").

  python -m benchmarks.pilots.drift_pilot --num_clients=50 --train_subset=10000 --local_epochs=20
"""

from __future__ import annotations

import argparse
import math
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax

from benchmarks import flag_checks
from benchmarks.results_io import RESULTS_DIR, write_results
from fedjax_proj.data.partition import parse_partition, partition
from fedjax_proj.data.pipeline import normalizer_for
from fedjax_proj.data.sources import find_shared_data, load_dataset
from fedjax_proj.models.registry import get_model
from fedjax_proj.training.inputs import subset

RESULTS = RESULTS_DIR


def parse_args(argv=None) -> argparse.Namespace:
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
  p.add_argument("--num_clients", type=int, default=50)
  p.add_argument("--clients_per_round", type=int, default=5)
  p.add_argument("--train_subset", type=int, default=10000, help="0: all 50,000")
  p.add_argument("--partition", default="dirichlet:0.3")
  p.add_argument("--local_epochs", type=int, default=20)
  p.add_argument("--eval_every_epochs", type=int, default=2)
  p.add_argument("--rounds", type=int, default=6)
  p.add_argument(
    "--warmup_rounds",
    type=int,
    default=0,
    help="FedAvg rounds of one local epoch first (not measured), so that the global model knows "
    "something the clients can forget",
  )
  p.add_argument("--batch_size", type=int, default=64)
  p.add_argument("--lr", type=float, default=1e-3)
  p.add_argument("--test_subset", type=int, default=1000)
  p.add_argument("--seed", type=int, default=100)
  p.add_argument("--out", default="", help="result JSON (default: results/drift_pilot-<tag>.json)")
  args = p.parse_args(argv)
  # Each checked before the data loads: otherwise a traceback from deep in the run (a negative
  # subset from NumPy, a bad partition spec from the partitioner) after the CIFAR-10 decode.
  names = ("num_clients", "clients_per_round", "local_epochs", "eval_every_epochs", "rounds")
  flag_checks.at_least(p, args, 1, *names, "batch_size")
  # A subset of 0 is the whole split.
  flag_checks.at_least(p, args, 0, "train_subset", "test_subset", "warmup_rounds", "seed")
  if args.clients_per_round > args.num_clients:
    p.error(
      f"--clients_per_round={args.clients_per_round} exceeds --num_clients={args.num_clients}; "
      "sample at most every client"
    )
  if not (math.isfinite(args.lr) and args.lr > 0):
    p.error(f"--lr must be a finite number > 0, got {args.lr}")
  try:
    parse_partition(args.partition)
  except ValueError as e:
    p.error(f"--partition={args.partition}: {e}")
  return args


def main(argv=None) -> dict:
  args = parse_args(argv)
  shared = find_shared_data()
  if shared is None:
    raise SystemExit("drift_pilot needs the real CIFAR-10 in ../shared/data (see its README).")
  train = load_dataset("cifar10", "train", shared / "cifar10")
  test = load_dataset("cifar10", "test", shared / "cifar10")
  x, y = subset(train, args.train_subset, args.seed)
  tx, ty = subset(test, args.test_subset, args.seed + 1)
  parts = partition(y, args.partition, args.num_clients, args.seed)
  normalize = normalizer_for("cifar10", x, "dataset")
  model = get_model("cnn", 10)
  variables = model.init(jax.random.key(args.seed), normalize(np.asarray(x[:2])))
  opt = optax.adam(args.lr)
  txn = normalize(jnp.asarray(tx))  # uint8 in: the normaliser scales by 1/255
  tyj = jnp.asarray(ty, jnp.int32)

  def loss_fn(params, bx, by):
    logits = model.apply({**variables, "params": params}, bx, train=True).logits
    return optax.softmax_cross_entropy_with_integer_labels(logits, by).mean()

  @jax.jit
  def step(params, state, bx, by):
    grads = jax.grad(loss_fn)(params, bx, by)
    updates, state = opt.update(grads, state, params)
    return optax.apply_updates(params, updates), state

  @jax.jit
  def accuracy(params):
    logits = model.apply({**variables, "params": params}, txn, train=False).logits
    return jnp.mean(jnp.argmax(logits, -1) == tyj)

  rng = np.random.default_rng(args.seed)
  params = variables["params"]
  rounds = []
  t0 = time.perf_counter()
  for r in range(args.warmup_rounds + args.rounds):
    warm = r < args.warmup_rounds
    g_acc = float(accuracy(params))
    sampled = rng.choice(args.num_clients, args.clients_per_round, replace=False)
    client_params, sizes, curves, steps = [], [], [], 0
    for k in sampled:
      idx = parts[k]
      p, s = params, opt.init(params)
      curve = {}
      for e in range(1, (1 if warm else args.local_epochs) + 1):
        order = rng.permutation(idx)
        for i in range(0, len(order), args.batch_size):  # the last batch may be short
          b = order[i : i + args.batch_size]
          bx = normalize(jnp.asarray(x[b]))
          p, s = step(p, s, bx, jnp.asarray(y[b], jnp.int32))
          steps += 1
        if not warm and (e % args.eval_every_epochs == 0 or e == 1):
          curve[e] = float(accuracy(p))
      client_params.append(p)
      sizes.append(len(idx))
      curves.append(curve)
    w = np.asarray(sizes, np.float32) / np.sum(sizes)
    params = jax.tree.map(lambda *ps, w=w: sum(wi * pi for wi, pi in zip(w, ps)), *client_params)
    if warm:
      print(f"warm-up round {r + 1}: global {g_acc:.3f}", flush=True)
      continue
    epochs = sorted(curves[0])
    mean_client = {e: float(np.mean([c[e] for c in curves])) for e in epochs}
    row = {
      "round": r + 1,
      "warmup_rounds": args.warmup_rounds,
      "global_acc": g_acc,
      "client_acc": mean_client,
      "forgetting": {e: g_acc - mean_client[e] for e in epochs},
      "client_sizes": sizes,
      "local_steps": steps,
      "wall_s": time.perf_counter() - t0,
    }
    rounds.append(row)
    f = row["forgetting"]
    print(
      f"round {r + 1}: global {g_acc:.3f}; forgetting after "
      + ", ".join(f"{e} ep {f[e]:+.3f}" for e in epochs)
      + f"; {steps} local steps; {row['wall_s']:.0f} s",
      flush=True,
    )
  final = float(accuracy(params))
  result = {
    "args": vars(args),
    "rounds": rounds,
    "final_global_acc": final,
    "backend": jax.default_backend(),
  }
  tag = (
    f"c{args.num_clients}-n{args.train_subset}-e{args.local_epochs}-w{args.warmup_rounds}"
    f"-s{args.seed}"
  )
  out = Path(args.out) if args.out else RESULTS / f"drift_pilot-{tag}.json"
  out.parent.mkdir(parents=True, exist_ok=True)
  write_results(out, result)
  print(f"final global acc {final:.3f}; wrote {out}")
  return result


if __name__ == "__main__":
  main()
