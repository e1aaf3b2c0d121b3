"""The report's results: loading a budget's result files (current, stale, corrupt), splitting
them by protocol (v1, v2) and into diverged and finished runs, the code equivalence that lets two
results pair, and what machine and arithmetic a result computed on (docs/reproduction.md,
"Results")."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import numpy as np

from fedjax_proj.reproduce import protocol, provenance, records, resolve, run

# Pairs of code fingerprints whose behaviour fingerprints were compared directly, under the results
# folder (docs/reproduction.md, "Results", its protocol): {"pairs": [{"fingerprints": [a, b],
# "evidence": [...]}], "refuted": [...]}. A pair counts as equivalent only when it is listed
# itself: equivalence is never inferred through a third fingerprint (a matches b and b matches c
# within what the fingerprint reaches says nothing of a against c), and a refuted pair (a direct
# comparison found a difference) never counts.
EQUIVALENCE_FILE = "code_equivalence.json"


# Each report's verdicts as plain values, beside its report.md (docs' "Verdicts at a glance").
VERDICTS_FILE = "verdicts.json"


# The per-round accuracy key of each kind of run.
CURVE_METRIC = {"image": "test_accuracy", "pilot": "global_accuracy", "continual": None}


def load_results(
  directory: Path, expected: dict[str, str] | None = None
) -> tuple[dict, list, list]:
  """Results in ``directory`` as {method: {seed: result}}, the stale files' names, and the corrupt
  files as ``name (why)``.

  ``expected`` maps a file stem (``<method>-seed<k>``) to its current fingerprint; a valid file
  whose config has another fingerprint is stale. A file that does not parse or lacks what a
  result holds (run.check_result) is corrupt, never stale.
  """
  found: dict[str, dict[int, dict]] = {}
  stale, corrupt = [], []
  for path in sorted(directory.glob("*-seed*.json")):
    result, problem = records.read_result(path)
    if result is None:
      corrupt.append(f"{path.name} ({problem})")
      continue
    if expected is not None and expected.get(path.stem) != resolve.fingerprint(result["config"]):
      stale.append(path.name)
      continue
    method, _, seed = path.stem.rpartition("-seed")
    found.setdefault(method, {})[int(seed)] = result
  return found, stale, corrupt


def metric_value(result: dict, metric: str) -> float:
  """A result's ``metric``; ``best_test_accuracy`` of a result that predates it is the best
  evaluated test accuracy of its curve (%); protocol v2's metric comes from the curve too."""
  if metric in result["metrics"]:
    return result["metrics"][metric]
  if metric == protocol.V2_METRIC:
    return protocol.late_mean(result["curve"])
  if metric == "best_test_accuracy":
    values = [c["test_accuracy"] for c in result["curve"] if "test_accuracy" in c]
    if values:
      return 100 * max(values)
  raise KeyError(metric)


def equivalent_pairs(data: dict) -> list[set[str]]:
  """The fingerprint pairs an EQUIVALENCE_FILE's content records as equivalent: each one compared
  directly, none refuted.

  Raises:
    ValueError: the file holds the earlier ``groups``, chains merged transitively, which no
      longer count (``tools/code_equivalence.py --convert`` keeps their direct pairs).
  """
  if "groups" in data:
    raise ValueError(
      f"{EQUIVALENCE_FILE} holds 'groups' (equivalence chained through other commits), which no "
      "longer count; convert it to the directly compared pairs with "
      "`python -m tools.code_equivalence --convert`"
    )
  refuted = {frozenset(r["fingerprints"]) for r in data.get("refuted", [])}
  pairs = [frozenset(p["fingerprints"]) for p in data.get("pairs", [])]
  return [set(p) for p in pairs if len(p) == 2 and p not in refuted]


def load_equivalence(results_root: Path | None) -> list[set[str]]:
  path = (results_root or run.DEFAULT_RESULTS) / EQUIVALENCE_FILE
  if not path.is_file():
    return []
  return equivalent_pairs(json.loads(path.read_text()))


def code_of(result: dict) -> str | None:
  """The code fingerprint a result recorded, or None (recorded before results kept it)."""
  return (result.get("code") or {}).get("fingerprint")


def same_code(a: dict, b: dict, equivalent: list[set[str]]) -> bool | None:
  """True/False whether two results ran the same code (equal fingerprints, or a pair of
  ``equivalent``: equivalent_pairs); None when either is code unknown."""
  ca, cb = code_of(a), code_of(b)
  if ca is None or cb is None:
    return None
  return ca == cb or {ca, cb} in equivalent  # a pair compared directly, never a chain


def format_value(x: float, digits: int = 2) -> str:
  return "—" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{digits}f}"


def split_diverged(found: dict) -> tuple[dict, dict]:
  """(the results with metrics, the diverged ones), each {method: {seed: result}}."""
  ok: dict[str, dict[int, dict]] = {}
  diverged: dict[str, dict[int, dict]] = {}
  for m, rs in found.items():
    for seed, r in rs.items():
      (diverged if r.get("diverged") else ok).setdefault(m, {})[seed] = r
  return ok, diverged


