"""The experiment entry point: a real run writes its files and learns; bad flags fail clearly."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from fedjax_proj.core.engine import choose_strategy
from tests.core.multiprocess import cpu_env

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "experiments" / "cifar10.py"


def _run(*args, timeout=300):
  return subprocess.run(
    [sys.executable, str(SCRIPT), *args],
    capture_output=True,
    text=True,
    timeout=timeout,
    env=cpu_env(),  # compiled with FAST_COMPILE, as every child process of the suite
  )


def _main(capsys, *args) -> tuple[int, str]:
  """The entry point's ``main`` in this process: (exit code, stderr). The refusals below are the
  parser's and the config's, and the runs below the runner's, the same code in a subprocess; a new
  Python process (2-3 s of CPU importing JAX) per test tested nothing more.
  test_digits_run_learns_and_writes_outputs starts the script for real."""
  from fedjax_proj.configs import cifar10

  try:
    code = cifar10.main(list(args))
  except SystemExit as e:  # argparse's errors
    code = e.code
  return code, capsys.readouterr().err


def test_digits_run_learns_and_writes_outputs(tmp_path):
  out = tmp_path / "run"
  proc = _run(
    "--preset=smoke",
    "--dataset=digits",
    "--model=mlp",
    "--rounds=6",
    "--local_epochs=2",
    "--partition=dirichlet:0.5",
    "--optimizer=sgd",
    "--lr=0.05",
    "--progress=false",
    f"--output_dir={out}",
  )
  assert proc.returncode == 0, proc.stderr[-3000:]
  # strategy=auto follows the measured table (fedjax_proj/core/strategy_table.json).
  auto = choose_strategy("auto", backend="cpu", has_conv=False, num_clients=2)
  assert f"backend=cpu devices=1 strategy={auto}" in proc.stdout
  lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
  assert [r["round"] for r in lines] == list(range(1, 7))
  assert all("train_loss" in r and "round_seconds" in r for r in lines)
  summary = json.loads((out / "summary.json").read_text())
  for key in ("final_test_accuracy", "rounds", "method", "seed", "wall_seconds"):
    assert key in summary
  assert summary["method"] == "fedavg" and summary["rounds"] == 6
  # 10 classes: chance is 0.1; six rounds of FedAvg on digits must be far above it.
  assert summary["final_test_accuracy"] > 0.6
  assert lines[-1]["train_loss"] < lines[0]["train_loss"]


@pytest.mark.parametrize(
  "flag, message",
  [
    ("--method=nope", "invalid choice"),
    ("--partition=dirichlet:abc", "dirichlet"),
    ("--strategy=fast", "invalid choice"),
    ("--clients_per_round=500", "clients_per_round"),
    ("--rounds=0", "rounds"),
  ],
)
def test_bad_flags_exit_nonzero_with_message(flag, message, capsys):
  code, err = _main(capsys, "--preset=smoke", "--dataset=digits", flag)
  assert code != 0
  assert message in err
  if "method" in flag:
    assert "fedavg" in err  # the valid choices are listed


def test_missing_data_names_offline_alternatives(tmp_path, capsys):
  empty = tmp_path / "empty"
  empty.mkdir()
  out = f"--output_dir={tmp_path / 'run'}"
  code, err = _main(capsys, "--preset=smoke", f"--data_dir={empty}", "--dataset=cifar10", out)
  assert code != 0
  assert "--data_dir" in err and "FEDJAX_PROJ_DATA_DIR" in err


@pytest.mark.parametrize("method", ["feddf", "fedproj"])
def test_public_data_methods_run_and_checkpoint(tmp_path, method, capsys):
  """The distillation family end to end through the runner, checkpoints included (the entry
  point's ``main`` in this process: the script itself runs in the first test above)."""
  out = tmp_path / method
  # A public set the clients do not hold (the runner refuses the private training set itself):
  # unlabelled images of digits' shape.
  public = tmp_path / "public.npz"
  rng = np.random.default_rng(0)
  np.savez(public, image=rng.integers(0, 17, (300, 8, 8, 1), dtype=np.uint8))
  code, err = _main(
    capsys,
    "--preset=smoke",
    "--dataset=digits",
    "--model=mlp",
    "--rounds=2",
    "--progress=false",
    f"--method={method}",
    f"--public_data={public}",
    "--memory_size=200",
    "--checkpoint_every=1",
    f"--output_dir={out}",
  )
  assert code == 0, err[-3000:]
  summary = json.loads((out / "summary.json").read_text())
  assert summary["final_test_accuracy"] is not None
  assert any((out / "checkpoints").iterdir())


def test_client_chunk_flag_matches_unchunked_run(tmp_path, capsys):
  """The flag's runs through the entry point's ``main`` in this process: what is tested is the
  flag's effect on the run, which the script runs the same way (the runs above start it)."""
  from fedjax_proj.configs import cifar10

  runs = {}
  for chunk in ("none", "2"):
    out = tmp_path / chunk
    code = cifar10.main(
      [
        "--preset=smoke",
        "--dataset=digits",
        "--model=mlp",
        "--rounds=2",
        "--progress=false",
        "--clients_per_round=4",
        f"--client_chunk={chunk}",
        f"--output_dir={out}",
      ]
    )
    captured = capsys.readouterr()
    assert code == 0, captured.err[-3000:]
    assert ("chunks of 2" in captured.out) == (chunk == "2")
    runs[chunk] = json.loads((out / "summary.json").read_text())["final_test_accuracy"]
  assert abs(runs["none"] - runs["2"]) < 1e-6
  code, err = _main(capsys, "--preset=smoke", "--dataset=digits", "--client_chunk=-3")
  assert code != 0 and "client_chunk" in err
