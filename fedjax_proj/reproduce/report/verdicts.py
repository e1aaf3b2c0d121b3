"""The pre-registered verdicts (fedjax_proj/reproduce/protocol.py): each claimed ordering paired
per seed on the declared seeds, Holm-adjusted, as a table and as ``verdicts.json`` records, each
with its magnitude beside the paper's (:func:`magnitude`); and the exploratory paired rows and the
paired sd the power calculation reads."""

from __future__ import annotations

import math
from typing import NamedTuple

from fedjax_proj.reproduce import protocol, stats
from fedjax_proj.reproduce.claims.common import LOWER_IS_BETTER, Claim
from fedjax_proj.reproduce.report.results import (
  computation,
  format_value,
  per_seed,
  same_code,
  seed_ranges,
)


def paired_rows(claim: Claim, found: dict) -> list[tuple]:
  """(better, worse, metric, Paired, verdict) for every claimed ordering over every seed both
  ran, by the interval rule of stats.py: the exploratory view (and the pilot sweep's)."""
  rows = []
  for o in claim.orderings:
    diffs = stats.differences(
      per_seed(found, o.better, o.metric),
      per_seed(found, o.worse, o.metric),
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
        diffs = stats.differences(per_seed(found, a, metric), per_seed(found, b, metric))
        if len(diffs) >= stats.MIN_SEEDS:
          out[metric] = round(max(out.get(metric, 0.0), stats.mean_std(diffs)[1]), 2)
  return out


# A paper gap smaller than this (points) prints as 0.00 at the papers' two decimals: a tie in the
# paper, against which no ratio means anything (docs/reproduction.md, "Results", the protocol's
# magnitude rule).
ZERO_GAP = 0.005


class Magnitude(NamedTuple):
  """How our mean paired difference compares in size with the paper's gap.

  ``inside``: the paper's gap lies in our 95% interval (None: no paper gap or no interval);
  ``ratio``: our mean / the paper's gap (None: no paper gap, no mean, or a paper gap within
  :data:`ZERO_GAP` of 0). Both signed as the verdict is, > 0 favouring the claimed winner, so a
  ratio < 0 means our difference and the paper's point opposite ways.
  """

  inside: bool | None
  ratio: float | None


def magnitude(
  paper_gap: float | None, mean: float | None, low: float | None, high: float | None
) -> Magnitude:
  """The verdict's direction says whether the ordering holds; this says whether its size does:
  a "reproduced" ordering at 5x the paper's gap (or a fifth of it) reproduces the direction, not
  the number. NaN and None alike mean "not computed"."""
  if not _known(paper_gap):
    return Magnitude(None, None)
  # Plain bool and float: the interval's ends may be numpy scalars, and verdicts.json holds these.
  inside = bool(low <= paper_gap <= high) if _known(low) and _known(high) else None
  ratio = float(mean / paper_gap) if _known(mean) and abs(paper_gap) >= ZERO_GAP else None
  return Magnitude(inside, ratio)


def _known(x: float | None) -> bool:
  return x is not None and not math.isnan(x)


def magnitude_cells(m: Magnitude, paper_gap: float | None, mean: float | None) -> str:
  """The two table cells of :func:`magnitude`: "yes"/"no" and the ratio, with a word where the
  ratio is not a plain multiple (opposite signs, a paper tie); "—" where nothing is computed."""
  inside = "—" if m.inside is None else ("yes" if m.inside else "no")
  if m.ratio is not None:
    ratio = f"{m.ratio:.2f}" + (" (opposite sign)" if m.ratio < 0 else "")
  elif _known(paper_gap) and _known(mean):
    ratio = "n/a (paper gap 0)"  # known both, yet no ratio: the paper's gap is ~0
  else:
    ratio = "—"
  return f"{inside} | {ratio}"


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
    a = protocol.confirmatory(per_seed(found, o.better, o.metric), seeds)
    b = protocol.confirmatory(per_seed(found, o.worse, o.metric), seeds)
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


def paired_cells(p: stats.Paired) -> str:
  """The shared cells of a paired row: seeds, mean, std, seeds favouring, 95% interval."""
  interval = f"[{format_value(p.low)}, {format_value(p.high)}]"
  return f"{p.n} | {format_value(p.mean)} | {format_value(p.std)} | {p.wins}/{p.n} | {interval}"


def format_p(x: float) -> str:
  return "—" if math.isnan(x) else (f"{x:.4f}" if x >= 1e-4 else f"{x:.1e}")


def _gap(x: float | None) -> str:
  return "—" if x is None else f"{x:+.2f}"


def verdict_text(r: Confirmatory, diverged: dict | None) -> str:
  """``r``'s verdict, or "not computable" where a diverged run broke a pre-registered pair."""
  lost = {
    m: sorted(s for s in (diverged or {}).get(m, {}) if s in r.seeds) for m in (r.better, r.worse)
  }
  lost = {m: s for m, s in lost.items() if s}
  if lost and r.paired.n < r.declared:  # the pre-registered test cannot be computed
    return "not computable: " + "; ".join(
      f"{m} diverged on {seed_ranges(s)}" for m, s in lost.items()
    )
  return r.verdict


def _number(x: float) -> float | None:
  return None if x is None or math.isnan(x) else float(x)


def verdict_records(
  claim: Claim, found: dict, budget: str, equivalent=(), diverged: dict | None = None
) -> list[dict]:
  """The verdict table's rows as plain values (``verdicts.json``; NaN as None), with the paper's
  gap for each ordering (None where the paper gives no number) and :func:`magnitude`'s two
  answers (``paper_gap_in_interval``, ``ratio_to_paper``)."""
  records = []
  for r in confirmatory_rows(claim, found, budget, equivalent):
    gap = protocol.paper_effect(claim, r.better, r.worse, r.metric, r.metric in LOWER_IS_BETTER)
    m = magnitude(gap, r.paired.mean, r.paired.low, r.paired.high)
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
        "paper_gap_in_interval": m.inside,
        "ratio_to_paper": m.ratio,
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
    f"adjusted p < {protocol.ALPHA}; incomplete while fewer than {declared} seeds have run. The "
    "verdict is the direction; the size beside the paper's: whether the paper's gap (signed the "
    "same way) lies in our 95% interval, and our mean difference over it (< 0: opposite sign).",
    "",
    "| claim | metric | seeds | mean diff | std | seeds favouring | 95% interval | paper gap "
    "| paper gap in interval | ours / paper | p | p (Holm) | verdict |",
    "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
  ]
  for r in rows:
    gap = protocol.paper_effect(claim, r.better, r.worse, r.metric, r.metric in LOWER_IS_BETTER)
    m = magnitude(gap, r.paired.mean, r.paired.low, r.paired.high)
    lines.append(
      f"| {r.better} > {r.worse} | {r.metric} | {paired_cells(r.paired)} | {_gap(gap)} | "
      f"{magnitude_cells(m, gap, r.paired.mean)} | {format_p(r.p)} | {format_p(r.p_holm)} | "
      f"{verdict_text(r, diverged)} |"
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
