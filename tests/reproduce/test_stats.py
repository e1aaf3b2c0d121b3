"""The reproduce report's paired statistics and verdict rule against hand computations."""

from __future__ import annotations

import math

import pytest

from fedjax_proj.reproduce import stats

# t_{0.975} quantiles from a printed table (2 and 3 degrees of freedom).
T975 = {2: 4.302653, 3: 3.182446}


def test_paired_matches_hand_computation():
  # d = [1, 2, 3]: mean 2, sample sd 1, half-width t_{.975,2} * 1 / sqrt(3).
  p = stats.paired([1.0, 2.0, 3.0])
  half = T975[2] / math.sqrt(3)
  assert (p.n, p.wins) == (3, 3)
  assert p.mean == pytest.approx(2.0)
  assert p.std == pytest.approx(1.0)
  assert p.low == pytest.approx(2.0 - half, abs=1e-5)
  assert p.high == pytest.approx(2.0 + half, abs=1e-5)


def test_differences_pair_common_seeds_and_flip_lower_is_better():
  better = {0: 80.0, 1: 82.0, 2: 81.0, 7: 99.0}
  worse = {0: 79.0, 1: 83.0, 2: 78.0}
  assert stats.differences(better, worse) == [1.0, -1.0, 3.0]
  # FGT: lower is better, so 2 (better) vs 5 (worse) favours `better` by +3.
  assert stats.differences({0: 2.0}, {0: 5.0}, lower_is_better=True) == [3.0]


def test_verdicts():
  # Mean 1.025, sd 0.171, 4 seeds: interval [0.75, 1.30] > 0.
  assert stats.verdict(stats.paired([1.0, 1.2, 0.8, 1.1])) == stats.REPRODUCED
  assert stats.verdict(stats.paired([-1.0, -1.2, -0.8])) == stats.NOT_REPRODUCED
  # All seeds favour the winner, yet the interval [-0.48, 4.48] straddles 0.
  assert stats.verdict(stats.paired([1.0, 2.0, 3.0])) == stats.INCONCLUSIVE
  assert stats.verdict(stats.paired([2.0, -1.0, 0.5])) == stats.INCONCLUSIVE
  assert stats.verdict(stats.paired([5.0, 6.0])) == stats.TOO_FEW
  assert stats.verdict(stats.paired([])) == stats.TOO_FEW
