r"""What MOON's network costs at fedgkd-cifar10-table3's cpu budget: the missing cell of a 2 x 2.

FedGKD+ (002 "Evaluation Methods"; docs/methods.md, "FedGKD", its FedGKD+ paragraph) is FedGKD on
MOON's network: the CNN's encoder, a 2-layer projection head, and the output layer on the projection
(``moon.MODEL_KWARGS``). It differs from FedAvg in two things at once, the network and the
distillation term, so the claim's ordering FedGKD+ > FedAvg cannot say which of them moved it. The
claim holds three cells of the 2 x 2 (FedAvg and FedGKD on the plain CNN, FedGKD on MOON's network);
this study runs the fourth, FedAvg on MOON's network, on the claim's own config (only
``model_kwargs`` added, checked equal to FedGKD+'s) and seeds, and pairs it per seed with the
claim's recorded results:

* head under FedAvg: ``fedavg[head] - fedavg``; head under FedGKD: ``fedgkd_plus - fedgkd``;
* distillation on the CNN: ``fedgkd - fedavg``; on MOON's network: ``fedgkd_plus - fedavg[head]``;
* MOON's contrastive term on its own network: ``moon - fedavg[head]``;

so that, per seed, ``fedgkd_plus - fedavg`` is exactly the distillation on MOON's network plus the
head under FedAvg. The metric is the claim's (protocol v2's ``late_test_accuracy``, the mean of the
last 3 evaluations). Exploratory: it never changes a verdict, and pairs only with results of code
that computes the same thing (run it from the replication's commit; the JSON records both).

  python -m studies.head_effect.study
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from benchmarks.results_io import RESULTS_DIR, write_results

CLAIM, BUDGET = "fedgkd-cifar10-table3", "cpu"
HEAD = "fedavg[head]"
RECORDED = ("fedavg", "fedgkd", "fedgkd_plus", "moon")  # the claim's methods the study pairs with
# (name, better, worse): each row's per-seed difference is better - worse.
CONTRASTS = (
  ("head under FedAvg", HEAD, "fedavg"),
  ("head under FedGKD", "fedgkd_plus", "fedgkd"),
  ("distillation on the CNN", "fedgkd", "fedavg"),
  ("distillation on MOON's network", "fedgkd_plus", HEAD),
  ("MOON's contrastive term on its network", "moon", HEAD),
  ("FedGKD+ - FedAvg (the claim's ordering)", "fedgkd_plus", "fedavg"),
)


def head_config(claim, seed: int, data_root: Path) -> dict:
  """The claim's FedAvg config at ``seed`` on FedGKD+'s network: FedGKD+'s ``model_kwargs``
  merged in, every other field the claim's; raises if FedGKD+'s config differs from FedAvg's in
  anything but the method, its hyperparameters and the network."""
  from fedjax_proj.reproduce import resolve

  fedavg = resolve.resolve_config(claim, BUDGET, "fedavg", seed, data_root)
  plus = resolve.resolve_config(claim, BUDGET, "fedgkd_plus", seed, data_root)
  ignored = ("method", "method_kwargs", "model_kwargs")
  differ = sorted(k for k in {*fedavg, *plus} - set(ignored) if fedavg.get(k) != plus.get(k))
  if differ:
    raise RuntimeError(f"{CLAIM}: fedavg's and fedgkd_plus's configs differ in {differ}")
  return {**fedavg, "model_kwargs": {**fedavg.get("model_kwargs", {}), **plus["model_kwargs"]}}


def recorded(results: Path) -> dict[str, dict[int, tuple[float, tuple]]]:
  """The claim's results of :data:`RECORDED`, read as its report reads them (corrupt files and
  diverged runs left out): method -> seed -> (late accuracy, (commit, code fingerprint))."""
  from fedjax_proj.reproduce.protocol import V2_METRIC
  from fedjax_proj.reproduce.report.results import code_of, load_results, per_seed

  found, _, _ = load_results(results)
  return {
    m: {
      s: (v, (found[m][s]["git_commit"], code_of(found[m][s])))
      for s, v in per_seed(found, m, V2_METRIC).items()
    }
    for m in RECORDED
  }


def contrasts(late: dict[str, dict[int, float]]) -> list[dict]:
  """The paired statistics of :data:`CONTRASTS` over the seeds every method in them has."""
  from fedjax_proj.reproduce import stats

  rows = []
  for name, better, worse in CONTRASTS:
    seeds = sorted(set(late.get(better, {})) & set(late.get(worse, {})))
    p = stats.paired([late[better][s] - late[worse][s] for s in seeds])
    rows.append({"contrast": name, "better": better, "worse": worse, **p._asdict()})
  return rows


def _print(out: dict) -> None:
  for r in out["contrasts"]:
    print(
      f"{r['contrast']:42s} {r['better']} - {r['worse']}: {r['mean']:+.2f} "
      f"[{r['low']:+.2f}, {r['high']:+.2f}] sd {r['std']:.2f}, {r['wins']}/{r['n']} seeds > 0"
    )


def parse_args(argv=None) -> argparse.Namespace:
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
  p.add_argument(
    "--seeds", default="", help="comma-separated (default: the claim's declared v2 seeds)"
  )
  p.add_argument("--results", default="", help="the claim's results folder (default: the repo's)")
  p.add_argument(
    "--out", default="", help="this study's folder (default: results/head_effect/CLAIM-BUDGET)"
  )
  p.add_argument("--summarize", action="store_true", help="recompute the contrasts; run nothing")
  args = p.parse_args(argv)
  if args.seeds:
    from benchmarks import flag_checks

    args.seeds = flag_checks.seeds(p, "--seeds", args.seeds)
  return args


def declared_seeds(claim) -> list[int]:
  """The seeds of the budget's protocol-v2 replication, which the claim's results hold."""
  from fedjax_proj.reproduce import protocol

  return list(
    range(protocol.V2_FIRST_SEED, protocol.V2_FIRST_SEED + claim.budgets[BUDGET].v2.seeds)
  )


def run_seed(claim, seed: int, data_root: Path) -> dict:
  """One FedAvg run on MOON's network at ``seed``, as the claim's runner runs its configs."""
  from fedjax_proj.reproduce import protocol, provenance, resolve, runners

  config = resolve.substitute_data(head_config(claim, seed, data_root), data_root)
  t0 = time.perf_counter()
  with tempfile.TemporaryDirectory() as work:
    metrics, curve = runners.RUNNERS[claim.kind](claim, config, Path(work), lambda *a, **k: None)
  return {
    "seed": seed,
    "late": protocol.late_mean(curve),
    "metrics": metrics,
    "curve": curve,
    "wall_seconds": time.perf_counter() - t0,
    "config": config,
    "git_commit": provenance.git_commit(),
    "code": provenance.code_fingerprint(),
    "machine": provenance.machine_info(),
  }


def summarize(folder: Path, results: Path) -> dict:
  """The contrasts over every seed in ``folder``, paired with the claim's results."""
  runs = [json.loads(f.read_text()) for f in sorted(folder.glob("seed*.json"))]
  if not runs:
    raise SystemExit(f"{folder} holds no run of this study (seed*.json): run it first.")
  late: dict[str, dict[int, float]] = {HEAD: {r["seed"]: r["late"] for r in runs}}
  sources: dict[str, set] = {HEAD: {(r["git_commit"], r["code"]) for r in runs}}
  held = recorded(results)
  for method in RECORDED:
    paired = {s: r for s, r in held[method].items() if s in late[HEAD]}
    late[method] = {s: v for s, (v, _) in paired.items()}
    sources[method] = {source for _, source in paired.values()}
  codes = {c for s in sources.values() for _, c in s}
  if len(codes) > 1:
    print(
      f"note: these results come from code {sorted(codes)}: pair them only if they compute "
      "the same thing"
    )
  out = {
    "claim": CLAIM,
    "budget": BUDGET,
    "seeds": sorted(late[HEAD]),
    "sources": {m: sorted(map(list, s)) for m, s in sources.items()},
    "late": {m: {str(k): v for k, v in sorted(d.items())} for m, d in late.items()},
    "contrasts": contrasts(late),
  }
  write_results(folder / "summary.json", out)
  return out


