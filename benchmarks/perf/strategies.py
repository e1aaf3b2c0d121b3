"""Which execution strategy wins where: samples/s of a FedAvg round per strategy, model and cohort.

    python -m benchmarks.perf.strategies [--clients 4,16,64] [--steps 8] [--models mlp,cnn,resnet8]
    python -m benchmarks.perf.strategies --write_table  # fedjax_proj/core/strategy_table.json

Every strategy runs the same round (same clients, batches and keys); the table also reports the
largest parameter difference to ``vmap_scan`` (they must agree) and the strategy ``auto`` picks.
Strategies are compiled first and then timed side by side in one process, in rotating order, for
``--repeats`` rounds each; the median round time decides, so a burst of load from other jobs on a
shared machine hits every strategy alike. ``--write_table`` turns the winners into the measured rule
``auto`` follows (:func:`fedjax_proj.core.engine.choose_strategy`, docs/performance.md): per backend
and model kind (``conv``: the traced model has a convolution; ``dense``: it has none), the fastest
strategy for cohorts up to each measured size.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax

from benchmarks import flag_checks
from benchmarks.common import cifar10, header, round_data
from benchmarks.results_io import RESULTS_DIR, write_results
from fedjax_proj.algorithms.base import make_round
from fedjax_proj.algorithms.fedavg import fedavg
from fedjax_proj.core import engine as engine_lib
from fedjax_proj.core import tree as tree_lib
from fedjax_proj.core.types import RoundData
from fedjax_proj.data.pipeline import make_batch_fn, normalizer_for
from fedjax_proj.models import get_model

STRATEGIES = ("vmap_scan", "vmap_stepwise", "sequential")


def model_kind(model, variables, sample) -> str:
  """``conv`` if the model's inference forward has a convolution, else ``dense``."""
  conv = engine_lib.has_convolution(
    lambda v, z: model.apply(v, z, train=False).logits, variables, sample
  )
  return "conv" if conv else "dense"


def fedavg_round_data(x, y, clients: int, batch: int) -> tuple[RoundData, int]:
  """One round over ``clients`` equal shards of (x, y); returns it and its number of samples."""
  rd, (_, mask, _) = round_data(x, y, np.array_split(np.arange(len(y)), clients), batch)
  return rd, int(mask.sum())


def compare_strategies(round_fns: dict, init_state, rd, repeats: int) -> dict:
  """Compiles every round function, then times them side by side in rotating order.

  Returns:
    {name: {"first_round_s", "round_s" (median), "round_s_all", "flat" (final parameters)}}.
  """
  out = {}
  for name, fn in round_fns.items():
    t0 = time.perf_counter()
    state, _ = fn(init_state(), rd, jax.random.key(1))
    jax.block_until_ready(state)
    out[name] = {
      "first_round_s": time.perf_counter() - t0,
      "round_s_all": [],
      "flat": np.asarray(tree_lib.tree_ravel(state.variables)),
    }
  names = list(round_fns)
  for r in range(repeats):
    for name in names[r % len(names) :] + names[: r % len(names)]:
      state0 = init_state()
      jax.block_until_ready(state0)
      t0 = time.perf_counter()
      state, _ = round_fns[name](state0, rd, jax.random.key(1))
      jax.block_until_ready(state)
      out[name]["round_s_all"].append(time.perf_counter() - t0)
  for v in out.values():
    v["round_s"] = statistics.median(v["round_s_all"]) if v["round_s_all"] else None
  return out


def bench_model(name, x, y, clients: int, args) -> list[dict]:
  model = get_model(name, 10)
  normalize = normalizer_for("cifar10")
  alg = fedavg(model, optax.sgd(0.01, momentum=0.9))
  batch_fn = make_batch_fn(normalize)
  sample = normalize(jnp.asarray(x[:2]))
  variables = model.init(jax.random.key(0), sample)
  kind = model_kind(model, variables, sample)
  n = clients * args.steps * args.batch
  rd, samples = fedavg_round_data(x[:n], y[:n], clients, args.batch)
  fns = {s: make_round(alg, s, batch_fn) for s in STRATEGIES}
  res = compare_strategies(fns, lambda: alg.init(variables, jax.random.key(0)), rd, args.repeats)
  ref = res["vmap_scan"]["flat"]
  auto = engine_lib.choose_strategy("auto", has_conv=kind == "conv", num_clients=clients)
  best = min(res, key=lambda s: res[s]["round_s"])
  return [
    {
      "model": name,
      "kind": kind,
      "clients": clients,
      "strategy": s,
      "first_round_s": r["first_round_s"],
      "round_s": r["round_s"],
      "round_s_all": r["round_s_all"],
      "samples_per_s": samples / r["round_s"],
      "max_abs_diff_vs_vmap_scan": float(np.abs(r["flat"] - ref).max()),
      "auto_picks": auto,
      "fastest": best,
    }
    for s, r in res.items()
  ]


