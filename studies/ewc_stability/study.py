"""Is EWC's divergence in the FOT claims the explicit-Euler instability of its penalty? Measured.

    python -m studies.ewc_stability.study --seed=1 --stop_round=40
    python -m studies.ewc_stability.study --seed=4 --stop_round=60

Runs ONE EWC run of a claim's budget (default fot-pmnist-noniid, cpu) at its pre-registered config
(the runner's own ``resolve_config`` and continual entry point, as
studies/continual_subspace/study.py) for the claim's seed, stopping after ``--stop_round`` rounds or
at the first non-finite round. Rounds are a pure function of (seed, round), so its rounds are the
claim's rounds.

The mechanism tested (docs/fot.md, "EWC's divergence at the cpu budget"): a client's local loss
is CE + (λ/2) Σ_i F_i (θ_i − θ*_i)² (algorithms/continual/ewc.py), whose gradient along θ_i is
λ F_i (θ_i − θ*_i), so one SGD step maps the deviation e_i = θ_i − θ*_i to (1 − lr·λ·F_i)·e_i plus
the CE gradient's push. It shrinks e_i only while |1 − lr·λ·F_i| < 1, i.e. lr·λ·F_i < 2; at
the cpu budget lr·λ = 0.05·40 = 2, so the bound is F_i < 1 (at the paper's lr 0.01: F_i < 5).
Over a round a sampled client k runs S_k steps, and the server averages (weights n_k), so the
global deviation along θ_i is multiplied by a_i = Σ_k w_k (1 − lr·λ·F_{k,i})^{S_k} (the linear
part; CE and weight decay ignored). A round can grow a deviation only where |a_i| > 1.

Recorded (benchmark-only wrappers around the method's end-of-task pass and the round; the library
pays for none of it):

* after each task: every client's largest Fisher entry (summed over tasks, as the method holds
  it) and where it is, the largest entry of the task's own Fisher, and how many clients have
  lr·λ·F_max > 2;
* after each round: the sampled clients' largest lr·λ·F_max (ρ), how many exceed 2, the round's
  largest linear amplification max_i |a_i| and how many coordinates have |a_i| > 1, the global
  model's largest deviation from the anchor over all coordinates and over those with |a_i| > 1,
  and the train loss.

Writes ``<out>/<claim>-<budget>-ewc-seed<s>.{json,md}`` (``results/`` is gitignored:
``git add -f``).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from benchmarks import flag_checks
from benchmarks.results_io import RESULTS_DIR, write_results


class StopRun(Exception):
  """Raised by the round wrapper after ``--stop_round`` rounds."""


def leaf_names(tree) -> list[str]:
  import jax

  return [jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_flatten_with_path(tree)[0]]


def fisher_table(fisher, prev, lr: float, lam: float) -> dict:
  """Per-client largest summed Fisher entry, its leaf, and the task's own largest entry."""
  import jax
  import jax.numpy as jnp

  names = leaf_names(fisher)
  leaves, prev_leaves = jax.tree.leaves(fisher), jax.tree.leaves(prev)
  per_leaf = np.stack([np.asarray(jnp.max(f.reshape(f.shape[0], -1), axis=1)) for f in leaves])
  own = np.stack(
    [
      np.asarray(jnp.max((f - p).reshape(f.shape[0], -1), axis=1))
      for f, p in zip(leaves, prev_leaves, strict=True)
    ]
  )
  fmax = per_leaf.max(axis=0)  # [clients]
  # What fisher="server" would hold from the same clients (equal n_k at these budgets: the mean).
  server = max(float(jnp.max(jnp.mean(f, axis=0))) for f in leaves)
  where = [names[i] for i in per_leaf.argmax(axis=0)]
  rho = lr * lam * fmax
  leaf_max = {n: float(per_leaf[i].max()) for i, n in enumerate(names)}
  return {
    "fmax_per_client": fmax.tolist(),
    "fmax_leaf_per_client": where,
    "task_fmax_per_client": own.max(axis=0).tolist(),
    "fmax_per_leaf": leaf_max,
    "fmax": float(fmax.max()),
    "fmax_median": float(np.median(fmax)),
    "fmax_client_mean": server,
    "task_fmax": float(own.max()),
    "clients_over_bound": int(np.sum(rho > 2.0)),
    "clients": int(len(fmax)),
  }


