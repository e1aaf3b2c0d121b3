"""The checks every benchmark script makes before it computes or imports anything heavy.

A benchmark's flags and its optional imports (torch) are checked first, each refusal one line and
exit 2 through the script's own parser (``ap.error``), as benchmarks/parity/common.py's
``rows_main`` does: a bad flag never ends in a traceback from deep inside a run, nor after minutes
of timing (docs/design.md, "Input rules"). This module imports nothing beyond the standard
library, so a script that must set XLA's flags before JAX loads (benchmarks/perf/cpu_step.py) can
call it first.
"""

from __future__ import annotations

import argparse
import importlib
import os


def names(ap: argparse.ArgumentParser, flag: str, text: str, valid=None) -> list[str]:
  """The comma-separated names of ``flag``: at least one, each once, each in ``valid`` (if given).

  A name listed twice would be timed or compared twice and an empty list would run nothing, both
  without a word; either is the parser's error, naming the flag, the value and the choices.
  """
  items = [t.strip() for t in text.split(",") if t.strip()]
  choices = f"; choose from {', '.join(valid)}" if valid is not None else ""
  if not items:
    ap.error(f"{flag}={text} lists nothing; list one or more, comma-separated{choices}")
  if valid is not None and (unknown := [t for t in dict.fromkeys(items) if t not in valid]):
    ap.error(f"{flag}={text}: unknown {', '.join(unknown)}{choices}")
  if twice := [t for t in dict.fromkeys(items) if items.count(t) > 1]:
    ap.error(f"{flag}={text} lists {', '.join(twice)} more than once; list each once")
  return items


def seeds(ap: argparse.ArgumentParser, flag: str, text: str) -> list[int]:
  """The comma-separated seeds of ``flag``: non-negative integers, at least one, each once."""
  items = names(ap, flag, text)
  if not all(t.isdigit() for t in items):
    ap.error(f"{flag} must be comma-separated non-negative integers, e.g. 0,1,2; got {text}")
  return [int(t) for t in items]


def sizes(ap: argparse.ArgumentParser, flag: str, text: str) -> tuple[int, ...]:
  """The comma-separated layer sizes of ``flag``: integers >= 1 (repeats allowed: 400,400,400)."""
  items = [t.strip() for t in text.split(",")]
  if not all(t.isdigit() and int(t) >= 1 for t in items):
    ap.error(f"{flag} must be comma-separated sizes >= 1, e.g. 400,400,400; got {text}")
  return tuple(int(t) for t in items)


def at_least(ap: argparse.ArgumentParser, args: argparse.Namespace, low: int, *flags: str) -> None:
  """Each integer flag of ``flags`` is at least ``low`` (0 timings or rounds would divide by 0)."""
  for flag in flags:
    value = getattr(args, flag)
    if value < low:
      ap.error(f"--{flag} must be >= {low}, got {value}")


def usable_cpu(ap: argparse.ArgumentParser, cpu: int | None) -> None:
  """``--cpu`` names a core this process may run on (``os.sched_setaffinity`` would raise)."""
  if cpu is None:
    return
  usable = sorted(os.sched_getaffinity(0))
  if cpu not in usable:
    ap.error(f"--cpu={cpu} is not a core this process may run on; choose from {usable}")


def require_torch(ap: argparse.ArgumentParser, extra: str):
  """torch, imported; missing, the parser's error naming the package extra that installs it."""
  try:
    torch = importlib.import_module("torch")
    importlib.import_module("torch.nn")  # a half-installed torch imports as an empty namespace
  except ImportError:
    ap.error(
      f'torch is not installed: pip install -e ".[{extra}]" in a checkout (CPU build suffices)'
    )
  return torch
