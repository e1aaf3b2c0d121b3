"""Paired per-seed statistics and the verdict rule of the reproduce report.

Two methods run with the same seed share the data partition, client sampling and initial model,
so the per-seed difference d_s = better_s - worse_s removes the seed's own luck (the "paired"
comparison). For a claimed ordering "A beats B" on a metric (signs flipped for lower-is-better
metrics, so a positive difference always favours A):

* fewer than :data:`MIN_SEEDS` paired seeds: ``too few seeds``;
* otherwise the two-sided 95% Student-t interval of the mean difference,
  mean(d) ± t_{0.975, n-1} · sd(d) / sqrt(n) (sd with n - 1 degrees of freedom):
  entirely above 0: ``reproduced``; entirely below 0: ``not reproduced``; containing 0 (the
  differences straddle 0 beyond what n seeds can resolve): ``inconclusive``.

docs/reproduction.md ("Results") states the same rule.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import NamedTuple

from scipy import stats as sps

MIN_SEEDS = 3
REPRODUCED = "reproduced"
NOT_REPRODUCED = "not reproduced"
INCONCLUSIVE = "inconclusive"
TOO_FEW = "too few seeds"


class Paired(NamedTuple):
  """Summary of the paired differences d_s (positive favours the claimed winner).

  Attributes:
    n: number of seeds both methods ran.
    mean: mean of d.
    std: sample standard deviation of d (n - 1 dof; 0 for one seed).
    wins: seeds with d > 0.
    low: lower end of the 95% t-interval of the mean (nan below 2 seeds).
    high: upper end.
  """

  n: int
  mean: float
  std: float
  wins: int
  low: float
  high: float


def mean_std(values: Sequence[float]) -> tuple[float, float]:
  """Mean and sample standard deviation (n - 1 dof; 0 for a single value)."""
  n = len(values)
  if n == 0:
    return math.nan, math.nan
  mean = sum(values) / n
  if n == 1:
    return mean, 0.0
  return mean, math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))


def paired(diffs: Sequence[float], confidence: float = 0.95) -> Paired:
  """Paired statistics of the per-seed differences ``diffs``."""
  n = len(diffs)
  mean, std = mean_std(diffs)
  wins = sum(1 for d in diffs if d > 0)
  if n < 2:
    return Paired(n, mean, std, wins, math.nan, math.nan)
  half = sps.t.ppf(0.5 + confidence / 2, n - 1) * std / math.sqrt(n)
  return Paired(n, mean, std, wins, mean - half, mean + half)


def verdict(p: Paired) -> str:
  """The verdict on a claimed ordering from its paired statistics (module docstring)."""
  if p.n < MIN_SEEDS:
    return TOO_FEW
  if p.low > 0:
    return REPRODUCED
  if p.high < 0:
    return NOT_REPRODUCED
  return INCONCLUSIVE


def differences(
  better: dict[int, float], worse: dict[int, float], lower_is_better: bool = False
) -> list[float]:
  """Per-seed differences over the seeds both methods ran, signed to favour ``better``."""
  sign = -1.0 if lower_is_better else 1.0
  return [sign * (better[s] - worse[s]) for s in sorted(set(better) & set(worse))]
