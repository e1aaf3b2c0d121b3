"""Runs nobody can lose (README, "Paper presets and run management"):
one run per directory, no silent replacement or fresh start,
truthful interrupt messages, every bad input refused before compute with the problem and the fix.

Each test asserts the exit code, that the message names the problem and the fix, and that what was
on disk is unchanged. Runs are sklearn digits + MLP for a few rounds, in process except where two
real processes are the point.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from fedjax_proj.data.sources import resolve
from fedjax_proj.training import checkpoint as ckpt
from fedjax_proj.training import experiment, rundir
from fedjax_proj.training.estimate import estimate_run
from fedjax_proj.training.signals import AbortedBySignal, StopOnSignal

ROOT = Path(__file__).resolve().parents[2]
SMOKE = ["--preset=smoke", "--dataset=digits", "--model=mlp", "--progress=false"]


def _entry(name: str):
  return importlib.import_module(f"fedjax_proj.configs.{name}")


CIFAR10 = _entry("cifar10")
common = _entry("common")


def run(*flags: str) -> int:
  """experiments/cifar10.py in process."""
  return common.main(list(flags), "", CIFAR10.get_config, {"method": experiment.registry.methods()})


def snapshot(path: Path) -> dict[str, str]:
  """Every file under ``path`` (relative name -> SHA-256): equal snapshots = nothing changed."""
  if not path.exists():
    return {}
  return {
    str(p.relative_to(path)): hashlib.sha256(p.read_bytes()).hexdigest()
    for p in sorted(path.rglob("*"))
    if p.is_file() and p.name not in (rundir.LOCK_FILE,)
  }


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> Path:
  """A finished 2-round run with a checkpoint of each round (copied by the tests that need it)."""
  out = tmp_path_factory.mktemp("finished") / "run"
  assert run(*SMOKE, f"--output_dir={out}", "--checkpoint_every=1", "--eval_every=3") == 0
  return out


def _copy(src: Path, dst: Path) -> Path:
  shutil.copytree(src, dst)
  return dst


@pytest.fixture
def no_compute(monkeypatch):
  """Fails the test if a model is built (every refusal below must come first)."""

  def fail(*args, **kwargs):
    raise AssertionError("the model was built before the input was checked")

  monkeypatch.setattr(experiment, "get_model", fail)


# 1. One run per output directory. --------------------------------------------------------------


def test_second_process_into_a_running_directory_is_refused_naming_the_holder(tmp_path, capsys):
  out = tmp_path / "run"
  env = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": str(ROOT)}
  script = str(ROOT / "experiments" / "cifar10.py")
  flags = [*SMOKE, f"--output_dir={out}", "--rounds=100000", "--checkpoint_every=0"]
  first = subprocess.Popen(
    [sys.executable, script, *flags, "--method=fedavg"],
    env=env,
    stdout=subprocess.PIPE,
    stderr=subprocess.PIPE,
    text=True,
  )
  try:
    deadline = time.monotonic() + 120
    metrics = out / "metrics.jsonl"
    # Round 1 logged: the first run holds the lock and its signal handler is installed.
    while not (metrics.exists() and metrics.read_text().strip()):
      assert first.poll() is None, first.communicate()[1][-2000:]
      assert time.monotonic() < deadline, "the first run did not start within 120 s"
      time.sleep(0.2)
    # The second run is this process (the first is another one): a third process would only
    # add its start-up, while the first keeps training. One round: were it not refused, it would
    # end (and fail below) instead of training in this process for 100000 rounds.
    capsys.readouterr()
    code = run(*flags, "--rounds=1", "--method=fedprox")
    second_err = capsys.readouterr().err
  finally:
    first.send_signal(signal.SIGTERM)  # the first run stops after its round and saves
    _, first_err = first.communicate(timeout=120)
  assert code == 1, second_err[-2000:]
  assert f"is in use by another run (pid {first.pid}" in second_err
  assert "--method=fedavg" in second_err  # the holder's command
  assert "choose another --output_dir" in second_err
  # The first run was not disturbed: it stopped on SIGTERM with its own checkpoint and metrics.
  assert first.returncode == 128 + signal.SIGTERM, first_err[-2000:]
  rounds = rundir.checkpoint_rounds(out)
  meta = json.loads((out / "checkpoints" / str(rounds[-1]) / ckpt.MANIFEST).read_text())["meta"]
  assert meta["config"]["method"] == "fedavg"
  lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
  assert [r["round"] for r in lines] == list(range(1, rounds[-1] + 1))
  assert not (out / rundir.HOLDER_FILE).exists()  # released on exit


def test_stale_lock_of_a_dead_process_is_taken_over_with_a_message(tmp_path, capsys):
  out = tmp_path / "run"
  out.mkdir()
  dead = subprocess.run(
    [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True
  )
  pid = int(dead.stdout)
  holder = {"pid": pid, "host": "h", "started": "then", "command": "python old_run.py"}
  (out / rundir.HOLDER_FILE).write_text(json.dumps(holder))
  (out / rundir.LOCK_FILE).write_text("")
  assert run(*SMOKE, f"--output_dir={out}", "--rounds=1") == 0
  err = capsys.readouterr().err
  assert f"taking over the stale lock of {out} left by pid {pid}" in err
  assert "python old_run.py" in err and "no longer running" in err
  assert (out / "summary.json").exists() and not (out / rundir.HOLDER_FILE).exists()


def test_lock_held_in_this_process_refuses_a_second_holder(tmp_path):
  holder = rundir.RunLock(tmp_path, command="first command").acquire()
  with pytest.raises(rundir.RunDirError, match=f"pid {os.getpid()} .*first command"):
    rundir.RunLock(tmp_path).acquire()
  holder.release()
  rundir.RunLock(tmp_path).acquire().release()  # released: free again


# 2. --resume needs something to resume. ---------------------------------------------------------


@pytest.mark.parametrize("target", ["missing", "empty", "typo"])
def test_resume_without_a_checkpoint_is_refused_listing_nearby_runs(
  target, finished, tmp_path, capsys, no_compute
):
  neighbour = _copy(finished, tmp_path / "fedavg-run")
  before = snapshot(neighbour)
  out = tmp_path / {"missing": "nothing-here", "empty": "empty", "typo": "fedavg-rnu"}[target]
  if target == "empty":
    out.mkdir()
  assert run(*SMOKE, f"--output_dir={out}", "--resume") == 1
  err = capsys.readouterr().err
  assert "nothing to resume" in err and "check the path" in err.lower()
  assert str(neighbour) in err  # the run directories next to it are listed
  assert out.exists() == (target == "empty")  # a mistyped directory is not created
  assert snapshot(neighbour) == before


def test_resume_over_run_files_without_checkpoint_names_the_fresh_start(tmp_path, capsys):
  out = tmp_path / "run"
  out.mkdir()
  (out / "metrics.jsonl").write_text('{"round": 1}\n')
  assert run(*SMOKE, f"--output_dir={out}", "--resume") == 1
  err = capsys.readouterr().err
  assert "holds run files but no checkpoint" in err and "--overwrite" in err
  assert (out / "metrics.jsonl").read_text() == '{"round": 1}\n'


# 3./4. Interrupts say what happens and what is on disk. ----------------------------------------


def test_first_signal_prints_at_once_which_round_the_run_stops_after(capfd):
  with StopOnSignal(True) as stop:
    stop.round, stop.round_started, stop.round_seconds = 7, time.perf_counter(), 30.0
    os.kill(os.getpid(), signal.SIGINT)
    err = capfd.readouterr().err
    assert "stopping after round 7 (about 30 s); Ctrl-C again to abort" in err
    assert stop.signum == signal.SIGINT
    with pytest.raises(KeyboardInterrupt):
      os.kill(os.getpid(), signal.SIGINT)
  with StopOnSignal(True) as stop:  # first round: its time includes compilation, say so
    stop.round = 1
    os.kill(os.getpid(), signal.SIGINT)
    assert "stopping after round 1 (time unknown" in capfd.readouterr().err


def test_a_signal_during_a_checkpoint_names_the_round_the_run_stops_after(
  tmp_path, monkeypatch, capfd
):
  save = ckpt.Checkpointer.save

  def save_then_signal(self, round_idx, *args, **kwargs):
    path = save(self, round_idx, *args, **kwargs)
    if round_idx == 1:  # after round 1's signal check: the run goes on to round 2
      os.kill(os.getpid(), signal.SIGINT)
    return path

  monkeypatch.setattr(ckpt.Checkpointer, "save", save_then_signal)
  flags = [*SMOKE, f"--output_dir={tmp_path / 'run'}", "--rounds=3", "--checkpoint_every=1"]
  assert run(*flags) == 130
  err = capfd.readouterr().err
  assert "stopping after round 2" in err and "stopping after round 1" not in err
  assert "stopped after round 2/3" in err


@pytest.mark.parametrize("has_checkpoint", [True, False])
def test_second_interrupt_reports_what_is_actually_on_disk(
  has_checkpoint, finished, tmp_path, monkeypatch, capsys
):
  out = tmp_path / "run"
  if has_checkpoint:
    _copy(finished, out)
  before = snapshot(out)

  def aborted(config, log=print):
    raise AbortedBySignal("second signal 2: aborting without saving")

  monkeypatch.setattr(experiment, "run_experiment", aborted)
  assert run(*SMOKE, f"--output_dir={out}", "--resume" if has_checkpoint else "--rounds=2") == 130
  err = capsys.readouterr().err
  assert "aborted by a second interrupt" in err
  if has_checkpoint:
    assert f"the checkpoint of round 2 in {out}/checkpoints is intact" in err
    assert "--resume=true" in err  # the command to continue
  else:
    assert f"nothing was written to {out}" in err
    assert "is intact" not in err
  assert snapshot(out) == before


# 5. --dataset is checked against the data before the model is built. ---------------------------


def _npz(path: Path, shape, classes: int, n: int = 40) -> Path:
  path.mkdir(parents=True, exist_ok=True)
  rng = np.random.default_rng(0)
  for split in ("train", "test"):
    np.savez(
      path / f"{split}.npz",
      image=rng.integers(0, 255, (n, *shape), np.uint8),
      label=np.arange(n) % classes,
      num_classes=classes,
    )
  return path


def test_unknown_dataset_name_is_refused(tmp_path, capsys):
  data = _npz(tmp_path / "data", (32, 32, 3), 10)
  with pytest.raises(SystemExit) as e:
    run(*SMOKE[:1], "--dataset=bogus", f"--data_dir={data}", f"--output_dir={tmp_path / 'r'}")
  assert e.value.code == 2
  err = capsys.readouterr().err
  assert "Unknown --dataset 'bogus'" in err and "cifar10" in err
  assert "--dataset=<folder or .npz path>" in err
  assert not (tmp_path / "r").exists()


@pytest.mark.parametrize(
  "dataset, shape, classes, message",
  [
    ("cifar10", (28, 28, 1), 10, "expects examples of shape 32x32x3 and 10 classes"),
    ("cifar10", (32, 32, 3), 100, "has examples of shape 32x32x3 and 100 classes"),
  ],
)
def test_data_of_another_dataset_is_refused_before_the_model_is_built(
  dataset, shape, classes, message, tmp_path, capsys, no_compute
):
  data = _npz(tmp_path / "data", shape, classes)
  before = snapshot(data)
  out = tmp_path / "r"
  assert run(*SMOKE[:1], f"--dataset={dataset}", f"--data_dir={data}", f"--output_dir={out}") == 1
  err = capsys.readouterr().err
  assert message in err and "Point --data_dir at cifar10's data" in err
  assert snapshot(data) == before and not out.exists()


def test_sequential_fashion_mnist_on_cifar_shaped_data_is_refused(tmp_path, capsys, no_compute):
  data = _npz(tmp_path / "data", (32, 32, 3), 10)
  sequential = _entry("sequential")
  flags = ["--preset=smoke", "--dataset=fashion_mnist", f"--data_dir={data}"]
  assert sequential.main([*flags, f"--output_dir={tmp_path / 'r'}"]) == 1
  err = capsys.readouterr().err
  assert "--dataset=fashion_mnist expects examples of shape 28x28x1" in err and "32x32x3" in err


# 6./+ Resume keeps the total wall time and extends runs bit-exactly. ----------------------------


def test_resume_keeps_total_wall_seconds_and_extends_bit_exactly(finished, tmp_path, capsys):
  first = json.loads((finished / "summary.json").read_text())["wall_seconds"]
  out = _copy(finished, tmp_path / "extended")
  assert (
    run(*SMOKE, f"--output_dir={out}", "--checkpoint_every=1", "--eval_every=3", "--resume") == 0
  )
  again = json.loads((out / "summary.json").read_text())["wall_seconds"]
  assert first <= again < first + 60  # the finished run's time, not the resume's fraction of it
  flags = [*SMOKE, "--checkpoint_every=1", "--eval_every=3", "--rounds=4"]
  assert run(*flags, f"--output_dir={out}", "--resume") == 0
  assert "extending the run from 2 to 4 rounds" in capsys.readouterr().err
  assert json.loads((out / "summary.json").read_text())["wall_seconds"] > again
  fresh = tmp_path / "fresh"
  assert run(*flags, f"--output_dir={fresh}") == 0
  # Round 2 was evaluated only as the old last round; a 4-round run evaluates at 3 and 4 only.
  assert ckpt.comparable_metrics(out) == ckpt.comparable_metrics(fresh)
  a = ckpt.load_variables(out / "final_variables.npz")
  b = ckpt.load_variables(fresh / "final_variables.npz")
  assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)


def test_resume_cannot_shorten_a_run(finished, tmp_path, capsys):
  out = _copy(finished, tmp_path / "run")
  before = snapshot(out)
  assert run(*SMOKE, f"--output_dir={out}", "--eval_every=3", "--rounds=1", "--resume") == 1
  err = capsys.readouterr().err
  assert "beyond --rounds=1: a run cannot be shortened" in err and "--rounds >= 2" in err
  assert snapshot(out) == before


# 7. A finished run is replaced only with --overwrite. --------------------------------------------


def test_rerun_into_a_finished_run_needs_overwrite(finished, tmp_path, capsys):
  out = _copy(finished, tmp_path / "run")
  before = snapshot(out)
  assert run(*SMOKE, f"--output_dir={out}", "--lr=0.01") == 1
  err = capsys.readouterr().err
  assert "already holds a finished run" in err and "--overwrite" in err
  assert "--resume --rounds=<more>" in err
  assert snapshot(out) == before
  assert run(*SMOKE, f"--output_dir={out}", "--lr=0.01", "--overwrite", "--rounds=1") == 0
  summary = json.loads((out / "summary.json").read_text())
  assert summary["rounds"] == 1 and summary["config"]["lr"] == 0.01
  assert rundir.checkpoint_rounds(out) == [1]  # the old run's checkpoints are gone


def test_resume_and_overwrite_together_are_refused(finished, tmp_path, capsys):
  out = _copy(finished, tmp_path / "run")
  before = snapshot(out)
  assert run(*SMOKE, f"--output_dir={out}", "--resume", "--overwrite") == 1
  assert "pass only one" in capsys.readouterr().err
  assert snapshot(out) == before


# Clear errors instead of tracebacks or silence. --------------------------------------------------


@pytest.mark.parametrize(
  "flag, message",
  [
    ("--lr=0", "--lr must be > 0"),
    ("--lr=-0.1", "--lr must be > 0"),
    ("--train_subset=-5", "--train_subset must be >= 0 (a whole number), got -5. Pass a number"),
    ("--test_subset=-1", "--test_subset must be >= 0"),
    ("--method_kwargs=nu=0.1", "unknown key(s) nu for --method=fedavg; fedavg accepts: (none)"),
    ("--num_client=5", "unrecognized arguments: --num_client=5"),
    ("--out=x", "unrecognized arguments: --out=x"),
  ],
)
def test_bad_flag_exits_2_naming_problem_and_fix(flag, message, tmp_path, capsys):
  out = tmp_path / "r"
  with pytest.raises(SystemExit) as e:
    run(*SMOKE, flag, f"--output_dir={out}")
  assert e.value.code == 2
  assert message in capsys.readouterr().err
  assert not out.exists()


@pytest.mark.parametrize(
  "kwargs, message",
  [
    ("mu=0.1,nu=2", "unknown key(s) nu for --method=fedprox; fedprox accepts: mu=0.01"),
    ("mu=abc", "mu='abc' is a str but fedprox's mu takes a float (default 0.01)"),
  ],
)
def test_method_kwargs_list_the_methods_keys_and_defaults(kwargs, message, tmp_path, capsys):
  with pytest.raises(SystemExit) as e:
    run(*SMOKE, "--method=fedprox", f"--method_kwargs={kwargs}", f"--output_dir={tmp_path}/r")
  assert e.value.code == 2
  assert message in capsys.readouterr().err


def test_missing_public_data_path_names_the_flag(tmp_path, capsys):
  with pytest.raises(SystemExit) as e:
    run(
      *SMOKE, "--method=feddf", f"--public_data={tmp_path}/nope.npz", f"--output_dir={tmp_path}/r"
    )
  assert e.value.code == 2
  err = capsys.readouterr().err
  assert f"--public_data={tmp_path}/nope.npz does not exist" in err and "cifar100" in err
  assert "--data_dir" not in err.strip().splitlines()[-1]  # the error line, not the usage


@pytest.mark.parametrize("kind", ["file", "under_a_file", "read_only"])
def test_unusable_output_dir_is_refused_before_compute(kind, tmp_path, capsys, no_compute):
  target = tmp_path / "taken.txt"
  target.write_text("keep me")
  if kind == "file":
    out, problem = target, "is a file, not a directory"
  elif kind == "under_a_file":
    out, problem = target / "run", "is not writable"
  else:
    if os.geteuid() == 0:  # root writes through permission bits: use a read-only filesystem
      out = Path("/sys/fedjax_proj_test_run")
      if not Path("/sys").is_dir():
        pytest.skip("no read-only /sys to write into")
    else:
      ro = tmp_path / "ro"
      ro.mkdir(mode=0o500)
      out = ro / "run"
    problem = "is not writable"
  assert run(*SMOKE, f"--output_dir={out}") == 1
  err = capsys.readouterr().err
  assert problem in err and ("choose a directory" in err)
  assert "Traceback" not in err
  assert target.read_text() == "keep me"


def test_explicit_data_dir_without_data_never_falls_back_to_tfds(tmp_path, monkeypatch, capsys):
  def no_tfds(*args, **kwargs):
    raise AssertionError("TFDS was tried despite an explicit --data_dir")

  monkeypatch.setattr(resolve, "load_tfds", no_tfds)
  empty = tmp_path / "empty"
  empty.mkdir()
  out = tmp_path / "r"
  assert run("--preset=smoke", f"--data_dir={empty}", f"--output_dir={out}") == 1
  err = capsys.readouterr().err
  assert f"--data_dir={empty} holds no data for 'cifar10'" in err and "train.npz" in err
  assert not out.exists() and list(empty.iterdir()) == []


def test_pmnist_zero_tasks_and_contradictory_split_flags(capsys):
  pmnist = _entry("pmnist")
  for flags, message in [
    (["--num_tasks=0"], "--num_tasks must be >= 1 (a whole number), got 0."),
    (["--iid", "--noniid"], "--iid and --noniid contradict each other; pass one of them"),
    (["--num_task=3"], "unrecognized arguments: --num_task=3"),
  ]:
    with pytest.raises(SystemExit) as e:
      pmnist.main(["--preset=smoke", *flags])
    assert e.value.code == 2
    assert message in capsys.readouterr().err


def test_no_prefix_matching_in_sequential_and_plot(capsys):
  with pytest.raises(SystemExit) as e:
    _entry("sequential").main(["--preset=smoke", "--datase=cifar10"])
  assert e.value.code == 2 and "unrecognized arguments: --datase" in capsys.readouterr().err
  from fedjax_proj import plot

  with pytest.raises(SystemExit) as e:
    plot.main(["somewhere", "--ou=x.png"])
  assert e.value.code == 2 and "unrecognized arguments: --ou" in capsys.readouterr().err


# Honest progress and budgets. --------------------------------------------------------------------


def test_estimate_is_printed_before_round_1(tmp_path, monkeypatch, capsys):
  monkeypatch.setattr(experiment, "ETA_PROBE_MIN_STEPS", 0)
  assert run(*SMOKE, f"--output_dir={tmp_path}/r", "--rounds=1") == 0
  out = capsys.readouterr().out
  estimate = out.index("estimated time: about")
  assert estimate < out.index("final_test_accuracy")
  assert "local steps of batch 64 at" in out
  # It times the method's own step and says the server's work is not in it.
  assert "fedavg's own step" in out and "distillation comes on top" in out


def test_estimate_over_an_hour_on_cpu_suggests_the_cpu_preset():
  class Fed:
    num_steps = 50

  c = CIFAR10.get_config("paper")  # 100 rounds x 10 clients x 50 steps = 50,000 steps
  text = estimate_run(c, Fed(), step_seconds=0.36)
  assert "about 5.0 h for 100 rounds (50,000 local steps of batch 64 at 360.0 ms each" in text
  assert "more than an hour on CPU" in text and "--preset=cpu" in text
  assert "warning" not in estimate_run(c, Fed(), step_seconds=0.036)  # 30 min
  Fed.sizes, Fed.steps_for = (10, 30), staticmethod(lambda n: n)  # unpadded: the mean client
  assert "(20,000 local steps" in estimate_run(c, Fed(), 0.36, padded=False)


def test_smoke_preset_caps_the_public_set_and_fedprojs_memory_batch():
  c = common.parse_config(
    ["--preset=smoke", "--method=fedproj", "--public_data=cifar100"], "", CIFAR10.get_config, {}
  )
  assert c.public_size == 512 and c.memory_size == 256
  assert c.method_kwargs.memory_batch_size == 64
  c = common.parse_config(
    ["--preset=smoke", "--method=fedproj", "--method_kwargs=memory_batch_size=32"],
    "",
    CIFAR10.get_config,
    {},
  )
  assert c.method_kwargs.memory_batch_size == 32  # the user's value wins
  c = common.parse_config(["--preset=smoke", "--method=fedavg"], "", CIFAR10.get_config, {})
  assert "memory_batch_size" not in c.method_kwargs  # fedavg does not take it


# Install and ecosystem. --------------------------------------------------------------------------


def test_dependencies_declare_what_runs_need_and_tests_are_an_extra():
  tomllib = pytest.importorskip("tomllib")  # Python 3.11+
  project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
  names = {d.split(">")[0].split("[")[0].strip().lower() for d in project["dependencies"]}
  assert {"filelock", "importlib_resources", "tensorflow-datasets"} <= names
  assert not {"pytest", "pytest-xdist"} & names
  test = {d.split(">")[0].strip().lower() for d in project["optional-dependencies"]["test"]}
  assert {"pytest", "pytest-xdist"} <= test


def test_every_flag_says_what_it_does_and_its_default(capsys):
  parser = common.build_parser("", CIFAR10.get_config, {"method": experiment.registry.methods()})
  for action in parser._actions:
    if action.dest == "help":
      continue
    assert action.help and len(action.help) > 20, action.dest
    if action.dest != "method_kwargs":
      assert "default" in action.help, action.dest
  helps = {a.dest: a.help for a in parser._actions}
  assert "dirichlet:<beta>[:<min_size>]" in helps["partition"] and "exdir:" in helps["partition"]
  for method in experiment.registry.methods():
    assert f"{method}: " in helps["method_kwargs"]
  assert "fedprox: mu=0.01" in helps["method_kwargs"] and "key=value" in helps["method_kwargs"]
  readme = (ROOT / "README.md").read_text()
  assert "--method_kwargs" in readme and "--overwrite" in readme