# The sentence a stopped run's error ends with (training/session.last_good). A claim run records
# its divergence as a result and then clears its work folder, checkpoints included, so in a
# report the sentence would point at a folder that no longer exists, on whatever machine ran it.
_KEPT_CHECKPOINT = re.compile(r" ?The last good checkpoint \(round \d+\) is kept in \S+\.")


def diverged_lines(diverged: dict) -> list[str]:
  """The diverged runs, as outcomes: which, after which round, and why (the error, less where the
  run kept its checkpoint: claim runs clear it once the outcome is recorded)."""
  if not diverged:
    return []
  parts = []
  for m, rs in sorted(diverged.items()):
    rounds = ", ".join(f"{rs[s]['diverged']['last_finite_round']}" for s in sorted(rs))
    parts.append(f"{m} {seed_ranges(sorted(rs))} (last finite round: {rounds})")
  first = next(iter(next(iter(diverged.values())).values()))["diverged"]["error"]
  first = _KEPT_CHECKPOINT.sub("", first)
  return [
    "Diverged (a non-finite loss or parameters stopped the run; recorded as the config's "
    "outcome, not rerun, and left out of every statistic): " + "; ".join(parts) + ". First "
    f"error: {first}",
    "",
  ]


def per_seed(found: dict, method: str, metric: str) -> dict[int, float]:
  out = {}
  for s, r in found.get(method, {}).items():
    if r.get("diverged"):  # no metrics; its partial curve is not a final accuracy
      continue
    try:
      out[s] = metric_value(r, metric)
    except KeyError:
      continue
  return out


def accuracy_matrices(found: dict, method: str) -> list[np.ndarray]:
  """A continual method's accuracy matrices a[i, t] (task i evaluated after training task t), one
  per result that records one, entries not yet defined (i > t) as NaN."""
  out = []
  for result in found.get(method, {}).values():
    matrix = result.get("detail", {}).get("acc_matrix")
    if matrix:
      out.append(np.array([[np.nan if v is None else v for v in row] for row in matrix], float))
  return out


def computation(result: dict) -> tuple:
  """What a result computed on beyond its config and code: the machine kind (backend and device;
  results from before machines were recorded ran on this project's CPU machine), the precision of
  its matrix products, and its recorded deviations of data or arithmetic. Two runs pair only when
  it is equal: the same code computes in another reduction order on another kind of machine."""
  m = result.get("machine") or {}
  return (
    m.get("backend", "cpu"),
    m.get("device_kind", "cpu"),
    arithmetic(result),
    tuple(sorted(result.get("deviations", []))),
  )


def machine_label(result: dict) -> str:
  """Which machine a result ran on, in words (results from before machines were recorded ran
  on this project's CPU machine), naming its card where the result recorded one (results from
  before cards were recorded name the kind only)."""
  m = result.get("machine")
  if not m:
    return "not recorded (this project's 2-core CPU machine)"
  card = m.get("card")
  if m.get("backend") == "cpu":
    model = f" ({card})" if card else ""
    return f"CPU{model}, {m.get('cores')} of {m.get('cpu_count')} cores"
  name = card or m.get("device_kind")
  return f"{name} ({m.get('backend')}, matmul precision {arithmetic(result)})"


def arithmetic(result: dict) -> str:
  """The precision a result's matrix products and convolutions ran at: "float32" on a CPU (XLA:CPU
  has no reduced mode) or where pinned, else the accelerator's default (TF32 on recent NVIDIA
  GPUs, bfloat16 passes on TPUs: docs/reproduction.md, "Running claims on a GPU")."""
  m = result.get("machine") or {}
  if m.get("backend", "cpu") == "cpu":
    return "float32"
  precision = str(m.get("matmul_precision", "default"))
  return "float32" if precision in provenance.FULL_FLOAT32 else precision


def machines(results: list[dict]) -> str:
  """ "<machine>: <n> runs" for every machine among ``results``."""
  counts: dict[str, int] = {}
  for r in results:
    label = machine_label(r)
    counts[label] = counts.get(label, 0) + 1
  return ", ".join(f"{k}: {v} run{'s' * (v != 1)}" for k, v in sorted(counts.items()))


def backend_of(result: dict) -> str:
  """The JAX backend a result ran on; results from before machines were recorded ran on CPUs."""
  return (result.get("machine") or {}).get("backend", "cpu")


def seed_ranges(seeds: list[int]) -> str:
  """[0, 1, 2, 5] -> 'seeds 0-2, 5'."""
  parts, start = [], seeds[0]
  for prev, cur in zip(seeds, [*seeds[1:], None], strict=True):
    if cur != prev + 1:
      parts.append(f"{start}" if start == prev else f"{start}-{prev}")
      start = cur
  return ("seed " if len(seeds) == 1 else "seeds ") + ", ".join(parts)


def split_protocols(found: dict) -> tuple[dict, dict]:
  """(v1's results, protocol v2's), each {method: {seed: result}}: v2 owns the seeds from
  ``protocol.V2_FIRST_SEED`` on, which no v1 table or verdict reads."""
  v1: dict[str, dict[int, dict]] = {}
  v2: dict[str, dict[int, dict]] = {}
  for m, rs in found.items():
    for seed, r in rs.items():
      (v2 if seed >= protocol.V2_FIRST_SEED else v1).setdefault(m, {})[seed] = r
  return v1, v2
