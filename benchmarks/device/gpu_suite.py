"""The accelerator suite: correctness, round throughput, FedProj's overhead, accuracy, GPSE cost.

    python -m benchmarks.device.make_device_data --out_dir=.device_data  # once, beside ../shared
    python -m benchmarks.device.gpu_suite --out_dir=$OUT            # on the GPU machine (<= 20 min)
    python -m benchmarks.device.gpu_suite --tiny --out_dir=/tmp/suite    # CPU smoke run (~1 min)

One command writes ``suite.json`` and ``suite.md`` (a markdown table per step) to ``--out_dir``,
plus ``accuracy_state.tar.gz`` (step d's checkpoints and metrics, to continue later with
``--accuracy_state``). The exact device call is in docs/performance.md ("Running the GPU suite").
Steps, each time-boxed by its ``--budget_<step>`` seconds (a step past its budget stops where it
is, keeps what it measured and is marked ``timed_out``):

a. ``correctness``: vmap_scan == vmap_stepwise == sequential (largest parameter difference to
   vmap_scan after one FedAvg round; two FedProj rounds, the second with a memory buffer) for the
   MLP, the FedAvg CNN and ResNet-8 on real CIFAR-10, under float32 matmul precision (TF32 would
   hide real differences). Passes when every difference, relative to the largest parameter update
   of the round (the metrics: to their value), is <= ``--tolerance``: float rounding in another
   computation order grows with the update (docs/performance.md, "Running the GPU suite").
b. ``throughput``: one FedAvg round per strategy at 10/50/100/500 clients (vmap_scan in chunks of
   ``--chunk`` above it) for the CNN and ResNet-8: samples/s, round time, compile time (first
   round minus a timed round), peak device memory (``memory_stats``; cumulative over the
   process, so read it as "at most"), and beside them a PyTorch sequential client loop on the same
   model, clients and batches (benchmarks/perf/torch_reference.py), on CUDA when available.
c. ``fedproj_overhead``: client phase and whole round of FedProj vs FedAvg and FedDF
   (benchmarks/perf/fedproj_overhead.py; paper 001, Table 5: a round 1.27x FedAvg on an RTX 3090).
d. ``accuracy``: CIFAR-10 Dirichlet 0.3, FedAvg vs FedProj with the paper preset
   (experiments/cifar10.py), each for half the budget, checkpointed every round; a later run with
   ``--accuracy_state`` resumes both. Curves (test accuracy per round) go to the JSON and table.
e. ``gpse_cost``: FOT's GPSE round vs one local epoch for the PMNIST MLP
   (benchmarks/perf/gpse_cost.py; paper 003, Table 4: 0.3-2.3x), steady state, with the compile
   time of the first call apart.
f. ``nlp_round``: one FedAvg round of 5 TinyBERT 4L-312 clients at 128 tokens, whole cohort and
   chunks of 1 (benchmarks/perf/nlp_memory.py): round time, peak device memory.

Data: ``--data`` (default ``.device_data/device_data.npz``) is unpacked into the layout of
../shared/data under ``--work_dir`` and exported as ``$FEDJAX_PROJ_SHARED_DATA``, so every
benchmark reads it unchanged. Without it the suite uses the shared folder when found, else
synthetic images, and says so in its output, the JSON (``data.source``) and the table.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import tarfile
import time
import traceback
from pathlib import Path

from benchmarks import flag_checks
from benchmarks.results_io import REPO_ROOT, write_results

REPO = REPO_ROOT

DEFAULT_DATA = (
  REPO / ".device_data" / "device_data.npz"
)  # made by benchmarks/device/make_device_data.py
STEPS = ("correctness", "throughput", "fedproj_overhead", "accuracy", "gpse_cost", "nlp_round")
SCHEMA_VERSION = 1
# Full-size budgets (seconds): 20 minutes in all on one H100, compilation included.
BUDGETS = {
  "correctness": 150,
  "throughput": 420,
  "fedproj_overhead": 120,
  "accuracy": 360,
  "gpse_cost": 90,
  "nlp_round": 120,
}


# Step a's pass mark: a strategy's largest difference to vmap_scan over the round's largest
# parameter update (compare_rows says why relative).
TOLERANCE = 1e-2
# FedProj's `projected_fraction` is a count of projected steps over all steps: another summation
# order may flip the projection of a step whose <g, g_mem> sits at 0, which moves the fraction by
# one step's share (compare_steps). Chosen after the 2026-11-28 H200 run (docs/performance.md,
# "Running the GPU suite").
MAX_FLIPPED_STEPS = 1

# --tiny is a smoke test of the code paths, not a measurement: on a loaded shared CPU its steps may
# take minutes of wall time, so they are not cut short.
TINY_BUDGET = 1800.0


class StepTimeout(Exception):
  """Raised inside a step when its budget is spent."""


@contextlib.contextmanager
def time_box(seconds: float):
  """Raises :class:`StepTimeout` in the main thread after ``seconds`` (SIGALRM)."""

  def handler(signum, frame):
    raise StepTimeout(f"budget of {seconds:.0f} s spent")

  old = signal.signal(signal.SIGALRM, handler)
  signal.setitimer(signal.ITIMER_REAL, max(seconds, 0.01))
  try:
    yield
  finally:
    signal.setitimer(signal.ITIMER_REAL, 0)
    signal.signal(signal.SIGALRM, old)


# ---------------------------------------------------------------------------------------------
# Data


def prepare_data(data: Path, work_dir: Path) -> dict:
  """Unpacks the device npz (or finds the shared folder) and exports it; says which it is."""
  from fedjax_proj.data.sources import find_shared_data

  if data.exists():
    from benchmarks.device import make_device_data

    dest = work_dir / "data"
    counts = make_device_data.unpack(data, dest)
    os.environ["FEDJAX_PROJ_SHARED_DATA"] = str(dest)
    return {"source": "real", "origin": str(data), "root": str(dest), "counts": counts}
  shared = find_shared_data()
  if shared is not None:
    return {"source": "real", "origin": str(shared), "root": str(shared), "counts": {}}
  warning = (
    f"WARNING: no real data ({data} is absent and no shared data folder was found): every step "
    "runs on SYNTHETIC random images; accuracy numbers are meaningless. Build the data with "
    "`python -m benchmarks.device.make_device_data --out_dir=.device_data` and carry .device_data."
  )
  print("!" * 100 + "\n" + warning + "\n" + "!" * 100, flush=True)
  return {"source": "synthetic", "origin": None, "root": None, "counts": {}, "warning": warning}


def device_info() -> dict:
  import jax

  dev = jax.devices()[0]
  info = {
    "backend": jax.default_backend(),
    "device_kind": dev.device_kind,
    "device_count": jax.device_count(),
    "jax": jax.__version__,
    "load_average": list(os.getloadavg()),
    "cpu_count": os.cpu_count(),
  }
  try:
    import torch

    info["torch"] = torch.__version__
    info["torch_cuda"] = bool(torch.cuda.is_available())
  except ImportError:
    info["torch"] = None
  return info


def peak_device_bytes() -> int | None:
  import jax

  stats = jax.devices()[0].memory_stats()
  return None if not stats else int(stats.get("peak_bytes_in_use", 0)) or None


# ---------------------------------------------------------------------------------------------
# Steps


def _fedavg_setup(name: str, x, y, clients: int, steps: int, batch: int):
  import jax
  import jax.numpy as jnp
  import numpy as np
  import optax

  from benchmarks.common import round_data
  from fedjax_proj.algorithms.fedavg import fedavg
  from fedjax_proj.data.pipeline import make_batch_fn, normalizer_for
  from fedjax_proj.models import get_model

  model = get_model(name, 10)
  normalize = normalizer_for("cifar10")
  alg = fedavg(model, optax.sgd(0.01, momentum=0.9))
  variables = model.init(jax.random.key(0), normalize(jnp.asarray(x[:2])))
  per = steps * batch
  # Client c holds examples [c*per, (c+1)*per) modulo the data: any cohort size fits the data.
  parts = [(c * per + np.arange(per)) % len(y) for c in range(clients)]
  rd, layout = round_data(x, y, parts, batch)
  return model, alg, make_batch_fn(normalize), variables, rd, layout


def step_correctness(cfg, x, y, public, results: dict) -> bool:
  """vmap_scan == vmap_stepwise == sequential, FedAvg per model and FedProj's two rounds."""
  import jax
  import jax.numpy as jnp
  import numpy as np
  import optax

  from benchmarks.perf.strategies import STRATEGIES, compare_strategies
  from fedjax_proj.algorithms.base import make_round
  from fedjax_proj.algorithms.distillation.fedproj import fedproj
  from fedjax_proj.core import tree as tree_lib
  from fedjax_proj.data.pipeline import normalizer_for

  rows = results.setdefault("rows", [])
  with jax.default_matmul_precision("float32"):
    for name in cfg.correctness_models:
      _, alg, batch_fn, variables, rd, _ = _fedavg_setup(
        name, x, y, cfg.clients, cfg.steps, cfg.batch
      )
      fns = {s: make_round(alg, s, batch_fn) for s in STRATEGIES}
      res = compare_strategies(fns, lambda a=alg, v=variables: a.init(v, jax.random.key(0)), rd, 0)
      init = np.asarray(tree_lib.tree_ravel(variables))
      flats = {s: res[s]["flat"] for s in STRATEGIES}
      rows += compare_rows(f"fedavg/{name}", flats, scale_of_update(flats["vmap_scan"], init))
    name = cfg.fedproj_model
    model, _, batch_fn, variables, rd, _ = _fedavg_setup(
      name, x, y, cfg.clients, cfg.steps, cfg.batch
    )
    rd = rd._replace(extra={"public_images": jnp.asarray(public)})
    normalize = normalizer_for("cifar10")

    # Adam's normalised step turns float-level gradient differences into +-lr parameter
    # differences, so the server's Adam distils at lr 1e-6 (bound 2 lr x steps, far below the
    # tolerance) and the distillation's equality is checked through its loss and L_mem metrics.
    alg = fedproj(
      model,
      optax.sgd(0.01, momentum=0.9),
      normalize,
      public_size=len(public),
      memory_size=len(public) // 2,
      memory_batch_size=cfg.batch,
      distill_batch_size=cfg.batch * 2,
      distill_lr=1e-6,
      lmem_global=True,  # compared across strategies below
    )
    flats, mets = {}, {}
    for s in STRATEGIES:
      round_fn = make_round(alg, s, batch_fn)
      state = alg.init(variables, jax.random.key(0))
      for r in range(2):  # round 0: no memory; round 1: projection against the memory
        state, metrics = round_fn(state, rd, jax.random.key(10 + r))
      flats[s] = np.asarray(tree_lib.tree_ravel(state.variables))
      keys = ("distill_loss", "lmem_global", "projected_fraction", "mean_cos")
      mets[s] = np.asarray([float(metrics[k]) for k in keys])
    init = np.asarray(tree_lib.tree_ravel(variables))
    rows += compare_rows(
      f"fedproj/{name} (2 rounds)", flats, scale_of_update(flats["vmap_scan"], init)
    )
    # One row per metric, each measured against the largest of the four values (the mark the
    # step has always used), so a failing row names its metric.
    # docs/performance.md, "Running the GPU suite": `projected_fraction` moves in whole steps'
    # shares when a step's <g, g_mem> sits near 0 and another summation order flips its projection.
    metric_scale = float(np.abs(mets["vmap_scan"]).max())
    for i, k in enumerate(keys):
      per = {s: m[i : i + 1] for s, m in mets.items()}
      program = f"fedproj/{name} round-2 {k}"
      if k == "projected_fraction":  # a count of steps, judged in steps
        rows += compare_steps(program, per, cfg.clients * cfg.steps, metric_scale)
      else:
        rows += compare_rows(program, per, metric_scale, cfg.tolerance)
  results["max_abs_diff"] = max(r["max_abs_diff"] for r in rows)
  results["max_rel_diff"] = max(r["rel_diff"] for r in rows if "flipped_steps" not in r)
  results["tolerance"] = cfg.tolerance
  results["tolerance_kind"] = (
    "relative to the largest parameter update (metrics: value); projected_fraction: at most "
    f"{MAX_FLIPPED_STEPS} step flipped"
  )
  results["passed"] = all(r["passed"] for r in rows)
  return results["passed"]


