"""The pre-registered protocol: seed counts from a power calculation, Holm-corrected verdicts.

Before a claim × budget runs, its seed count n is declared in claims/ (``Budget.seeds``) from
:func:`plan`: for every claimed ordering with a paper effect δ (the paper's difference between the
two methods, signed to favour the claimed winner) and a paired sd σ measured at the budget
(``Budget.power_sd``, per metric), the smallest n >= :data:`MIN_SEEDS` at which a two-sided paired
t-test at level α/m (m orderings in the claim: the strictest step of Holm's procedure) has power
>= :data:`POWER`; n is the largest of these, capped at :data:`MAX_SEEDS` (an ordering that needs
more is reported as underpowered, with its power at n). The verdict uses exactly seeds 0..n-1
(:func:`confirmatory`); other seeds are exploratory and never change it.

Verdicts within a claim carry Holm's correction: the raw two-sided paired t-test p-values of the
m orderings, sorted, p_(i) multiplied by (m - i + 1), made monotone and capped at 1. An ordering
is ``reproduced`` when its adjusted p < α and the mean difference favours the claimed winner,
``not reproduced`` when adjusted p < α against it, else ``inconclusive``; with fewer than n
pre-registered seeds it is ``incomplete``. docs/reproduction.md ("Results") states the same.

Protocol v2 (docs/reproduction.md, "Protocol v2") is a confirmatory replication, declared before
any of its runs: the same budgets and orderings, scored on one metric that does not swing with the
last evaluation (:data:`V2_METRIC`, the mean test accuracy over the last :data:`LATE_EVALS`
evaluations), on seeds no run had used (from :data:`V2_FIRST_SEED` on), counted by this module's
power calculation on v1's paired spread under that metric, capped at :data:`V2_MAX_SEEDS`. The
v1 verdicts stay as they are; seeds from :data:`V2_FIRST_SEED` on never enter them.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import NamedTuple

from scipy import stats as sps

ALPHA = 0.05
POWER = 0.80
MIN_SEEDS = 3
MAX_SEEDS = 10
INCOMPLETE = "incomplete"
# Protocol v2. The metric: the mean of the last LATE_EVALS evaluated test accuracies (%). k = 3 was
# chosen from the v1 curves (docs/reproduction.md, "Protocol v2"): at the drift budget the last
# three evaluations (rounds 6, 8, 10) are those after the global model enters the forgetting regime
# (above ~35% from round 5, benchmarks/pilots/drift_pilot.py), and over the five v1 claim x budgets
# it lowers the largest paired sd of k = 1 (the final evaluation) by 25-83%.
V2_METRIC = "late_test_accuracy"
LATE_EVALS = 3
# Seeds 0-9 (every v1 result) and 100 (the drift pilot) have been run; v2 seeds start here.
V2_FIRST_SEED = 1000
# A drift claim of 20 seeds is 60 runs, about 6 minutes on one H200 (docs/reproduction.md,
# "Running claims on a GPU"): the most one device call holds beside its start-up.
V2_MAX_SEEDS = 20


def power(n: int, effect: float, sd: float, alpha: float) -> float:
  """Power of the two-sided paired t-test with n pairs at level ``alpha`` for a true mean
  difference ``effect`` with paired sd ``sd`` (noncentral t)."""
  if n < 2:
    return 0.0
  if sd <= 0:
    return 1.0
  df = n - 1
  nc = effect / sd * math.sqrt(n)
  crit = sps.t.ppf(1 - alpha / 2, df)
  value = float(sps.nct.sf(crit, df, nc) + sps.nct.cdf(-crit, df, nc))
  if math.isnan(value):  # scipy's noncentral t fails far in the tail: all mass beyond crit
    return 1.0 if abs(nc) > crit else 0.0
  return value


def required_seeds(
  effect: float, sd: float, alpha: float, max_seeds: int = MAX_SEEDS
) -> int | None:
  """The smallest n in [MIN_SEEDS, max_seeds] with power >= POWER, or None."""
  for n in range(MIN_SEEDS, max_seeds + 1):
    if power(n, effect, sd, alpha) >= POWER:
      return n
  return None


class PlanRow(NamedTuple):
  """One ordering's power calculation (``effect`` None: the paper gives no number for it)."""

  better: str
  worse: str
  metric: str
  effect: float | None
  sd: float | None
  alpha: float
  needed: int | None
  power_at_declared: float | None


def paper_effect(claim, better: str, worse: str, metric: str, lower_is_better: bool):
  a = claim.paper.get(better, {}).get(metric)
  b = claim.paper.get(worse, {}).get(metric)
  if a is None or b is None:
    return None
  return (b - a) if lower_is_better else (a - b)