def round_stats(state, rd, lr: float, lam: float) -> dict:
  """The linear amplification of this round's sampled clients and the global deviation."""
  import jax
  import jax.numpy as jnp

  ids = jnp.asarray(rd.client_ids)
  w = jnp.asarray(rd.num_examples, jnp.float32)
  w = w / jnp.sum(w)
  steps = jnp.sum(jnp.any(jnp.asarray(rd.mask), axis=-1), axis=-1).astype(jnp.float32)  # [C]
  fisher = jax.tree.map(lambda f: f[ids], state.method["fisher"])
  params, anchor = state.variables["params"], state.method["anchor"]
  rho_k = jnp.max(
    jnp.stack([jnp.max(f.reshape(f.shape[0], -1), 1) for f in jax.tree.leaves(fisher)]), 0
  )
  rho_k = lr * lam * rho_k

  def amp(f):
    s = steps.reshape(-1, *(1,) * (f.ndim - 1))
    ww = w.reshape(s.shape)
    return jnp.abs(jnp.sum(ww * (1.0 - lr * lam * f) ** s, axis=0))

  a = jax.tree.map(amp, fisher)
  dev = jax.tree.map(lambda p, q: jnp.abs(p - q), params, anchor)
  a_l, d_l = jax.tree.leaves(a), jax.tree.leaves(dev)
  unstable = [x > 1.0 for x in a_l]
  return {
    "rho_max": float(jnp.max(rho_k)),
    "clients_over_bound": int(jnp.sum(rho_k > 2.0)),
    "amp_max": float(max(jnp.max(x) for x in a_l)),
    "unstable_coords": int(sum(jnp.sum(u) for u in unstable)),
    "dev_max": float(max(jnp.max(d) for d in d_l)),
    "dev_unstable_max": float(
      max(jnp.max(jnp.where(u, d, 0.0)) for u, d in zip(unstable, d_l, strict=True))
    ),
  }


def instrument(records: dict, lr: float, lam: float, stop_round: int):
  """Wraps the continual method builder (EWC's end-of-task pass) and the round builder."""
  import jax

  from fedjax_proj.training import continual as continual_lib
  from fedjax_proj.training import placement

  build = continual_lib.build_continual_method
  build_round = placement.build_round
  held = {}

  def wrapped_method(name, *args, **kwargs):
    method = build(name, *args, **kwargs)

    def end_task(state, rd, key, task):
      prev = jax.tree.map(np.asarray, state.method["fisher"])
      state, metrics = method.end_task(state, rd, key, task)
      records["tasks"].append({"task": task, **fisher_table(state.method["fisher"], prev, lr, lam)})
      held["fisher_ready"] = True
      return state, metrics

    return method._replace(end_task=end_task)

  def wrapped_round(algorithm, executor, log):
    round_fn = build_round(algorithm, executor, log)

    def run_round(state, rd, key):
      state, metrics = round_fn(state, rd, key)
      r = len(records["rounds"]) + 1
      row = {"round": r, "train_loss": float(metrics["train_loss"])}
      if held.get("fisher_ready"):
        row |= round_stats(state, rd, lr, lam)
      records["rounds"].append(row)
      print(json.dumps(row), flush=True)
      if r >= stop_round:
        raise StopRun(r)
      return state, metrics

    return run_round

  continual_lib.build_continual_method = wrapped_method
  placement.build_round = wrapped_round


def run(args) -> dict:
  from fedjax_proj.reproduce import claims as claims_lib
  from fedjax_proj.reproduce import provenance, resolve, runners
  from fedjax_proj.reproduce.runners import Diverged

  claim = claims_lib.get_claim(args.claim)
  config = resolve.resolve_config(claim, args.budget, "ewc", args.seed)
  config = resolve.substitute_data(
    config, Path(args.data) if args.data else resolve.default_data_root()
  )
  lr, lam = float(config["lr"]), float(config["method_kwargs"]["lam"])
  if config["method_kwargs"].get("normalize") or config["method_kwargs"].get("fisher") != "client":
    raise ValueError(f"this analysis reads per-client unnormalised Fishers, got {config}")
  records: dict = {"tasks": [], "rounds": []}
  instrument(records, lr, lam, args.stop_round)
  commit = provenance.git_commit()
  t0 = time.perf_counter()
  stopped = "stop_round"
  with tempfile.TemporaryDirectory(prefix="ewc_stability_") as work:
    try:
      runners.run_continual(claim, config, Path(work), print)
      stopped = "finished"
    except StopRun:
      pass
    except Diverged as e:
      stopped = f"diverged: {e}"
  first_bad = next(
    (x["round"] for x in records["rounds"] if not math.isfinite(x["train_loss"])), None
  )
  return {
    "claim": args.claim,
    "budget": args.budget,
    "seed": args.seed,
    "lr": lr,
    "lam": lam,
    "bound_fisher": 2.0 / (lr * lam),
    "stop_round": args.stop_round,
    "stopped": stopped,
    "first_nonfinite_round": first_bad,
    "config": {k: v for k, v in config.items() if k != "data_dir"},
    "git_commit": commit,
    "tasks": records["tasks"],
    "rounds": records["rounds"],
    "wall_seconds": time.perf_counter() - t0,
    "load_average": list(os.getloadavg()),
  }