def main(argv=None) -> dict:
  from fedjax_proj.reproduce import claims, resolve

  args = parse_args(argv)
  claim = claims.CLAIMS[CLAIM]
  data_root = resolve.default_data_root()
  results = Path(args.results) if args.results else RESULTS_DIR / "reproduce" / CLAIM / BUDGET
  folder = Path(args.out) if args.out else RESULTS_DIR / "head_effect" / f"{CLAIM}-{BUDGET}"
  seeds = [] if args.summarize else (args.seeds or declared_seeds(claim))
  # Before any training: every run is paired with the claim's results of its seed.
  held = recorded(results) if seeds else {}
  missing = [f"{m}-seed{s}.json" for s in seeds for m in RECORDED if s not in held[m]]
  if missing:
    raise SystemExit(
      f"{results} lacks the claim's results {', '.join(missing[:4])}"
      f"{' ...' if len(missing) > 4 else ''}: choose --seeds the claim has run, or point "
      "--results at its folder."
    )
  for seed in seeds:
    path = folder / f"seed{seed}.json"
    if path.exists():
      continue  # a rerun keeps the seeds it finished
    run = run_seed(claim, seed, data_root)
    write_results(path, run)
    print(f"seed {seed}: {HEAD} late_test_accuracy {run['late']:.2f}", flush=True)
  out = summarize(folder, results)
  _print(out)
  print(f"wrote {folder / 'summary.json'}")
  return out


if __name__ == "__main__":
  main()
