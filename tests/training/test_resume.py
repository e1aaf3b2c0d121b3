"""Kill a real run with SIGTERM after its first checkpoint, resume it, compare with a full run.

The entry point is ``experiments/cifar10.py`` on scikit-learn's digits with an MLP (fast, offline).
The resumed run must end with the same final parameters (``final_variables.npz``) and the same
``metrics.jsonl`` byte for byte once the wall-clock field ``round_seconds`` is dropped.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from fedjax_proj.training.checkpoint import MANIFEST, comparable_metrics, load_variables

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "experiments" / "cifar10.py"
FLAGS = (
  "--preset=smoke",
  "--dataset=digits",
  "--model=mlp",
  "--rounds=14",
  "--eval_every=4",
  "--optimizer=sgd",
  "--lr=0.05",
  "--progress=false",
)
ENV = {**os.environ, "JAX_PLATFORMS": "cpu"}


def _cmd(*args):
  return [sys.executable, str(SCRIPT), *FLAGS, *args]


def test_sigterm_after_first_checkpoint_then_resume_is_bit_exact(tmp_path):
  full, cut = tmp_path / "full", tmp_path / "cut"
  # The uninterrupted reference saves no checkpoints: checkpointing must not change the results.
  ref = subprocess.run(
    _cmd(f"--output_dir={full}", "--checkpoint_every=0"),
    capture_output=True,
    text=True,
    timeout=300,
    env=ENV,
  )
  assert ref.returncode == 0, ref.stderr[-3000:]
  assert not (full / "checkpoints").exists()

  proc = subprocess.Popen(
    _cmd(f"--output_dir={cut}", "--checkpoint_every=2", "--keep_checkpoints=2"),
    stdout=subprocess.PIPE,
    stderr=subprocess.PIPE,
    text=True,
    env=ENV,
  )
  deadline = time.monotonic() + 300
  while not list((cut / "checkpoints").glob(f"*/{MANIFEST}")):
    assert proc.poll() is None, proc.communicate()[1][-3000:]
    assert time.monotonic() < deadline, "no checkpoint appeared"
    time.sleep(0.02)
  proc.send_signal(signal.SIGTERM)
  _, err = proc.communicate(timeout=300)
  assert proc.returncode == 128 + signal.SIGTERM, err[-3000:]
  assert "SIGTERM received: stopped after round" in err
  assert f"--output_dir={cut} --resume=true" in err  # the message names the resume command
  stopped = [json.loads(x)["round"] for x in (cut / "metrics.jsonl").read_text().splitlines()]
  assert 2 <= stopped[-1] < 14 and not (cut / "summary.json").exists()

  resumed = subprocess.run(
    _cmd(f"--output_dir={cut}", "--checkpoint_every=2", "--keep_checkpoints=2", "--resume"),
    capture_output=True,
    text=True,
    timeout=300,
    env=ENV,
  )
  assert resumed.returncode == 0, resumed.stderr[-3000:]
  assert f"resuming from the checkpoint of round {stopped[-1]}" in resumed.stderr
  rounds = [json.loads(x)["round"] for x in (cut / "metrics.jsonl").read_text().splitlines()]
  assert rounds == list(range(1, 15))
  assert comparable_metrics(cut) == comparable_metrics(full)
  a, b = load_variables(full / "final_variables.npz"), load_variables(cut / "final_variables.npz")
  assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)
  summary = json.loads((cut / "summary.json").read_text())
  assert summary["resumed_from_round"] == stopped[-1]
  assert (
    summary["final_test_accuracy"]
    == json.loads((full / "summary.json").read_text())["final_test_accuracy"]
  )
  ckpts = sorted(int(p.name) for p in (cut / "checkpoints").iterdir() if p.name.isdigit())
  assert ckpts == [12, 14]  # keep_checkpoints=2, the final round always saved
