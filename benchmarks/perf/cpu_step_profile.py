"""Where a CNN FedAvg client step's time goes on one pinned CPU core: ours by XLA:CPU thunk, torch's
by aten operator (docs/performance.md, "Where the CNN step's time goes").

    taskset -c 1 python -m benchmarks.perf.cpu_step_profile

The step is ``benchmarks/perf/cpu_step.py``'s ``cnn_step`` (the CNN, SGD with momentum, batch 64,
the same batches and initial weights on both sides, one core, XLA and torch at one thread). Each
side is warmed (compiled) first, then ``--reps`` calls of ``--steps`` steps run under its profiler:
``jax.profiler.trace`` (XLA:CPU records one event per executed thunk, named after its HLO
instruction) and ``torch.profiler`` (self CPU time per aten operator). Profilers add their own
cost, so read the shares within a side, not the totals against ``cpu_step.py``'s timings.
Writes ``results/cpu_step_profile.json`` (``--out``).
"""

from __future__ import annotations

import argparse
import collections
import glob
import gzip
import json
import os
import re
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.results_io import RESULTS_DIR, write_results

# An executed thunk's event is its HLO instruction's name (e.g. "convolution.3", "fusion.12",
# "custom-call.1"); the runtime's own events have other names (PjitFunction(...), ThunkExecutor::).
THUNK = re.compile(r"^([a-z][a-z_\-]*?)(\.\d+)*$")


def thunk_times(trace_dir: str) -> dict[str, float]:
  """Microseconds per HLO instruction name in the perfetto trace under ``trace_dir``."""
  (path,) = glob.glob(f"{trace_dir}/**/*perfetto_trace.json.gz", recursive=True)
  with gzip.open(path) as f:
    data = json.load(f)
  events = data["traceEvents"] if isinstance(data, dict) else data
  out = collections.Counter()
  for e in events:
    if e.get("ph") == "X" and THUNK.match(e.get("name", "")):
      out[e["name"]] += float(e.get("dur", 0.0))
  return dict(out)


def by_kind(times: dict[str, float]) -> dict[str, float]:
  """The thunk times summed by instruction kind ("convolution", "fusion", "custom-call", ...)."""
  out = collections.Counter()
  for name, us in times.items():
    out[THUNK.match(name).group(1)] += us
  return dict(out)


def main(argv=None) -> int:
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--cpu", type=int, default=None, help="core to pin to (default: the lowest)")
  ap.add_argument("--steps", type=int, default=4, help="local steps per profiled call")
  ap.add_argument("--reps", type=int, default=5, help="profiled calls per side")
  ap.add_argument("--conv_impls", default="gemm_grad,onednn_grad")
  ap.add_argument("--out", default=str(RESULTS_DIR / "cpu_step_profile.json"))
  ap.add_argument(
    "--keep_freed_memory",
    action=argparse.BooleanOptionalAction,
    default=True,
    help="as the entry points do (benchmarks/perf/cpu_step.py's flag)",
  )
  args = ap.parse_args(argv)
  from benchmarks import flag_checks
  from benchmarks.perf import cpu_step

  flag_checks.at_least(ap, args, 1, "steps", "reps")
  impls = flag_checks.names(ap, "--conv_impls", args.conv_impls, cpu_step.COLUMNS)
  flag_checks.usable_cpu(ap, args.cpu)
  flag_checks.require_torch(ap, "bench")
  cpu = cpu_step._pin(args.cpu)
  cpu_step.one_thread_environment()
  os.environ.setdefault("JAX_PLATFORMS", "cpu")
  kept = cpu_step.keep_freed_memory() if args.keep_freed_memory else None
  import jax
  import numpy as np
  import optax
  import torch

  from benchmarks.perf.torch_reference import torch_cifar_model, torch_state_from_flax
  from fedjax_proj.algorithms import client as client_lib
  from fedjax_proj.data import pipeline
  from fedjax_proj.models import get_model

  torch.set_num_threads(1)
  if missing := [i for i in impls if i not in cpu_step.conv_impls()]:
    raise SystemExit(f"--conv_impls: {missing} not loadable here ({cpu_step.conv_impls()})")
  batch, steps = 64, args.steps
  x, y = cpu_step._cifar_batches(steps, batch)
  normalize = pipeline.normalizer(0.0, 1.0)
  batch_fn = pipeline.make_batch_fn(normalize, augment=False)
  opt = optax.sgd(0.01, momentum=0.9)
  command = " ".join(["python -m benchmarks.perf.cpu_step_profile", *sys.argv[1:]])
  result = {"command": command, "cpu": cpu, "steps": steps, "reps": args.reps}
  result["keep_freed_memory"] = kept
  result["loadavg_before"] = os.getloadavg()
  variables = None
  per_step = steps * args.reps
  for impl in impls:
    model = get_model("cnn", 10, conv_impl=impl)
    if variables is None:
      variables = model.init(jax.random.key(0), normalize(x[:2]))
    program = client_lib.local_training_client(model, opt, client_lib.cross_entropy_loss(model))
    engine = cpu_step._our_engine(program, batch_fn)
    run = cpu_step._step_runner(engine, {"variables": variables}, x, y, batch, steps)
    run()  # compiled outside the profile
    with tempfile.TemporaryDirectory() as d:
      with jax.profiler.trace(d, create_perfetto_trace=True):
        c = time.process_time()
        for _ in range(args.reps):
          run()
        cpu_s = time.process_time() - c
      times = thunk_times(d)
    result[f"ours {impl}"] = {
      # The process's CPU time over the profiled calls; what the thunks do not account for is the
      # runtime's and the host loop's (and the profiler's own).
      "process_cpu_ms_per_step": cpu_s * 1e3 / per_step,
      "ms_per_step": sum(times.values()) / 1e3 / per_step,
      "by_kind_ms_per_step": {
        k: v / 1e3 / per_step for k, v in sorted(by_kind(times).items(), key=lambda kv: -kv[1])
      },
      "top_thunks_ms_per_step": {
        k: v / 1e3 / per_step for k, v in sorted(times.items(), key=lambda kv: -kv[1])[:12]
      },
    }
  net = torch_cifar_model("cnn")
  net.load_state_dict(torch_state_from_flax(jax.tree.map(np.asarray, variables)))
  torch_run = cpu_step.torch_client(net, normalize(x), y, batch, steps)
  torch_run()
  with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
    c = time.process_time()
    for _ in range(args.reps):
      torch_run()
    cpu_s = time.process_time() - c
  ops = {e.key: e.self_cpu_time_total for e in prof.key_averages()}
  result["torch"] = {
    "process_cpu_ms_per_step": cpu_s * 1e3 / per_step,
    "ms_per_step": sum(ops.values()) / 1e3 / per_step,
    "top_ops_ms_per_step": {
      k: v / 1e3 / per_step for k, v in sorted(ops.items(), key=lambda kv: -kv[1])[:15]
    },
  }
  result["loadavg_after"] = os.getloadavg()
  out = Path(args.out)
  out.parent.mkdir(parents=True, exist_ok=True)
  write_results(out, result)
  for side in [f"ours {i}" for i in impls] + ["torch"]:
    r = result[side]
    parts = r.get("by_kind_ms_per_step") or r["top_ops_ms_per_step"]
    cpu_ms, attributed = round(r["process_cpu_ms_per_step"], 1), round(r["ms_per_step"], 1)
    print(side, cpu_ms, attributed, {k: round(v, 1) for k, v in list(parts.items())[:8]})
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
