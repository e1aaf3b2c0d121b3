"""Behaviour fingerprint: fixed-seed smoke CLI runs whose outputs must not change in a refactor.

    python -m tools.behaviour_fingerprint --out=/tmp/fp_before          # record
    python -m tools.behaviour_fingerprint --out=/tmp/fp_after           # after the change
    python -m tools.behaviour_fingerprint --compare /tmp/fp_before /tmp/fp_after

Each run is a small fixed-seed CLI run, exactly as a user types it (``experiments/cifar10.py`` on
scikit-learn's digits with an MLP, ``experiments/sequential.py`` and ``experiments/pmnist.py`` on
MNIST subsets from the shared data), covering the round drivers a redesign touches: the one-program
round (``vmap_scan``), the host-looped one (``sequential``), the chunked round with streaming
aggregation, the server-distillation host aggregate, the sequential-FL chain and the continual task
loop with its end-of-task hooks. Together the runs train every method of every claim in
``fedjax_proj/reproduce/claims/`` (the NLP claims' methods are the image claims' ones; their
text pipeline is not covered), plus ``cifar10_cnn``: the CIFAR claims' own data path (the shared
data's CIFAR-10 image folder and CIFAR-100 public npz, the ``cnn`` model) on a few hundred images,
and ``pilot_iris``: the Iris pilot's script. Each takes seconds. Every run is pinned to one CPU:
XLA:CPU's results depend on how many cores it may use (in the last bits, then up to 7e-4 after
training), so two recordings compare only when both ran on one core.

Training runs miss inputs that no tiny run happens to produce, so some entries are probes instead:
fixed inputs that reach a known edge case, evaluated in a process of their own (``PROBES``).
``edge_cases`` evaluates MOON's and FedRCL's contrastive losses and their gradients on a batch
with one all-zero feature row (an example whose post-ReLU features are all zero, which turned a
FedRCL run's model into NaN before ``losses.l2_norm``: docs/methods.md, FedRCL) and the masked
losses on a batch that is all padding; it records the values and the gradients bit for bit, and
whether they are finite.

One entry is a resume rather than a run: ``fot_resumed`` runs ``fot`` with a checkpoint every
round, removes what came after the checkpoint of round 3 (task 2's first round) as a crash would
(the later checkpoint, ``summary.json``, ``final_variables.npz``) and leaves a torn last line in
``metrics.jsonl``, then runs it again with ``--resume``; its outputs must equal ``fot``'s
(docs/fot.md, "Interrupting and resuming"). ``--compare`` checks that within each recording.

``--compare`` reads both directories and exits 1 on any difference: every ``.jsonl`` and ``.json``
file of a run (``metrics.jsonl``, ``summary.json``, the pilot's ``pilot_iris.json``) record by
record with the wall-clock fields dropped (any key ending in ``_seconds`` or containing ``wall``)
and ``resumed_from_round``, which says how the run was managed (a ``.json`` also without
``config`` and ``output_dir``, which name the directory), and every leaf of every ``.npz``
(``final_variables.npz``) bit for bit (dtype, shape and bytes). A run with none of these files
differs from everything: an empty directory proves nothing. It is the check that a refactor left
behaviour unchanged (docs/design.md, "The algorithm contract").
"""

from __future__ import annotations

import argparse
import json
import os
import resource
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

# The CIFAR claims' data path (claims.presets.CIFAR_CPU: the shared image folder, the CIFAR-100
# public npz, the FedAvg CNN) on 300 training images, one round. The strategy is pinned to the one
# ``auto`` picks on a CPU, so the recording does not depend on the machine's choice.
_CIFAR = (
  "--preset=smoke",
  "--dataset=cifar10",
  "--data_dir={data}/cifar10",
  "--model=cnn",
  "--num_clients=4",
  "--clients_per_round=2",
  "--rounds=1",
  "--train_subset=300",
  "--test_subset=100",
  "--public_data={data}/cifar100/public_20k.npz",
  "--public_size=100",
  "--memory_size=100",
  "--seed=3",
  "--strategy=sequential",
  "--checkpoint_every=0",
  "--progress=false",
)

