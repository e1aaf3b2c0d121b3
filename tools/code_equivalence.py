"""Records two commits' code as equivalent when their behaviour fingerprints match.

The claim runner pairs two results only when they recorded the same code fingerprint, or when
the results folder's ``code_equivalence.json`` lists exactly those two fingerprints as a pair
compared directly (docs/reproduction.md, "Results", its protocol: a behaviour-fingerprint match
across commits counts as equal).
This script produces that evidence and the entry:

    python -m tools.code_equivalence a97d70a HEAD            # all fingerprint entries
    python -m tools.code_equivalence a97d70a HEAD --runs=fedavg_scan,fedproj_scan
    python -m tools.code_equivalence 5bd6f64 HEAD --runs=edge_cases --this_script
    python -m tools.code_equivalence --convert     # an earlier file's groups -> its pairs

For each commit it checks the tree out into a temporary ``git worktree``, records
``tools/behaviour_fingerprint.py`` there (the commit's own runs, pinned to one CPU; with
``--this_script``, this tree's script and runs, for runs added after ``commit_a``, whose flags must
exist at both commits) and asks the commit's own ``fedjax_proj.reproduce.run.code_fingerprint``
for the fingerprint its results record. Then it compares the two recordings with this tree's
``--compare``. On 0 differences (and at least one run compared) it adds the evidence (the
commits, the runs compared, the script, the date) to the pair of the two fingerprints in
``code_equivalence.json``; on a difference it moves the pair, with its earlier evidence, to
``refuted`` and exits 1. A refuted pair never counts as equivalent again: a later match within a
narrower fingerprint cannot undo a difference seen once.

Equivalence is not transitive here. Each check says that two commits agree on the inputs the
fingerprint reaches; a chain a = b = c says nothing about a against c (the changes from a to b and
from b to c can each be invisible to the runs and still add up to one that is not), so pairs are
never merged into groups: results of a and c pair only after a and c are compared directly.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from fedjax_proj.data.sources import find_shared_data
from fedjax_proj.reproduce.report.results import EQUIVALENCE_FILE
from fedjax_proj.reproduce.run import DEFAULT_RESULTS

REPO = Path(__file__).resolve().parents[1]


def _pair_key(fingerprints) -> list[str]:
  return sorted(set(fingerprints))


def record_check(data: dict, fingerprints: tuple[str, str], evidence: dict, same: bool) -> dict:
  """``data`` (the content of ``code_equivalence.json``) with one direct comparison of two
  fingerprints added: a match adds ``evidence`` to the pair's entry in ``pairs`` (unless the pair
  is refuted, where it joins the refuted entry's ``matched`` list); a difference moves the pair's
  entry, with its earlier evidence as ``matched``, to ``refuted``. No other pair changes."""
  key = _pair_key(fingerprints)
  if len(key) != 2:
    raise ValueError(f"a pair needs two different fingerprints, not {fingerprints}")
  pairs = [dict(p) for p in data.get("pairs", [])]
  refuted = [dict(r) for r in data.get("refuted", [])]
  entry = next((p for p in pairs if _pair_key(p["fingerprints"]) == key), None)
  gone = next((r for r in refuted if _pair_key(r["fingerprints"]) == key), None)
  if gone is not None:
    gone.setdefault("matched" if same else "evidence", []).append(evidence)
  elif same:
    if entry is None:
      pairs.append(entry := {"fingerprints": key, "evidence": []})
    entry["evidence"] = [*entry["evidence"], evidence]
  else:
    matched = pairs.pop(pairs.index(entry))["evidence"] if entry is not None else []
    refuted.append({"fingerprints": key, "evidence": [evidence], "matched": matched})
  return {**data, "pairs": pairs, "refuted": refuted}


def pairs_from_groups(data: dict) -> dict:
  """An earlier ``code_equivalence.json`` whose ``groups`` merged pairs transitively, as the
  pairs its evidence compared directly (each evidence entry names the two fingerprints it
  compared)."""
  out = {k: v for k, v in data.items() if k != "groups"}
  for group in data.get("groups", []):
    for evidence in group.get("evidence", []):
      out = record_check(out, tuple(evidence["code_fingerprints"]), evidence, True)
  return out


def _git(*args: str) -> str:
  return subprocess.run(
    ["git", "-C", str(REPO), *args], check=True, capture_output=True, text=True
  ).stdout.strip()


def _record(commit: str, tmp: Path, runs: str, cpu: int, this_script: bool) -> tuple[Path, str]:
  """(the commit's fingerprint recording, its code fingerprint)."""
  tree = tmp / f"tree-{commit[:12]}"
  _git("worktree", "add", "--detach", str(tree), commit)
  try:
    if this_script:  # outside fedjax_proj/ and experiments/: the code fingerprint is unchanged
      script = "tools/behaviour_fingerprint.py"
      (tree / script).write_bytes((REPO / script).read_bytes())
    env = {**os.environ, "PYTHONPATH": str(tree)}
    shared = find_shared_data()
    if shared is not None:  # the temporary tree has no ../shared beside it
      env["FEDJAX_PROJ_SHARED_DATA"] = str(shared)
    out = tmp / f"fp-{commit[:12]}"
    # Commits before the benchmarks were shelved keep the script at benchmarks/, run as a file.
    if (tree / "tools" / "behaviour_fingerprint.py").is_file():
      fingerprint = ["-m", "tools.behaviour_fingerprint"]
    else:
      fingerprint = ["benchmarks/behaviour_fingerprint.py"]
    cmd = ["taskset", "-c", str(cpu), sys.executable, *fingerprint]
    cmd += [f"--out={out}"] + ([f"--runs={runs}"] if runs else [])
    subprocess.run(cmd, cwd=tree, env=env, check=True)
    probe = "from fedjax_proj.reproduce import run; print(run.code_fingerprint())"
    code = subprocess.run(
      [sys.executable, "-c", probe], cwd=tree, env=env, check=True, capture_output=True, text=True
    ).stdout.strip()
    return out, code
  finally:
    _git("worktree", "remove", "--force", str(tree))


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("commit_a", nargs="?")
  p.add_argument("commit_b", nargs="?")
  p.add_argument("--runs", default="", help="behaviour_fingerprint.py runs (default: all)")
  p.add_argument("--results", default=str(DEFAULT_RESULTS), help="the claim runner's results")
  p.add_argument("--cpu", type=int, default=0, help="the CPU the recordings are pinned to")
  p.add_argument(
    "--this_script",
    action="store_true",
    help="record both commits with this tree's behaviour_fingerprint.py (runs added since)",
  )
  p.add_argument(
    "--convert",
    action="store_true",
    help="rewrite an earlier file's transitive groups as the pairs its evidence compared",
  )
  args = p.parse_args(argv)
  path = Path(args.results) / EQUIVALENCE_FILE
  data = json.loads(path.read_text()) if path.is_file() else {"pairs": [], "refuted": []}
  if args.convert:
    path.write_text(json.dumps(pairs_from_groups(data), indent=1) + "\n")
    print(f"{path}: {len(data.get('groups', []))} groups rewritten as the pairs compared directly")
    return 0
  if not (args.commit_a and args.commit_b):
    p.error("pass two commits to compare (or --convert)")
  if "groups" in data:
    p.error(f"{path} holds transitive groups; run --convert first")
  try:
    commits = [
      _git("rev-parse", "--verify", f"{c}^{{commit}}") for c in (args.commit_a, args.commit_b)
    ]
  except subprocess.CalledProcessError:
    p.error(f"not a commit of {REPO}: {args.commit_a!r} or {args.commit_b!r}")
  with tempfile.TemporaryDirectory() as tmp:
    (dir_a, code_a), (dir_b, code_b) = (
      _record(c, Path(tmp), args.runs, args.cpu, args.this_script) for c in commits
    )
    compare = [sys.executable, "-m", "tools.behaviour_fingerprint"]
    done = subprocess.run(
      [*compare, "--compare", str(dir_a), str(dir_b)], capture_output=True, text=True, cwd=REPO
    )
    print(done.stdout, end="")
    summary = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else ""
  if code_a == code_b:
    print(f"both commits have code fingerprint {code_a}: their results pair as they are")
    return done.returncode
  compared = done.returncode == 0 and not summary.startswith("0 runs")
  # A difference in a run both recordings hold refutes the pair; a run missing from one of them
  # (or nothing compared) is no evidence either way.
  differs = done.returncode == 1 and "run missing" not in done.stdout
  if not (compared or differs):
    print(f"not compared ({summary or done.stderr.strip()}); {EQUIVALENCE_FILE} unchanged")
    return 1
  evidence = {
    "commits": commits,
    "code_fingerprints": [code_a, code_b],
    "behaviour_fingerprint": summary,
    "runs": args.runs or "all",
    "script": "this tree's" if args.this_script else "each commit's own",
    "date": datetime.date.today().isoformat(),
  }
  # Read again: another comparison may have written the file during this one's recordings.
  data = json.loads(path.read_text()) if path.is_file() else data
  data = record_check(data, (code_a, code_b), evidence, compared)
  path.parent.mkdir(parents=True, exist_ok=True)
  path.write_text(json.dumps(data, indent=1) + "\n")
  if compared and not any(
    _pair_key(r["fingerprints"]) == _pair_key((code_a, code_b)) for r in data["refuted"]
  ):
    print(f"{code_a} and {code_b} recorded as equivalent in {path} ({summary})")
    return 0
  print(f"{code_a} and {code_b} are not equivalent: recorded as refuted in {path} ({summary})")
  return 1


if __name__ == "__main__":
  sys.exit(main())
