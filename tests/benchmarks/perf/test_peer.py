"""benchmarks/perf/peer/: the peer benchmark's export, measurement, runners and driver, tiny sizes.

The export must hand every system the same clients and cohorts (docs/performance.md, "Peer
benchmark"), so the round trip is checked against our own partition and sampler; the runners for
ours and the plain torch loop run a tiny workload; the device mode, which needs a GPU, is checked as
the dry run that builds its commands.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from benchmarks.perf.peer import common, export, run
from fedjax_proj.data.federated import FederatedData
from fedjax_proj.data.partition import partition

TINY = dict(n_train=96, n_test=16, num_clients=8, clients_per_round=3, rounds=3, batch_size=8,
            alpha=0.5, seed=3, synthetic=True)  # fmt: skip


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
  path = tmp_path_factory.mktemp("peer") / "workload.npz"
  export.export(path, **TINY)
  return path


def test_export_round_trips_every_client_and_cohort(tiny):
  d = common.load_export(tiny)
  assert d["train_x"].shape == (96, 32, 32, 3) and d["train_x"].dtype == np.uint8
  assert d["test_x"].shape == (16, 32, 32, 3)
  # Every client's indices are exactly our partition of the exported labels, in order.
  parts = partition(d["train_y"], "dirichlet:0.5", 8, seed=3)
  assert len(d["clients"]) == 8
  for got, want in zip(d["clients"], parts, strict=True):
    np.testing.assert_array_equal(got, want)
  # The clients cover the train subset once (a partition, no example shared or lost).
  np.testing.assert_array_equal(np.sort(np.concatenate(d["clients"])), np.arange(96))
  # Every round's cohort is our sampler's, and distinct clients.
  fed = FederatedData(parts, 8)
  for r in range(3):
    np.testing.assert_array_equal(d["cohorts"][r], fed.sample_clients(r, 3, 3))
    assert len(set(d["cohorts"][r].tolist())) == 3
  s = d["settings"]
  assert (s["num_clients"], s["clients_per_round"], s["batch_size"], s["rounds"]) == (8, 3, 8, 3)
  assert s["client_sizes"]["min"] == min(len(c) for c in parts)


def test_export_refuses_impossible_sizes_before_reading_data(tmp_path):
  with pytest.raises(ValueError, match="clients_per_round=9 must be in"):
    export.export(tmp_path / "w.npz", **{**TINY, "clients_per_round": 9})
  with pytest.raises(ValueError, match="is a .npz"):
    export.export(tmp_path / "w.npy", **TINY)
  assert not list(tmp_path.iterdir())


def test_tree_cpu_seconds_counts_a_child_process():
  # A child that burns ~0.4 CPU seconds: the process tree's count must see it (the frameworks'
  # worker processes are children too), while the driver itself only waits.
  before = common.tree_cpu_seconds()
  burn = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.4: pass"
  child = subprocess.Popen([sys.executable, "-c", burn + "\ntime.sleep(0.3)"])
  time.sleep(0.35)
  while child.poll() is None and common.tree_cpu_seconds() - before < 0.3:
    time.sleep(0.02)
  during = common.tree_cpu_seconds() - before
  child.wait()
  assert during >= 0.3
  mb, kind = common.tree_memory_mb()
  assert kind in ("pss", "rss") and mb > 10


def test_round_paired_ratio_is_the_median_of_per_round_ratios():
  def runs(cpu):  # one run per alternation: rounds 0..3, round 0 the warm-up
    return [([{"round": r, "cpu_s": c, "wall_s": 2 * c, "train_gflop": 10.0} for r, c in
              enumerate(row)], {"startup_s": 1.0, "first_round_cpu_s": row[0],
              "first_round_wall_s": row[0], "peak_mem_mb": 5.0, "mem_kind": "pss",
              "accuracy": 0.1, "user_code_lines": 3}) for row in cpu]  # fmt: skip

  ours = [[9.0, 1.0, 2.0, 4.0], [9.0, 2.0, 2.0, 2.0]]
  other = [[9.0, 3.0, 3.0, 3.0], [9.0, 1.0, 8.0, 2.0]]
  table = run.summarize({"ours": runs(ours), "other": runs(other)}, warmup=1, peak_gflops=20.0)
  want = np.median(np.array(other)[:, 1:] / np.array(ours)[:, 1:])  # paired, warm-up dropped
  assert table["other"]["cpu_ratio_vs_ours"] == pytest.approx(want)
  assert table["other"]["cpu_s_per_round"] == pytest.approx(np.median(np.array(other)[:, 1:]))
  assert table["ours"]["cpu_ratio_vs_ours"] == pytest.approx(1.0)
  # GFLOP/s per round is its FLOPs over its CPU seconds; the share divides by the peak.
  gflops = np.median(10.0 / np.array(ours)[:, 1:])
  assert table["ours"]["achieved_gflops"] == pytest.approx(gflops)
  assert table["ours"]["share_of_peak"] == pytest.approx(gflops / 20.0)


def test_user_code_lines_counts_only_code_between_the_markers(tmp_path):
  f = tmp_path / "r.py"
  f.write_text(
    "import os\n# --- user code\nx = 1\n\n# a comment\ny = 2\n# --- end user code\nz = 3\n"
  )
  assert common.user_code_lines(str(f)) == 2


def _check_runner(module, tiny, tmp_path, system):
  out = tmp_path / f"{system}.jsonl"
  module.main(["--export", str(tiny), "--rounds", "2", "--out", str(out)])
  lines = [json.loads(x) for x in out.read_text().splitlines()]
  rounds, summary = lines[:-1], lines[-1]
  d = common.load_export(tiny)
  assert [x["round"] for x in rounds] == [0, 1]
  for x in rounds:
    assert x["system"] == system and x["cpu_s"] >= 0 and x["wall_s"] > 0
    assert x["examples"] == sum(len(d["clients"][c]) for c in d["cohorts"][x["round"]])
    assert np.isfinite(x["train_loss"])
  assert summary["summary"] and 0.0 <= summary["accuracy"] <= 1.0
  assert summary["user_code_lines"] > 10 and summary["peak_mem_mb"] > 0
  return summary


def test_ours_runner_on_a_tiny_workload(tiny, tmp_path):
  from benchmarks.perf.peer import ours

  summary = _check_runner(ours, tiny, tmp_path, "ours")
  assert summary["strategy"] in ("sequential", "vmap_scan", "chunked")
  assert summary["conv_impl"]


def test_torch_runner_on_a_tiny_workload(tiny, tmp_path):
  pytest.importorskip("torch", reason="the torch loop needs torch (pip install -e .[bench])")
  from benchmarks.perf.peer import torch_loop

  _check_runner(torch_loop, tiny, tmp_path, "torch")


def test_device_mode_dry_run_builds_every_command(tmp_path, capsys):
  for s in ("torch", "pfl", "flower"):  # stand-in environments: the dry run only names them
    (tmp_path / s / "bin").mkdir(parents=True)
    (tmp_path / s / "bin" / "python").touch()
  run.main(["--mode", "device", "--dry_run", "--envs", str(tmp_path)])
  plan = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
  assert [p["clients_per_round"] for p in plan["plan"]] == [10, 100, 500]
  for step in plan["plan"]:
    cpr = step["clients_per_round"]
    exp = step["export"]
    assert exp[exp.index("--clients_per_round") + 1] == str(cpr)
    assert int(exp[exp.index("--num_clients") + 1]) >= cpr
    assert [c[c.index("-m") + 1] for c in step["runs"]] == [
      "benchmarks.perf.peer.ours", "benchmarks.perf.peer.torch_loop", "benchmarks.perf.peer.pfl",
      "benchmarks.perf.peer.flower"]  # fmt: skip
    for c in step["runs"]:
      assert c[-2:] == ["--device", "cuda"] and "taskset" not in c
      assert c[c.index("--export") + 1] == exp[exp.index("--out") + 1]
  assert "tff" not in plan["not_run"]  # only asked-for systems are listed
  # "--envs -": a lent GPU machine's one Python runs every system.
  assert run.python_for("pfl", Path("-")) == sys.executable
  assert run.python_for("pfl", tmp_path) == str(tmp_path / "pfl" / "bin" / "python")
  with pytest.raises(SystemExit, match="unknown"):
    run.main(["--mode", "device", "--dry_run", "--systems", "ours,nope"])


def test_scaling_dry_run_takes_the_asked_cohorts(tmp_path, capsys):
  run.main(["--mode", "scaling", "--dry_run", "--envs", str(tmp_path), "--cohorts", "100,500"])
  plan = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
  assert [p["clients_per_round"] for p in plan["plan"]] == [100, 500]
  exp = plan["plan"][1]["export"]
  assert exp[exp.index("--min_size") + 1] == "5"  # 500 clients of 40 examples on average