# name -> (entry point, flags). ``{public}`` is the public npz written next to the runs,
# ``{mnist}`` the shared data's MNIST folder, ``{data}`` the shared data folder.
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
  "fedprox": ("cifar10.py", (*_DIGITS, "--method=fedprox", "--strategy=vmap_scan")),
  "fedntd": ("cifar10.py", (*_DIGITS, "--method=fedntd", "--strategy=vmap_scan")),
  "fedet": ("cifar10.py", (*_DIGITS, "--public_data={public}", "--method=fedet")),
  "cifar10_cnn": ("cifar10.py", (*_CIFAR, "--method=fedproj")),
  "pilot_iris": (
    "pilot_iris.py",
    ("--methods=fedavg,feddf,fedproj", "--rounds=1", "--local_epochs=1", "--pretrain_steps=20")
    + ("--seeds=0", "--no_plot"),
  ),
  "fedseq": ("sequential.py", (*_SEQ, "--method=fedseq", "--strategy=vmap_scan")),
  "sfedkd_scan": ("sequential.py", (*_SEQ, "--method=sfedkd", "--strategy=vmap_scan")),
  "sfedkd_seq": ("sequential.py", (*_SEQ, "--method=sfedkd", "--strategy=sequential")),
  "cwc": ("sequential.py", (*_SEQ, "--method=cwc", "--strategy=vmap_scan")),
  "fot": ("pmnist.py", (*_PMNIST, "--method=fot")),
  "gpm": ("pmnist.py", (*_PMNIST, "--method=gpm")),
  "ewc_seq": ("pmnist.py", (*_PMNIST[:-1], "--strategy=sequential", "--method=ewc")),
  "er": ("pmnist.py", (*_PMNIST, "--method=er")),
  "fl": ("pmnist.py", (*_PMNIST, "--method=fl")),
  "fot_resumed": ("pmnist.py", (*_PMNIST, "--method=fot", "--checkpoint_every=1")),
}
# name -> (the uninterrupted run it must equal, the checkpoint its crash leaves).
RESUMED = {"fot_resumed": ("fot", 3)}
# How each entry point is told to replace an earlier run in its output folder (the pilot always
# overwrites its one JSON).
OVERWRITE = {"cifar10.py": "--overwrite=true", "sequential.py": "--overwrite=true"}
OVERWRITE |= {"pmnist.py": "--overwrite", "pilot_iris.py": None}


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
  from fedjax_proj.data.sources import load_dataset

  path = out / "public.npz"
  digits = load_dataset("digits", "test")
  np.savez(path, image=digits.images[:60], label=digits.labels[:60])
  return path


