"""The Iris pilot runs end to end on a tiny budget and reports every method."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.core.multiprocess import cpu_env

ROOT = Path(__file__).resolve().parents[2]


def test_pilot_runs_and_writes_json(tmp_path):
  proc = subprocess.run(
    [
      sys.executable,
      str(ROOT / "experiments" / "pilot_iris.py"),
      "--rounds=2",
      "--local_epochs=1",
      # Unlabelled public data from a random start: round 1 has no ensemble to protect.
      "--public=gaussian",
      "--pretrain_steps=0",
      f"--output_dir={tmp_path}",
    ],
    capture_output=True,
    text=True,
    env=cpu_env(),  # FAST_COMPILE, as every child process of the suite
    timeout=600,
  )
  assert proc.returncode == 0, proc.stderr[-3000:]
  summary = json.loads((tmp_path / "pilot_iris.json").read_text())
  assert set(summary["final_global_accuracy"]) == {"fedavg", "feddf", "fedproj"}
  assert (tmp_path / "pilot_iris.png").stat().st_size > 10_000
  fp = summary["history"]["fedproj"]
  assert fp[0]["projected_fraction"] == 0.0 and "lmem_global" in fp[-1]
  # Round 1 has no ensemble yet, so the memory gradient is off and FedProj trains like FedAvg.
  assert (
    fp[0]["client_accuracy_all_data"] == summary["history"]["fedavg"][0]["client_accuracy_all_data"]
  )
  assert summary["per_seed"]["seeds"] == [0]
  assert summary["fedproj_minus_fedavg"]["per_seed"] == [
    summary["per_seed"]["fedproj"][0] - summary["per_seed"]["fedavg"][0]
  ]


def test_labelled_public_projects_from_round_one(tmp_path):
  # iris_labelled: g_mem is the CE on the labelled public points in every round (000 Algorithm 1
  # line 9), so FedProj projects already in round 1 and leaves FedAvg's trajectory. The pilot's
  # main in this process: the script itself runs above; a process per run paid the Python and JAX
  # start-up again for the same code.
  from fedjax_proj.configs import pilot_iris

  code = pilot_iris.main(
    [
      "--rounds=1",
      "--methods=fedavg,fedproj",
      "--public=iris_labelled",
      "--pretrain_steps=0",
      "--no_plot",
      f"--output_dir={tmp_path}",
    ]
  )
  assert code == 0
  summary = json.loads((tmp_path / "pilot_iris.json").read_text())
  assert summary["public_data"] == "iris_labelled"
  fp, avg = summary["history"]["fedproj"][0], summary["history"]["fedavg"][0]
  assert fp["projected_fraction"] > 0.0
  assert fp["client_accuracy_all_data"] != avg["client_accuracy_all_data"]
