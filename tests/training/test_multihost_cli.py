"""The experiment entry point as a 2-process job (jax.distributed, gloo over 127.0.0.1).

Both processes run ``experiments/cifar10.py`` (digits, MLP) with the client axis sharded over
their devices and the cohort in chunks (streaming aggregation): the result equals a plain
single-process run, only process 0 reports and writes, and the
job resumes from its (collectively written) checkpoint. Bad process flags fail before any compute.
"""

from __future__ import annotations

import json
import shutil
import sys

import jax
import ml_collections
import numpy as np
import pytest

from fedjax_proj.algorithms.fedavg import fedavg
from fedjax_proj.data.federated import FederatedData
from fedjax_proj.training.checkpoint import MANIFEST, comparable_metrics, load_variables
from fedjax_proj.training.config import base_config, validate_config
from fedjax_proj.training.loop import train
from fedjax_proj.training.placement import client_mesh_for
from fedjax_proj.training.session import RunIO
from tests import helpers
from tests.core.multiprocess import ROOT, free_port, run_processes

SCRIPT = ROOT / "experiments" / "cifar10.py"
FLAGS = (
  "--preset=smoke",
  "--dataset=digits",
  "--model=mlp",
  "--rounds=2",
  "--clients_per_round=4",
  "--optimizer=sgd",
  "--lr=0.05",
  "--progress=false",
)


def _launch_two(output_dir, *flags) -> list[tuple[str, str]]:
  port = free_port()
  common = [
    sys.executable,
    str(SCRIPT),
    *FLAGS,
    "--num_processes=2",
    f"--coordinator_address=127.0.0.1:{port}",
    "--cpu_collectives=gloo",
    f"--output_dir={output_dir}",
    "--client_chunk=2",  # 2 chunks, each with one client on each process
    *flags,
  ]
  return run_processes([[*common, f"--process_id={pid}"] for pid in (0, 1)])


def _max_diff(a: dict, b: dict) -> float:
  assert a.keys() == b.keys()
  return max(float(np.abs(a[k] - b[k]).max()) for k in a)


def test_two_processes_equal_one_process_and_resume(tmp_path):
  ref_dir, mp_dir = tmp_path / "single", tmp_path / "two"
  # The single-process reference is the entry point's main in this process (same flags, the same
  # compile flags as the suite's child processes, FAST_COMPILE): a process boundary is what the
  # two-process job tests, not what the reference needs.
  from fedjax_proj.configs import cifar10

  assert cifar10.main([*FLAGS, f"--output_dir={ref_dir}"]) == 0

  (out0, err0), (out1, err1) = _launch_two(mp_dir, "--checkpoint_every=1")
  assert "devices=2 processes=2" in out0 and "round 2/2" in out0
  assert "chunks of 2 (1 per device)" in out0
  assert "final_test_accuracy" in out0
  # Process 1 computes the same run but reports nothing (gloo's own connection line aside).
  for text in (out1, err1):
    for marker in ("backend=", "round ", "final_test_accuracy", "sharding"):
      assert marker not in text, text[-2000:]

  ref_vars = load_variables(ref_dir / "final_variables.npz")
  mp_vars = load_variables(mp_dir / "final_variables.npz")
  assert _max_diff(ref_vars, mp_vars) < 1e-5
  ref_metrics = [json.loads(x) for x in (ref_dir / "metrics.jsonl").read_text().splitlines()]
  mp_metrics = [json.loads(x) for x in (mp_dir / "metrics.jsonl").read_text().splitlines()]
  assert [m["round"] for m in mp_metrics] == [1, 2]  # one writer: no duplicated lines
  for a, b in zip(ref_metrics, mp_metrics, strict=True):
    for key in ("train_loss", "test_accuracy", "test_loss"):
      assert abs(a[key] - b[key]) < 1e-5, (key, a[key], b[key])
  assert mp_metrics[-1]["train_loss"] < mp_metrics[0]["train_loss"]  # it trained
  acc = json.loads((mp_dir / "summary.json").read_text())["final_test_accuracy"]
  ref_acc = json.loads((ref_dir / "summary.json").read_text())["final_test_accuracy"]
  assert abs(acc - ref_acc) < 1e-5 and acc > 0.15  # 10 classes: chance is 0.1

  # Checkpoints were written collectively, with process 0's manifest. Drop the last one and the
  # final outputs: the relaunched job resumes from round 1 and ends where the first one did.
  ckpts = mp_dir / "checkpoints"
  assert all((ckpts / str(step) / MANIFEST).exists() for step in (1, 2))
  first_metrics = comparable_metrics(mp_dir)
  shutil.rmtree(ckpts / "2")
  (mp_dir / "summary.json").unlink()
  (mp_dir / "final_variables.npz").unlink()
  (out0, err0), (out1, err1) = _launch_two(mp_dir, "--checkpoint_every=1", "--resume")
  assert "resuming from the checkpoint of round 1" in err0
  assert "resuming" not in err1
  assert _max_diff(mp_vars, load_variables(mp_dir / "final_variables.npz")) == 0.0
  assert comparable_metrics(mp_dir) == first_metrics
  assert json.loads((mp_dir / "summary.json").read_text())["resumed_from_round"] == 1