def edge_cases() -> tuple[dict, dict[str, np.ndarray]]:
  """Known edge cases on fixed inputs: (summary, arrays), the value and gradient each reaches.

  ``moon`` and ``fedrcl``: the method's contrastive loss and its gradient with respect to the
  features of a batch whose row 1 is all zero. Post-ReLU features of one example can all be zero;
  the norms must then give that row a finite gradient, not 0/0 = NaN (``losses.l2_norm``,
  docs/methods.md, FedRCL). ``padding_ce`` and ``padding_ntd``: the masked cross-entropy and
  FedNTD's not-true distillation of a batch that is all padding (the engine pads a client's
  batches to the round's longest, docs/design.md), whose loss and gradient must be zero.
  """
  import jax
  import jax.numpy as jnp

  from fedjax_proj.algorithms import fedrcl, losses, moon

  rng = np.random.default_rng(0)
  z, z_global, z_prev = (jnp.asarray(rng.normal(size=(6, 8)), jnp.float32) for _ in range(3))
  z = z.at[1].set(0.0)
  labels = jnp.array([0, 0, 1, 1, 2, 2])
  logits, teacher = (jnp.asarray(rng.normal(size=(6, 5)), jnp.float32) for _ in range(2))
  padding = jnp.zeros(6)
  cases = {
    "moon": (lambda f: moon.model_contrastive_loss(f, z_global, z_prev, 0.5), z),
    "fedrcl": (lambda f: sum(fedrcl.relaxed_contrastive_terms(f, labels)), z),
    "padding_ce": (lambda x: losses.cross_entropy(x, labels, padding), logits),
    "padding_ntd": (lambda x: losses.not_true_kl(teacher, x, labels, 1.0, padding), logits),
  }
  summary, arrays = {}, {}
  for name, (fn, x) in cases.items():
    value, grad = (np.asarray(v) for v in jax.jit(jax.value_and_grad(fn))(x))
    finite = bool(np.isfinite(value) and np.isfinite(grad).all())
    summary[name] = {"value": float(value), "finite": finite}
    arrays[f"{name}/value"], arrays[f"{name}/grad"] = value, grad
  return summary, arrays


# name -> function returning (summary, arrays): entries computed in-process, not CLI runs.
PROBES = {"edge_cases": edge_cases}


def write_probe(name: str, run_dir: Path) -> None:
  """Writes probe ``name`` as a run directory: ``summary.json`` and ``final_variables.npz``."""
  summary, arrays = PROBES[name]()
  run_dir.mkdir(parents=True, exist_ok=True)
  (run_dir / "summary.json").write_text(json.dumps(summary, indent=1, sort_keys=True) + "\n")
  np.savez(run_dir / "final_variables.npz", **arrays)


def record(out: Path, names: list[str]) -> int:
  """Runs ``names`` into ``out/<name>``; returns the number of failed runs."""
  out.mkdir(parents=True, exist_ok=True)
  public = _public_npz(out)
  from fedjax_proj.data.sources import find_shared_data

  shared = find_shared_data()
  if shared is None:
    print("error: the shared data folder (MNIST, CIFAR) was not found; set FEDJAX_PROJ_SHARED_DATA")
    return len(names)
  env = {**os.environ, "PYTHONPATH": str(REPO), "JAX_PLATFORMS": "cpu"}
  # XLA:CPU sizes its thread pool from the CPUs the process may use, and the reductions it splits
  # over threads round differently: the same commit run on 1 and on 2 cores gives parameters that
  # differ by up to 7e-4 (MOON; measured, XLA_FLAGS thread options do not remove it). Every run is
  # therefore pinned to one CPU, so a fingerprint does not depend on the machine's core count.
  cpu = min(os.sched_getaffinity(0))
  print(f"runs pinned to CPU {cpu}", flush=True)
  failed = 0
  start, started = time.perf_counter(), _children_cpu()
  for name in names:
    if name in PROBES:
      cmd = [sys.executable, "-m", "tools.behaviour_fingerprint", f"--probe={name}"]
      cmd.append(f"--out={out / name}")
    else:
      script, flags = RUNS[name]
      cmd = [sys.executable, str(REPO / "experiments" / script)]
      cmd += [f.format(public=public, mnist=shared / "mnist", data=shared) for f in flags]
      cmd.append(f"--output_dir={out / name}")
      if OVERWRITE[script]:
        cmd.append(OVERWRITE[script])
    t0, c0 = time.perf_counter(), _children_cpu()

    def run(cmd):
      pin = lambda: os.sched_setaffinity(0, {cpu})  # noqa: E731
      return subprocess.run(cmd, capture_output=True, text=True, env=env, preexec_fn=pin)

    proc = run(cmd)
    if name in RESUMED and proc.returncode == 0:
      _crash_after(out / name, RESUMED[name][1])
      proc = run([*cmd[:-1], "--resume"])  # the same flags, --overwrite replaced
    status = "ok" if proc.returncode == 0 else f"FAILED rc={proc.returncode}"
    wall, cpu_s = time.perf_counter() - t0, _children_cpu() - c0
    print(f"{name:<22} {wall:6.1f} s  {cpu_s:6.1f} s CPU  {status}", flush=True)
    if proc.returncode:
      failed += 1
      print(proc.stdout[-2000:] + proc.stderr[-3000:], file=sys.stderr)
  wall, cpu_s = time.perf_counter() - start, _children_cpu() - started
  print(f"{len(names)} entries: {wall:.0f} s wall, {cpu_s:.0f} s CPU", flush=True)
  return failed


