"""``python experiments/pmnist.py`` killed mid-task (SIGKILL, then SIGINT), resumed with
``--resume``, equals the uninterrupted run bit for bit.

Tiny fake MNIST (random 28x28 images), the smoke preset's MLP, FL (the cheapest to compile; the
methods' end-of-task state in a checkpoint is tests/training/test_continual_resume.py's), 2 tasks
of 12 rounds, a checkpoint every 3 rounds and at each task's end. One
run is SIGKILLed once its first checkpoint is on disk, resumed, stopped by SIGINT once a later
checkpoint is on disk (it finishes the running round, saves, names the task and round and the
resume command), and resumed to the end. Its accuracy matrix, ``final_variables.npz`` and
``metrics.jsonl`` (wall-clock fields aside) equal an uninterrupted run's: the same program, so
exactly equal (the runs share a persistent compilation cache, so they even run the same
executables).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from fedjax_proj.training.checkpoint import MANIFEST, comparable_metrics, load_variables

ROOT = Path(__file__).resolve().parents[2]
FLAGS = (
  "--preset=smoke",
  "--method=fl",
  "--num_clients=4",
  "--clients_per_round=2",
  "--num_tasks=2",
  "--rounds_per_task=12",
  "--checkpoint_every=3",
  "--eval_batch_size=50",
  "--progress=false",
)


def _env(cache: Path) -> dict:
  # One persistent compilation cache for the four runs: the later three load the executables the
  # first compiled (about half of each run's time here) instead of compiling them again.
  return {
    **os.environ,
    "JAX_PLATFORMS": "cpu",
    "JAX_COMPILATION_CACHE_DIR": str(cache),
    "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
    "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "0",
  }


def _data(root: Path) -> Path:
  rng = np.random.default_rng(0)
  root.mkdir()
  for split, n in (("train", 160), ("test", 40)):
    images = rng.integers(0, 256, (n, 28, 28, 1), dtype=np.uint8)
    np.savez(root / f"{split}.npz", image=images, label=np.arange(n) % 10)
  return root


def _cmd(data: Path, out: Path, *more: str) -> list[str]:
  script = str(ROOT / "experiments" / "pmnist.py")
  return [sys.executable, script, *FLAGS, f"--data_dir={data}", f"--output_dir={out}", *more]


def _start_and_signal(cmd, env, out: Path, after_round: int, sig: int):
  """Starts ``cmd`` and sends ``sig`` once the checkpoint of ``after_round`` or later exists."""
  proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
  deadline = time.monotonic() + 240
  while not any(
    int(p.parent.name) >= after_round for p in (out / "checkpoints").glob(f"[0-9]*/{MANIFEST}")
  ):
    assert proc.poll() is None, proc.communicate()[1][-3000:]
    assert time.monotonic() < deadline, "no checkpoint appeared"
    time.sleep(0.01)
  proc.send_signal(sig)
  _, err = proc.communicate(timeout=240)
  return proc.returncode, err


def test_sigkill_and_sigint_mid_task_then_resume_equal_the_uninterrupted_run(tmp_path):
  data, env = _data(tmp_path / "mnist"), _env(tmp_path / "jax_cache")
  full, cut = tmp_path / "full", tmp_path / "cut"
  # The uninterrupted reference is the entry point's main in this process (compiled with the
  # same flags as the script's processes, tests/conftest.py); the kills and resumes need processes.
  from fedjax_proj.configs import pmnist

  assert pmnist.main([*FLAGS, f"--data_dir={data}", f"--output_dir={full}"]) == 0

  rc, err = _start_and_signal(_cmd(data, cut), env, cut, 3, signal.SIGKILL)
  assert rc == -signal.SIGKILL and not (cut / "summary.json").exists(), err[-2000:]
  rc, err = _start_and_signal(_cmd(data, cut, "--resume"), env, cut, 15, signal.SIGINT)
  assert rc == 128 + signal.SIGINT, err[-3000:]
  assert "taking over the stale lock" in err  # the killed run's lock
  assert "resuming from the checkpoint of round" in err
  # What is on disk: the round, the task and the round within it, and the command to go on.
  # At once, which round (and task) it stops after; once saved, what is on disk.
  assert re.search(r"stopping after round \d+ \(task 2/2, round \d+/12 of the task", err), err
  assert "SIGINT received: stopped after round" in err and "(task 2/2, round" in err, err
  assert f"--output_dir={cut} --resume=true" in err
  assert not (cut / "summary.json").exists()

  done = subprocess.run(
    _cmd(data, cut, "--resume"), capture_output=True, text=True, timeout=240, env=env
  )
  assert done.returncode == 0, done.stderr[-3000:]
  a, b = (
    json.loads((full / "summary.json").read_text()),
    json.loads((cut / "summary.json").read_text()),
  )
  assert a["acc_matrix"] == b["acc_matrix"] and a["acc"] == b["acc"] and a["fgt"] == b["fgt"]
  assert comparable_metrics(cut) == comparable_metrics(full)
  va, vb = load_variables(full / "final_variables.npz"), load_variables(cut / "final_variables.npz")
  assert va.keys() == vb.keys() and all(np.array_equal(va[k], vb[k]) for k in va)


def test_resume_flags_parse_like_the_fl_entry_points(capsys):
  from fedjax_proj.configs import pmnist

  c = pmnist.parse(["--output_dir=d", "--resume", "--progress=false"], "", pmnist.get_config)
  assert c.resume is True and c.progress is False and c.checkpoint_every == 10
  with pytest.raises(SystemExit) as e:
    pmnist.parse(["--resume", "--output_dir="], "", pmnist.get_config)
  assert e.value.code == 2 and "--resume needs --output_dir" in capsys.readouterr().err
