"""PyTorch reference throughput: the same FedAvg round as a plain sequential loop of SGD steps.

    pip install -e .[bench]   # torch (CPU build), kept out of the core dependencies
    python -m benchmarks.perf.torch_reference [--cpr 10,100] [--models mlp,cnn]

The same MLP (784-200-200-10) and FedAvg CNN, the same MNIST clients, sampled clients and batches
(``scaling.round_layouts``), the same local optimiser (SGD, lr 0.01, momentum 0.9, re-initialised
per client) and the same example-weighted average. The torch round is the loop a PyTorch user
would write: for each client, load the global weights, run its steps, add n_k θ_k. In the same run
our round is measured per execution strategy (each configuration, torch or JAX, in a fresh
subprocess) and the table puts the best strategy next to torch. Samples/s counts real (unpadded)
training examples; the first (compiling / warm-up) round is excluded. torch runs with
``--torch_threads`` intra-op threads (default 1: on the shared, overloaded 2-core development
machine torch's default of 2 OpenMP threads made a round ~100x slower, 67 vs ~9000 samples/s for
the MLP); XLA uses its own thread pool. Writes
results/torch_reference.json.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

import numpy as np

from benchmarks import flag_checks
from benchmarks.perf.scaling import NUM_CLIENTS, federation, round_layouts, run_in_subprocess
from benchmarks.results_io import REPO_ROOT

MNIST_MEAN, MNIST_STD = 0.1307, 0.3081
JAX_STRATEGIES = {"mlp": ("vmap_scan", "sequential"), "cnn": ("sequential", "vmap_scan")}
# vmap_scan of the CNN on XLA:CPU is ~10x slower than the host loop (benchmarks/perf/strategies.py);
# measure it only at the smallest cohort.
SLOW = {("cnn", "vmap_scan")}


def _torch_cnn(channels: int, side: int):
  """The FedAvg CNN: two 5x5 convs (32, 64) each with ReLU and 2x2 max-pool, dense 512, 10."""
  import torch.nn as nn

  return nn.Sequential(
    nn.Conv2d(channels, 32, 5, padding=2),
    nn.ReLU(),
    nn.MaxPool2d(2),
    nn.Conv2d(32, 64, 5, padding=2),
    nn.ReLU(),
    nn.MaxPool2d(2),
    nn.Flatten(),
    nn.Linear((side // 4) ** 2 * 64, 512),
    nn.ReLU(),
    nn.Linear(512, 10),
  )


def torch_model(name: str):
  import torch.nn as nn

  if name == "mlp":
    return nn.Sequential(
      nn.Flatten(),
      nn.Linear(784, 200),
      nn.ReLU(),
      nn.Linear(200, 200),
      nn.ReLU(),
      nn.Linear(200, 10),
    )
  if name == "cnn":
    return _torch_cnn(1, 28)
  raise ValueError(f"Unknown model {name!r}; choose mlp or cnn.")


def torch_cifar_model(name: str):
  """Our CIFAR-10 models in PyTorch (same layers and parameter counts as fedjax_proj.models).

  ``cnn``: the FedAvg CNN (two 5x5 convs 32/64 + max-pool, dense 512); ``resnet8``: FedDF's
  ResNet-8 (3x3 stem 16, one BasicBlock per stage of 16/32/64 channels, BatchNorm, global pool).
  """
  import torch.nn as nn

  if name == "mlp":
    return nn.Sequential(
      nn.Flatten(), nn.Linear(3072, 200), nn.ReLU(), nn.Linear(200, 200), nn.ReLU(),
      nn.Linear(200, 10),
    )  # fmt: skip
  if name == "cnn":
    return _torch_cnn(3, 32)
  if name != "resnet8":
    raise ValueError(f"Unknown model {name!r}; choose mlp, cnn or resnet8.")

  class Block(nn.Module):
    def __init__(self, cin, cout, stride):
      super().__init__()
      self.conv0 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
      self.norm0 = nn.BatchNorm2d(cout)
      self.conv1 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
      self.norm1 = nn.BatchNorm2d(cout)
      self.short = None
      if stride != 1 or cin != cout:
        self.short = nn.Sequential(
          nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout)
        )

    def forward(self, x):
      out = self.norm1(self.conv1(nn.functional.relu(self.norm0(self.conv0(x)))))
      return nn.functional.relu(out + (x if self.short is None else self.short(x)))

  return nn.Sequential(
    nn.Conv2d(3, 16, 3, 1, 1, bias=False),
    nn.BatchNorm2d(16),
    nn.ReLU(),
    Block(16, 16, 1),
    Block(16, 32, 2),
    Block(32, 64, 2),
    nn.AdaptiveAvgPool2d(1),
    nn.Flatten(),
    nn.Linear(64, 10),
  )


def torch_cnn():
  """Our CIFAR-10 ``cnn`` (fedjax_proj/models/cnn.py) in torch: NCHW, SAME padding = 2 for the
  5x5 convolutions; layer indices 0, 3, 7, 9 hold parameters (:func:`torch_state_from_flax`).
  The parity benchmark (benchmarks/parity/fedproj.py) and the step benchmarks share it."""
  return torch_cifar_model("cnn")


def torch_state_from_flax(variables: dict) -> dict:
  """Our Flax ``cnn`` parameters as the state dict of :func:`torch_cnn`."""
  import torch

  p = variables["params"]
  t = lambda a: torch.from_numpy(np.array(a, np.float32))  # a writable copy
  dense = np.asarray(p["dense_0"]["kernel"])  # rows in NHWC flatten order (8, 8, 64)
  dense = dense.reshape(8, 8, 64, -1).transpose(2, 0, 1, 3).reshape(8 * 8 * 64, -1)
  return {
    "0.weight": t(np.asarray(p["conv_0"]["kernel"]).transpose(3, 2, 0, 1)),
    "0.bias": t(p["conv_0"]["bias"]),
    "3.weight": t(np.asarray(p["conv_1"]["kernel"]).transpose(3, 2, 0, 1)),
    "3.bias": t(p["conv_1"]["bias"]),
    "7.weight": t(dense.T),
    "7.bias": t(p["dense_0"]["bias"]),
    "9.weight": t(np.asarray(p["head"]["kernel"]).T),
    "9.bias": t(p["head"]["bias"]),
  }


def torch_round(
  model, global_state, images, labels, layout, lr, mean=MNIST_MEAN, std=MNIST_STD, device="cpu"
):
  """One FedAvg round: a sequential loop over clients and their steps; returns the new state.

  ``images`` (NCHW uint8) and ``labels`` may already live on ``device``; only the step's index
  vector moves there.
  """
  import torch
  import torch.nn.functional as F

  _, idx, mask, n = layout
  acc = {k: torch.zeros_like(v, dtype=torch.float32) for k, v in global_state.items()}
  for c in range(idx.shape[0]):
    model.load_state_dict(global_state)
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    for s in range(idx.shape[1]):
      m = mask[c, s]
      if not m.any():
        continue
      ii = torch.from_numpy(idx[c, s][m].astype(np.int64)).to(device)
      xb = (images[ii].float() / 255.0 - mean) / std
      loss = F.cross_entropy(model(xb), labels[ii])
      opt.zero_grad(set_to_none=True)
      loss.backward()
      opt.step()
    with torch.no_grad():
      for k, v in model.state_dict().items():
        acc[k] += float(n[c]) * v.float()
  total = float(n.sum())
  return {k: (v / total).to(global_state[k].dtype) for k, v in acc.items()}


def run_torch(cfg: dict) -> dict:
  import torch

  torch.set_num_threads(cfg["threads"])
  torch.manual_seed(0)
  x, y, fd = federation(NUM_CLIENTS, cfg["batch"], cfg["steps"])
  images = torch.from_numpy(np.ascontiguousarray(x.transpose(0, 3, 1, 2)))  # NCHW uint8.
  labels = torch.from_numpy(y.astype(np.int64))
  layouts = round_layouts(fd, cfg["cpr"], 1 + cfg["rounds"])
  model = torch_model(cfg["model"])
  state = {k: v.clone() for k, v in model.state_dict().items()}
  t0 = time.perf_counter()
  state = torch_round(model, state, images, labels, layouts[0], 0.01)
  first = time.perf_counter() - t0
  t0 = time.perf_counter()
  for r in range(1, 1 + cfg["rounds"]):
    state = torch_round(model, state, images, labels, layouts[r], 0.01)
  elapsed = time.perf_counter() - t0
  samples = int(layouts[0][2].sum())
  return {
    **cfg,
    "framework": "torch",
    "torch": torch.__version__,
    "threads": torch.get_num_threads(),
    "first_round_s": first,
    "round_s": elapsed / cfg["rounds"],
    "samples_per_s": samples * cfg["rounds"] / elapsed,
  }


def torch_in_subprocess(cfg: dict, timeout: float) -> dict:
  env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
  cmd = [sys.executable, "-m", "benchmarks.perf.torch_reference", "--worker", json.dumps(cfg)]
  try:
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout)
  except subprocess.TimeoutExpired:
    return {**cfg, "framework": "torch", "error": f"timeout after {timeout:.0f} s"}
  lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
  if proc.returncode != 0 or not lines:
    return {**cfg, "framework": "torch", "error": proc.stderr.strip().splitlines()[-1:]}
  return json.loads(lines[-1][len("RESULT ") :])


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--cpr", default="10,100", help="clients per round, comma-separated")
  p.add_argument("--models", default="mlp,cnn")
  p.add_argument("--steps", type=int, default=2)
  p.add_argument("--batch", type=int, default=20)
  p.add_argument("--rounds", type=int, default=2, help="timed rounds after the warm-up round")
  p.add_argument("--timeout", type=float, default=300)
  p.add_argument(
    "--torch_threads",
    type=int,
    default=1,
    help="torch intra-op threads (1: on a loaded 2-core machine 2 threads ran ~100x slower)",
  )
  p.add_argument("--worker", help=argparse.SUPPRESS)
  args = p.parse_args(argv)
  if args.worker:
    print("RESULT " + json.dumps(run_torch(json.loads(args.worker))), flush=True)
    return
  # The lists, the counts and torch, before a worker starts: a bad value, or no torch, would
  # otherwise show only as an error row of every torch worker (flag_checks).
  cprs = flag_checks.seeds(p, "--cpr", args.cpr)
  if 0 in cprs:
    p.error(f"--cpr must list clients per round >= 1, got {args.cpr}")
  models = flag_checks.names(p, "--models", args.models, tuple(JAX_STRATEGIES))
  flag_checks.at_least(p, args, 1, "steps", "batch", "rounds", "torch_threads")
  flag_checks.require_torch(p, "bench")
  from benchmarks.common import header
  from benchmarks.results_io import RESULTS_DIR, write_results

  print(header(), f"steps={args.steps} batch={args.batch} timed rounds={args.rounds}", flush=True)
  rows, summary = [], []
  for model in models:
    for cpr in cprs:
      base = dict(model=model, cpr=cpr, rounds=args.rounds, steps=args.steps, batch=args.batch)
      t = torch_in_subprocess({**base, "threads": args.torch_threads}, args.timeout)
      rows.append(t)
      jax_rows = []
      for strategy in JAX_STRATEGIES[model]:
        if (model, strategy) in SLOW and cpr > min(cprs):
          continue
        r = run_in_subprocess({**base, "strategy": strategy, "chunk": None}, args.timeout)
        r["framework"] = "jax"
        rows.append(r)
        jax_rows.append(r)
      ok = [r for r in jax_rows if "error" not in r]
      best = max(ok, key=lambda r: r["samples_per_s"]) if ok else None
      torch_sps = t.get("samples_per_s")
      summary.append(
        {
          "model": model,
          "cpr": cpr,
          "torch_samples_per_s": torch_sps,
          "best_strategy": best and best["strategy"],
          "jax_samples_per_s": best and best["samples_per_s"],
          "jax_over_torch": best and torch_sps and best["samples_per_s"] / torch_sps,
          "all_jax": {r["strategy"]: r.get("samples_per_s") for r in jax_rows},
        }
      )
      print(json.dumps(summary[-1]), flush=True)
  print(
    f"{'model':5s} {'clients':>7s} {'torch sps':>10s} {'best ours':>13s} {'ours sps':>9s} "
    f"{'ours/torch':>10s}"
  )
  for s in summary:
    fmt = lambda v, spec: format(v, spec) if v is not None else "n/a"
    print(
      f"{s['model']:5s} {s['cpr']:7d} {fmt(s['torch_samples_per_s'], '10.0f')} "
      f"{str(s['best_strategy']):>13s} {fmt(s['jax_samples_per_s'], '9.0f')} "
      f"{fmt(s['jax_over_torch'], '10.2f')}"
    )
  payload = {"args": vars(args), "rows": rows, "summary": summary}
  path = write_results(
    RESULTS_DIR / "torch_reference.json", payload, indent=2, sort_keys=True, default=float
  )
  print(f"wrote {path}")


if __name__ == "__main__":
  main()