def test_only_process_0_writes(tmp_path, monkeypatch, capsys):
  """The loop on a process other than 0 writes no file and prints nothing (same computation)."""
  x, y = helpers.synthetic_data(n=60)
  model = helpers.tiny_model()
  fd = FederatedData(np.array_split(np.arange(60), 4), batch_size=5)
  alg = fedavg(model, helpers.sgd())
  variables = model.init(jax.random.key(0), x[:2])
  from fedjax_proj.algorithms.base import make_round

  def run(out):
    return train(
      alg,
      make_round(alg, "vmap_scan", helpers.float_batch_fn()),
      fd,
      (x, y),
      (x, y),
      lambda v, xs, ys: {"accuracy": 0.5, "loss": 1.0},
      variables,
      rounds=2,
      clients_per_round=2,
      seed=0,
      run=RunIO(
        output_dir=out,
        progress=True,
        tensorboard_dir=out / "tensorboard",
        handle_signals=False,
      ),
    )[1]

  assert run(tmp_path / "p0")["final_test_accuracy"] == 0.5
  assert {p.name for p in (tmp_path / "p0").iterdir()} >= {"metrics.jsonl", "summary.json"}
  capsys.readouterr()
  monkeypatch.setattr(jax, "process_index", lambda: 1)
  summary = run(tmp_path / "p1")
  assert summary["final_test_accuracy"] == 0.5  # it ran, and returns the same summary
  assert not (tmp_path / "p1").exists()
  captured = capsys.readouterr()
  assert captured.out == "" and captured.err == ""


def _config(**overrides) -> ml_collections.ConfigDict:
  c = base_config()
  c.dataset, c.output_dir = "digits", "/tmp/unused"
  c.update(overrides)
  return c


@pytest.mark.parametrize(
  "overrides, message",
  [
    ({"num_processes": 2, "process_id": 2, "coordinator_address": "h:1"}, "0..1"),
    ({"num_processes": 2, "process_id": 0}, "--coordinator_address=<host:port>"),
    ({"num_processes": 2, "coordinator_address": "h"}, "host:port"),
    ({"num_processes": 1, "process_id": 1}, "--num_processes > 1"),
    ({"num_processes": -1}, "num_processes"),
    ({"num_processes": 0, "coordinator_address": "h:1"}, "auto-detect|detect the cluster"),
    ({"num_processes": 2, "coordinator_address": "h:1", "output_dir": ""}, "--output_dir"),
    ({"num_processes": 2, "coordinator_address": "h:1", "shard_clients": False}, "shard_clients"),
    ({"num_processes": 2, "coordinator_address": "h:1", "strategy": "sequential"}, "vmap_scan"),
    ({"cpu_collectives": "nccl"}, "cpu_collectives"),
  ],
)
def test_bad_process_flags_are_refused(overrides, message):
  with pytest.raises(ValueError, match=message):
    validate_config(_config(**overrides))


def test_cohort_must_split_over_all_processes_devices(monkeypatch):
  monkeypatch.setattr(jax, "process_count", lambda: 2)
  monkeypatch.setattr(jax, "device_count", lambda: 4)
  with pytest.raises(ValueError, match="multiple of 4 clients per round"):
    client_mesh_for(_config(clients_per_round=6), "vmap_scan", print)
  with pytest.raises(ValueError, match="--strategy=vmap_scan"):
    client_mesh_for(_config(clients_per_round=8), "sequential", print)


def test_process_flags_reach_the_config_and_not_the_fingerprint():
  from fedjax_proj.configs import cifar10 as entry
  from fedjax_proj.configs import common

  argv = ["--num_processes=2", "--process_id=1", "--coordinator_address=h:9", "--output_dir=o"]
  c = common.parse_config(argv, "d", entry.get_config, {})
  assert (c.num_processes, c.process_id, c.coordinator_address) == (2, 1, "h:9")
  from fedjax_proj.training.checkpoint import config_fingerprint

  other = c.copy_and_resolve_references()
  other.process_id, other.coordinator_address = 0, "other:1"
  # The processes of one job (and a relaunch elsewhere) must accept each other's checkpoints.
  assert config_fingerprint(c.to_dict())["hash"] == config_fingerprint(other.to_dict())["hash"]
