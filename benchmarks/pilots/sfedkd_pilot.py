"""Pilot of the SFedKD claim's ``mnist`` budget: how much FedSeq forgets along the client chain.

SFedKD's mechanism (004 Sect. 1 and Figure 1) is catastrophic forgetting in sequential FL: each
client in the chain fits its own few classes and the model loses the classes the clients before it
taught; SFedKD's discrepancy-aware multi-teacher distillation exists to counter that. This benchmark
measures it on real MNIST with LeNet-5 (the offline stand-in for 004's Fashion-MNIST, the same
shape and network) for a candidate budget, with the two quantities of 004's Figure 1:

* the class-wise test accuracy of the model after each client of the chain (Fig. 1a), summarised as
  the *class-wise swing*, the mean over classes of |acc_t(c) - acc_{t-1}(c)| between consecutive
  clients t-1 and t (in points), and as 004 Fig. 1b's cosine similarity of the consecutive
  class-wise accuracy vectors;
* the *Forgetting Measure* (Fig. 1d), which 004 takes from Chaudhry et al., ECCV 2018 (its ref.
  [5]) without restating it. Chaudhry et al.'s FM of task j after point k is
  max_{l < k} a_{l,j} - a_{k,j}, averaged over the tasks; 004 applies it to classes trained in
  sequence, so here the "tasks" are the classes: FM = mean over classes c of (the best accuracy on c
  at any earlier point of the chain - the accuracy on c at the end). :func:`forgetting_measure`.
  The model before the first client is excluded from the max (an untrained network that predicts
  one class scores 100% on it without knowing anything).

FedSeq's chain is written out here (each round the sampled clients in a random order, each training
``--local_epochs`` of SGD with weight decay from the model it received, a fresh optimiser per
client; the library's model, partition, normaliser and client optimiser) so that the model can be
evaluated after every client; it is the recipe of the library's FedSeq
(fedjax_proj/algorithms/sequential/fedseq.py), not its code path. FedAvg is the same clients
averaged in parallel, evaluated after every round: the parallel-FL reference of 004 Table 1. An
``--partition=iid`` FedSeq run is the reference with nothing to forget (004 Fig. 1a's i.i.d.
chain): its swing is what test-set sampling and SGD noise alone give. The pilot's seed (200) is
never used by a verdict (docs/reproduction.md, "SFedKD budget on MNIST").

The rule that picks the budget, stated (and committed) before the first pilot run: the ``mnist``
budget is the cheapest candidate at ExDir(2, 0.5), the claim's partition (004 Table 1), in which
(i) FedSeq's late-round FM and its class-wise swing are each at least 10 points and at least 3x
those of the i.i.d. FedSeq reference at the same shape (forgetting well above the noise); (ii)
FedAvg's or FedSeq's late accuracy is at least 50% (far from chance, so that methods can differ,
unlike the 23-25% every method ends at on the CIFAR-10 cpu budget); (iii) the claim's 4 methods x
10 seeds cost at most 8 core-hours on this machine, counting an SFedKD run as 3 FedSeq runs (5
teachers' forward passes per step). If no ExDir(2, 0.5) candidate qualifies, the same rule at
ExDir(2, 10.0). The pilot runs no SFedKD, so it cannot favour it.

  python -m benchmarks.pilots.sfedkd_pilot --partition=exdir:2:0.5 --local_epochs=1 --rounds=20
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax

from benchmarks import flag_checks
from benchmarks.results_io import RESULTS_DIR, write_results
from fedjax_proj.data.partition import partition
from fedjax_proj.data.pipeline import normalizer_for
from fedjax_proj.data.sources import find_shared_data, load_dataset
from fedjax_proj.models.registry import get_model
from fedjax_proj.training.inputs import subset
from fedjax_proj.training.optimizers import make_optimizer

RESULTS = RESULTS_DIR

METHODS = ("fedavg", "fedseq")
NUM_CLASSES = 10


def forgetting_measure(acc: np.ndarray) -> float:
  """Chaudhry et al.'s Forgetting Measure (004 Fig. 1d, its ref. [5]) with classes as the tasks.

  Args:
    acc: [points, classes] per-class accuracy of the model at successive points of training
      (after each client of a chain, or each round), in any unit; at least 2 points.

  Returns:
    The mean over classes of (max over every point but the last) - (the last point), in the unit
    of ``acc``. Positive: the final model lost accuracy it had on some class earlier.
  """
  acc = np.asarray(acc, np.float64)
  if acc.ndim != 2 or acc.shape[0] < 2:
    raise ValueError(f"forgetting_measure needs [points >= 2, classes], got shape {acc.shape}")
  return float(np.mean(acc[:-1].max(axis=0) - acc[-1]))


def classwise_swing(acc: np.ndarray) -> np.ndarray:
  """Mean over classes of |acc_t(c) - acc_{t-1}(c)| for each consecutive pair: [points - 1]."""
  acc = np.asarray(acc, np.float64)
  return np.abs(np.diff(acc, axis=0)).mean(axis=1)


def consecutive_cosine(acc: np.ndarray) -> np.ndarray:
  """Cosine similarity of consecutive class-wise accuracy vectors (004 Fig. 1b): [points - 1]."""
  acc = np.asarray(acc, np.float64)
  a, b = acc[:-1], acc[1:]
  norms = np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1)
  # A model that gets every class wrong has no direction; count it as unlike its neighbour.
  return np.where(norms > 0, (a * b).sum(axis=1) / np.maximum(norms, 1e-12), 0.0)


def chain_summary(acc: np.ndarray, points_per_round: int, late_rounds: int) -> dict:
  """The pilot's numbers from a [1 + rounds * points_per_round, classes] accuracy matrix in
  points (row 0: the model before training, excluded from the FM's max).

  ``fm_chain`` is the FM over the whole chain at its end; ``fm_late_round`` the mean over the last
  ``late_rounds`` rounds of the FM within the round (the round's points before its end, and the
  previous round's end, against the round's end), which does not depend on a single early peak;
  ``swing`` and ``cosine`` are means over the late rounds' consecutive pairs.
  """
  acc = np.asarray(acc, np.float64)
  rounds = (acc.shape[0] - 1) // points_per_round
  if rounds * points_per_round + 1 != acc.shape[0]:
    raise ValueError(f"{acc.shape[0]} rows is not 1 + rounds x {points_per_round}")
  late = range(max(1, rounds - late_rounds + 1), rounds + 1)
  within = [
    forgetting_measure(acc[(r - 1) * points_per_round : r * points_per_round + 1]) for r in late
  ]
  pairs = slice((late[0] - 1) * points_per_round, None)
  return {
    "fm_chain": forgetting_measure(acc[1:]),
    "fm_late_round": float(np.mean(within)),
    "swing": float(classwise_swing(acc)[pairs].mean()),
    "max_swing": float(classwise_swing(acc)[pairs].max()),
    "cosine": float(consecutive_cosine(acc)[pairs].mean()),
    "final_acc": float(acc[-1].mean()),
    "late_acc": float(acc[[r * points_per_round for r in late]].mean()),
    "late_rounds": len(late),
  }


def table(results: list[dict]) -> list[str]:
  """The markdown table of pilot results (one row per run and method), as docs/reproduction.md
  shows it."""
  lines = [
    "| partition | local epochs x rounds | method | FM, whole chain | FM, late rounds | swing "
    "| largest swing | cosine | late acc. | final acc. | wall |",
    "|---|---|---|---|---|---|---|---|---|---|---|",
  ]
  for r in results:
    a = r["args"]
    for m, res in r["methods"].items():
      s = res["summary"]
      lines.append(
        f"| {a['partition']} | {a['local_epochs']} x {a['rounds']} | {m} | {s['fm_chain']:.1f} | "
        f"{s['fm_late_round']:.1f} | {s['swing']:.1f} | {s['max_swing']:.1f} | {s['cosine']:.3f} | "
        f"{s['late_acc']:.1f} | {s['final_acc']:.1f} | {res['wall_s']:.0f} s |"
      )
  return lines


def parse_args(argv=None) -> argparse.Namespace:
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
  p.add_argument("--methods", default="fedavg,fedseq")
  p.add_argument("--partition", default="exdir:2:0.5")
  p.add_argument("--num_clients", type=int, default=20)
  p.add_argument("--clients_per_round", type=int, default=10)
  p.add_argument("--train_subset", type=int, default=10000, help="0: all 60,000")
  p.add_argument("--local_epochs", type=int, default=1)
  p.add_argument("--rounds", type=int, default=20)
  p.add_argument("--late_rounds", type=int, default=5, help="rounds the late means cover")
  p.add_argument("--batch_size", type=int, default=64)
  p.add_argument("--lr", type=float, default=0.01)
  p.add_argument("--weight_decay", type=float, default=1e-4)
  p.add_argument("--test_subset", type=int, default=5000)
  p.add_argument("--seed", type=int, default=200)
  p.add_argument("--out", default="", help="result JSON (default: results/sfedkd_pilot-<tag>.json)")
  p.add_argument(
    "--table", action="store_true", help="print the table of every saved pilot result and exit"
  )
  args = p.parse_args(argv)
  for name in ("num_clients", "clients_per_round", "local_epochs", "rounds", "late_rounds"):
    if getattr(args, name) < 1:
      p.error(f"--{name} must be >= 1, got {getattr(args, name)}")
  if args.clients_per_round > args.num_clients:
    p.error("--clients_per_round must not exceed --num_clients")

  # Each method once (a repeat would run and be tabled twice), each one of METHODS.
  args.method_list = flag_checks.names(p, "--methods", args.methods, METHODS)
  return args


def run(args: argparse.Namespace, method: str, data) -> dict:
  """One method's run: the [points, classes] accuracy matrix (percent) and its summary."""
  x, y, tx, ty, parts, normalize = data
  model = get_model("lenet5", NUM_CLASSES)
  variables = model.init(jax.random.key(args.seed), normalize(jnp.asarray(x[:2])))
  opt = make_optimizer("sgd", args.lr, 0.0, args.weight_decay)
  txn = normalize(jnp.asarray(tx))
  b = args.batch_size

  def loss_fn(params, bx, by, w):
    logits = model.apply({**variables, "params": params}, bx, train=True).logits
    ce = optax.softmax_cross_entropy_with_integer_labels(logits, by)
    return jnp.sum(w * ce) / jnp.sum(w)  # the mean over the batch's real examples

  @jax.jit
  def step(params, state, bx, by, w):
    grads = jax.grad(loss_fn)(params, bx, by, w)
    updates, state = opt.update(grads, state, params)
    return optax.apply_updates(params, updates), state

  @jax.jit
  def predict(params):
    return jnp.argmax(model.apply({**variables, "params": params}, txn, train=False).logits, -1)

  counts = np.bincount(ty, minlength=NUM_CLASSES)

  def per_class(params) -> np.ndarray:
    hit = np.asarray(predict(params)) == ty
    return 100.0 * np.bincount(ty, weights=hit, minlength=NUM_CLASSES) / np.maximum(counts, 1)

  def local(params, idx, rng):
    state = opt.init(params)
    for _ in range(args.local_epochs):
      order = rng.permutation(idx)
      for i in range(0, len(order), b):
        # Short last batches are padded to the batch size with zero weight, so one compiled step
        # serves every client size.
        chunk = order[i : i + b]
        pad = b - len(chunk)
        full = np.concatenate([chunk, np.full(pad, chunk[0], chunk.dtype)])
        w = np.concatenate([np.ones(len(chunk)), np.zeros(pad)]).astype(np.float32)
        params, state = step(
          params, state, normalize(jnp.asarray(x[full])), jnp.asarray(y[full], jnp.int32), w
        )
    return params

  rng = np.random.default_rng(args.seed)
  params = variables["params"]
  rows = [per_class(params)]
  t0 = time.perf_counter()
  for r in range(args.rounds):
    sampled = rng.choice(args.num_clients, args.clients_per_round, replace=False)  # random order
    if method == "fedseq":
      for k in sampled:
        params = local(params, parts[k], rng)
        rows.append(per_class(params))
    else:
      outs = [local(params, parts[k], rng) for k in sampled]
      w = np.asarray([len(parts[k]) for k in sampled], np.float64)
      w /= w.sum()
      params = jax.tree.map(lambda *ps, w=w: sum(wi * pi for wi, pi in zip(w, ps)), *outs)
      rows.append(per_class(params))
    print(
      f"{method} round {r + 1}: acc {rows[-1].mean():.1f}% ({time.perf_counter() - t0:.0f} s)",
      flush=True,
    )
  acc = np.stack(rows)
  per_round = args.clients_per_round if method == "fedseq" else 1
  return {
    "accuracy": acc.round(2).tolist(),
    "points_per_round": per_round,
    "summary": chain_summary(acc, per_round, args.late_rounds),
    "wall_s": time.perf_counter() - t0,
  }


def main(argv=None) -> dict:
  args = parse_args(argv)
  if args.table:
    saved = sorted(RESULTS.glob("sfedkd_pilot-*.json"))
    print("\n".join(table([json.loads(f.read_text()) for f in saved])))
    return {}
  shared = find_shared_data()
  if shared is None:
    raise SystemExit("sfedkd_pilot needs the real MNIST in ../shared/data (see its README).")
  train = load_dataset("mnist", "train", shared / "mnist")
  test = load_dataset("mnist", "test", shared / "mnist")
  x, y = subset(train, args.train_subset, args.seed)
  tx, ty = subset(test, args.test_subset, args.seed + 1)
  y, ty = np.asarray(y, np.int64), np.asarray(ty, np.int64)
  parts = partition(y, args.partition, args.num_clients, args.seed)
  data = (x, y, tx, ty, parts, normalizer_for("mnist", x, "dataset"))
  # The binomial sd of one class's accuracy on this test set at 50% (its largest): the sampling
  # noise under any single per-class number (points).
  sampling_sd = 100.0 * float(np.sqrt(0.25 / np.bincount(ty, minlength=NUM_CLASSES).min()))
  result = {
    "args": vars(args),
    "client_sizes": [len(p) for p in parts],
    "sampling_sd_per_class": sampling_sd,
    "backend": jax.default_backend(),
    "methods": {},
  }
  for m in args.method_list:
    result["methods"][m] = run(args, m, data)
  part = args.partition.replace(":", "")
  tag = (
    f"{part}-c{args.num_clients}x{args.clients_per_round}-n{args.train_subset}"
    f"-e{args.local_epochs}-r{args.rounds}-s{args.seed}"
  )
  out = Path(args.out) if args.out else RESULTS / f"sfedkd_pilot-{tag}.json"
  out.parent.mkdir(parents=True, exist_ok=True)
  write_results(out, result)
  print(f"per-class sampling sd <= {sampling_sd:.1f} points")
  print("\n".join(table([result])))
  print(f"wrote {out}")
  return result


if __name__ == "__main__":
  main()
