"""Records two commits' code as equivalent when their behaviour fingerprints match.

The claim runner pairs two results only when they recorded the same code fingerprint, or when
the results folder's ``code_equivalence.json`` lists both fingerprints in one group
(docs/reproduction.md, "Results", its protocol: a behaviour-fingerprint match across commits
counts as equal).
This script produces that evidence and the entry:

    python benchmarks/code_equivalence.py a97d70a HEAD            # all fingerprint runs
    python benchmarks/code_equivalence.py a97d70a HEAD --runs=fedavg_scan,fedproj_scan
    python benchmarks/code_equivalence.py 5bd6f64 HEAD --runs=fedrcl,moon --this_script

For each commit it checks the tree out into a temporary ``git worktree``, records
``benchmarks/behaviour_fingerprint.py`` there (the commit's own runs, pinned to one CPU; with
``--this_script``, this tree's script and runs, for runs added after ``commit_a``, whose flags must
exist at both commits) and asks the commit's own ``fedjax_proj.reproduce.run.code_fingerprint``
for the fingerprint its results record. Then it compares the two recordings with this tree's
``--compare``; on 0 differences (and at least one run compared) it adds both fingerprints to one
group of ``code_equivalence.json``, merged with any group that already holds either, with the
commits, the runs compared and the date as evidence. Any difference leaves the file untouched and
exits 1.
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

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from fedjax_proj.data.sources import find_shared_data  # noqa: E402
from fedjax_proj.reproduce.report import EQUIVALENCE_FILE  # noqa: E402
from fedjax_proj.reproduce.run import DEFAULT_RESULTS  # noqa: E402


def merge_group(groups: list[dict], fingerprints: set[str], evidence: dict) -> list[dict]:
  """``groups`` with ``fingerprints`` joined into one group: every group sharing a fingerprint
  with it is merged in (equivalence is transitive), evidence lists concatenated."""
  merged = {"fingerprints": set(fingerprints), "evidence": [evidence]}
  rest = []
  for g in groups:
    if merged["fingerprints"] & set(g["fingerprints"]):
      merged["fingerprints"] |= set(g["fingerprints"])
      merged["evidence"] = list(g.get("evidence", [])) + merged["evidence"]
    else:
      rest.append(g)
  return rest + [{**merged, "fingerprints": sorted(merged["fingerprints"])}]


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
      script = "benchmarks/behaviour_fingerprint.py"
      (tree / script).write_bytes((REPO / script).read_bytes())
    env = {**os.environ, "PYTHONPATH": str(tree)}
    shared = find_shared_data()
    if shared is not None:  # the temporary tree has no ../shared beside it
      env["FEDJAX_PROJ_SHARED_DATA"] = str(shared)
    out = tmp / f"fp-{commit[:12]}"
    cmd = ["taskset", "-c", str(cpu), sys.executable, "benchmarks/behaviour_fingerprint.py"]
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
  p.add_argument("commit_a")
  p.add_argument("commit_b")
  p.add_argument("--runs", default="", help="behaviour_fingerprint.py runs (default: all)")
  p.add_argument("--results", default=str(DEFAULT_RESULTS), help="the claim runner's results")
  p.add_argument("--cpu", type=int, default=0, help="the CPU the recordings are pinned to")
  p.add_argument(
    "--this_script",
    action="store_true",
    help="record both commits with this tree's behaviour_fingerprint.py (runs added since)",
  )
  args = p.parse_args(argv)
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
    compare = [sys.executable, str(REPO / "benchmarks" / "behaviour_fingerprint.py")]
    done = subprocess.run(
      [*compare, "--compare", str(dir_a), str(dir_b)], capture_output=True, text=True
    )
    print(done.stdout, end="")
    summary = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else ""
  if done.returncode != 0 or summary.startswith("0 runs"):
    print(f"not equivalent ({summary or done.stderr.strip()}); {EQUIVALENCE_FILE} unchanged")
    return 1
  path = Path(args.results) / EQUIVALENCE_FILE
  data = json.loads(path.read_text()) if path.is_file() else {"groups": []}
  evidence = {
    "commits": commits,
    "code_fingerprints": [code_a, code_b],
    "behaviour_fingerprint": summary,
    "runs": args.runs or "all",
    "script": "this tree's" if args.this_script else "each commit's own",
    "date": datetime.date.today().isoformat(),
  }
  data["groups"] = merge_group(data["groups"], {code_a, code_b}, evidence)
  path.parent.mkdir(parents=True, exist_ok=True)
  path.write_text(json.dumps(data, indent=1) + "\n")
  print(f"{code_a} and {code_b} recorded as equivalent in {path} ({summary})")
  return 0


if __name__ == "__main__":
  sys.exit(main())
