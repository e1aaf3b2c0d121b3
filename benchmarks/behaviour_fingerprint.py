"""Behaviour fingerprint: fixed-seed smoke CLI runs whose outputs must not change in a refactor.

    python benchmarks/behaviour_fingerprint.py --out=/tmp/fp_before          # record
    python benchmarks/behaviour_fingerprint.py --out=/tmp/fp_after           # after the change
    python benchmarks/behaviour_fingerprint.py --compare /tmp/fp_before /tmp/fp_after

Each run is a small fixed-seed CLI run, exactly as a user types it (``experiments/cifar10.py`` on
scikit-learn's digits with an MLP, ``experiments/sequential.py`` and ``experiments/pmnist.py`` on
MNIST subsets from the shared data), covering the round drivers a redesign touches: the one-program
round (``vmap_scan``), the host-looped one (``sequential``), the chunked round with streaming
aggregation, the server-distillation host aggregate, the sequential-FL chain and the continual task
loop with its end-of-task hooks. Each takes seconds. Every run is pinned to one CPU: XLA:CPU's
results depend on how many cores it may use (in the last bits, then up to 7e-4 after training), so
two recordings compare only when both ran on one core.

One entry is a resume rather than a run: ``fot_resumed`` runs ``fot`` with a checkpoint every
round, removes what came after the checkpoint of round 3 (task 2's first round) as a crash would
(the later checkpoint, ``summary.json``, ``final_variables.npz``) and leaves a torn last line in
``metrics.jsonl``, then runs it again with ``--resume``; its outputs must equal ``fot``'s
(docs/fot.md, "Interrupting and resuming"). ``--compare`` checks that within each recording.

``--compare`` reads both directories and exits 1 on any difference: ``metrics.jsonl`` and
``summary.json`` record by record with the wall-clock fields dropped (any key ending in
``_seconds`` or containing ``wall``) and ``resumed_from_round``, which says how the run was
managed (``summary.json`` also without ``config`` and ``output_dir``, which name the directory),
and every leaf of ``final_variables.npz`` bit for bit (dtype, shape and bytes). It is the check
that a refactor left behaviour unchanged (docs/design.md, "The algorithm contract").
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]

# Shared flags of the cifar10.py runs: digits (1797 examples, 64 features), an MLP, 2 rounds.
_DIGITS = (
  "--preset=smoke",
  "--dataset=digits",
  "--model=mlp",
  "--num_clients=6",
  "--clients_per_round=3",
  "--rounds=2",
  "--seed=3",
  "--checkpoint_every=0",
  "--progress=false",
)
_PUBLIC = ("--public_data={public}", "--memory_size=40")
_SEQ = (
  "--preset=smoke",
  "--data_dir={mnist}",
  "--dataset=mnist",
  "--model=mlp",
  "--num_clients=6",
  "--clients_per_round=3",
  "--train_subset=600",
  "--test_subset=200",
  "--seed=3",
  "--checkpoint_every=0",
  "--progress=false",
)
_PMNIST = (
  "--preset=smoke",
  "--data_dir={mnist}",
  "--num_clients=4",
  "--clients_per_round=2",
  "--rounds_per_task=2",
  "--num_tasks=2",
  "--train_per_task=400",
  "--test_per_task=100",
  "--seed=3",
  "--strategy=vmap_scan",
)

# name -> (entry point, flags). ``{public}`` is the public npz written next to the runs,
# ``{mnist}`` the shared data's MNIST folder.
RUNS: dict[str, tuple[str, tuple[str, ...]]] = {
  "fedavg_scan": ("cifar10.py", (*_DIGITS, "--method=fedavg", "--strategy=vmap_scan")),
  "fedavg_seq": ("cifar10.py", (*_DIGITS, "--method=fedavg", "--strategy=sequential")),
  "fedavg_chunked": (
    "cifar10.py",
    (*_DIGITS, "--method=fedavg", "--strategy=vmap_scan", "--client_chunk=2"),
  ),
  "fedavgm_chunked_host": (
    "cifar10.py",
    (*_DIGITS, "--method=fedavg", "--strategy=sequential", "--client_chunk=2")
    + ("--server_optimizer=sgd",),
  ),
  "fedproj_scan": ("cifar10.py", (*_DIGITS, *_PUBLIC, "--method=fedproj", "--strategy=vmap_scan")),
  "fedproj_seq": ("cifar10.py", (*_DIGITS, *_PUBLIC, "--method=fedproj", "--strategy=sequential")),
  "feddf_seq": ("cifar10.py", (*_DIGITS, "--public_data={public}", "--method=feddf")),
  "scaffold": ("cifar10.py", (*_DIGITS, "--method=scaffold", "--optimizer=sgd", "--lr=0.05")),
  "moon": ("cifar10.py", (*_DIGITS, "--method=moon", "--strategy=vmap_scan")),
  "fedrcl": ("cifar10.py", (*_DIGITS, "--method=fedrcl", "--strategy=vmap_scan")),
  "fedgkd": ("cifar10.py", (*_DIGITS, "--method=fedgkd", "--strategy=vmap_scan")),
  "fedgkd_vote": ("cifar10.py", (*_DIGITS, "--method=fedgkd_vote", "--strategy=vmap_scan")),
  "feddyn": ("cifar10.py", (*_DIGITS, "--method=feddyn", "--strategy=vmap_scan")),
  "fednova": ("cifar10.py", (*_DIGITS, "--method=fednova", "--strategy=sequential")),
  "sfedkd_scan": ("sequential.py", (*_SEQ, "--method=sfedkd", "--strategy=vmap_scan")),
  "sfedkd_seq": ("sequential.py", (*_SEQ, "--method=sfedkd", "--strategy=sequential")),
  "cwc": ("sequential.py", (*_SEQ, "--method=cwc", "--strategy=vmap_scan")),
  "fot": ("pmnist.py", (*_PMNIST, "--method=fot")),
  "gpm": ("pmnist.py", (*_PMNIST, "--method=gpm")),
  "ewc_seq": ("pmnist.py", (*_PMNIST[:-1], "--strategy=sequential", "--method=ewc")),
  "er": ("pmnist.py", (*_PMNIST, "--method=er")),
  "fot_resumed": ("pmnist.py", (*_PMNIST, "--method=fot", "--checkpoint_every=1")),
}
# name -> (the uninterrupted run it must equal, the checkpoint its crash leaves).
RESUMED = {"fot_resumed": ("fot", 3)}


def _crash_after(run_dir: Path, round_idx: int) -> None:
  """Leaves ``run_dir`` as a crash after the checkpoint of ``round_idx`` would: later checkpoints
  and the final files gone, a torn line at the end of ``metrics.jsonl``."""
  import shutil

  for step in (run_dir / "checkpoints").iterdir():
    if step.name.isdigit() and int(step.name) > round_idx:
      shutil.rmtree(step)
  for name in ("summary.json", "final_variables.npz"):
    (run_dir / name).unlink()
  with open(run_dir / "metrics.jsonl", "a") as f:
    f.write('{"round": 99, "train_lo')


def _public_npz(out: Path) -> Path:
  """The public set of the distillation runs: the first 60 digits of the test split."""
  sys.path.insert(0, str(REPO))
  from fedjax_proj.data.sources import load_dataset

  path = out / "public.npz"
  digits = load_dataset("digits", "test")
  np.savez(path, image=digits.images[:60], label=digits.labels[:60])
  return path


def record(out: Path, names: list[str]) -> int:
  """Runs ``names`` into ``out/<name>``; returns the number of failed runs."""
  out.mkdir(parents=True, exist_ok=True)
  public = _public_npz(out)
  from fedjax_proj.data.sources import find_shared_data

  shared = find_shared_data()
  if shared is None:
    print("error: the shared data folder (MNIST) was not found; set FEDJAX_PROJ_SHARED_DATA")
    return len(names)
  env = {**os.environ, "PYTHONPATH": str(REPO), "JAX_PLATFORMS": "cpu"}
  # XLA:CPU sizes its thread pool from the CPUs the process may use, and the reductions it splits
  # over threads round differently: the same commit run on 1 and on 2 cores gives parameters that
  # differ by up to 7e-4 (MOON; measured, XLA_FLAGS thread options do not remove it). Every run is
  # therefore pinned to one CPU, so a fingerprint does not depend on the machine's core count.
  cpu = min(os.sched_getaffinity(0))
  print(f"runs pinned to CPU {cpu}", flush=True)
  failed = 0
  for name in names:
    script, flags = RUNS[name]
    cmd = [sys.executable, str(REPO / "experiments" / script)]
    cmd += [f.format(public=public, mnist=shared / "mnist") for f in flags] + [
      f"--output_dir={out / name}"
    ]
    cmd.append("--overwrite=true" if script != "pmnist.py" else "--overwrite")
    t0 = time.perf_counter()

    def run(cmd):
      pin = lambda: os.sched_setaffinity(0, {cpu})  # noqa: E731
      return subprocess.run(cmd, capture_output=True, text=True, env=env, preexec_fn=pin)

    proc = run(cmd)
    if name in RESUMED and proc.returncode == 0:
      _crash_after(out / name, RESUMED[name][1])
      proc = run([*cmd[:-1], "--resume"])  # the same flags, --overwrite replaced
    status = "ok" if proc.returncode == 0 else f"FAILED rc={proc.returncode}"
    print(f"{name:<22} {time.perf_counter() - t0:6.1f} s  {status}", flush=True)
    if proc.returncode:
      failed += 1
      print(proc.stdout[-2000:] + proc.stderr[-3000:], file=sys.stderr)
  return failed


# How a run was managed, not what it computed: a resumed run says where it resumed.
RUN_MANAGEMENT = ("resumed_from_round",)


def _comparable(record: dict, drop: tuple[str, ...] = ()) -> dict:
  return {
    k: v
    for k, v in record.items()
    if not (k.endswith("_seconds") or "wall" in k or k in RUN_MANAGEMENT or k in drop)
  }


def _json_lines(path: Path) -> list[dict]:
  return [_comparable(json.loads(line)) for line in path.read_text().splitlines() if line.strip()]


def compare_run(a: Path, b: Path) -> list[str]:
  """Differences between two run directories (empty: identical behaviour)."""
  diffs = []
  for name in ("metrics.jsonl", "summary.json", "final_variables.npz"):
    fa, fb = a / name, b / name
    if fa.exists() != fb.exists():
      diffs.append(f"{name}: present in only one of the runs")
      continue
    if not fa.exists():
      continue
    if name == "metrics.jsonl":
      ra, rb = _json_lines(fa), _json_lines(fb)
      if len(ra) != len(rb):
        diffs.append(f"{name}: {len(ra)} vs {len(rb)} records")
      for i, (x, y) in enumerate(zip(ra, rb)):
        if x != y:
          keys = sorted(k for k in x.keys() | y.keys() if x.get(k) != y.get(k))
          diffs.append(
            f"{name} record {i}: {', '.join(f'{k}: {x.get(k)} vs {y.get(k)}' for k in keys)}"
          )
    elif name == "summary.json":
      drop = ("config", "output_dir")
      x = _comparable(json.loads(fa.read_text()), drop)
      y = _comparable(json.loads(fb.read_text()), drop)
      keys = sorted(k for k in x.keys() | y.keys() if x.get(k) != y.get(k))
      if keys:
        diffs.append(f"{name}: {', '.join(f'{k}: {x.get(k)} vs {y.get(k)}' for k in keys)}")
    else:
      with np.load(fa) as va, np.load(fb) as vb:
        if sorted(va.files) != sorted(vb.files):
          diffs.append(f"{name}: leaves {sorted(va.files)} vs {sorted(vb.files)}")
        for k in sorted(set(va.files) & set(vb.files)):
          x, y = va[k], vb[k]
          if x.dtype != y.dtype or x.shape != y.shape or x.tobytes() != y.tobytes():
            diff = (
              float(np.max(np.abs(x.astype(np.float64) - y.astype(np.float64))))
              if x.shape == y.shape
              else "shape"
            )
            diffs.append(f"{name} leaf {k}: differs (max |a-b| = {diff})")
  return diffs


def compare(dir_a: Path, dir_b: Path) -> int:
  runs_a = {p.name for p in dir_a.iterdir() if p.is_dir()}
  runs_b = {p.name for p in dir_b.iterdir() if p.is_dir()}
  bad = 0
  for name in sorted(runs_a - runs_b):
    print(f"{name}: run missing from {dir_b}")
    bad += 1
  for name in sorted(runs_b - runs_a):  # an entry added since DIR_A was recorded
    print(f"{name}: new run, only in {dir_b} (not compared across the recordings)")
  for directory in (dir_a, dir_b):  # a resumed run equals its uninterrupted run
    for name, (base, _) in RESUMED.items():
      if (directory / name).is_dir() and (directory / base).is_dir():
        diffs = compare_run(directory / base, directory / name)
        for d in diffs:
          print(f"{directory / name} vs {base}: {d}")
        print(f"{directory / name}: equals {base} ({len(diffs)} differences)")
        bad += bool(diffs)
  for name in sorted(runs_a & runs_b):
    diffs = compare_run(dir_a / name, dir_b / name)
    for d in diffs:
      print(f"{name}: {d}")
    bad += bool(diffs)
  print(f"{len(runs_a & runs_b)} runs compared, {bad} differ")
  return 1 if bad else 0


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
  p.add_argument("--out", help="directory to record the runs into (outside the repository)")
  p.add_argument("--runs", default="", help=f"comma-separated subset of: {', '.join(RUNS)}")
  p.add_argument("--compare", nargs=2, metavar=("DIR_A", "DIR_B"), help="diff two recordings")
  args = p.parse_args(argv)
  if args.compare:
    return compare(Path(args.compare[0]), Path(args.compare[1]))
  if not args.out:
    p.error("pass --out=DIR to record, or --compare DIR_A DIR_B")
  names = [n for n in args.runs.split(",") if n] or list(RUNS)
  unknown = sorted(set(names) - set(RUNS))
  if unknown:
    p.error(f"unknown run(s) {unknown}; choose from {', '.join(RUNS)}")
  return 1 if record(Path(args.out), names) else 0


if __name__ == "__main__":
  sys.exit(main())
