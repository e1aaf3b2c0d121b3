"""A Ctrl-C (or SIGTERM) while an entry point starts up, before round 1: one line, exit 128 + n.

Interrupting imports, data loading or compilation used to end in a KeyboardInterrupt traceback,
jax's atexit errors or a segmentation fault (fedjax_proj/configs/common.py, exit_on_interrupt).
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.core.multiprocess import cpu_env

ROOT = Path(__file__).resolve().parents[2]
SMOKE = ["--preset=smoke", "--dataset=digits", "--model=mlp", "--progress=false"]


def _catches(pid: int, signum: int) -> bool:
  """Whether process ``pid`` has a handler for ``signum`` (Linux: /proc/<pid>/status SigCgt)."""
  for line in Path(f"/proc/{pid}/status").read_text().splitlines():
    if line.startswith("SigCgt:"):
      return bool(int(line.split()[1], 16) >> (signum - 1) & 1)
  return False


@pytest.mark.skipif(not Path("/proc/self/status").is_file(), reason="reads /proc (Linux)")
@pytest.mark.parametrize(
  "moment, signum",
  [(0.0, signal.SIGINT), (0.7, signal.SIGINT), (1.5, signal.SIGTERM), ("held", signal.SIGINT)],
)
def test_a_stop_during_start_up_is_one_line_and_a_clean_exit_code(tmp_path, moment, signum):
  out = tmp_path / "run"
  proc = subprocess.Popen(
    [sys.executable, str(ROOT / "experiments" / "cifar10.py"), *SMOKE, f"--output_dir={out}"],
    stdout=subprocess.PIPE,
    stderr=subprocess.PIPE,
    text=True,
    env=cpu_env(),
  )
  try:
    # The script's first act is to take SIGTERM (Python itself already catches SIGINT), so
    # every moment is after that: seconds into the imports, or once the run holds its directory
    # (data loading and compilation follow).
    deadline = time.monotonic() + 60
    while proc.poll() is None and not _catches(proc.pid, signal.SIGTERM):
      assert time.monotonic() < deadline, "the entry point never installed its handler"
      time.sleep(0.01)
    while moment == "held" and proc.poll() is None and not (out / ".lock.json").exists():
      assert time.monotonic() < deadline, "the run never took its directory"
      time.sleep(0.01)
    time.sleep(0 if moment == "held" else moment)
    proc.send_signal(signum)
    stdout, stderr = proc.communicate(timeout=120)
  finally:
    proc.kill()
  name = signal.Signals(signum).name
  assert proc.returncode == 128 + signum, (proc.returncode, stderr)
  if "backend=" in stdout:  # a fast machine reached the rounds: the round loop's own stop
    assert "Traceback" not in stderr and "Segmentation" not in stderr, stderr
    return
  lines = stderr.strip().splitlines()
  assert len(lines) == 1, stderr
  # Before the flags are parsed the run directory is not known yet; after, the line names it.
  assert lines[0] in (
    f"aborted by {name} before round 1; nothing was written.",
    f"aborted by {name} before round 1; nothing was written to {out}; start the run again.",
  )
  assert not (out / "metrics.jsonl").exists()
