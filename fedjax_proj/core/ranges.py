"""Numeric ranges of settings, declared once and checked before any data is loaded.

Every numeric setting (a config field or a method hyperparameter) must be a finite number; where a
range is declared (a config field's ``Field`` in training/fields.py, the registry's
``HPARAM_RANGES`` and a method spec's ``ranges``) it must also lie in it. :func:`check_number`
raises the one error text both use.
"""

from __future__ import annotations

import math
from typing import NamedTuple


class Interval(NamedTuple):
  """The numbers from ``low`` to ``high``, each end open or closed; ``integer`` also needs ints."""

  low: float = -math.inf
  high: float = math.inf
  low_open: bool = False
  high_open: bool = False
  integer: bool = False

  def __contains__(self, value) -> bool:
    if not is_number(value) or not math.isfinite(value):
      return False
    if self.integer and not float(value).is_integer():
      return False
    above = value > self.low if self.low_open else value >= self.low
    below = value < self.high if self.high_open else value <= self.high
    return above and below

  def __str__(self) -> str:
    whole = " (a whole number)" if self.integer else ""
    if self.high == math.inf:
      return f"{'>' if self.low_open else '>='} {_num(self.low)}{whole}"
    if self.low == -math.inf:
      return f"{'<' if self.high_open else '<='} {_num(self.high)}{whole}"
    left, right = "(" if self.low_open else "[", ")" if self.high_open else "]"
    return f"in {left}{_num(self.low)}, {_num(self.high)}{right}{whole}"


def _num(x: float) -> str:
  return str(int(x)) if float(x).is_integer() and abs(x) < 1e16 else repr(x)


def is_number(value) -> bool:
  """An int or float (not a bool, which is an int in Python)."""
  return isinstance(value, int | float) and not isinstance(value, bool)


ANY = Interval()
NON_NEGATIVE = Interval(0.0)
POSITIVE = Interval(0.0, low_open=True)
AT_LEAST_ONE = Interval(1, integer=True)
COUNT = Interval(0, integer=True)  # 0 allowed (often "all" or "none")
FRACTION = Interval(0.0, 1.0)  # probabilities, thresholds
RATE = Interval(0.0, 1.0, high_open=True)  # dropout, momentum: 1 would stop learning
SEED = Interval(0, 2**32 - 1, high_open=True, integer=True)
# A run's rounds: round r's key is fold_in(seed key, r) with r a uint32 (core/random.py), so the
# indices 0..rounds-1 fit below 2**32; a longer run would fail with an OverflowError mid-run.
ROUNDS = Interval(1, 2**32, integer=True)
# The fix named next to a round count's range error.
ROUNDS_FIX = (
  "A round's index enters its random key as a 32-bit integer (core/random.py), so a run has at "
  "most 2**32 rounds; the header estimates a run's time before round 1."
)


def check_number(name: str, value, interval: Interval = ANY, fix: str = "") -> None:
  """Raises a ValueError unless ``value`` is a finite number in ``interval``.

  Args:
    name: how the setting is named to the user (``--lr``, ``--method_kwargs mu``).
    value: the value given.
    interval: its declared range.
    fix: appended to the message (e.g. a typical value).
  """
  if value in interval:
    return
  if not is_number(value):
    problem = f" (a {type(value).__name__}, not a number)"
  elif not math.isfinite(value):
    problem = " (not a finite number)"
  else:
    problem = ""
  raise ValueError(
    f"{name} must be {interval}, got {value!r}{problem}." + (f" {fix}" if fix else "")
  )
