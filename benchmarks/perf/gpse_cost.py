"""Cost of FOT's GPSE round against one local epoch on the same clients, measured side by side.

FOT paper (Bakman et al., ICLR 2024), section 4.2 and Appendix: a GPSE round costs about 0.3-2.3x
one local epoch. Here, for the PMNIST MLP (784-400-400, real MNIST when ../shared/data exists,
otherwise synthetic digits of the same shape) and optionally the Split-CIFAR100 AlexNet-like
model, on the same sampled clients and data:

* ``epoch``: one training round with one local epoch (vmap over clients of a scan over steps, or
  the engine's CPU choice for convolutions), compiled once;
* ``gpse``: one GPSE round on the same clients (client sketches inside one jit + the server's sum,
  then the server step, jitted on the same device: projection, decomposition, rank rule and basis
  update, :func:`fedjax_proj.algorithms.continual.gpse.extend_step`), once with an empty basis
  (first task) and once with a populated one (later tasks: the ratio needs each client's covered
  energy).

The first call of each compiles; its time minus the steady median is reported apart as the
compile time (``*_compile_seconds``; for the server step alone, ``gpse_server_first_seconds``
against ``gpse_server_seconds``). Then ``--repeats`` rounds call epoch, GPSE (empty), GPSE
(populated) in turn, so all three see the same background load; ratios are taken within a round
and the median is reported, in wall time and in this process's CPU time (less sensitive to other
jobs on a shared machine). The 1-minute load average is recorded. For comparison on the same
device, ``host_server_baseline_seconds`` times the server step as it ran before it moved to the
device (:func:`host_server_baseline`). Prints a table and writes
``results/gpse_cost.json``.

    python -m benchmarks.perf.gpse_cost --models=mlp,alexnet
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax

from benchmarks import flag_checks
from benchmarks.results_io import RESULTS_DIR, write_results


def _bench_data(model_name: str, seed: int):
  from fedjax_proj.data.continual import permuted_mnist, split_cifar100, split_classes
  from fedjax_proj.data.sources import ArrayDataset, find_shared_data, load_dataset

  shared = find_shared_data()
  rng = np.random.default_rng(seed)
  if model_name == "mlp":
    if shared is not None and (shared / "mnist" / "train.npz").exists():
      train = load_dataset("mnist", "train", shared / "mnist")
      test = load_dataset("mnist", "test", shared / "mnist")
      return permuted_mnist(train, test, num_tasks=2, seed=seed), "real MNIST"
    ds = ArrayDataset(
      rng.integers(0, 255, (60000, 28, 28, 1), dtype=np.uint8),
      rng.integers(0, 10, 60000).astype(np.int32),
      10,
      "mnist",
    )
    return permuted_mnist(ds, ds, num_tasks=2, seed=seed), "synthetic"
  npz = shared / "cifar100" / "public_20k.npz" if shared is not None else None
  if npz is not None and npz.exists():
    return split_cifar100(npz, seed=seed), "real CIFAR-100 20k subset"
  ds = ArrayDataset(
    rng.integers(0, 255, (20000, 32, 32, 3), dtype=np.uint8),
    np.repeat(np.arange(100), 200).astype(np.int32),
    100,
    "cifar100",
  )
  return split_classes(ds, ds, num_tasks=10, seed=seed, normalizer_name="cifar100"), "synthetic"


def _run(fn) -> tuple[float, float]:
  """(wall seconds, process CPU seconds) of one call, waited for."""
  t0, c0 = time.perf_counter(), time.process_time()
  jax.block_until_ready(fn())
  return time.perf_counter() - t0, time.process_time() - c0


def _interleaved(fns: dict, repeats: int) -> dict:
  """Warm-up (compile) call of each, then ``repeats`` rounds calling each once in turn.

  Interleaving puts every function under the same background load; the ratios are taken within
  a round. CPU seconds (this process, all threads) are less sensitive to other jobs than wall
  seconds on a shared machine, so both are kept.
  """
  first = {k: _run(f)[0] for k, f in fns.items()}
  wall = {k: [] for k in fns}
  cpu = {k: [] for k in fns}
  for _ in range(repeats):
    for k, f in fns.items():
      w, c = _run(f)
      wall[k].append(w)
      cpu[k].append(c)
  return {"first": first, "wall": wall, "cpu": cpu}


def host_server_baseline(bases: dict, ranks: dict, widths: dict, repeats: int) -> float:
  """Median seconds of the server step as it ran before it moved to the device, on these shapes.

  The earlier code (up to commit 725ea76) did, per layer, on the host: fetch the summed sketch
  [d, s], project it in float64 NumPy, take eigh of its Gram matrix (or the randomized range
  finder above 2M entries, which these PMNIST shapes never reach), apply the rank rule, two
  Gram-Schmidt passes and a QR, and send the [d, d] basis back, under one BLAS thread. This
  re-creates that sequence on a random sketch of each layer's shape with the stored bases of
  the populated state, so the same card times both paths in one process.
  """
  from fedjax_proj.algorithms.continual import gpse

  rng = np.random.default_rng(0)
  sketches = {
    k: jax.device_put(rng.normal(size=(b.shape[0], widths[k])).astype(np.float32))
    for k, b in bases.items()
  }

  def once():
    out = {}
    for k, a_dev in sketches.items():
      rank = int(ranks[k])
      u_old = np.asarray(bases[k], np.float64)[:, :rank]
      a = np.asarray(a_dev, np.float64)
      a = a - u_old @ (u_old.T @ a)
      w, v = np.linalg.eigh(a @ a.T)
      v = v[:, np.argsort(w)[::-1][:32]]
      for _ in range(2):
        v = v - u_old @ (u_old.T @ v)
      q, _ = np.linalg.qr(v)
      new = np.zeros(bases[k].shape, np.float32)
      new[:, :rank] = u_old
      new[:, rank : rank + q.shape[1]] = q[:, : new.shape[1] - rank]
      out[k] = jax.device_put(new)
    return out

  times = []
  with gpse.blas_threads(1):
    for _ in range(repeats + 1):
      times.append(_run(once)[0])
  return statistics.median(times[1:])


def measure(
  model_name: str,
  clients: int,
  num_clients: int,
  repeats: int,
  seed: int,
  gpse_batch: int,
  sketch_dist: str,
  threshold_rule: str = "energy",
) -> dict:
  from fedjax_proj.algorithms.base import make_round
  from fedjax_proj.algorithms.continual import gpse
  from fedjax_proj.algorithms.continual.fl import fl
  from fedjax_proj.algorithms.continual.fot import fot
  from fedjax_proj.core import engine as engine_lib
  from fedjax_proj.core.executor import Executor
  from fedjax_proj.data import pipeline
  from fedjax_proj.data.continual import input_transform, task_model, task_partition
  from fedjax_proj.data.federated import FederatedData
  from fedjax_proj.models import mlp, multi_head
  from fedjax_proj.training.continual import task_round_data

  bench, source = _bench_data(model_name, seed)
  if model_name == "mlp":
    # The authors' PMNIST model: one classifier shared by the tasks (projected too).
    base = mlp(10, hidden=(400, 400), dropout=(0.2, 0.2))
    batch_size, hp = 64, {"sketch_multiplier": 1.0, "eps": 0.96}
  else:
    base = multi_head("alexnet", bench.num_tasks, 10, head_bias=False, norm="none")
    batch_size, hp = 16, {"sketch_multiplier": 5.0, "conv_sketch_multiplier": 1.0, "eps": 0.87}
  model = task_model(base, input_transform(bench), shared_head=model_name == "mlp")
  normalize = pipeline.normalizer_for(bench.normalizer_name, bench.images)
  batch_fn = pipeline.make_batch_fn(normalize)
  sample = normalize(jnp.asarray(bench.images[:2]))
  variables = model.init(jax.random.key(seed), sample)
  has_conv = engine_lib.has_convolution(
    lambda v, x: model.apply(v, x, train=False).logits, variables, sample
  )
  executor = Executor(engine_lib.choose_strategy("auto", has_conv=has_conv), batch_fn)
  parts = task_partition(bench, 0, num_clients, iid=False, seed=seed)
  sampled = np.arange(clients, dtype=np.int32)
  images = jax.device_put(bench.images)
  labels = jax.device_put(bench.labels)

  def round_data(bs):
    return task_round_data(images, labels, FederatedData(parts, bs, 1), sampled, 0, seed, 0)

  rd = round_data(batch_size)
  method = fl(model, optax.sgd(0.01))
  round_fn = make_round(method.algorithm, executor)
  state = {"s": method.algorithm.init(variables, jax.random.key(0))}

  def epoch():
    state["s"], m = round_fn(state["s"], rd, jax.random.key(1))
    return m

  fot_method = fot(
    model,
    optax.sgd(0.01),
    executor,
    variables=variables,
    sample_x=sample,
    sketch_dist=sketch_dist,
    threshold_rule=threshold_rule,
    **hp,
  )
  fstate = fot_method.algorithm.init(variables, jax.random.key(0))
  # GPSE is inference only: it may use larger batches than training (fewer sketch updates).
  rd_g = round_data(gpse_batch or batch_size)
  last = {}
  populated = {}

  def gpse_empty():
    populated["s"], m = fot_method.end_task(fstate, rd_g, jax.random.key(2), 0)
    last.setdefault("first_empty", m)
    last["empty"] = m
    return populated["s"].bases

  def gpse_full():
    s, m = fot_method.end_task(populated["s"], rd_g, jax.random.key(3), 1)
    last.setdefault("first_full", m)
    last["full"] = m
    return s.bases

  t = _interleaved({"epoch": epoch, "gpse_empty": gpse_empty, "gpse_full": gpse_full}, repeats)
  specs = gpse.find_layers(model, variables, sample, task=0)
  mult = {"dense": hp["sketch_multiplier"]}
  mult["conv"] = hp.get("conv_sketch_multiplier", mult["dense"])
  widths = {s.key: gpse.sketch_width(s, mult[s.kind]) for s in specs}
  # The earlier host path decomposed sketches of up to 2M entries exactly (fot's max_exact_svd);
  # the baseline re-creates only that path, so it is timed only where every layer took it.
  host_baseline = None
  if all(s.in_dim * widths[s.key] <= 2_000_000 for s in specs):
    host_baseline = host_server_baseline(
      populated["s"].bases, populated["s"].ranks, widths, repeats
    )
  med = {kind: {k: statistics.median(v) for k, v in t[kind].items()} for kind in ("wall", "cpu")}

  def ratios(kind, name):
    return [g / e for g, e in zip(t[kind][name], t[kind]["epoch"])]

  examples = int(np.asarray(rd.mask).sum())
  return {
    "model": model_name,
    "data": source,
    "strategy": executor.strategy,
    "sketch_dist": sketch_dist,
    "clients": clients,
    "examples": examples,
    "train_batch": batch_size,
    "gpse_batch": gpse_batch or batch_size,
    "repeats": repeats,
    "epoch_seconds": med["wall"]["epoch"],
    "epoch_cpu_seconds": med["cpu"]["epoch"],
    "epoch_first_call_seconds": t["first"]["epoch"],
    "gpse_seconds_empty_basis": med["wall"]["gpse_empty"],
    "gpse_seconds_populated_basis": med["wall"]["gpse_full"],
    "gpse_cpu_seconds_populated_basis": med["cpu"]["gpse_full"],
    "gpse_first_call_seconds": t["first"]["gpse_empty"],
    # First call minus the steady median: compilation (client pass and server step, both jitted).
    "gpse_compile_seconds": t["first"]["gpse_empty"] - med["wall"]["gpse_empty"],
    "epoch_compile_seconds": t["first"]["epoch"] - med["wall"]["epoch"],
    "gpse_client_seconds": last["full"]["client_seconds"],
    "gpse_server_seconds": last["full"]["server_seconds"],
    "gpse_server_first_seconds": last["first_empty"]["server_seconds"],
    # The pre-jit host server step on the same shapes and card (None: a layer would have taken
    # the randomized path, which the baseline does not re-create).
    "host_server_baseline_seconds": host_baseline,
    "gpse_server_solvers": {k: v for k, v in last["full"].items() if k.startswith("solver/")},
    "threshold_rule": threshold_rule,
    "backend": jax.default_backend(),
    "device": str(jax.devices()[0].device_kind),
    "ratio_empty": statistics.median(ratios("wall", "gpse_empty")),
    "ratio_populated": statistics.median(ratios("wall", "gpse_full")),
    "cpu_ratio_empty": statistics.median(ratios("cpu", "gpse_empty")),
    "cpu_ratio_populated": statistics.median(ratios("cpu", "gpse_full")),
    "ratios_populated_each_repeat": ratios("wall", "gpse_full"),
    "load_average_1min_after": os.getloadavg()[0],
    "ranks_after_first_gpse": {k: v for k, v in last["empty"].items() if k.startswith("rank/")},
  }


def _opt(seconds: float | None) -> str:
  return "-" if seconds is None else f"{seconds:.3f}"


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--models", default="mlp,alexnet")
  parser.add_argument("--clients", type=int, default=0, help="0: 64 (mlp) / 10 (alexnet)")
  parser.add_argument("--repeats", type=int, default=5)
  parser.add_argument("--sketch_dists", default="gaussian,rademacher")
  parser.add_argument(
    "--gpse_batch",
    type=int,
    default=-1,
    help="0: the training batch size; -1: what the experiments use (256 for the MLP, as "
    "experiments/pmnist.py; the training batch for AlexNet, as experiments/split_cifar100.py)",
  )
  parser.add_argument("--seed", type=int, default=0)
  parser.add_argument(
    "--threshold_rule",
    default="energy",
    choices=("energy", "authors"),
    help="FOT's threshold rule (docs/fot.md, 'The threshold rule'); it changes the ranks added, "
    "hardly the cost",
  )
  parser.add_argument("--out", default=str(RESULTS_DIR / "gpse_cost.json"))
  args = parser.parse_args(argv)

  from fedjax_proj.algorithms.continual.gpse import SKETCH_DISTS

  # Each model and sketch once and known (the two continual models), counts valid, first.
  models = flag_checks.names(parser, "--models", args.models, ("mlp", "alexnet"))
  dists = flag_checks.names(parser, "--sketch_dists", args.sketch_dists, SKETCH_DISTS)
  flag_checks.at_least(parser, args, 0, "clients")
  flag_checks.at_least(parser, args, 1, "repeats")
  flag_checks.at_least(parser, args, -1, "gpse_batch")
  print(f"backend={jax.default_backend()} devices={jax.device_count()}", flush=True)
  rows = []
  for name in models:
    clients = args.clients or (64 if name == "mlp" else 10)
    num_clients = 125 if name == "mlp" else 50
    gpse_batch = args.gpse_batch if args.gpse_batch >= 0 else (256 if name == "mlp" else 0)
    for dist in dists:
      rows.append(
        measure(
          name,
          clients,
          num_clients,
          args.repeats,
          args.seed,
          gpse_batch,
          dist,
          args.threshold_rule,
        )
      )
      print(json.dumps(rows[-1]), flush=True)
  lines = [
    "| model | strategy | G | clients | examples | batch train/GPSE | 1 local epoch s |"
    " GPSE s (empty / populated basis) | GPSE / epoch wall (empty / populated) |"
    " GPSE / epoch CPU time (empty / populated) |"
    " server s (steady / first call / earlier host path) | compile s (epoch / GPSE) | load |",
    "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
  ]
  for r in rows:
    lines.append(
      f"| {r['model']} ({r['data']}) | {r['strategy']} | {r['sketch_dist']} | {r['clients']} | "
      f"{r['examples']} | "
      f"{r['train_batch']}/{r['gpse_batch']} | "
      f"{r['epoch_seconds']:.3f} | {r['gpse_seconds_empty_basis']:.3f} / "
      f"{r['gpse_seconds_populated_basis']:.3f} | {r['ratio_empty']:.2f} / "
      f"{r['ratio_populated']:.2f} | {r['cpu_ratio_empty']:.2f} / "
      f"{r['cpu_ratio_populated']:.2f} | {r['gpse_server_seconds']:.3f} / "
      f"{r['gpse_server_first_seconds']:.2f} / {_opt(r['host_server_baseline_seconds'])} | "
      f"{r['epoch_compile_seconds']:.2f} / "
      f"{r['gpse_compile_seconds']:.2f} | {r['load_average_1min_after']:.1f} |"
    )
  print("\n".join(lines))
  out = Path(args.out)
  out.parent.mkdir(parents=True, exist_ok=True)
  write_results(out, {"rows": rows, "table": lines}, indent=2)
  print(f"wrote {out}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
