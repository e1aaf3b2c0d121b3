"""How long runs take: the wall seconds a budget's results recorded, the queue's ETA, and the
report's line on what the verdicts still lack and its time."""

from __future__ import annotations

from pathlib import Path

from fedjax_proj.reproduce import protocol, records
from fedjax_proj.reproduce.claims.common import Claim, Replication
from fedjax_proj.reproduce.report.results import backend_of, seed_ranges
from fedjax_proj.reproduce.runners import STEP_TIMERS


def recorded_seconds(directory: Path, backend: str | None = None) -> dict[str, list[float]]:
  """{method: wall seconds of every valid result in ``directory``}, stale ones included (same
  budget, older config or code): what the runs of this budget took where they ran. With
  ``backend``, only results that ran on it (a GPU run's seconds say nothing of a CPU's)."""
  out: dict[str, list[float]] = {}
  for path in sorted(directory.glob("*-seed*.json")) if directory.is_dir() else ():
    result, _ = records.read_result(path)
    if result is not None and backend is not None and backend_of(result) != backend:
      continue
    if result is not None and isinstance(result.get("wall_seconds"), int | float):
      out.setdefault(result["method"], []).append(float(result["wall_seconds"]))
  return out


def _duration(seconds: float) -> str:
  if seconds < 90:
    return f"{seconds:.0f} s"
  return f"{seconds / 3600:.1f} h" if seconds >= 5400 else f"{seconds / 60:.0f} min"


def eta(
  methods: list[str],
  recorded: dict[str, list[float]],
  n_jobs: int = 1,
  first_seed: int = 0,
  timed: dict[str, float] | None = None,
  timeable: bool = True,
) -> str:
  """The time ``methods`` (one entry per queued run) take at the mean recorded time of each
  method, in one process and, with ``n_jobs`` > 1, spread over that many (assumed to share the
  runs evenly). A method never recorded uses ``timed`` (seconds a run, from one local step timed
  now: ``--no_run --time_step``) where it has it, said apart; others are named, not guessed, with
  the commands that time them (one seed's runs: ``first_seed``, the first queued; and, where the
  claim's kind has a step timer, ``timeable``, ``--no_run --time_step``)."""
  if not methods:
    return "nothing left"
  timed = timed or {}
  known = [m for m in methods if recorded.get(m)]
  stepped = [m for m in methods if not recorded.get(m) and m in timed]
  unknown = sorted({m for m in methods if not recorded.get(m) and m not in timed})
  total = sum(sum(recorded[m]) / len(recorded[m]) for m in known)
  parts = []
  if known:
    spread = f"about {_duration(total / n_jobs)} with {n_jobs} jobs, " if n_jobs > 1 else ""
    parts.append(
      f"{spread or 'about '}{_duration(total)} in one process for {len(known)} run(s) at this "
      "budget's recorded times"
    )
  if stepped:
    steps = sum(timed[m] for m in stepped)
    spread = f" (about {_duration(steps / n_jobs)} with {n_jobs} jobs)" if n_jobs > 1 else ""
    parts.append(
      f"about {_duration(steps)}{spread} of local steps for {len(stepped)} run(s) of "
      f"{', '.join(sorted(set(stepped)))} with no recorded time, from one step of each timed "
      "now (the server's work and compiling come on top)"
    )
  if unknown:
    # Timing a step loads the data and compiles each method's step (10-40 s for the first method
    # on a CPU, seconds for each further one), so only on request (--time_step).
    how = f"run one seed (--seeds={first_seed})"
    how += " or time one step of each (--no_run --time_step)" if timeable else ""
    parts.append(
      f"{len(methods) - len(known) - len(stepped)} run(s) of {', '.join(unknown)} with no "
      "recorded time" + ("" if known or stepped else f": no estimate; {how} to get one")
    )
  return "; ".join(parts)


def completion_lines(
  claim: Claim,
  found: dict,
  budget: str,
  diverged: dict | None = None,
  timing: dict | None = None,
  replication: Replication | None = None,
) -> list[str]:
  """What the verdicts still lack: the pre-registered (method, seed) runs without a current
  result (a diverged one is an outcome, not missing), and their time at the mean wall time this
  budget's CPU results recorded (or, where none ran on a CPU, its accelerator results, named):
  the results of ``timing`` where given (the report passes the budget's runs of both protocols),
  else of ``found``. A v2 ``replication`` declared for a device names its command there and is
  timed from that backend's runs only."""
  b = claim.budgets.get(budget)
  if b is None:
    return []
  done = {m: {**found.get(m, {}), **(diverged or {}).get(m, {})} for m in claim.at(budget).methods}
  missing = {m: [s for s in b.declared if s not in done[m]] for m in claim.at(budget).methods}
  missing = {m: s for m, s in missing.items() if s}
  if not missing:
    return []
  # The estimate is for a CPU machine where the budget has CPU results: a GPU run's seconds would
  # understate it many times. A budget that only ran on an accelerator (the gpu budget) is timed
  # from that backend's runs, and the line says so.
  timing = found if timing is None else timing
  backends = {backend_of(r) for rs in timing.values() for r in rs.values()}
  device = replication.device if replication is not None else None
  backend = device or ("cpu" if "cpu" in backends or not backends else sorted(backends)[0])
  recorded = {
    m: [
      float(r["wall_seconds"])
      for r in rs.values()
      if "wall_seconds" in r and backend_of(r) == backend
    ]
    for m, rs in timing.items()
  }
  queue = [m for m, seeds in missing.items() for _ in seeds]
  first = min(s for seeds in missing.values() for s in seeds)
  runs = "; ".join(f"{m} {seed_ranges(s)}" for m, s in missing.items())
  v2 = " --protocol=v2" if b.first_seed >= protocol.V2_FIRST_SEED else ""
  command = f"python -m fedjax_proj.reproduce {claim.name} --budget={budget}{v2}"
  if replication is not None:  # its command where it is declared to run, not on this machine
    command = replication.command(claim.name, budget)
  where = ""
  if device is not None:
    where = (
      f" on a {device}, where they are declared to run (its data and packages: "
      'docs/reproduction.md, "Running claims on a GPU")'
    )
  return [
    f"To complete the verdicts: {len(queue)} run(s) of the pre-registered seeds are missing "
    f"({runs}); `{command}` runs them{where}: "
    f"{eta(queue, recorded, first_seed=first, timeable=claim.kind in STEP_TIMERS)}"
    + ("" if backend == "cpu" or device else f", timed on {backend}")
    + ".",
    "",
  ]
