"""Peak host memory of one vmapped round of TinyBERT-sized clients on CPU, with and without chunks.

    python -m benchmarks.perf.nlp_memory  # writes results/nlp_memory.json

Each setting runs in its own process (a fresh peak): FedAvg with Adam on a random-init TinyBERT
4L-312 (14.5M parameters, 30522-word vocabulary), 5 clients, sequences of 128 tokens, ``--steps``
local steps of ``--batch`` examples, ``vmap_scan``; ``client_chunk=none`` (one program over all
clients, ``algorithms/base.make_round``) against chunks of 1 and 2 clients with streaming
aggregation (``core/chunked.make_chunked_round``). Peak = the process's maximum resident set
(``ru_maxrss``), which on CPU holds every XLA buffer; the baseline after building the inputs and
the initial state is reported beside it (docs/nlp.md, "Memory").
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

from benchmarks import flag_checks
from benchmarks.results_io import REPO_ROOT, RESULTS_DIR, write_results


def _rss_mib() -> float:
  return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def model_vocab(size: str) -> int:
  from fedjax_proj.models.bert import SIZES

  return SIZES[size].vocab_size


def one(
  chunk: str, clients: int, steps: int, batch: int, seq: int, size: str = "tinybert_4l_312"
) -> dict:
  """One FedAvg round of ``clients`` random-init ``size`` encoders; its memory and time."""
  import jax
  import numpy as np
  import optax

  from fedjax_proj.algorithms import fedavg
  from fedjax_proj.algorithms.base import make_round
  from fedjax_proj.core.chunked import make_chunked_round
  from fedjax_proj.core.types import RoundData
  from fedjax_proj.data.pipeline import make_batch_fn
  from fedjax_proj.models import count_params, get_model

  model = get_model("bert", 2, size=size)
  n = clients * steps * batch
  rng = np.random.default_rng(0)
  ids = rng.integers(1, model_vocab(size), (n, seq)).astype(np.int32)
  tokens = np.stack([ids, np.zeros_like(ids)], axis=1)
  labels = rng.integers(0, 2, n).astype(np.int32)
  variables = model.init(jax.random.key(0), tokens[:1])
  algorithm = fedavg.fedavg(model, optax.adam(3e-5))
  state = algorithm.init(variables, jax.random.key(1))
  batch_fn = make_batch_fn(lambda x: x)
  idx = np.arange(n, dtype=np.int32).reshape(clients, steps, batch)
  rd = RoundData(
    jax.device_put(tokens), jax.device_put(labels), np.arange(clients, dtype=np.int32), idx,
    np.ones_like(idx, bool), np.full(clients, steps * batch, np.float32), {},
  )  # fmt: skip
  if chunk == "none":
    round_fn = make_round(algorithm, "vmap_scan", batch_fn)
  else:
    round_fn = make_chunked_round(algorithm, "vmap_scan", batch_fn, client_chunk=int(chunk))
  base = _rss_mib()
  start = time.time()
  state, metrics = round_fn(state, rd, jax.random.key(2))
  jax.block_until_ready(state)
  return {
    "client_chunk": chunk, "clients": clients, "steps": steps, "batch": batch, "seq_len": seq,
    "params": count_params(variables), "baseline_rss_mib": round(base, 1),
    "peak_rss_mib": round(_rss_mib(), 1), "round_seconds": round(time.time() - start, 1),
    "train_loss": float(metrics["train_loss"]) if "train_loss" in metrics else None,
  }  # fmt: skip


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--clients", type=int, default=5)
  p.add_argument("--steps", type=int, default=2)
  p.add_argument("--batch", type=int, default=8)
  p.add_argument("--seq_len", type=int, default=128)
  p.add_argument("--chunks", default="none,2,1")
  p.add_argument("--one", default="", help=argparse.SUPPRESS)
  p.add_argument("--out", default=str(RESULTS_DIR / "nlp_memory.json"))
  a = p.parse_args(argv)
  # Before any process starts: a chunk that is not a client count, or one listed twice (measured
  # twice), would otherwise show as a child's traceback or a silent duplicate row.
  flag_checks.at_least(p, a, 1, "clients", "steps", "batch", "seq_len")
  chunks = flag_checks.names(p, "--chunks", a.chunks)
  if bad := [c for c in chunks if c != "none" and not (c.isdigit() and 1 <= int(c) <= a.clients)]:
    p.error(
      f"--chunks={a.chunks}: {', '.join(bad)} is not none or a chunk size in 1..--clients="
      f"{a.clients}; e.g. none,2,1"
    )
  if a.one:
    print(json.dumps(one(a.one, a.clients, a.steps, a.batch, a.seq_len)))
    return 0
  Path(a.out).parent.mkdir(parents=True, exist_ok=True)  # not a traceback after the runs
  rows = []
  for chunk in chunks:
    cmd = [sys.executable, "-m", "benchmarks.perf.nlp_memory", f"--one={chunk}",
           f"--chunks={chunk}", f"--clients={a.clients}", f"--steps={a.steps}",
           f"--batch={a.batch}", f"--seq_len={a.seq_len}"]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}  # from any folder, as this process
    out = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if out.returncode != 0:  # the child's last line, not this process's traceback over it
      last = (out.stdout + out.stderr).strip().splitlines()[-1:] or ["no output"]
      sys.exit(f"error: client_chunk={chunk} exited {out.returncode}: {last[0]}")
    rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
    print(rows[-1])
  import jax

  result = {"backend": jax.default_backend(), "jax": jax.__version__, "rows": rows}
  write_results(a.out, result)
  return 0


if __name__ == "__main__":
  sys.exit(main())
