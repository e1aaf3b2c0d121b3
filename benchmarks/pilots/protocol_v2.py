"""The v1 curves behind protocol v2's metric and seed counts (docs/reproduction.md, "Protocol v2").

    python -m benchmarks.pilots.protocol_v2          # markdown tables from the committed v1 results

For every claim x budget with v1 results on curves of test accuracy: how far the last evaluation
swings from the one before (mean and largest |final - previous| over every run, points), and, for
the mean over the last k evaluations (k = 1 is v1's final accuracy), the largest paired sd over
the budget's claimed orderings on the v1 pre-registered seeds. Protocol v2's k
(``protocol.LATE_EVALS``) and each replication's ``power_sd`` (claims/) were read off these
tables before any v2 run. For the continual claims, the paired sd of each claimed ordering on ACC
and FGT, which their replications score as v1 did. Then the power calculation of each declared
replication.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

from fedjax_proj.reproduce import claims, protocol, run, stats
from fedjax_proj.reproduce.report import results as report_results

BUDGETS = ("cpu", "drift", "mnist")


def _late(result: dict, k: int) -> float | None:
  try:
    return protocol.late_mean(result["curve"], k=k)
  except KeyError:
    return None


def rows(results: Path) -> list[str]:
  """One markdown row per claim x budget with v1 results."""
  out = []
  for claim in claims.CLAIMS.values():
    if claim.kind != "image":
      continue
    for budget in BUDGETS:
      directory = results / claim.name / budget
      if budget not in claim.budgets or not directory.is_dir():
        continue
      found, _, _ = report_results.load_results(directory)
      found, _ = report_results.split_diverged(found)
      at, seeds = claim.at(budget), claim.budgets[budget].declared
      curves = [
        [c["test_accuracy"] for c in r["curve"] if "test_accuracy" in c]
        for rs in found.values()
        for s, r in rs.items()
        if s in seeds
      ]
      swings = [100 * abs(c[-1] - c[-2]) for c in curves if len(c) > 1]
      if not swings:
        continue
      evals = min(len(c) for c in curves)
      pairs = dict.fromkeys((o.better, o.worse) for o in at.orderings)
      cells = []
      for k in range(1, evals + 1):
        sds = []
        for better, worse in pairs:
          a = {s: _late(r, k) for s, r in found.get(better, {}).items() if s in seeds}
          b = {s: _late(r, k) for s, r in found.get(worse, {}).items() if s in seeds}
          diffs = [a[s] - b[s] for s in a.keys() & b.keys() if None not in (a[s], b[s])]
          if len(diffs) >= stats.MIN_SEEDS:
            sds.append(statistics.stdev(diffs))
        cells.append(f"{max(sds):.2f}" if sds else "—")
      cells += ["—"] * (5 - len(cells))
      out.append(
        f"| {claim.name} | {budget} | {evals} | {statistics.mean(swings):.2f} | "
        f"{max(swings):.2f} | " + " | ".join(cells[:5]) + " |"
      )
  return out


def continual_rows(results: Path) -> list[str]:
  """For each continual claim's cpu budget: every claimed ordering's paired sd on the v1 seeds
  that both methods have, on the claim's own metrics (the replication scores ACC and FGT as v1).
  Pairs are taken whatever code each side ran: this sizes the replication, it is no verdict."""
  out = []
  for claim in claims.CLAIMS.values():
    directory = results / claim.name / "cpu"
    if claim.kind != "continual" or not directory.is_dir():
      continue
    found, _, _ = report_results.load_results(directory)
    found, _ = report_results.split_diverged(found)
    seeds = claim.budgets["cpu"].declared
    for o in claim.orderings:
      a = {s: r["metrics"][o.metric] for s, r in found.get(o.better, {}).items() if s in seeds}
      b = {s: r["metrics"][o.metric] for s, r in found.get(o.worse, {}).items() if s in seeds}
      common = sorted(a.keys() & b.keys())
      diffs = [a[s] - b[s] for s in common]
      sd = f"{statistics.stdev(diffs):.2f}" if len(diffs) >= 2 else "—"
      mean = f"{statistics.mean(diffs):+.2f}" if diffs else "—"
      out.append(
        f"| {claim.name} | {o.better} > {o.worse} | {o.metric} | {len(diffs)} | {mean} | {sd} |"
      )
  return out


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--results", default=str(run.DEFAULT_RESULTS))
  args = p.parse_args(argv)
  print(
    "| claim | budget | evaluations | mean \\|final - previous\\| | largest | sd, k=1 | k=2 | k=3 "
    "| k=4 | k=5 |"
  )
  print("|---|---|---|---|---|---|---|---|---|---|")
  print("\n".join(rows(Path(args.results))))
  print()
  print("| claim (cpu) | ordering | metric | pairs | mean (better - worse) | paired sd |")
  print("|---|---|---|---|---|---|")
  print("\n".join(continual_rows(Path(args.results))))
  for claim in claims.CLAIMS.values():
    for budget, b in claim.budgets.items():
      if b.v2 is not None:
        print()
        print(protocol.render_plan(protocol.v2_view(claim, budget), budget))
  return 0


if __name__ == "__main__":
  sys.exit(main())