def scale_of_update(final, init) -> float:
  """The largest parameter change of the reference strategy: what a difference is measured in."""
  import numpy as np

  return float(np.abs(np.asarray(final) - np.asarray(init)).max())


def compare_steps(program: str, values: dict, steps: int, scale: float) -> list[dict]:
  """``compare_rows`` for a fraction of ``steps`` decisions (FedProj's projected fraction): each
  strategy's difference also in decisions (``flipped_steps``); it passes with at most
  MAX_FLIPPED_STEPS flipped. A projection skipped or inverted moves many steps and fails."""
  rows = compare_rows(program, values, scale)
  for r in rows:
    r["flipped_steps"] = int(round(r["max_abs_diff"] * steps))
    r["passed"] = r["flipped_steps"] <= MAX_FLIPPED_STEPS
  return rows


def compare_rows(
  program: str, values: dict, scale: float, tolerance: float = TOLERANCE
) -> list[dict]:
  """Each strategy's largest difference to vmap_scan, absolute and relative to ``scale``.

  Why relative: the same round computed in another order (a per-client conv against a batched
  one, cuDNN's choice of algorithm for each shape) differs by float rounding, which grows with
  the size of the update. On CPU the strategies' ResNet-8 FedAvg rounds differ by 9e-5 with a
  largest update of 0.64 (1.4e-4 of it); a wrong client, step or learning rate differs by a
  sizeable fraction of the update (tests/benchmarks/device/test_gpu_suite.py)."""
  import numpy as np

  rows = []
  for s, v in values.items():
    diff = float(np.abs(np.asarray(v) - np.asarray(values["vmap_scan"])).max())
    rows.append(
      {
        "program": program,
        "strategy": s,
        "max_abs_diff": diff,
        "scale": scale,
        # No update to measure against: equal values pass, any difference fails.
        "rel_diff": diff / scale if scale > 0 else (float("inf") if diff > 0 else 0.0),
      }
    )
    rows[-1]["passed"] = rows[-1]["rel_diff"] <= tolerance
  return rows


