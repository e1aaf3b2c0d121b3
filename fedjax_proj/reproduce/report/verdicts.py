"""The pre-registered verdicts (fedjax_proj/reproduce/protocol.py): each claimed ordering paired
per seed on the declared seeds, Holm-adjusted, as a table and as ``verdicts.json`` records; and the
exploratory paired rows and the paired sd the power calculation reads."""

from __future__ import annotations

import math
from typing import NamedTuple

from fedjax_proj.reproduce import protocol, stats
from fedjax_proj.reproduce.claims import LOWER_IS_BETTER, Claim
from fedjax_proj.reproduce.report.results import (
  _fmt,
  _per_seed,
  _seed_ranges,
  computation,
  same_code,
)


def paired_rows(claim: Claim, found: dict) -> list[tuple]:
  """(better, worse, metric, Paired, verdict) for every claimed ordering over every seed both
  ran, by the interval rule of stats.py: the exploratory view (and the pilot sweep's)."""
  rows = []
  for o in claim.orderings:
    diffs = stats.differences(
      _per_seed(found, o.better, o.metric),
      _per_seed(found, o.worse, o.metric),
      o.metric in LOWER_IS_BETTER,
    )
    p = stats.paired(diffs)
    rows.append((o.better, o.worse, o.metric, p, stats.verdict(p)))
  return rows


def measured_sd(claim: Claim, found: dict) -> dict[str, float]:
  """The largest paired sd per metric over the pairs (headline or an ablation of it) x (any
  other method) that share >= 3 seeds in ``found``: the power calculation's input
  (protocol.py)."""
  out: dict[str, float] = {}
  firsts = [m for m in (claim.headline, *claim.ablations) if m in found]
  for metric in claim.metrics:
    for a in firsts:
      for b in found:
        if b == a:
          continue
        diffs = stats.differences(_per_seed(found, a, metric), _per_seed(found, b, metric))
        if len(diffs) >= stats.MIN_SEEDS:
          out[metric] = round(max(out.get(metric, 0.0), stats.mean_std(diffs)[1]), 2)
  return out


class Confirmatory(NamedTuple):
  """One ordering's pre-registered verdict (fedjax_proj/reproduce/protocol.py)."""

  better: str
  worse: str
  metric: str
  paired: stats.Paired
  p: float
  p_holm: float
  verdict: str
  declared: int
  refused: tuple[int, ...]  # seeds whose two runs recorded different code
  unknown: int  # seeds where either run is code unknown
  mismatched: tuple[int, ...] = ()  # seeds whose two runs computed on different machines/arithmetic
  seeds: range = range(0)  # the pre-registered seeds


def declared_seeds(claim: Claim, budget: str) -> range:
  """The pre-registered seeds of ``budget`` (v1: 0..n-1; a protocol v2 view: its own range)."""
  b = claim.budgets.get(budget)
  return b.declared if b is not None else range(protocol.MIN_SEEDS)


def confirmatory_rows(
  claim: Claim, found: dict, budget: str, equivalent: list[set[str]] = ()
) -> list[Confirmatory]:
  """Every claimed ordering on the pre-registered seeds only, pairs of differing code or
  computation (:func:`computation`) refused, raw and Holm-adjusted p-values across the claim's
  orderings."""
  seeds = declared_seeds(claim, budget)
  declared = len(seeds)
  if budget in claim.budgets:
    claim = claim.at(budget)  # the budget's orderings are its Holm family
  parts = []
  for o in claim.orderings:
    a = protocol.confirmatory(_per_seed(found, o.better, o.metric), seeds)
    b = protocol.confirmatory(_per_seed(found, o.worse, o.metric), seeds)
    refused, unknown, mismatched = [], 0, []
    for seed in sorted(set(a) & set(b)):
      ra, rb = found[o.better][seed], found[o.worse][seed]
      same = same_code(ra, rb, list(equivalent))
      if same is False:
        refused.append(seed)
        continue
      if computation(ra) != computation(rb):
        mismatched.append(seed)
        continue
      unknown += same is None
    keep = set(a) & set(b) - set(refused) - set(mismatched)
    diffs = stats.differences(
      {k: a[k] for k in keep}, {k: b[k] for k in keep}, o.metric in LOWER_IS_BETTER
    )
    parts.append(
      (o, stats.paired(diffs), protocol.paired_p(diffs), tuple(refused), unknown, mismatched)
    )
  # An ordering without its n pre-registered pairs (incomplete, or broken by a diverged run) has
  # no test: it counts in the family with p = 1, so its partial p cannot lower the others' bar.
  adjusted = protocol.holm([p if pr.n >= declared else math.nan for _, pr, p, *_ in parts])
  return [
    Confirmatory(
      o.better,
      o.worse,
      o.metric,
      pr,
      p,
      adj,
      protocol.verdict(pr.mean, adj, pr.n, declared),
      declared,
      refused,
      unknown,
      tuple(mismatched),
      seeds,
    )
    for (o, pr, p, refused, unknown, mismatched), adj in zip(parts, adjusted, strict=True)
  ]