def max_seeds(budget) -> int:
  """The seed cap of the protocol a :class:`~fedjax_proj.reproduce.claims.Budget` belongs to."""
  return V2_MAX_SEEDS if budget.first_seed >= V2_FIRST_SEED else MAX_SEEDS


def v2_view(claim, budget: str):
  """The claim as protocol v2 tests ``budget``: its methods and config, every ordering of
  ``claim.at(budget)`` once, on :data:`V2_METRIC`, with the replication's seeds (from
  :data:`V2_FIRST_SEED`), sd and cap; the paper's gaps come from its ``effect_metric``.

  Raises:
    ValueError: the budget declares no replication (``Budget.v2`` is None).
  """
  from fedjax_proj.reproduce.claims.common import Ordering

  b = claim.budgets[budget]
  if b.v2 is None:
    raise ValueError(f"claim {claim.name} budget {budget} declares no protocol v2 replication")
  at, r = claim.at(budget), b.v2
  if not MIN_SEEDS <= r.seeds <= V2_MAX_SEEDS:
    raise ValueError(
      f"claim {claim.name} budget {budget} declares a replication of {r.seeds} seeds; declare "
      f"{MIN_SEEDS}..{V2_MAX_SEEDS}, the count `--protocol=v2 --power` recommends"
    )
  metrics = v2_metrics(r)
  sd = dict(r.power_sd) if isinstance(r.power_sd, Mapping) else dict.fromkeys(metrics, r.power_sd)
  view = b._replace(
    seeds=r.seeds, first_seed=V2_FIRST_SEED, power_sd=sd, power_source=r.power_source, v2=None
  )
  if r.metrics is not None:  # the claim's own orderings on its own metrics (a continual claim)
    return at._replace(
      metrics=metrics,
      orderings=tuple(o for o in at.orderings if o.metric in metrics),
      paper={m: {k: v[k] for k in metrics if k in v} for m, v in at.paper.items()},
      budgets={**claim.budgets, budget: view},
    )
  pairs = dict.fromkeys((o.better, o.worse) for o in at.orderings)
  return at._replace(
    metrics=(V2_METRIC,),
    orderings=tuple(Ordering(a, w, V2_METRIC) for a, w in pairs),
    paper={m: {V2_METRIC: v[r.effect_metric]} for m, v in at.paper.items() if r.effect_metric in v},
    budgets={**claim.budgets, budget: view},
  )


def v2_metrics(replication) -> tuple[str, ...]:
  """The metrics a :class:`~fedjax_proj.reproduce.claims.Replication` scores."""
  return tuple(replication.metrics) if replication.metrics is not None else (V2_METRIC,)


def late_mean(curve: Sequence[dict], key: str = "test_accuracy", k: int = LATE_EVALS) -> float:
  """:data:`V2_METRIC`: the mean of the last ``k`` evaluated ``key`` values of a result's curve,
  in percent (the curve holds fractions). Raises ``KeyError`` when fewer than ``k`` were
  evaluated, so a run too short for the metric is never scored on fewer points."""
  values = [c[key] for c in curve if key in c]
  if len(values) < k:
    raise KeyError(f"{V2_METRIC} needs {k} evaluations of {key}; the curve has {len(values)}")
  return 100 * sum(values[-k:]) / k


def plan(claim, budget: str, sd: dict[str, float] | None = None) -> list[PlanRow]:
  """The power calculation of every ordering of ``claim`` at ``budget``; ``sd`` (metric -> paired
  sd) defaults to the budget's pre-registered ``power_sd``."""
  from fedjax_proj.reproduce.claims.common import LOWER_IS_BETTER

  b = claim.budgets[budget]
  cap = max_seeds(b)
  claim = claim.at(budget)
  sd = b.power_sd if sd is None else sd
  m = len(claim.orderings)
  alpha = ALPHA / m
  rows = []
  for o in claim.orderings:
    effect = paper_effect(claim, o.better, o.worse, o.metric, o.metric in LOWER_IS_BETTER)
    s = (sd or {}).get(o.metric)
    usable = effect is not None and effect > 0 and s is not None
    needed = required_seeds(effect, s, alpha, cap) if usable else None
    at = power(b.seeds, effect, s, alpha) if usable else None
    rows.append(PlanRow(o.better, o.worse, o.metric, effect, s, alpha, needed, at))
  return rows