def step_throughput(cfg, x, y, public, results: dict) -> bool:
  """Samples/s, round and compile time, peak memory per strategy and cohort; torch beside."""
  import jax

  from benchmarks.perf.strategies import STRATEGIES
  from fedjax_proj.algorithms.base import make_round
  from fedjax_proj.core.chunked import make_chunked_round

  rows = results.setdefault("rows", [])
  # The distance to the limit (docs/performance.md): this device's GEMM peak, measured in this run,
  # and each model's FLOPs per example, counted from its traced step (cpu_step.step_flops).
  if "gemm_peak" not in results:
    results["gemm_peak"] = device_gemm_peak(cfg.peak_n)
  peak = results["gemm_peak"]["peak_gflops"]
  per_example = {
    name: model_flops_per_example(name, x, y, cfg.batch) for name in cfg.throughput_models
  }
  results["flops_per_example"] = per_example
  # Cohorts outer, models inner: a budget that runs out loses the largest cohorts, not a model.
  for clients in cfg.cohorts:
    for name in cfg.throughput_models:
      model, alg, batch_fn, variables, rd, layout = _fedavg_setup(
        name, x, y, clients, cfg.steps, cfg.batch
      )
      samples = int(layout[1].sum())
      for s in STRATEGIES:
        if s != "vmap_scan" and clients > cfg.host_loop_max_clients:
          continue
        chunk = cfg.chunk if s == "vmap_scan" and clients > cfg.chunk else None
        fn = make_chunked_round(alg, s, batch_fn, chunk) if chunk else make_round(alg, s, batch_fn)
        row = {"model": name, "clients": clients, "framework": "jax", "strategy": s}
        row["chunk"] = chunk
        t0 = time.perf_counter()
        state, _ = fn(alg.init(variables, jax.random.key(0)), rd, jax.random.key(1))
        jax.block_until_ready(state)
        first = time.perf_counter() - t0
        times = []
        for r in range(cfg.timed_rounds):
          state0 = alg.init(variables, jax.random.key(0))
          jax.block_until_ready(state0)
          t0 = time.perf_counter()
          state, _ = fn(state0, rd, jax.random.key(2 + r))
          jax.block_until_ready(state)
          times.append(time.perf_counter() - t0)
        round_s = min(times)
        row.update(
          round_s=round_s,
          samples_per_s=samples / round_s,
          first_round_s=first,
          compile_s=max(first - round_s, 0.0),
          peak_device_bytes=peak_device_bytes(),
        )
        row.update(achieved(per_example[name] * samples, round_s, peak))
        rows.append(row)
        print(json.dumps(row), flush=True)
      torch_row = torch_loop(name, x, y, layout, cfg)
      if torch_row:
        rows.append({"model": name, "clients": clients, **torch_row})
        print(json.dumps(rows[-1]), flush=True)
  return True