def _paired_cells(p: stats.Paired) -> str:
  """The shared cells of a paired row: seeds, mean, std, seeds favouring, 95% interval."""
  return (
    f"{p.n} | {_fmt(p.mean)} | {_fmt(p.std)} | {p.wins}/{p.n} | [{_fmt(p.low)}, {_fmt(p.high)}]"
  )


def _p(x: float) -> str:
  return "—" if math.isnan(x) else (f"{x:.4f}" if x >= 1e-4 else f"{x:.1e}")


def verdict_text(r: Confirmatory, diverged: dict | None) -> str:
  """``r``'s verdict, or "not computable" where a diverged run broke a pre-registered pair."""
  lost = {
    m: sorted(s for s in (diverged or {}).get(m, {}) if s in r.seeds) for m in (r.better, r.worse)
  }
  lost = {m: s for m, s in lost.items() if s}
  if lost and r.paired.n < r.declared:  # the pre-registered test cannot be computed
    return "not computable: " + "; ".join(
      f"{m} diverged on {_seed_ranges(s)}" for m, s in lost.items()
    )
  return r.verdict


def _number(x: float) -> float | None:
  return None if x is None or math.isnan(x) else float(x)


def verdict_records(
  claim: Claim, found: dict, budget: str, equivalent=(), diverged: dict | None = None
) -> list[dict]:
  """The verdict table's rows as plain values (``verdicts.json``; NaN as None), with the paper's
  gap for each ordering (None where the paper gives no number)."""
  records = []
  for r in confirmatory_rows(claim, found, budget, equivalent):
    gap = protocol.paper_effect(claim, r.better, r.worse, r.metric, r.metric in LOWER_IS_BETTER)
    records.append(
      {
        "better": r.better,
        "worse": r.worse,
        "metric": r.metric,
        "paper_gap": gap,
        "seeds": r.paired.n,
        "declared": r.declared,
        "mean": _number(r.paired.mean),
        "low": _number(r.paired.low),
        "high": _number(r.paired.high),
        "wins": r.paired.wins,
        "p": _number(r.p),
        "p_holm": _number(r.p_holm),
        "verdict": verdict_text(r, diverged),
      }
    )
  return records


def verdict_table(
  claim: Claim, found: dict, budget: str, equivalent=(), diverged: dict | None = None
) -> list[str]:
  rows = confirmatory_rows(claim, found, budget, equivalent)
  seeds = declared_seeds(claim, budget)
  declared = len(seeds)
  lines = [
    f"Verdicts on the pre-registered seeds {seeds[0]}..{seeds[-1]} ({declared} seeds, declared "
    "before running by the power calculation of fedjax_proj/reproduce/protocol.py): paired "
    "per-seed difference, > 0 favours the claimed winner; two-sided paired t-test, p "
    f"Holm-adjusted across the claim's {len(rows)} orderings; reproduced / not reproduced at "
    f"adjusted p < {protocol.ALPHA}; incomplete while fewer than {declared} seeds have run.",
    "",
    "| claim | metric | seeds | mean diff | std | seeds favouring | 95% interval | p | p (Holm) "
    "| verdict |",
    "|---|---|---|---|---|---|---|---|---|---|",
  ]
  for r in rows:
    lines.append(
      f"| {r.better} > {r.worse} | {r.metric} | {_paired_cells(r.paired)} | {_p(r.p)} | "
      f"{_p(r.p_holm)} | {verdict_text(r, diverged)} |"
    )
  refused = [f"{r.better} > {r.worse} seeds {list(r.refused)}" for r in rows if r.refused]
  if refused:
    lines += ["", "Pairs refused (the two runs recorded different code): " + "; ".join(refused)]
  unknown = sum(r.unknown for r in rows)
  if unknown:
    lines += [
      "",
      f"Code unknown: {unknown} of the pairs above include a result recorded before results "
      "kept their code fingerprint, so whether both runs computed with the same code cannot be "
      "checked (their commits are listed below).",
    ]
  mismatched = [f"{r.better} > {r.worse} seeds {list(r.mismatched)}" for r in rows if r.mismatched]
  if mismatched:
    lines += [
      "",
      "Pairs refused (the two runs computed on different kinds of machine, at different matmul "
      "precisions or with different deviations of data; the machines are listed below): "
      + "; ".join(mismatched)
      + ". Run all of a seed's methods on one machine kind, with "
      "JAX_DEFAULT_MATMUL_PRECISION=float32 on an accelerator.",
    ]
  return lines + [""]
