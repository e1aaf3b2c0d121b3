"""What every peer runner shares: reading the export, the FedAvg CNN's FLOP count, and measuring a
round (CPU seconds of the process tree, wall seconds, PSS of the process tree).

Only numpy and the standard library are imported here: each runner runs in its own system's
environment (benchmarks/perf/peer/make_envs.sh), where fedjax_proj may not be installed.
"""

from __future__ import annotations

import json
import os
import resource
import sys
import time
from pathlib import Path

import numpy as np

# CIFAR-10 channel statistics (fedjax_proj.data.pipeline.CHANNEL_STATS["cifar10"]), repeated here
# because the other systems' environments do not have the package; every runner normalises alike.
CIFAR10_MEAN = (0.4914, 0.4822, 0.4465)
CIFAR10_STD = (0.2470, 0.2435, 0.2616)
NUM_CLASSES = 10


def load_export(path: str | Path) -> dict:
  """Reads an export written by :mod:`benchmarks.perf.peer.export`.

  Returns:
    dict with ``train_x`` uint8 [N, 32, 32, 3], ``train_y`` int64 [N], ``clients`` (one int64 index
    array into the train arrays per client), ``cohorts`` int32 [R, C] (round r's client ids),
    ``test_x``, ``test_y`` and ``settings`` (the JSON written beside the .npz).
  """
  path = Path(path)
  if path.suffix != ".npz":
    raise ValueError(f"{path}: the export is the .npz that benchmarks/perf/peer/export.py writes.")
  if not path.exists():
    raise FileNotFoundError(
      f"{path} does not exist; write it: python -m benchmarks.perf.peer.export"
    )
  with np.load(path) as f:
    d = {k: f[k] for k in f.files}
  offsets = d.pop("client_offsets")
  flat = d.pop("client_index")
  d["clients"] = [flat[offsets[i] : offsets[i + 1]] for i in range(len(offsets) - 1)]
  d["settings"] = json.loads(path.with_suffix(".json").read_text())
  return d


def normalize(x_uint8: np.ndarray) -> np.ndarray:
  """uint8 NHWC images to float32, scaled to [0, 1] then standardised per channel."""
  x = x_uint8.astype(np.float32) / 255.0
  return (x - np.float32(CIFAR10_MEAN)) / np.float32(CIFAR10_STD)