def device_gemm_peak(n: int) -> dict:
  """The default device's best float32 GEMM rate on n x n matrices (GFLOP/s, wall-clock, as the
  rows' round times), the peak the throughput rows are a share of (on a GPU, what its kernels
  reach, not the data sheet's)."""
  from benchmarks.perf.peer.peak import jax_gemm_rate

  rate = jax_gemm_rate(n, clock=time.perf_counter)
  return {"n": n, "peak_gflops": rate, "device": device_info().get("device_kind")}


def model_flops_per_example(name: str, x, y, batch: int) -> float:
  """FLOPs of one example's FedAvg training step of ``name`` (forward and backward), counted from
  the traced step on XLA's convolutions (:func:`benchmarks.perf.cpu_step.step_flops`)."""
  import jax
  import jax.numpy as jnp
  import optax

  from benchmarks.perf.cpu_step import step_flops
  from fedjax_proj.algorithms import client as client_lib
  from fedjax_proj.data.pipeline import make_batch_fn, normalizer_for
  from fedjax_proj.models import CONV_MODELS, get_model

  # A convolution run as a library call (oneDNN on CPU) is not a convolution in the trace.
  model = get_model(name, 10, **({"conv_impl": "xla"} if name in CONV_MODELS else {}))
  normalize = normalizer_for("cifar10")
  variables = model.init(jax.random.key(0), normalize(jnp.asarray(x[:2])))
  program = client_lib.local_training_client(
    model, optax.sgd(0.01, momentum=0.9), client_lib.cross_entropy_loss(model)
  )
  flops = step_flops(
    program, make_batch_fn(normalize), {"variables": variables}, x[:batch], y[:batch], batch
  )
  return flops["counted"] / batch