def _children_cpu() -> float:
  """CPU seconds (user + system) of this process's finished children: a run's cost on its one
  core, which its wall time overstates when other processes share that core."""
  usage = resource.getrusage(resource.RUSAGE_CHILDREN)
  return usage.ru_utime + usage.ru_stime


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


def _same(x, y) -> bool:
  """Equal JSON values, NaN equal to NaN: a run that diverges the same way behaves the same."""
  return json.dumps(x, sort_keys=True) == json.dumps(y, sort_keys=True)


def _dict_diffs(x: dict, y: dict) -> str:
  keys = sorted(k for k in x.keys() | y.keys() if not _same(x.get(k), y.get(k)))
  return ", ".join(f"{k}: {x.get(k)} vs {y.get(k)}" for k in keys)


# The files of a run that hold what it computed; anything else (a figure, checkpoints) is not
# compared.
COMPARED = (".jsonl", ".json", ".npz")


def _outputs(run_dir: Path) -> set[str]:
  return {p.name for p in run_dir.iterdir() if p.is_file() and p.suffix in COMPARED}


def compare_run(a: Path, b: Path) -> list[str]:
  """Differences between two run directories (empty: identical behaviour)."""
  names = _outputs(a) | _outputs(b)
  if not names:
    return ["no outputs to compare (a run that wrote nothing proves nothing)"]
  diffs = []
  for name in sorted(names):
    fa, fb = a / name, b / name
    if fa.is_file() != fb.is_file():
      diffs.append(f"{name}: present in only one of the runs")
      continue
    if name.endswith(".jsonl"):
      ra, rb = _json_lines(fa), _json_lines(fb)
      if len(ra) != len(rb):
        diffs.append(f"{name}: {len(ra)} vs {len(rb)} records")
      for i, (x, y) in enumerate(zip(ra, rb)):
        if not _same(x, y):
          diffs.append(f"{name} record {i}: {_dict_diffs(x, y)}")
    elif name.endswith(".json"):
      drop = ("config", "output_dir")
      x = _comparable(json.loads(fa.read_text()), drop)
      y = _comparable(json.loads(fb.read_text()), drop)
      if not _same(x, y):
        diffs.append(f"{name}: {_dict_diffs(x, y)}")
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
  entries = [*RUNS, *PROBES]
  p.add_argument("--runs", default="", help=f"comma-separated subset of: {', '.join(entries)}")
  p.add_argument("--compare", nargs=2, metavar=("DIR_A", "DIR_B"), help="diff two recordings")
  p.add_argument("--probe", choices=sorted(PROBES), help="write one probe into --out (internal)")
  args = p.parse_args(argv)
  if args.compare:
    return compare(Path(args.compare[0]), Path(args.compare[1]))
  if not args.out:
    p.error("pass --out=DIR to record, or --compare DIR_A DIR_B")
  if args.probe:
    write_probe(args.probe, Path(args.out))
    return 0
  names = entries  # the default, empty; a list given names each run once
  if args.runs:
    from benchmarks import flag_checks

    names = flag_checks.names(p, "--runs", args.runs, entries)
  return 1 if record(Path(args.out), names) else 0


if __name__ == "__main__":
  sys.exit(main())