def markdown(r: dict) -> str:
  lines = [
    f"# EWC stability, {r['claim']} --budget={r['budget']} seed {r['seed']}",
    "",
    f"`python -m studies.ewc_stability.study --claim={r['claim']} --budget={r['budget']} "
    f"--seed={r['seed']} --stop_round={r['stop_round']}`; commit {r['git_commit']}; wall "
    f"{r['wall_seconds']:.0f} s, load {r['load_average'][0]:.1f}. lr {r['lr']}, λ {r['lam']}: "
    f"stable per coordinate while F < 2/(lr·λ) = {r['bound_fisher']:.3g}. Run: {r['stopped']}; "
    f"first non-finite round: {r['first_nonfinite_round']}.",
    "",
    "| after task | F_max (all clients) | median client F_max | task's own F_max | clients with "
    "lr·λ·F_max > 2 | leaf of the largest | F_max of the clients' mean |",
    "|---|---|---|---|---|---|---|",
  ]
  for t in r["tasks"]:
    top = int(np.argmax(t["fmax_per_client"]))
    # "-": recorded before this column existed (seeds 1 and 4).
    mean = f"{t['fmax_client_mean']:.3g}" if "fmax_client_mean" in t else "-"
    lines.append(
      f"| {t['task'] + 1} | {t['fmax']:.3g} | {t['fmax_median']:.3g} | {t['task_fmax']:.3g} | "
      f"{t['clients_over_bound']} / {t['clients']} | {t['fmax_leaf_per_client'][top]} | {mean} |"
    )
  lines += [
    "",
    "| round | loss | ρ_max of sampled | sampled over 2 | max amplification | coords \\|a\\| > 1 | "
    "max \\|θ − θ*\\| | over \\|a\\| > 1 |",
    "|---|---|---|---|---|---|---|---|",
  ]
  for x in r["rounds"]:
    if "rho_max" not in x:
      continue
    lines.append(
      f"| {x['round']} | {x['train_loss']:.4g} | {x['rho_max']:.3g} | {x['clients_over_bound']} | "
      f"{x['amp_max']:.3g} | {x['unstable_coords']} | {x['dev_max']:.3g} | "
      f"{x['dev_unstable_max']:.3g} |"
    )
  return "\n".join(lines) + "\n"


def check_flags(ap: argparse.ArgumentParser, args: argparse.Namespace) -> None:
  """The claim runs EWC under the budget, and the data folder exists, before JAX or any data loads.

  Otherwise each is a traceback from deep in the run (an unknown claim or budget, a missing folder
  read as the claim's data) after the imports.
  """
  from fedjax_proj.reproduce.claims import CLAIMS  # no JAX: the claims are plain data

  ewc = [name for name, c in CLAIMS.items() if "ewc" in c.methods]
  if args.claim not in ewc:
    ap.error(f"--claim={args.claim} is not a claim that runs EWC; choose from {', '.join(ewc)}")
  budgets = list(CLAIMS[args.claim].budgets)
  if args.budget not in budgets:
    ap.error(f"--budget={args.budget} is not {args.claim}'s; choose from {', '.join(budgets)}")
  flag_checks.at_least(ap, args, 0, "seed")
  flag_checks.at_least(ap, args, 1, "stop_round")
  if args.data and not Path(args.data).is_dir():
    ap.error(f"--data={args.data} is not a folder; pass the shared data folder (its README)")


def main(argv=None) -> int:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--claim", default="fot-pmnist-noniid")
  ap.add_argument("--budget", default="cpu")
  ap.add_argument("--seed", type=int, default=1)
  ap.add_argument("--stop_round", type=int, default=40, help="stop after this round (>= 1)")
  ap.add_argument("--data", default="", help="shared data root (default: the runner's)")
  ap.add_argument("--out", default=str(RESULTS_DIR / "ewc_stability"))
  args = ap.parse_args(argv)
  check_flags(ap, args)
  result = run(args)
  out = Path(args.out)
  out.mkdir(parents=True, exist_ok=True)
  name = f"{args.claim}-{args.budget}-ewc-seed{args.seed}"
  write_results(out / f"{name}.json", result, markdown=markdown(result))
  print(markdown(result))
  return 0


if __name__ == "__main__":
  sys.exit(main())