def achieved(flops: float, seconds: float, peak_gflops: float) -> dict:
  """GFLOP/s of ``flops`` done in ``seconds`` and its share of the measured peak."""
  rate = flops / seconds / 1e9
  return {"gflops": rate, "share_of_peak": rate / peak_gflops if peak_gflops else None}


def torch_loop(name, x, y, layout, cfg) -> dict | None:
  """The PyTorch sequential client loop on the same clients and batches (None without torch)."""
  try:
    import torch
  except ImportError:
    return {"framework": "torch", "strategy": "loop", "error": "torch not installed"}
  from benchmarks.perf.torch_reference import torch_cifar_model, torch_round

  device = "cuda" if torch.cuda.is_available() else "cpu"
  torch.manual_seed(0)
  model = torch_cifar_model(name).to(device)
  images = torch.from_numpy(x.transpose(0, 3, 1, 2).copy()).to(device)
  labels = torch.from_numpy(y.astype("int64")).to(device)
  lay = (None, *layout)
  state = {k: v.clone() for k, v in model.state_dict().items()}
  sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
  t0 = time.perf_counter()
  torch_round(model, state, images, labels, lay, 0.01, mean=0.5, std=0.25, device=device)
  sync()
  first = time.perf_counter() - t0
  times = []
  for _ in range(cfg.timed_rounds):
    t0 = time.perf_counter()
    torch_round(model, state, images, labels, lay, 0.01, mean=0.5, std=0.25, device=device)
    sync()
    times.append(time.perf_counter() - t0)
  samples = int(layout[1].sum())
  peak = torch.cuda.max_memory_allocated() if device == "cuda" else None
  return {
    "framework": "torch",
    "strategy": f"loop ({device})",
    "round_s": min(times),
    "samples_per_s": samples / min(times),
    "first_round_s": first,
    "compile_s": None,
    "peak_device_bytes": peak,
    "torch": torch.__version__,
  }


def step_fedproj_overhead(cfg, x, y, public, results: dict) -> bool:
  from benchmarks.perf import fedproj_overhead

  out = fedproj_overhead.measure(
    model_name=cfg.fedproj_model,
    clients=cfg.overhead_clients,
    steps=cfg.steps,
    batch=cfg.batch,
    x=x,
    y=y,
    public=public,
    strategy="auto",
    repeats=cfg.timed_rounds,
    breakdown=not cfg.tiny,
  )
  out.pop("_setup")
  results.update(out)
  results["paper_round_ratio"] = 1.27
  return True


def step_accuracy(cfg, x, y, public, results: dict, budget: float, data: dict) -> bool:
  """FedAvg vs FedProj, paper preset, checkpointed; each method gets half the budget."""
  work = cfg.work_dir / "accuracy"
  if cfg.accuracy_state and Path(cfg.accuracy_state).exists():
    with tarfile.open(cfg.accuracy_state) as tar:
      tar.extractall(cfg.work_dir, filter="data")
    results["resumed_from"] = str(cfg.accuracy_state)
  root = data.get("root")
  if data["source"] != "real" or root is None:
    results["skipped"] = "needs real CIFAR-10 (device data or the shared folder)"
    return True
  curves = results.setdefault("curves", {})
  per_method = budget / 2
  for method in ("fedavg", "fedproj"):
    out = work / method
    cmd = [
      sys.executable,
      str(REPO / "experiments" / "cifar10.py"),
      f"--preset={cfg.accuracy_preset}",
      f"--method={method}",
      f"--data_dir={Path(root) / 'cifar10'}",
      f"--output_dir={out}",
      "--checkpoint_every=1",
      "--keep_checkpoints=1",
      "--eval_every=1",
      "--progress=false",
      *cfg.accuracy_flags,
    ]
    if method == "fedproj":
      cmd.append(f"--public_data={Path(root) / 'cifar100' / 'public_20k.npz'}")
    # Continue a checkpointed run; a fresh directory is a new run (--resume refuses an empty one).
    if (out / "checkpoints").is_dir() and any((out / "checkpoints").iterdir()):
      cmd.append("--resume=true")
    env = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1"}
    t0 = time.perf_counter()
    proc = subprocess.Popen(
      cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env
    )
    try:
      log, _ = proc.communicate(timeout=per_method)
    except subprocess.TimeoutExpired:
      proc.send_signal(signal.SIGTERM)  # finishes the running round, saves, exits 143
      log, _ = proc.communicate()
    metrics = out / "metrics.jsonl"
    records = (
      [json.loads(line) for line in metrics.read_text().splitlines()] if metrics.exists() else []
    )
    curves[method] = {
      "command": " ".join(cmd),
      "exit_code": proc.returncode,
      "seconds": time.perf_counter() - t0,
      "rounds_done": records[-1]["round"] if records else 0,
      "test_accuracy": [
        [r["round"], r["test_accuracy"]] for r in records if r.get("test_accuracy") is not None
      ],
      "round_seconds": [r.get("round_seconds") for r in records],
      "log_tail": log[-1500:],
    }
    print(f"accuracy/{method}: {curves[method]['rounds_done']} rounds, exit {proc.returncode}")
  work.mkdir(parents=True, exist_ok=True)
  state = cfg.out_dir / "accuracy_state.tar.gz"
  with tarfile.open(state, "w:gz") as tar:
    tar.add(work, arcname="accuracy")
  results["state_file"] = state.name
  results["state_bytes"] = state.stat().st_size
  return all(c["exit_code"] in (0, 128 + signal.SIGTERM) for c in curves.values())