def rules_from_rows(rows: list[dict]) -> dict[str, list[list]]:
  """Per model kind: ``[[max_clients, strategy], ...]``, the last bucket open (``None``).

  At each measured cohort size the winner is the strategy with the largest summed samples/s over
  that kind's models; consecutive sizes with the same winner merge into one bucket.
  """
  rules = {}
  for kind in sorted({r["kind"] for r in rows}):
    score: dict[int, dict[str, float]] = {}
    for r in rows:
      if r["kind"] == kind:
        per = score.setdefault(r["clients"], {})
        per[r["strategy"]] = per.get(r["strategy"], 0.0) + r["samples_per_s"]
    buckets: list[list] = []
    for c in sorted(score):
      win = max(score[c], key=score[c].get)
      if buckets and buckets[-1][1] == win:
        buckets[-1][0] = c
      else:
        buckets.append([c, win])
    buckets[-1][0] = None
    rules[kind] = buckets
  return rules


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--clients", default="4,16,64", help="comma-separated cohort sizes (dense models)")
  p.add_argument(
    "--conv_clients", default="4", help="cohort sizes for conv models (vmap_scan is slow there)"
  )
  p.add_argument("--steps", type=int, default=8)
  p.add_argument("--conv_steps", type=int, default=1)
  p.add_argument("--batch", type=int, default=32)
  p.add_argument("--repeats", type=int, default=5)
  p.add_argument("--models", default="mlp,cnn")
  p.add_argument("--write_table", action="store_true", help="rewrite the auto rule's table")
  args = p.parse_args(argv)

  from fedjax_proj.models.registry import MODELS

  # Cohort sizes are counts (each once), models known names (each once), before any data loads.
  cohorts = flag_checks.seeds(p, "--clients", args.clients)
  conv_cohorts = flag_checks.seeds(p, "--conv_clients", args.conv_clients)
  if 0 in cohorts + conv_cohorts:
    p.error("--clients and --conv_clients must list cohort sizes >= 1")
  models = flag_checks.names(p, "--models", args.models, MODELS)
  flag_checks.at_least(p, args, 1, "steps", "conv_steps", "batch", "repeats")
  n_max = max(cohorts + conv_cohorts) * max(args.steps, args.conv_steps) * args.batch
  x, y = cifar10(n_max)
  load_before = os.getloadavg()
  print(header(), f"cohorts={cohorts} conv_cohorts={conv_cohorts} batch={args.batch}")
  print(f"load average before: {load_before[0]:.2f} {load_before[1]:.2f} {load_before[2]:.2f}")
  rows = []
  for name in models:
    probe = get_model(name, 10)
    sample = normalizer_for("cifar10")(jnp.asarray(x[:2]))
    kind = model_kind(probe, probe.init(jax.random.key(0), sample), sample)
    steps = args.conv_steps if kind == "conv" else args.steps
    for clients in conv_cohorts if kind == "conv" else cohorts:
      run_args = argparse.Namespace(**{**vars(args), "steps": steps})
      got = bench_model(name, x, y, clients, run_args)
      rows += got
      for r in got:
        print(
          f"{r['model']:8s} {r['kind']:5s} {r['clients']:4d} {r['strategy']:14s} "
          f"{r['samples_per_s']:10.0f} samples/s  round {r['round_s']:.3f}s  "
          f"first {r['first_round_s']:.2f}s  max|diff| {r['max_abs_diff_vs_vmap_scan']:.1e}"
        )
      print(f"  -> fastest {got[0]['fastest']}, auto picks {got[0]['auto_picks']}", flush=True)
  load_after = os.getloadavg()
  print(f"load average after: {load_after[0]:.2f} {load_after[1]:.2f} {load_after[2]:.2f}")
  payload = {
    "args": vars(args),
    "header": header(),
    "load_before": load_before,
    "load_after": load_after,
    "rows": rows,
  }
  path = write_results(
    RESULTS_DIR / "strategies.json", payload, indent=2, sort_keys=True, default=float
  )
  print(f"wrote {path}")
  if args.write_table:
    backend = jax.default_backend()
    table = engine_lib.load_strategy_table()
    table["rules"][backend] = rules_from_rows(rows)
    table["measurements"][backend] = {
      "command": "python -m benchmarks.perf.strategies --write_table "
      + " ".join(f"--{k}={v}" for k, v in vars(args).items() if k != "write_table"),
      "date": time.strftime("%Y-%m-%d", time.gmtime()),
      "machine": f"{header()}, {os.cpu_count()} cores",
      "load_average_before_after": [round(load_before[0], 2), round(load_after[0], 2)],
      "samples_per_s": [
        [r["model"], r["kind"], r["clients"], r["strategy"], round(r["samples_per_s"], 1)]
        for r in rows
      ],
    }
    engine_lib.STRATEGY_TABLE.write_text(json.dumps(table, indent=1) + "\n")
    print(f"wrote {engine_lib.STRATEGY_TABLE}: {table['rules'][backend]}")


if __name__ == "__main__":
  main()
