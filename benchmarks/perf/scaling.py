"""Scaling: rounds/s, time to first round, recompilation and peak memory vs clients per round.

    python -m benchmarks.perf.scaling                    # the default grid (~10 min on 2 CPU cores)
    python -m benchmarks.perf.scaling --grid quick          # a smoke run

FedAvg on MNIST (../shared/data/mnist; random images of the same shape if absent) split IID over
1000 clients of 60 examples; every client runs ``--steps`` local SGD steps of batch ``--batch``.
Each configuration (model, strategy, client chunk, clients per round) runs in a FRESH subprocess, so
its peak RSS (``resource.getrusage``) is its own: the round's buffers plus the fixed cost of the
interpreter, JAX and the data (reported separately as the RSS just before the first round).
Device memory (``peak_bytes_in_use``) is reported where the backend exposes it (GPU/TPU; not CPU).
``chunk`` = ``none`` is the ordinary round (:func:`fedjax_proj.algorithms.base.make_round`, every
client's outputs materialised at once); a number is :func:`~fedjax_proj.core.chunked.
make_chunked_round` with that many clients per chunk. Rounds after the first must not compile
anything: the number of XLA compilations per round is counted with ``jax.monitoring``.
Writes results/scaling.json and prints a table.
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

from benchmarks import flag_checks
from benchmarks.results_io import REPO_ROOT

NUM_CLIENTS = 1000

# (model, strategy, chunk or None, clients per round, timed rounds after the first)
GRIDS = {
  "default": [
    *[("mlp", "vmap_scan", None, c, 3) for c in (10, 100, 1000)],
    *[("mlp", "vmap_scan", 100, c, 3) for c in (10, 100, 1000)],
    *[("mlp", "vmap_stepwise", 100, c, 2) for c in (10, 100, 1000)],
    *[("mlp", "sequential", 100, c, 2) for c in (10, 100, 1000)],
    # The CNN trains at ~300 samples/s on 2 shared CPU cores: 1000 clients (80k samples, ~5 min
    # per round) do not fit the time budget, so its grid stops at 100 clients per round.
    ("cnn", "sequential", None, 10, 2),
    ("cnn", "sequential", None, 100, 1),
    *[("cnn", "sequential", 100, c, 1) for c in (10, 100)],
    ("cnn", "vmap_scan", None, 10, 1),
  ],
  "quick": [("mlp", "vmap_scan", None, 10, 1), ("mlp", "vmap_scan", 100, 100, 1)],
}


def rss_mb() -> float:
  """Current resident set size (MB) from /proc (Linux); NaN elsewhere."""
  try:
    for line in Path("/proc/self/status").read_text().splitlines():
      if line.startswith("VmRSS:"):
        return int(line.split()[1]) / 1024
  except OSError:
    pass
  return float("nan")


def peak_rss_mb() -> float:
  scale = 1024 if sys.platform != "darwin" else 1024 * 1024  # ru_maxrss: KB on Linux.
  return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / scale


def mnist(seed: int = 0):
  """MNIST train images uint8 [60000, 28, 28, 1] and labels (random stand-ins if absent)."""
  from fedjax_proj.data.sources import find_shared_data, load_dataset

  shared = find_shared_data()
  if shared is None:
    print("note: ../shared/data not found; using random images", file=sys.stderr)
    rng = np.random.default_rng(seed)
    return rng.integers(0, 255, (60000, 28, 28, 1), np.uint8), rng.integers(0, 10, 60000)
  ds = load_dataset(str(shared / "mnist" / "train.npz"), "train")
  return ds.images, np.asarray(ds.labels)


def federation(num_clients: int, batch: int, steps: int, seed: int = 0):
  """(images, labels, FederatedData): an IID split of MNIST over ``num_clients`` clients."""
  from fedjax_proj.data.federated import FederatedData

  x, y = mnist(seed)
  order = np.random.default_rng(seed).permutation(len(y))
  fd = FederatedData(np.array_split(order, num_clients), batch_size=batch, local_steps=steps)
  return x, y.astype(np.int32), fd


def round_layouts(fd, cpr: int, rounds: int, seed: int = 0):
  """Host layouts (sampled, idx, mask, n_k) of rounds 0..rounds-1; shared with the torch loop."""
  out = []
  for r in range(rounds):
    sampled = fd.sample_clients(r, cpr, seed)
    idx, mask, n = fd.round_layout(sampled, r, seed)
    out.append((sampled, idx, mask, n))
  return out


def jax_fedavg(model_name: str, lr: float = 0.01):
  import jax
  import jax.numpy as jnp
  import optax

  from fedjax_proj.algorithms.fedavg import fedavg
  from fedjax_proj.data.pipeline import make_batch_fn, normalizer_for
  from fedjax_proj.models import get_model

  model = get_model(model_name, 10)
  normalize = normalizer_for("mnist")
  alg = fedavg(model, optax.sgd(lr, momentum=0.9))
  variables = model.init(jax.random.key(0), jnp.zeros((1, 28, 28, 1), jnp.float32))
  return alg, make_batch_fn(normalize), variables


def run_config(cfg: dict) -> dict:
  """Runs one configuration in this process and returns its measurements."""
  import jax
  import jax.numpy as jnp

  from fedjax_proj.algorithms.base import make_round
  from fedjax_proj.core.chunked import make_chunked_round
  from fedjax_proj.core.types import RoundData

  compiles = []
  jax.monitoring.register_event_duration_secs_listener(
    lambda event, secs, **kw: (
      compiles.append(secs) if event == "/jax/core/compile/backend_compile_duration" else None
    )
  )
  x, y, fd = federation(NUM_CLIENTS, cfg["batch"], cfg["steps"])
  alg, batch_fn, variables = jax_fedavg(cfg["model"])
  images, labels = jnp.asarray(x), jnp.asarray(y)
  layouts = round_layouts(fd, cfg["cpr"], 1 + cfg["rounds"])
  rds = [
    RoundData(images, labels, jnp.asarray(s), jnp.asarray(i), jnp.asarray(m), jnp.asarray(n), {})
    for s, i, m, n in layouts
  ]
  samples = int(layouts[0][2].sum())
  if cfg["chunk"] is None:
    round_fn = make_round(alg, cfg["strategy"], batch_fn)
  else:
    round_fn = make_chunked_round(alg, cfg["strategy"], batch_fn, client_chunk=cfg["chunk"])
  state = alg.init(variables, jax.random.key(0))
  jax.block_until_ready((state, rds))
  rss_before = rss_mb()
  compiles.clear()
  t0 = time.perf_counter()
  state, metrics = round_fn(state, rds[0], jax.random.key(0))
  jax.block_until_ready(state)
  first = time.perf_counter() - t0
  first_compiles = len(compiles)
  compiles.clear()
  t0 = time.perf_counter()
  for r in range(1, 1 + cfg["rounds"]):
    state, metrics = round_fn(state, rds[r], jax.random.key(r))
  jax.block_until_ready(state)
  elapsed = time.perf_counter() - t0
  device_stats = jax.local_devices()[0].memory_stats() or {}
  return {
    **cfg,
    "backend": jax.default_backend(),
    "samples_per_round": samples,
    "first_round_s": first,
    "round_s": elapsed / cfg["rounds"],
    "rounds_per_s": cfg["rounds"] / elapsed,
    "samples_per_s": samples * cfg["rounds"] / elapsed,
    "compiles_first_round": first_compiles,
    "compiles_later_rounds": len(compiles),
    "rss_before_round_mb": rss_before,
    "peak_rss_mb": peak_rss_mb(),
    "device_peak_bytes": device_stats.get("peak_bytes_in_use"),
    "train_loss": float(metrics["train_loss"]),
  }


def run_in_subprocess(cfg: dict, timeout: float) -> dict:
  env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
  cmd = [sys.executable, "-m", "benchmarks.perf.scaling", "--worker", json.dumps(cfg)]
  try:
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout)
  except subprocess.TimeoutExpired:
    return {**cfg, "error": f"timeout after {timeout:.0f} s"}
  lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
  if proc.returncode != 0 or not lines:
    return {**cfg, "error": proc.stderr.strip().splitlines()[-1:] or ["no output"]}
  return json.loads(lines[-1][len("RESULT ") :])


def table(rows: list[dict]) -> str:
  head = (
    f"{'model':5s} {'strategy':13s} {'chunk':>5s} {'clients':>7s} {'rounds/s':>8s} "
    f"{'samples/s':>9s} {'1st round s':>11s} {'recompiles':>10s} {'RSS0 MB':>8s} {'peak MB':>8s}"
  )
  lines = [head]
  for r in rows:
    chunk = "none" if r["chunk"] is None else str(r["chunk"])
    prefix = f"{r['model']:5s} {r['strategy']:13s} {chunk:>5s} {r['cpr']:7d}"
    if "error" in r:
      lines.append(f"{prefix} ERROR {r['error']}")
      continue
    lines.append(
      f"{prefix} {r['rounds_per_s']:8.3f} {r['samples_per_s']:9.0f} {r['first_round_s']:11.2f} "
      f"{r['compiles_later_rounds']:10d} {r['rss_before_round_mb']:8.0f} {r['peak_rss_mb']:8.0f}"
    )
  return "\n".join(lines)


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--grid", default="default", choices=sorted(GRIDS))
  p.add_argument("--steps", type=int, default=2, help="local steps per client per round")
  p.add_argument("--batch", type=int, default=20)
  p.add_argument("--timeout", type=float, default=300, help="seconds per configuration")
  p.add_argument("--out", default="scaling", help="results/<out>.json")
  p.add_argument("--worker", help=argparse.SUPPRESS)
  args = p.parse_args(argv)
  # Before any configuration starts: 0 steps or batches would time nothing, and a timeout <= 0
  # would record every configuration as timed out without running it.
  flag_checks.at_least(p, args, 1, "steps", "batch")
  if not args.timeout > 0:
    p.error(f"--timeout must be > 0 seconds, got {args.timeout}")
  if not args.out or os.sep in args.out:  # written after the first configuration, not before
    p.error(f"--out={args.out} must be a file name stem under results/, e.g. scaling")
  if args.worker:
    print("RESULT " + json.dumps(run_config(json.loads(args.worker))), flush=True)
    return
  from benchmarks.common import header
  from benchmarks.results_io import RESULTS_DIR, write_results

  print(header(), f"clients={NUM_CLIENTS} steps={args.steps} batch={args.batch}", flush=True)
  rows, t0 = [], time.perf_counter()
  for model, strategy, chunk, cpr, rounds in GRIDS[args.grid]:
    cfg = dict(model=model, strategy=strategy, chunk=chunk, cpr=cpr, rounds=rounds)
    cfg.update(steps=args.steps, batch=args.batch)
    rows.append(run_in_subprocess(cfg, args.timeout))
    print(table(rows[-1:]).splitlines()[-1], flush=True)
    total = time.perf_counter() - t0
    payload = {"args": vars(args), "num_clients": NUM_CLIENTS, "wall_s": total, "rows": rows}
    path = write_results(
      RESULTS_DIR / f"{args.out}.json", payload, indent=2, sort_keys=True, default=float
    )  # After every row, so a cut-short run keeps its rows.
  print(table(rows))
  print(f"total wall time {total:.0f} s")
  print(f"wrote {path}")


if __name__ == "__main__":
  main()
