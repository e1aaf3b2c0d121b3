"""How much of each layer's input space FOT and GPM+FL protect, task by task, in a claim's run.

    python -m studies.continual_subspace.study --claim=fot-pmnist-noniid --budget=cpu --method=fot
    python -m studies.continual_subspace.study --method=fot --method_kwargs=threshold_rule=authors \
        --label=authors-rule
    python -m studies.continual_subspace.study --method=gpm
    python -m studies.continual_subspace.study --method=fot --num_tasks=1   # to time one task

Runs ONE run of the claim's method at the budget's pre-registered config (the runner's own
``resolve_config`` and continual entry point; ``--num_tasks`` and ``--method_kwargs`` override
it for timing and for the other threshold rule, and say so in the output), then reads the
end-of-task records of its ``metrics.jsonl``. Per task and per layer it reports:

* FOT: the protected dimension (the rank of the global basis), its fraction of the layer's input
  width d, the directions added, and the rule's target and residual share q (docs/fot.md, "The
  threshold rule").
* GPM+FL: every client keeps its own basis (algorithms/continual/gpm.py), so the mean, least and
  largest client rank; and, computed here from the bases after each task, the spectrum of the mean
  projector P̄ = mean_c U_c U_cᵀ over all clients: its eigenvalues near 1 are directions every
  client protects (the only ones a FedAvg of projected updates leaves untouched: the global update
  is mean_c (I − P_c) g_c), the count above 1e-3 is the span of the union of the bases.
* Both: a_{t,t}, the accuracy on task t just after training it, and the accuracy matrix.

003 Table 3 reports the share of the subspace used after the last task, averaged over the layers
(PMNIST: 62.18% IID, 61.36% non-IID); the summary gives the unweighted mean over layers and the
d-weighted one. Writes ``<out>/<claim>-<budget>-<method>[-label]-seed<s>.{json,md}``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from benchmarks.results_io import RESULTS_DIR, write_results

TABLE3 = {"fot-pmnist-noniid": 61.36, "fot-pmnist-iid": 62.18}  # 003 Table 3, % used
COMMON, UNION = 0.99, 1e-3  # eigenvalue cuts of the mean projector (GPM+FL)


def mean_projector_counts(bases: dict) -> dict:
  """Per layer: directions protected by (nearly) every client and by any, from [C, d, d] bases."""
  import jax.numpy as jnp

  out = {}
  for key, b in bases.items():
    b = jnp.asarray(b, jnp.float32)
    p = jnp.einsum("cik,cjk->ij", b, b) / b.shape[0]  # zero-padded columns add nothing
    eig = np.linalg.eigvalsh(np.asarray(p, np.float64))
    out[key] = {
      "common": int(np.sum(eig >= COMMON)),
      "union": int(np.sum(eig >= UNION)),
      "trace_over_d": float(eig.sum() / len(eig)),
    }
  return out


def instrument_gpm(records: list):
  """Wraps the continual method builder so GPM's end-of-task pass also records the bases'
  mean-projector counts (benchmark-only: the library's GPM does not pay for them)."""
  from fedjax_proj.training import continual as continual_lib

  build = continual_lib.build_continual_method

  def wrapped(name, *args, **kwargs):
    method = build(name, *args, **kwargs)
    if name != "gpm":
      return method

    def end_task(state, rd, key, task):
      state, metrics = method.end_task(state, rd, key, task)
      t0 = time.perf_counter()
      records.append({"task": task, **mean_projector_counts(state.method)})
      records[-1]["seconds"] = time.perf_counter() - t0
      return state, metrics

    return method._replace(end_task=end_task)

  continual_lib.build_continual_method = wrapped


def task_table(method: str, ends: list, extra: list, acc_matrix: list) -> list[dict]:
  """One row per (task, layer) from the end-of-task records."""
  rows = []
  for end in ends:
    t = end["task_end"]
    prefix = "rank/" if method == "fot" else "mean_rank/"
    for name in sorted(k[len(prefix) :] for k in end if k.startswith(prefix)):
      row = {"task": t, "layer": name, "a_tt": acc_matrix[t][t], "rank": end[prefix + name]}
      if method == "fot":
        row |= {
          "added": end.get(f"added/{name}"),
          "target": end.get(f"eps_prime/{name}"),
          "residual_share": end.get(f"residual_energy/{name}"),
          "rho": end.get(f"rho/{name}"),
        }
      else:
        row |= {
          "min_rank": end.get(f"min_rank/{name}"),
          "max_rank": end.get(f"max_rank/{name}"),
          "threshold": end.get("threshold"),
        }
        found = [e for e in extra if e["task"] == t]
        if found:
          row |= {k: found[0][name][k] for k in ("common", "union", "trace_over_d")}
      rows.append(row)
  return rows


def run(args) -> dict:
  from fedjax_proj.reproduce import claims as claims_lib
  from fedjax_proj.reproduce import provenance, resolve, runners
  from fedjax_proj.training.config import parse_method_kwargs

  claim = claims_lib.get_claim(args.claim)
  config = resolve.resolve_config(claim, args.budget, args.method, args.seed)
  deviations = {}
  if args.num_tasks:
    deviations["num_tasks"] = args.num_tasks
    config["num_tasks"] = args.num_tasks
  if args.method_kwargs:
    extra = parse_method_kwargs(args.method_kwargs)
    deviations["method_kwargs"] = extra
    config["method_kwargs"] = {**config["method_kwargs"], **extra}
  config = resolve.substitute_data(
    config, Path(args.data) if args.data else resolve.default_data_root()
  )
  commit = provenance.git_commit()  # the code the run starts from
  records: list = []
  instrument_gpm(records)
  t0 = time.perf_counter()
  if args.work:
    # A long run (the paper budget) keeps its checkpoints there and continues from them when the
    # same command runs again: the entry point's --resume, which refuses a different config.
    work = Path(args.work)
    if (work / "metrics.jsonl").is_file():
      config["resume"] = True
      deviations["resumed"] = True
    work.mkdir(parents=True, exist_ok=True)
    metrics, _ = runners.run_continual(claim, config, work, print)
    lines = [json.loads(x) for x in (work / "metrics.jsonl").read_text().splitlines()]
  else:
    with tempfile.TemporaryDirectory(prefix="continual_subspace_") as tmp:
      metrics, _ = runners.run_continual(claim, config, Path(tmp), print)
      lines = [json.loads(x) for x in (Path(tmp) / "metrics.jsonl").read_text().splitlines()]
  wall = time.perf_counter() - t0
  ends = [x for x in lines if "task_end" in x]
  acc = metrics["acc_matrix"]
  rows = task_table(args.method, ends, records, acc)
  widths = {}
  for row in rows:
    d = run_lib_width(row["layer"], config)
    widths[row["layer"]] = d
    row["d"] = d
    row["fraction"] = row["rank"] / d
  last = [r for r in rows if r["task"] == rows[-1]["task"]] if rows else []
  return {
    "claim": args.claim,
    "budget": args.budget,
    "method": args.method,
    "label": args.label,
    "seed": args.seed,
    "deviations_from_claim": deviations,
    "config": {k: v for k, v in config.items() if k != "data_dir"},
    "git_commit": commit,
    "acc": metrics["acc"],
    "fgt": metrics["fgt"],
    "acc_matrix": acc,
    "a_tt": [acc[t][t] for t in range(len(ends))],
    "rows": rows,
    "end_task_records": ends,
    "final_mean_fraction": float(np.mean([r["fraction"] for r in last])) if last else None,
    "final_weighted_fraction": (
      float(sum(r["rank"] for r in last) / sum(r["d"] for r in last)) if last else None
    ),
    "table3_percent": TABLE3.get(args.claim),
    "wall_seconds": wall,
    "load_average": list(os.getloadavg()),
  }


def run_lib_width(layer: str, config: dict) -> int:
  """A PMNIST MLP layer's input width from the config (784 for dense_0, else the previous width)."""
  hidden = [int(h) for h in str(config["hidden"]).split(",")]
  if layer == "dense_0":
    return 784
  if layer.startswith("dense_"):
    return hidden[int(layer.split("_")[1]) - 1]
  return hidden[-1]  # the classifier


def markdown(r: dict) -> str:
  gpm = r["method"] == "gpm"
  lines = [
    f"# {r['method']} subspace, {r['claim']} --budget={r['budget']} seed {r['seed']}"
    + (f" ({r['label']})" if r["label"] else ""),
    "",
    f"`python -m studies.continual_subspace.study --claim={r['claim']} --budget={r['budget']} "
    f"--method={r['method']} --seed={r['seed']}`"
    + (f" with {json.dumps(r['deviations_from_claim'])}" if r["deviations_from_claim"] else "")
    + f"; commit {r['git_commit']}; wall {r['wall_seconds']:.0f} s, load "
    f"{r['load_average'][0]:.1f}.",
    "",
    f"ACC {r['acc']:.2f}, FGT {r['fgt']:.2f}; a_tt (accuracy on each task just after training it): "
    + " ".join(f"{100 * a:.1f}" for a in r["a_tt"]),
    "",
  ]
  if r["final_mean_fraction"] is not None:
    paper = f" (003 Table 3: {r['table3_percent']}% for FOT)" if r["table3_percent"] else ""
    what = "mean client rank / d" if gpm else "rank / d"
    lines += [
      f"After the last task, {what} averaged over the layers: "
      f"{100 * r['final_mean_fraction']:.2f}%{paper}; weighted by d: "
      f"{100 * r['final_weighted_fraction']:.2f}%.",
      "",
    ]
  if gpm:
    lines += [
      "| task | layer | d | threshold | client rank mean (min-max) | mean / d | common (P̄ eig ≥ "
      f"{COMMON}) | union (eig ≥ {UNION}) | tr P̄ / d | a_tt |",
      "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for x in r["rows"]:
      lines.append(
        f"| {x['task'] + 1} | {x['layer']} | {x['d']} | {x['threshold']} | {x['rank']:.1f} "
        f"({x['min_rank']}-{x['max_rank']}) | {100 * x['fraction']:.1f}% | "
        f"{x.get('common', '-')} | "
        f"{x.get('union', '-')} | {100 * x.get('trace_over_d', float('nan')):.1f}% | "
        f"{100 * x['a_tt']:.1f} |"
      )
  else:
    lines += [
      "| task | layer | d | added | rank | rank / d | target | q (residual share) | a_tt |",
      "|---|---|---|---|---|---|---|---|---|",
    ]
    for x in r["rows"]:
      lines.append(
        f"| {x['task'] + 1} | {x['layer']} | {x['d']} | {x['added']} | {x['rank']} | "
        f"{100 * x['fraction']:.1f}% | {x['target']:.4f} | {x['residual_share']:.4f} | "
        f"{100 * x['a_tt']:.1f} |"
      )
  return "\n".join(lines) + "\n"


def main(argv=None) -> int:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--claim", default="fot-pmnist-noniid", choices=sorted(TABLE3))
  ap.add_argument("--budget", default="cpu")
  ap.add_argument("--method", default="fot", choices=("fot", "gpm"))
  ap.add_argument("--seed", type=int, default=0)
  ap.add_argument(
    "--num_tasks", type=int, default=0, help="fewer tasks, to time one (0: the claim's)"
  )
  ap.add_argument("--method_kwargs", default="", help="overrides, e.g. threshold_rule=authors")
  ap.add_argument("--label", default="", help="suffix of the output name (e.g. authors-rule)")
  ap.add_argument("--data", default="", help="shared data root (default: the runner's)")
  ap.add_argument("--out", default=str(RESULTS_DIR / "continual_subspace"))
  ap.add_argument(
    "--work",
    default="",
    help="keep the run's folder here and continue it from its checkpoints when run again "
    "(default: a temporary folder; FOT only, as GPM+FL's bases are recorded in memory)",
  )
  args = ap.parse_args(argv)
  if args.work and args.method != "fot":
    ap.error("--work continues FOT runs only: GPM+FL's per-task bases are recorded in memory")
  if args.num_tasks < 0:
    ap.error(f"--num_tasks must be >= 0, got {args.num_tasks}")
  result = run(args)
  name = f"{args.claim}-{args.budget}-{args.method}" + (f"-{args.label}" if args.label else "")
  name += f"-seed{args.seed}" + (f"-tasks{args.num_tasks}" if args.num_tasks else "")
  out = Path(args.out)
  out.mkdir(parents=True, exist_ok=True)
  write_results(out / f"{name}.json", result, markdown=markdown(result))
  print(markdown(result))
  print(f"wrote {out / name}.json and .md")
  return 0


if __name__ == "__main__":
  sys.exit(main())
