"""The peer benchmark's driver: runs every system's runner on one exported workload, alternating
the systems run by run, and tabulates CPU seconds per steady round against ours.

    benchmarks/perf/peer/make_envs.sh                              # once: one venv per system
    python -m benchmarks.perf.peer.run --mode one-core             # one pinned core, 1 thread each
    python -m benchmarks.perf.peer.run --mode all-cores            # every core, default threads
    python -m benchmarks.perf.peer.run --mode scaling              # 10/50/100/500 clients a round
    python -m benchmarks.perf.peer.run --mode device --dry_run     # the GPU call's commands

Each run is a fresh process of the system's own environment (``--envs``/<system>/bin/python; ours
is this interpreter), started with PEER_T0 so that start-up counts from the launch. The first
``--warmup`` rounds of every run are its compile/warm-up rounds and are left out of the steady
medians. Ratios are round-paired: for each alternation and steady round, the system's seconds over
ours in the same round of the same alternation (same clients, same examples), then the median.
Achieved GFLOP/s is a round's counted training FLOPs (``common.cnn_train_flops_per_example`` x its
real examples) over its CPU seconds, as a share of the GEMM peak that ``benchmarks.perf.peer.peak``
measures in the same run, under the same pinning. Writes results/peer/<mode>.json and
.md (docs/performance.md, "Peer benchmark").
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from benchmarks.results_io import REPO_ROOT, RESULTS_DIR

RESULTS = RESULTS_DIR / "peer"
ROOT = REPO_ROOT
MODULES = {"ours": "ours", "torch": "torch_loop", "pfl": "pfl", "flower": "flower",
           "fedjax": "fedjax_runner"}  # fmt: skip
# Systems whose environment make_envs.sh tries to build but that have no runner: recorded as such.
NO_RUNNER = {
  "tff": "tensorflow-federated 0.87.0 does not install on Python 3.11: it pins jaxlib==0.4.14, "
  "which has no Python 3.11 wheel (make_envs.sh's log)",
}
MODES = ("one-core", "all-cores", "device", "scaling")
DEVICE_COHORTS = (10, 100, 500)
DEVICE_SYSTEMS = ("ours", "torch", "pfl", "flower")  # the device targets
SCALING_COHORTS = (10, 50, 100, 500)


def python_for(system: str, envs: Path) -> str:
  """The interpreter of a system's environment; ours runs on the driver's own, and so does every
  system with ``--envs -`` (a machine with one Python holding them all, e.g. a lent GPU's)."""
  if system == "ours" or str(envs) == "-":
    return sys.executable
  return str(envs / system / "bin" / "python")


def runner_command(system, export, rounds, out, envs, *, core=None, device="cpu") -> list[str]:
  cmd = [python_for(system, envs), "-m", f"benchmarks.perf.peer.{MODULES[system]}", "--export",
         str(export), "--rounds", str(rounds), "--out", str(out)]  # fmt: skip
  if device != "cpu":
    cmd += ["--device", device]
  return (["taskset", "-c", str(core)] if core is not None else []) + cmd


def runner_env(mode: str) -> dict:
  env = dict(os.environ, PYTHONPATH=str(ROOT))
  if mode in ("one-core", "scaling"):
    # One thread everywhere: torch/OpenMP, MKL, OpenBLAS, and XLA's intra-op Eigen pool.
    for k in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
      env[k] = "1"
  return env


def export_workload(path: Path, *, clients_per_round=10, num_clients=100, rounds=4, n_train=20_000,
                    n_test=2_000, extra=()) -> list[str]:  # fmt: skip
  """The export's command (run with this interpreter, which has fedjax_proj)."""
  return [sys.executable, "-m", "benchmarks.perf.peer.export", "--out", str(path), "--rounds",
          str(rounds), "--clients_per_round", str(clients_per_round), "--num_clients",
          str(num_clients), "--n_train", str(n_train), "--n_test", str(n_test), *extra]  # fmt: skip


def read_run(path: Path) -> tuple[list[dict], dict | None]:
  lines = (
    [json.loads(x) for x in path.read_text().splitlines() if x.strip()] if path.exists() else []
  )
  return [x for x in lines if "round" in x], next((x for x in lines if x.get("summary")), None)


def summarize(runs: dict, warmup: int, peak_gflops: float | None) -> dict:
  """Per system: medians over steady rounds of all runs, and round-paired ratios against ours.

  Args:
    runs: system -> list over alternations of (rounds, summary).
    warmup: leading rounds of each run left out.
    peak_gflops: the measured GEMM peak, for the share.
  """
  out = {}
  ours = runs.get("ours", [])
  for system, per_run in runs.items():
    ok = [(r, s) for r, s in per_run if s is not None]
    if not ok:
      out[system] = {"status": "failed", "runs": len(per_run)}
      continue
    steady = [x for r, _ in ok for x in r[warmup:]]
    cpu = [x["cpu_s"] for x in steady]
    gflops = [x["train_gflop"] / x["cpu_s"] for x in steady if x["cpu_s"] > 0]
    row = {
      "status": "ok",
      "runs": len(ok),
      "steady_rounds": len(steady),
      "cpu_s_per_round": float(np.median(cpu)),
      "wall_s_per_round": float(np.median([x["wall_s"] for x in steady])),
      "startup_s": float(np.median([s["startup_s"] for _, s in ok])),
      "first_round_cpu_s": float(np.median([s["first_round_cpu_s"] for _, s in ok])),
      "first_round_wall_s": float(np.median([s["first_round_wall_s"] for _, s in ok])),
      "peak_mem_mb": float(max(s["peak_mem_mb"] for _, s in ok)),
      "mem_kind": ok[0][1]["mem_kind"],
      "accuracy": [s["accuracy"] for _, s in ok],
      "user_code_lines": ok[0][1]["user_code_lines"],
      "framework": ok[0][1].get("framework"),
      "achieved_gflops": float(np.median(gflops)) if gflops else None,
    }
    for k in ("conv_impl", "strategy", "torch_threads", "ray_cpus"):
      if k in ok[0][1]:
        row[k] = ok[0][1][k]
    if peak_gflops and row["achieved_gflops"]:
      row["share_of_peak"] = row["achieved_gflops"] / peak_gflops
    pairs = {"cpu_s": [], "wall_s": []}
    for a, (r, s) in enumerate(per_run):
      if s is None or a >= len(ours) or ours[a][1] is None:
        continue
      base = {x["round"]: x for x in ours[a][0][warmup:]}
      for x in r[warmup:]:
        if x["round"] in base:
          for k in pairs:
            pairs[k].append(x[k] / base[x["round"]][k])
    if pairs["cpu_s"]:
      row["cpu_ratio_vs_ours"] = float(np.median(pairs["cpu_s"]))
      row["wall_ratio_vs_ours"] = float(np.median(pairs["wall_s"]))
    out[system] = row
  return out


def markdown(title: str, table: dict, meta: dict) -> str:
  lines = [f"### {title}", "",
           "| system | CPU s / round | vs ours (CPU, round-paired) | wall s / round "
           "| vs ours (wall) "
           "| start-up s | first round CPU s | peak memory MB | accuracy | GFLOP/s | share of peak "
           "| user code lines |",
           "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]  # fmt: skip
  for system, r in table.items():
    if r.get("status") != "ok":
      lines.append(f"| {system} | {r.get('status')}: {r.get('reason', '')} |" + " |" * 10)
      continue
    label = f"{system}: {r['framework']}"
    if "strategy" in r:
      label += f", `auto` = {r['strategy']}, conv_impl={r.get('conv_impl')}"
    share = f"{100 * r['share_of_peak']:.0f}%" if "share_of_peak" in r else "-"
    acc = "/".join(f"{a:.3f}" for a in r["accuracy"])
    lines.append(
      f"| {label} | {r['cpu_s_per_round']:.2f} | {r.get('cpu_ratio_vs_ours', float('nan')):.2f} "
      f"| {r['wall_s_per_round']:.2f} | {r.get('wall_ratio_vs_ours', float('nan')):.2f} "
      f"| {r['startup_s']:.1f} | {r['first_round_cpu_s']:.2f} "
      f"| {r['peak_mem_mb']:.0f} ({r['mem_kind'].upper()}) | {acc} "
      f"| {r['achieved_gflops']:.1f} | {share} | {r['user_code_lines']} |"
    )
  peak, m = meta.get("peak", {}), meta.get("meta", {})
  lines += [
    "",
    f"Steady rounds: medians over {meta.get('runs', '?')} runs per system x the rounds after the "
    "warm-up; ratios: medians of the round-paired ratios against ours (above 1: slower than ours).",
    f"Peak: {peak.get('peak_gflops', float('nan')):.1f} GFLOP/s per CPU second (float32 GEMM "
    f"{peak.get('n')}x{peak.get('n')}: numpy {peak.get('numpy_gflops', float('nan')):.1f}, "
    f"jax {peak.get('jax_gflops', float('nan')):.1f}), measured in the same run under the same "
    "pinning. FLOPs per training example: "
    f"{peak.get('counted_train_flops_per_example', 0) / 1e6:.1f} M counted (dense kernels, padding "
    f"taps included), {(peak.get('xla_train_flops_per_example') or 0) / 1e6:.1f} M by XLA's cost "
    "analysis (padding taps left out).",
    f"CPU: {meta.get('cpu')}, {meta.get('nproc')} cores, shared with other users: load average "
    f"(1/5/15 min) {_fmt_load(m.get('load_before'))} before, {_fmt_load(m.get('load_after'))} "
    f"after. Commit {meta.get('commit', '')[:10]}, {meta.get('date')}.",
    "",
  ]
  return "\n".join(lines)


def _fmt_load(load) -> str:
  return "/".join(f"{x:.1f}" for x in load) if load else "?"


def measure_peak(mode: str, core: int | None) -> dict:
  cmd = ([] if core is None else ["taskset", "-c", str(core)]) + [
    sys.executable, "-m", "benchmarks.perf.peer.peak"]  # fmt: skip
  res = subprocess.run(cmd, env=runner_env(mode), capture_output=True, text=True, check=False)
  if res.returncode:
    return {"error": res.stderr[-2000:]}
  return json.loads(res.stdout.strip().splitlines()[-1])


def run_mode(args, systems, export: Path, tag: str) -> dict:
  core = args.core if args.mode in ("one-core", "scaling") else None
  env = runner_env(args.mode)
  runs: dict = {s: [] for s in systems}
  logs = RESULTS / "runs" / tag
  logs.mkdir(parents=True, exist_ok=True)
  for a in range(args.alternations):
    order = systems if a % 2 == 0 else systems[::-1]  # alternate, so drift hits all alike
    for system in order:
      out = logs / f"{system}-{a}.jsonl"
      if args.reuse and read_run(out)[1] is not None:
        print(f"[{tag} {a}] {system}: reusing {out}")
        runs[system].append(read_run(out))
        continue
      out.unlink(missing_ok=True)
      (logs / f"{system}-{a}.stderr").unlink(missing_ok=True)  # an earlier run's
      cmd = runner_command(system, export, args.rounds, out, args.envs, core=core)
      print(f"[{tag} {a}] {shlex.join(cmd)}", flush=True)
      env["PEER_T0"] = repr(time.time())
      try:
        res = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True,
                             timeout=args.timeout, check=False)  # fmt: skip
        if res.returncode:
          (logs / f"{system}-{a}.stderr").write_text(res.stderr[-20000:])
          print(f"  {system} failed (rc {res.returncode}); see {logs}/{system}-{a}.stderr")
      except subprocess.TimeoutExpired:
        print(f"  {system} timed out after {args.timeout} s")
      runs[system].append(read_run(out))
  return runs


def main(argv=None) -> None:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--mode", choices=MODES, required=True)
  p.add_argument(
    "--systems",
    default="ours,torch,pfl,flower",
    help=f"comma-separated, from {sorted(MODULES)}; also recorded: {sorted(NO_RUNNER)}",
  )
  p.add_argument("--rounds", type=int, default=4, help="rounds per run, warm-up included")
  p.add_argument("--warmup", type=int, default=1, help="leading rounds left out of the medians")
  p.add_argument("--alternations", type=int, default=2, help="runs of every system")
  p.add_argument("--core", type=int, default=0, help="the pinned core (one-core, scaling)")
  envs = Path(os.environ.get("PEER_ENVS", ROOT.parent / "peer-envs"))  # make_envs.sh's default
  p.add_argument("--envs", type=Path, default=envs,
                 help="make_envs.sh's folder; '-': this interpreter for every system")  # fmt: skip
  p.add_argument("--timeout", type=int, default=1800, help="seconds per run")
  p.add_argument("--dry_run", action="store_true", help="print the commands, run nothing")
  p.add_argument("--reuse", action="store_true",
                 help="keep an interrupted call's finished runs (same settings)")  # fmt: skip
  p.add_argument("--tag", default=None, help="result file name (default: the mode)")
  p.add_argument("--device_data", type=Path, default=ROOT / ".device_data" / "device_data.npz",
                 help="device mode: the carried data (device/make_device_data.py)")  # fmt: skip
  p.add_argument("--render", action="store_true", help="only rewrite <tag>.md from <tag>.json")
  p.add_argument(
    "--cohorts",
    default=None,
    help="scaling/device: clients per round, comma-separated (default: the mode's)",
  )
  args = p.parse_args(argv)
  if args.render:
    render(args.tag or args.mode)
    return
  systems = args.systems.split(",")
  unknown = [s for s in systems if s not in MODULES and s not in NO_RUNNER]
  if unknown:
    raise SystemExit(f"--systems: unknown {unknown}; choose from {sorted(MODULES)}")
  if args.warmup >= args.rounds:
    raise SystemExit(f"--warmup={args.warmup} leaves no steady round of --rounds={args.rounds}.")
  if "ours" not in systems:
    systems = ["ours", *systems]  # the ratios are against ours
  missing = [s for s in systems if s in MODULES and not Path(python_for(s, args.envs)).exists()]
  recorded = {s: NO_RUNNER[s] for s in systems if s in NO_RUNNER}
  recorded |= {s: f"no environment at {args.envs / s} (run make_envs.sh {s})" for s in missing}
  runnable = [s for s in systems if s not in recorded]

  if args.mode in ("device", "scaling"):
    cohorts = DEVICE_COHORTS if args.mode == "device" else SCALING_COHORTS
    if args.cohorts:
      cohorts = tuple(int(c) for c in args.cohorts.split(","))
    keep = ("ours", "torch", "pfl") if args.mode == "scaling" else DEVICE_SYSTEMS
    runnable = [s for s in runnable if s in keep]
    plan = []
    for cpr in cohorts:
      export = RESULTS / f"workload-{args.mode}-{cpr}.npz"
      # 500 clients a round need 500 clients: the federation grows with the cohort past 100.
      # At 500 clients (40 examples each on average) Dirichlet(0.3) leaves some with under the
      # partition's default minimum of 10: allow 5 there.
      exp_cmd = export_workload(export, clients_per_round=cpr, num_clients=max(100, cpr),
                                rounds=args.rounds,
                                extra=("--min_size", "5") if cpr > 100 else ())  # fmt: skip
      cmds = [runner_command(s, export, args.rounds, RESULTS / "runs" / f"{args.mode}-{cpr}" /
                             f"{s}-0.jsonl", args.envs,
                             core=args.core if args.mode == "scaling" else None,
                             device="cuda" if args.mode == "device" else "cpu")
              for s in runnable]  # fmt: skip
      plan.append({"clients_per_round": cpr, "export": exp_cmd, "runs": cmds})
    if args.dry_run:
      for step in plan:
        print(shlex.join(step["export"]))
        for c in step["runs"]:
          print(shlex.join(c))
      print(json.dumps({"mode": args.mode, "plan": plan, "not_run": recorded}))
      return
    env = runner_env(args.mode)
    if args.mode == "device" and args.device_data.exists():
      env["FEDJAX_PROJ_SHARED_DATA"] = str(unpack_device_data(args.device_data))
    results = {}
    meta = {"load_before": os.getloadavg(), "uptime_before": _uptime()}
    for step in plan:
      exported = subprocess.run(step["export"], env=env, cwd=ROOT, check=False)
      if exported.returncode:  # record it and go on with the other cohorts
        results[step["clients_per_round"]] = {"export": {"status": "failed", "runs": 0}}
        continue
      args.alternations = args.alternations if args.mode == "scaling" else 1
      runs = run_mode(args, runnable, Path(step["export"][step["export"].index("--out") + 1]),
                      f"{args.tag or args.mode}-{step['clients_per_round']}")  # fmt: skip
      results[step["clients_per_round"]] = summarize(runs, args.warmup, None)
    meta |= {"load_after": os.getloadavg(), "uptime_after": _uptime()}
    write(args, {"mode": args.mode, "by_clients_per_round": results, "not_run": recorded,
                 "meta": meta}, None)  # fmt: skip
    return

  export = RESULTS / "workload.npz"
  exp_cmd = export_workload(export, rounds=args.rounds)
  if args.dry_run:
    print(shlex.join(exp_cmd))
    core = args.core if args.mode == "one-core" else None
    for s in runnable:
      print(shlex.join(runner_command(s, export, args.rounds, "-", args.envs, core=core)))
    return
  subprocess.run(exp_cmd, env=runner_env(args.mode), cwd=ROOT, check=True)
  meta = {"load_before": os.getloadavg(), "uptime_before": _uptime()}
  peak = measure_peak(args.mode, args.core if args.mode == "one-core" else None)
  runs = run_mode(args, runnable, export, args.tag or args.mode)
  meta |= {"load_after": os.getloadavg(), "uptime_after": _uptime()}
  table = summarize(runs, args.warmup, peak.get("peak_gflops"))
  for s, why in recorded.items():
    table[s] = {"status": "not run", "reason": why}
  write(args, {"mode": args.mode, "table": table, "peak": peak, "meta": meta,
               "runs": {s: [r for r, _ in v] for s, v in runs.items()}}, table)  # fmt: skip


def unpack_device_data(path: Path) -> Path:
  """A lent GPU has no ../shared/data: unpack the carried CIFAR-10
  (benchmarks/device/make_device_data.py, docs/performance.md "Running the GPU suite") into its
  layout, for the export to read."""
  from benchmarks.device import make_device_data

  dest = Path("/tmp/peer_device_data")
  make_device_data.unpack(path, dest)
  return dest


def _uptime() -> str:
  return subprocess.run(["uptime"], capture_output=True, text=True, check=False).stdout.strip()


def render(tag: str) -> None:
  """(Re)writes <tag>.md from <tag>.json."""
  payload = json.loads((RESULTS / f"{tag}.json").read_text())
  meta = {k: payload.get(k) for k in ("peak", "meta", "commit", "cpu", "nproc", "date")}
  meta["runs"] = payload["settings"]["alternations"]
  (RESULTS / f"{tag}.md").write_text(markdown(f"Peer benchmark, {tag}", payload["table"], meta))
  print((RESULTS / f"{tag}.md").read_text())


def write(args, payload: dict, table: dict | None) -> None:
  tag = args.tag or args.mode
  payload |= {
    "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
    "commit": subprocess.run(
      ["git", "rev-parse", "HEAD"], capture_output=True, text=True, cwd=ROOT, check=False
    ).stdout.strip(),  # fmt: skip
    "cpu": _cpu_model(),
    "nproc": os.cpu_count(),
    "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
  }
  export_json = RESULTS / "workload.json"
  if export_json.exists():
    payload["workload"] = json.loads(export_json.read_text())
  RESULTS.mkdir(parents=True, exist_ok=True)
  (RESULTS / f"{tag}.json").write_text(json.dumps(payload, indent=1) + "\n")
  if table is not None:
    render(tag)
  else:
    rows = []
    for cpr, t in payload["by_clients_per_round"].items():
      for s, r in t.items():
        if r.get("status") == "ok":
          rows.append(f"| {cpr} | {s}{', ' + r['strategy'] if 'strategy' in r else ''} "
                      f"| {r['cpu_s_per_round']:.2f} | {r['wall_s_per_round']:.2f} "
                      f"| {r['peak_mem_mb']:.0f} |")  # fmt: skip
    md = "\n".join([f"### Peer benchmark, {tag}", "",
                    "| clients / round | system | CPU s / round | wall s / round | peak MB |",
                    "|---:|---|---:|---:|---:|", *rows, ""])  # fmt: skip
    (RESULTS / f"{tag}.md").write_text(md)
    print(md)


def _cpu_model() -> str:
  try:
    text = Path("/proc/cpuinfo").read_text()
    return next(x.split(":", 1)[1].strip() for x in text.splitlines() if x.startswith("model name"))
  except (OSError, StopIteration):
    return "unknown"


if __name__ == "__main__":
  main()