def cnn_train_flops_per_example(side: int = 32, channels: int = 3) -> dict:
  """Multiply-add FLOPs (2 per MAC) of one training example through the FedAvg CNN.

  Forward: two 5x5 SAME convolutions (32, 64 filters) each before a 2x2 max-pool, dense 512, dense
  10. The backward pass of each layer costs one forward for the weight gradient and one for the
  input gradient, except the first convolution, whose input gradient nobody needs: training is
  3x forward minus conv1's forward. Element-wise work (ReLU, pooling, bias, softmax, the SGD
  update) is left out: it is under 1% of the total. Issue-free check: XLA's cost analysis of one
  step (benchmarks/perf/peer/run.py records both).
  """
  conv1 = 2 * side * side * 32 * (5 * 5 * channels)
  conv2 = 2 * (side // 2) ** 2 * 64 * (5 * 5 * 32)
  dense1 = 2 * (side // 4) ** 2 * 64 * 512
  dense2 = 2 * 512 * NUM_CLASSES
  forward = conv1 + conv2 + dense1 + dense2
  return {"forward": forward, "train": 3 * forward - conv1}


def round_examples(export: dict, r: int) -> int:
  """Real (unpadded) training examples in round ``r``: one local epoch of every sampled client."""
  return int(sum(len(export["clients"][c]) for c in export["cohorts"][r]))


def _tree_pids(root: int) -> list[int]:
  """``root`` and its live descendants, from /proc/*/stat's parent ids."""
  parent = {}
  for entry in os.listdir("/proc"):
    if entry.isdigit():
      try:
        stat = Path(f"/proc/{entry}/stat").read_text()
      except OSError:
        continue
      parent[int(entry)] = int(stat.rsplit(")", 1)[1].split()[1])
  tree, frontier = [root], [root]
  while frontier:
    kids = [p for p, pp in parent.items() if pp in frontier]
    tree += kids
    frontier = kids
  return tree


def tree_cpu_seconds(root: int | None = None) -> float:
  """User + system CPU seconds of the process tree under ``root``: each live process's own time
  plus its reaped children's (utime, stime, cutime, cstime of /proc/<pid>/stat). Ray and
  multiprocessing workers are descendants, so a framework's helper processes count too."""
  ticks = os.sysconf("SC_CLK_TCK")
  total = 0
  for pid in _tree_pids(root or os.getpid()):
    try:
      fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
      continue
    total += sum(int(v) for v in fields[11:15])  # utime stime cutime cstime (stat fields 14-17)
  return total / ticks


def tree_memory_mb(root: int | None = None) -> tuple[float, str]:
  """Memory of the process tree under ``root`` in MB: the sum of PSS (proportional set size, so
  pages shared between the processes count once) from /proc/<pid>/smaps_rollup; the sum of RSS
  where smaps_rollup is unreadable (then shared pages count once per process).

  Returns:
    (megabytes, "pss" or "rss").
  """
  kib, kind = 0, "pss"
  for pid in _tree_pids(root or os.getpid()):
    try:
      text = Path(f"/proc/{pid}/smaps_rollup").read_text()
      key = "Pss:"
    except OSError:
      try:
        text, key, kind = Path(f"/proc/{pid}/status").read_text(), "VmRSS:", "rss"
      except OSError:
        continue
    kib += next((int(line.split()[1]) for line in text.splitlines() if line.startswith(key)), 0)
  return kib / 1024, kind


class Recorder:
  """Times rounds and writes one JSON line per round, then a summary line, to stdout and ``out``.

  Start-up seconds run from the interpreter's start (``PEER_T0``, set by the driver just before it
  launched the process, else this object's creation) to the first round's start: imports, reading
  the export, building the model and the framework's machinery.
  """

  def __init__(self, system: str, export: dict, out: str | None):
    self.system, self.export = system, export
    self.out = open(out, "w") if out else None  # noqa: SIM115 - closed in finish()
    self.t0 = float(os.environ.get("PEER_T0", time.time()))
    self.rounds: list[dict] = []
    self.peak_mb, self.mem_kind = 0.0, "pss"
    self.flops = cnn_train_flops_per_example()["train"]

  def _emit(self, rec: dict) -> None:
    line = json.dumps(rec)
    print(line, flush=True)
    if self.out:
      self.out.write(line + "\n")
      self.out.flush()

  def begin(self) -> None:
    if not self.rounds:
      self.startup_s = time.time() - self.t0
    self._wall, self._cpu = time.perf_counter(), tree_cpu_seconds()

  def end(self, r: int, **extra) -> None:
    wall, cpu = time.perf_counter() - self._wall, tree_cpu_seconds() - self._cpu
    mb, self.mem_kind = tree_memory_mb()
    self.peak_mb = max(self.peak_mb, mb)
    n = round_examples(self.export, r)
    rec = {"system": self.system, "round": r, "cpu_s": cpu, "wall_s": wall, "examples": n,
           "train_gflop": n * self.flops / 1e9, "mem_mb": mb, **extra}  # fmt: skip
    self.rounds.append(rec)
    self._emit(rec)

  def finish(self, accuracy: float, user_code_file: str, **extra) -> dict:
    mb, _ = tree_memory_mb()
    self.peak_mb = max(self.peak_mb, mb)
    rec = {
      "system": self.system,
      "summary": True,
      "startup_s": self.startup_s,
      "first_round_cpu_s": self.rounds[0]["cpu_s"],
      "first_round_wall_s": self.rounds[0]["wall_s"],
      "peak_mem_mb": self.peak_mb,
      "mem_kind": self.mem_kind,
      # ru_maxrss: the driver process's own peak resident set, in KiB on Linux: a true peak, where
      # the tree's PSS is sampled at round ends.
      "self_max_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
      "accuracy": accuracy,
      "user_code_lines": user_code_lines(user_code_file),
      "python": sys.version.split()[0],
      **extra,
    }
    self._emit(rec)
    if self.out:
      self.out.close()
    return rec


def user_code_lines(path: str) -> int:
  """Lines of user code in a runner: the lines between its ``# --- user code`` and
  ``# --- end user code`` markers that are neither blank nor comments. The markers fence what a
  user of that system would write (model, data plumbing, training loop), not the measuring."""
  lines, inside = 0, False
  for line in Path(path).read_text().splitlines():
    s = line.strip()
    if s.startswith("# --- end user code"):
      inside = False
    elif s.startswith("# --- user code"):
      inside = True
    elif inside and s and not s.startswith("#"):
      lines += 1
  # A runner whose user code starts with imports that the formatter keeps at the top of the file
  # says how many in its marker line: "# --- user code (the imports above count as N lines ...".
  head = next(
    (line for line in Path(path).read_text().splitlines() if "# --- user code (" in line), ""
  )
  if "count as " in head:
    lines += int(head.split("count as ")[1].split()[0])
  return lines


def runner_args(argv=None):
  """The flags every runner takes."""
  import argparse

  p = argparse.ArgumentParser()
  p.add_argument("--export", required=True, help="the .npz written by benchmarks.perf.peer.export")
  p.add_argument("--rounds", type=int, default=None, help="rounds to run (default: all exported)")
  p.add_argument("--out", default=None, help="also write the JSON lines to this file")
  p.add_argument("--device", default="cpu", help="cpu, or cuda/gpu for the device mode")
  p.add_argument("--lr", type=float, default=None, help="default: the export's lr")
  args = p.parse_args(argv)
  export = load_export(args.export)
  rounds = args.rounds or len(export["cohorts"])
  if not 1 <= rounds <= len(export["cohorts"]):
    raise SystemExit(
      f"--rounds={args.rounds}: the export holds {len(export['cohorts'])} rounds; export more "
      "with benchmarks.perf.peer.export --rounds."
    )
  args.rounds = rounds
  args.lr = args.lr or export["settings"]["lr"]
  return args, export