def recommended_seeds(rows: Sequence[PlanRow], cap: int = MAX_SEEDS) -> int:
  """The seed count the plan asks for: the largest ``needed`` (``cap`` where one needs more
  than ``cap``), at least MIN_SEEDS; MIN_SEEDS where no ordering has an effect and an sd."""
  usable = [r for r in rows if r.effect is not None and r.effect > 0 and r.sd is not None]
  if not usable:
    return MIN_SEEDS
  return max(cap if r.needed is None else r.needed for r in usable)


def _sd_line(b) -> str:
  """Which paired sd the plan used and where it was measured, or that none was (a budget whose
  ``power_sd`` is None: its seed count is the minimum)."""
  if not b.power_sd:
    return (
      f"Paired sd: none measured for this budget yet, so the plan recommends the minimum, "
      f"{MIN_SEEDS} seeds; once their results exist, --power also prints the sd they measure."
    )
  sds = ", ".join(f"{metric} {sd:.2f}" for metric, sd in b.power_sd.items())
  return f"Paired sd used (pre-registered): {sds} (measured on {b.power_source})."


def render_plan(claim, budget: str, measured: dict[str, float] | None = None) -> str:
  """The printed power calculation (``--power``) with the declared seed count."""
  b = claim.budgets[budget]
  rows = plan(claim, budget)
  cap = max_seeds(b)
  first, last = b.first_seed, b.first_seed + b.seeds - 1
  lines = [
    f"Power calculation, {claim.name} budget {budget}: two-sided paired t-test at "
    f"alpha {ALPHA}/{len(rows)} (Holm's strictest step), target power {POWER:.0%}, "
    f"{MIN_SEEDS}..{cap} seeds.",
    _sd_line(b),
  ]
  if measured:
    sds = ", ".join(f"{metric} {sd:.2f}" for metric, sd in measured.items())
    lines.append(f"Paired sd measured now from the result files (max per metric): {sds}.")
  lines += [
    "",
    "| ordering | metric | paper effect | sd | seeds needed | power at declared n |",
    "|---|---|---|---|---|---|",
  ]
  for r in rows:
    eff = "n/a" if r.effect is None else f"{r.effect:+.2f}"
    sd = "n/a" if r.sd is None else f"{r.sd:.2f}"
    needed = (
      f">{cap} (underpowered)"
      if r.needed is None and r.power_at_declared is not None
      else ("n/a" if r.needed is None else str(r.needed))
    )
    pw = "n/a" if r.power_at_declared is None else f"{r.power_at_declared:.2f}"
    lines.append(f"| {r.better} > {r.worse} | {r.metric} | {eff} | {sd} | {needed} | {pw} |")
  lines += [
    "",
    f"Recommended: {recommended_seeds(rows, cap)} seeds; declared (claims.py): {b.seeds} "
    f"(seeds {first}..{last} decide the verdict; others are exploratory).",
  ]
  return "\n".join(lines)


def confirmatory(per_seed: dict[int, float], seeds: range) -> dict[int, float]:
  """The pre-registered ``seeds`` of ``per_seed`` (v1: 0..n-1; v2: its declared range)."""
  return {s: v for s, v in per_seed.items() if s in seeds}


def paired_p(diffs: Sequence[float]) -> float:
  """Two-sided p of the paired t-test of mean(diffs) = 0 (nan below 2 seeds; 0 sd: 0 or 1)."""
  n = len(diffs)
  if n < 2:
    return math.nan
  mean = sum(diffs) / n
  sd = math.sqrt(sum((d - mean) ** 2 for d in diffs) / (n - 1))
  if sd == 0:
    return 0.0 if mean != 0 else 1.0
  t = mean / (sd / math.sqrt(n))
  return float(2 * sps.t.sf(abs(t), n - 1))


def holm(pvalues: Sequence[float]) -> list[float]:
  """Holm-adjusted p-values over all m = len(pvalues) orderings, the pre-registered family (an
  ordering not tested yet, nan, counts in m as if its p were 1 and stays nan)."""
  idx = [i for i, p in enumerate(pvalues) if not math.isnan(p)]
  m = len(pvalues)
  order = sorted(idx, key=lambda i: pvalues[i])
  out = [math.nan] * len(pvalues)
  running = 0.0
  for rank, i in enumerate(order):
    running = max(running, min(1.0, (m - rank) * pvalues[i]))
    out[i] = running
  return out


def verdict(mean: float, adjusted: float, n: int, declared: int) -> str:
  """The confirmatory verdict of one ordering (module docstring)."""
  from fedjax_proj.reproduce import stats

  if n < declared:
    return INCOMPLETE
  if math.isnan(adjusted) or adjusted >= ALPHA:
    return stats.INCONCLUSIVE
  return stats.REPRODUCED if mean > 0 else stats.NOT_REPRODUCED