def step_gpse_cost(cfg, x, y, public, results: dict) -> bool:
  from benchmarks.perf import gpse_cost

  row = gpse_cost.measure(
    "mlp", cfg.gpse_clients, cfg.gpse_num_clients, cfg.timed_rounds, 0, 256, "gaussian"
  )
  results.update(row)
  results["paper_ratio_range"] = [0.3, 2.3]
  return True


def step_nlp_round(cfg, x, y, public, results: dict) -> bool:
  """One FedAvg round of TinyBERT 4L-312 clients (random init, 128 tokens), whole cohort vs
  chunks (benchmarks/perf/nlp_memory.py; docs/nlp.md, "Memory"): round time and peak device
  memory."""
  from benchmarks.perf import nlp_memory

  rows = []
  for chunk in ("none", "1"):
    row = nlp_memory.one(chunk, cfg.nlp_clients, 2, 8, cfg.nlp_seq_len, size=cfg.nlp_size)
    row["peak_device_bytes"] = peak_device_bytes()  # cumulative over the process: "at most"
    rows.append(row)
  results["rows"] = rows
  return True


# ---------------------------------------------------------------------------------------------
# Report


def markdown(report: dict) -> str:
  d, data = report["device"], report["data"]
  lines = [
    f"# GPU suite ({'TINY CPU SMOKE RUN, not a measurement' if report['tiny'] else 'full'})",
    "",
    f"device: {d['device_kind']} (backend {d['backend']}, jax {d['jax']}, torch {d.get('torch')});"
    f" data: **{data['source']}**" + (f" - {data['warning']}" if data.get("warning") else ""),
    f"command: `{report['command']}`",
    "",
    "| step | status | seconds | budget s |",
    "|---|---|---:|---:|",
  ]
  for name, s in report["steps"].items():
    lines.append(f"| {name} | {s['status']} | {s['seconds']:.1f} | {s['budget_s']:.0f} |")
  res = report["steps"]["correctness"].get("result", {})
  if res.get("rows"):
    lines += ["", "## a. correctness (max |param diff| to vmap_scan)", ""]
    lines += [
      "| program | strategy | max abs diff | largest update | relative | passed |",
      "|---|---|---:|---:|---:|---|",
    ]
    lines += [
      f"| {r['program']} | {r['strategy']} | {r['max_abs_diff']:.2e} | "
      f"{r.get('scale', float('nan')):.2e} | {r.get('rel_diff', float('nan')):.2e} | "
      + ("yes" if r.get("passed", True) else "**no**")
      + (f" ({r['flipped_steps']} step(s) flipped)" if "flipped_steps" in r else "")
      + " |"
      for r in res["rows"]
    ]
  res = report["steps"]["throughput"].get("result", {})
  if res.get("rows"):
    lines += ["", "## b. round throughput", ""]
    if gemm := res.get("gemm_peak"):
      lines += [
        f"GEMM peak measured on this device in this run: {gemm['peak_gflops']:.0f} GFLOP/s "
        f"(float32, n = {gemm['n']}); GFLOP/s counts each model's traced training step.",
        "",
      ]
    lines += [
      "| model | clients | framework | strategy | chunk | samples/s | round s | compile s | "
      "peak device MiB | GFLOP/s | share of peak |",
      "|---|---:|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in res["rows"]:
      if "error" in r:
        lines.append(f"| {r['model']} | {r['clients']} | {r['framework']} | {r['error']} |||||")
        continue
      fmt = lambda v, spec: "" if v is None else format(v, spec)
      peak = r.get("peak_device_bytes")
      lines.append(
        f"| {r['model']} | {r['clients']} | {r['framework']} | {r['strategy']} | "
        f"{fmt(r.get('chunk'), 'd')} | {r['samples_per_s']:.0f} | {r['round_s']:.3f} | "
        f"{fmt(r.get('compile_s'), '.1f')} | {fmt(peak and peak / 2**20, '.0f')} | "
        f"{fmt(r.get('gflops'), '.1f')} | {fmt(r.get('share_of_peak'), '.1%')} |"
      )
  res = report["steps"]["fedproj_overhead"].get("result", {})
  if res.get("round_seconds"):
    lines += ["", "## c. FedProj overhead (paper 001 Table 5: round 1.27x FedAvg)", ""]
    lines += ["| quantity | seconds | / FedAvg |", "|---|---:|---:|"]
    for k in ("fedavg", "fedproj"):
      v = res["client_seconds"][k]
      lines.append(f"| client phase {k} | {v:.3f} | {v / res['client_seconds']['fedavg']:.2f} |")
    for k, v in res["round_seconds"].items():
      lines.append(f"| round {k} | {v:.3f} | {v / res['round_seconds']['fedavg']:.2f} |")
  res = report["steps"]["accuracy"].get("result", {})
  if res.get("curves"):
    lines += ["", "## d. CIFAR-10 Dir 0.3, paper preset (test accuracy by round)", ""]
    for m, c in res["curves"].items():
      acc = ", ".join(f"{r}:{a:.3f}" for r, a in c["test_accuracy"])
      lines.append(f"- {m}: {c['rounds_done']} rounds (exit {c['exit_code']}): {acc}")
  res = report["steps"]["gpse_cost"].get("result", {})
  if res.get("ratio_populated") is not None:
    lines += ["", "## e. GPSE cost vs one local epoch (paper 003 Table 4: 0.3-2.3x)", ""]
    lines.append(
      f"PMNIST MLP, {res['clients']} clients: epoch {res['epoch_seconds']:.3f} s, GPSE "
      f"{res['gpse_seconds_empty_basis']:.3f} / {res['gpse_seconds_populated_basis']:.3f} s "
      f"(empty / populated basis): ratio {res['ratio_empty']:.2f} / {res['ratio_populated']:.2f}"
    )
    if res.get("gpse_compile_seconds") is not None:  # reports made before the jitted server step
      lines.append(
        f"GPSE server step (jitted on the device) {res['gpse_server_seconds']:.3f} s steady, "
        f"{res['gpse_server_first_seconds']:.2f} s first call (the earlier host path on the same "
        f"shapes: {res['host_server_baseline_seconds']:.3f} s); compile: epoch "
        f"{res['epoch_compile_seconds']:.2f} s, GPSE {res['gpse_compile_seconds']:.2f} s"
      )
  return "\n".join(lines) + "\n"


def suite_config(args) -> argparse.Namespace:
  """Sizes of every step; ``--tiny`` shrinks them to a CPU smoke run."""
  tiny = args.tiny
  return argparse.Namespace(
    tiny=tiny,
    out_dir=Path(args.out_dir),
    work_dir=Path(args.work_dir),
    accuracy_state=args.accuracy_state,
    tolerance=args.tolerance,
    correctness_models=["mlp"] if tiny else ["mlp", "cnn", "resnet8"],
    fedproj_model="mlp" if tiny else "resnet8",
    throughput_models=["mlp"] if tiny else ["cnn", "resnet8"],
    cohorts=[3] if tiny else [10, 50, 100, 500],
    chunk=2 if tiny else 100,
    host_loop_max_clients=3 if tiny else 500,
    clients=2 if tiny else 4,
    steps=2 if tiny else 5,
    batch=8 if tiny else 32,
    peak_n=128 if tiny else 8192,
    timed_rounds=1 if tiny else 3,
    overhead_clients=2 if tiny else 10,
    n_train=64 if tiny else 50000,
    n_public=32 if tiny else 2000,
    accuracy_preset="smoke" if tiny else "paper",
    accuracy_flags=(
      [
        "--model=mlp",
        "--rounds=1",
        "--num_clients=4",
        "--train_subset=80",
        "--batch_size=8",  # 4 clients of 80 examples: a batch they can fill
        "--test_subset=32",
        "--public_size=32",
        "--memory_size=16",
      ]
      if tiny
      else []
    ),
    gpse_clients=2 if tiny else 64,
    nlp_size="tiny" if tiny else "tinybert_4l_312",
    nlp_clients=2 if tiny else 5,
    nlp_seq_len=16 if tiny else 128,
    gpse_num_clients=4 if tiny else 125,
  )


def check_flags(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
  """The numbers and paths the suite will use, before it loads JAX, data or anything else.

  Only the default ``--data`` may be absent (the suite then warns and runs on synthetic images);
  a named one, or a named ``--accuracy_state``, that is missing would otherwise be run without,
  silently.
  """
  if not (0 < args.tolerance < float("inf")):
    p.error(f"--tolerance must be a finite number > 0, got {args.tolerance}")
  for name in BUDGETS:
    if (budget := getattr(args, f"budget_{name}")) is not None and not 0 < budget < float("inf"):
      p.error(f"--budget_{name} must be a finite number of seconds > 0, got {budget}")
  for flag in ("data", "accuracy_state"):
    if (path := getattr(args, flag)) and not Path(path).is_file():
      p.error(f"--{flag}={path} is not a file; name an existing one, or leave the flag out")
  for flag in ("out_dir", "work_dir"):
    if (path := Path(getattr(args, flag))).exists() and not path.is_dir():
      p.error(f"--{flag}={path} is a file; name a folder")


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--out_dir", required=True, help="<name>.json, <name>.md, accuracy_state.tar.gz")
  p.add_argument("--name", default="suite", help="file name stem of the JSON and the table")
  p.add_argument("--data", help=f"the device npz (default {DEFAULT_DATA.relative_to(REPO)})")
  p.add_argument("--work_dir", default="/tmp/gpu_suite", help="unpacked data, step d's runs")
  p.add_argument("--tiny", action="store_true", help="CPU smoke sizes (about a minute)")
  p.add_argument("--steps", default=",".join(STEPS), help=f"subset of {','.join(STEPS)}")
  p.add_argument("--accuracy_state", default="", help="a previous accuracy_state.tar.gz to resume")
  p.add_argument(
    "--tolerance",
    type=float,
    default=TOLERANCE,
    help="step a's max |diff| / largest update to pass",
  )
  for name, seconds in BUDGETS.items():
    p.add_argument(
      f"--budget_{name}", type=float, help=f"seconds (default {seconds}; --tiny: {TINY_BUDGET})"
    )
  args = p.parse_args(argv)
  check_flags(p, args)
  chosen = flag_checks.names(p, "--steps", args.steps, STEPS)
  cfg = suite_config(args)
  cfg.out_dir.mkdir(parents=True, exist_ok=True)
  cfg.work_dir.mkdir(parents=True, exist_ok=True)
  t_start = time.perf_counter()
  data = prepare_data(Path(args.data) if args.data else DEFAULT_DATA, cfg.work_dir)

  from benchmarks.common import cifar10, cifar100_public

  x, y = cifar10(cfg.n_train)
  public = cifar100_public(cfg.n_public)
  report = {
    "schema_version": SCHEMA_VERSION,
    "suite": "gpu_suite",
    "tiny": cfg.tiny,
    "command": " ".join([Path(sys.argv[0]).name, *(argv if argv is not None else sys.argv[1:])]),
    "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    "device": device_info(),
    "data": data,
    "steps": {},
  }
  print(f"device: {report['device']}\ndata: {data['source']} {data.get('origin')}", flush=True)
  runners = {
    "correctness": step_correctness,
    "throughput": step_throughput,
    "fedproj_overhead": step_fedproj_overhead,
    "accuracy": lambda c, *a: step_accuracy(c, *a, budget=budget, data=data),
    "gpse_cost": step_gpse_cost,
    "nlp_round": step_nlp_round,
  }
  for name in STEPS:
    budget = getattr(args, f"budget_{name}")
    if budget is None:
      budget = TINY_BUDGET if cfg.tiny else BUDGETS[name]
    entry = {"status": "skipped", "seconds": 0.0, "budget_s": budget, "result": {}}
    report["steps"][name] = entry
    if name not in chosen:
      continue
    print(f"== step {name} (budget {budget:.0f} s)", flush=True)
    t0 = time.perf_counter()
    try:
      # The accuracy step stops its own runs (SIGTERM, checkpointed) and needs no alarm.
      box = contextlib.nullcontext() if name == "accuracy" else time_box(budget)
      with box:
        ok = runners[name](cfg, x, y, public, entry["result"])
      entry["status"] = "ok" if ok else "failed"
    except StepTimeout as e:
      entry["status"] = "timed_out"
      entry["error"] = str(e)
    except Exception as e:  # a broken step must not lose the others' results
      entry["status"] = "error"
      entry["error"] = f"{type(e).__name__}: {e}"
      traceback.print_exc()
    entry["seconds"] = time.perf_counter() - t0
    print(f"== step {name}: {entry['status']} in {entry['seconds']:.1f} s", flush=True)
    write_results(cfg.out_dir / f"{args.name}.json", report, default=str)
  report["total_seconds"] = time.perf_counter() - t_start
  write_results(cfg.out_dir / f"{args.name}.json", report, default=str, markdown=markdown(report))
  print(markdown(report))
  bad = [n for n in chosen if report["steps"][n]["status"] not in ("ok", "timed_out")]
  return 1 if bad else 0


if __name__ == "__main__":
  sys.exit(main())
