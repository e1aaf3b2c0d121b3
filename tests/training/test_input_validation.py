"""Every numeric setting is finite and in its declared range, checked before any data is loaded;
data-dependent settings before the model is built; an OSError becomes one line.

The ranges are declared once (training/fields.py's Field tables, the registry's HPARAM_RANGES and
a spec's ``ranges``); these tests probe the rule through the entry points, not one patch per flag.
"""

from __future__ import annotations

import errno
import math

import numpy as np
import pytest

from fedjax_proj.algorithms import registry
from fedjax_proj.configs import cifar10, common, pmnist
from fedjax_proj.core import ranges
from fedjax_proj.data.sources import load_sklearn
from fedjax_proj.training import experiment, inputs
from fedjax_proj.training.config import base_config, parse_method_kwargs

DIGITS = ("--preset=smoke", "--dataset=digits", "--model=mlp")


@pytest.fixture
def no_data(monkeypatch):
  """Fails the test if anything loads data."""

  def loaded(*args, **kwargs):
    raise AssertionError("data was loaded before the bad value was refused")

  monkeypatch.setattr(experiment, "load_dataset", loaded)
  monkeypatch.setattr(inputs, "load_dataset", loaded)


def _main(flags, tmp_path):
  return common.main(
    [*DIGITS, *flags, f"--output_dir={tmp_path / 'run'}"],
    "test",
    cifar10.get_config,
    {"method": common.parallel_methods()},
    prepare=cifar10.prepare,
  )


@pytest.mark.parametrize(
  "flags, message",
  [
    (["--lr=nan"], "--lr must be > 0, got nan (not a finite number)"),
    (["--lr=inf"], "--lr must be > 0, got inf (not a finite number)"),
    (["--server_lr=-inf"], "--server_lr must be > 0"),
    (["--momentum=1.5"], "--momentum must be in [0, 1), got 1.5"),
    (["--weight_decay=nan"], "--weight_decay must be >= 0, got nan"),
    (["--seed=-1"], "--seed must be in [0, 4294967295)"),
    (["--seed=1180591620717411303424"], "--seed must be in [0, 4294967295)"),
    (["--eval_batch_size=0"], "--eval_batch_size must be >= 1"),
    # Round r's key folds r in as a uint32: 2**32 rounds (indices 0..2**32-1) is the most.
    (["--rounds=100000000000000000000"], "--rounds must be in [1, 4294967296] (a whole number)"),
    (["--rounds=4294967297"], "as a 32-bit integer (core/random.py)"),
    (["--method=fedprox", "--method_kwargs=mu=nan"], "--method_kwargs mu must be >= 0, got nan"),
    (["--method=fedntd", "--method_kwargs=temperature=0"], "temperature must be > 0, got 0"),
    (["--method=fedprox", "--method_kwargs=mu=0.1,mu=0.2"], "gives mu twice (0.1 and '0.2')"),
    (
      ["--method=fedproj", "--memory_size=100", "--method_kwargs=memory_size=200"],
      "--memory_size=100 and --method_kwargs memory_size=200 disagree",
    ),
  ],
)
def test_bad_numbers_exit_2_before_any_data_loads(flags, message, tmp_path, capsys, no_data):
  with pytest.raises(SystemExit) as e:
    _main(flags, tmp_path)
  assert e.value.code == 2
  assert message in capsys.readouterr().err
  assert not (tmp_path / "run").exists()


def test_memory_size_in_method_kwargs_alone_becomes_the_flag(tmp_path):
  c = common.parse_config(
    [*DIGITS, "--method=fedproj", "--method_kwargs=memory_size=200"],
    "test",
    cifar10.get_config,
    {"method": common.parallel_methods()},
    cifar10.PRESETS,
  )
  assert c.memory_size == 200 and "memory_size" not in c.method_kwargs  # one source, recorded


@pytest.mark.parametrize(
  "flags, message",
  [
    (["--dropout=1.5,0.5"], "--dropout must be in [0, 1), got 1.5"),
    (["--lr=nan"], "--lr must be > 0, got nan"),
    (["--method=fot", "--method_kwargs=eps=inf"], "--method_kwargs eps must be in [0, 1], got inf"),
    (["--method_kwargs=eps=0.9,eps=0.8"], "gives eps twice"),
    (["--rounds_per_task=4294967297"], "--rounds_per_task must be in [1, 4294967296]"),
    (["--hidden=400,400", "--dropout=0.2,0.5,0.5"], "gives 3 rate(s) for the 2 hidden layer(s)"),
    (["--hidden=,"], "rate(s) for the 0 hidden layer(s) of --hidden=,; give one rate per"),
  ],
)
def test_continual_entry_refuses_bad_numbers_before_data(flags, message, capsys, monkeypatch):
  from fedjax_proj.data import sources

  monkeypatch.setattr(sources, "load_dataset", lambda *a, **k: pytest.fail("data loaded"))
  with pytest.raises(SystemExit) as e:
    pmnist.main(["--preset=smoke", *flags])
  assert e.value.code == 2
  assert message in capsys.readouterr().err


def test_every_declared_numeric_hyperparameter_refuses_nan_and_accepts_its_default():
  checked = 0
  for method in registry.methods(registry.FAMILIES):
    declared = registry.declared_hparams(method) or {}
    for key, default in declared.items():
      if not ranges.is_number(default):
        continue
      registry.check_hparams(method, {key: default})
      # A float's nan/inf fails the range rule; an int hyperparameter refuses any float first.
      why = "not a finite number" if isinstance(default, float) else "takes a int"
      for bad in (math.nan, math.inf):
        with pytest.raises(ValueError, match=f"{key}.*{why}"):
          registry.check_hparams(method, {key: bad})
      checked += 1
  assert checked > 40


def test_method_kwargs_parsing_refuses_malformed_pairs():
  assert parse_method_kwargs("a=1, b=x ,c=true") == {"a": 1, "b": "x", "c": True}
  with pytest.raises(ValueError, match="expects key=value pairs"):
    parse_method_kwargs("a=1,b")


def _digits_config(tmp_path, **fields):
  c = base_config()
  c.update(
    dataset="digits", model="mlp", num_clients=10, clients_per_round=2, rounds=1, local_epochs=1,
    batch_size=16, progress=False, output_dir=str(tmp_path / "run"),
  )  # fmt: skip
  c.update(fields)
  return c


def test_data_dependent_checks_come_before_the_model_is_built(tmp_path, monkeypatch, capsys):
  monkeypatch.setattr(experiment, "get_model", lambda *a, **k: pytest.fail("model was built"))
  train = load_sklearn("digits", "train")
  np.savez(tmp_path / "private.npz", image=train.images, label=train.labels)
  np.savez(tmp_path / "public.npz", image=load_sklearn("digits", "test").images)  # unlabelled
  for fields, message in [
    ({"batch_size": 100_000}, "--batch_size=100000 exceeds the largest client's data"),
    (
      {"method": "feddf", "public_data": str(tmp_path / "private.npz")},
      "examples are in the private training set",
    ),
  ]:
    with pytest.raises(ValueError, match=message):
      experiment.run_experiment(_digits_config(tmp_path, **fields))
  # The unlabelled public set is accepted (the docs call it unlabelled); a --public_size above
  # its size is capped with a note and recorded as used.
  c = _digits_config(
    tmp_path, method="feddf", public_data=str(tmp_path / "public.npz"), public_size=5000
  )
  got, size = inputs.public_inputs(c, train.images, 10, "digits")
  assert size == 360 and c.public_size == 360 and "public_labels" not in got
  assert "--public_size=5000 exceeds the public set" in capsys.readouterr().err


def test_an_os_error_is_one_line_naming_path_cause_and_what_is_on_disk(
  tmp_path, capsys, monkeypatch
):
  out = tmp_path / "run"

  def full_disk(config):
    out.mkdir()
    (out / "metrics.jsonl").write_text('{"round": 1, "train_lo')  # torn by the full disk
    raise OSError(errno.ENOSPC, "No space left on device", str(out / "metrics.jsonl"))

  monkeypatch.setattr(experiment, "run_experiment", full_disk)
  assert _main([], tmp_path) == 1
  err = capsys.readouterr().err
  assert err.count("\n") == 1 and "Traceback" not in err
  assert f"error: No space left on device (ENOSPC): {out / 'metrics.jsonl'}; free space" in err
  assert f"no checkpoint was saved in {out}" in err.lower()


def test_an_output_dir_name_too_long_is_one_line(tmp_path, capsys):
  long = tmp_path / ("x" * 300)
  code = common.main(
    [*DIGITS, f"--output_dir={long}"], "test", cifar10.get_config, {}, prepare=cifar10.prepare
  )
  err = capsys.readouterr().err
  assert code == 1 and err.count("\n") == 1
  assert "File name too long (ENAMETOOLONG)" in err and "shorter --output_dir" in err


def test_resume_on_a_folder_of_runs_names_them_not_an_empty_folder(tmp_path):
  from fedjax_proj.training import rundir

  for k in range(7):  # the runs' folder, as --output_dir=runs/<name> leaves it
    (tmp_path / f"run{k}" / "checkpoints" / "1").mkdir(parents=True)
  with pytest.raises(rundir.RunDirError) as e:
    rundir.check_run_dir(tmp_path, resume=True, overwrite=False)
  msg = str(e.value)
  assert "is empty" not in msg and "is not a run directory but holds 7 of them" in msg
  assert " and 2 more); pass the one to resume as --output_dir" in msg
  assert f"--output_dir={tmp_path}/run" in msg
  only_notes = tmp_path / "run0" / "checkpoints" / "1"  # neither a run nor a folder of runs
  (only_notes / "notes.txt").write_text("")
  with pytest.raises(rundir.RunDirError, match=r"holds no run files \(metrics.jsonl, checkpo"):
    rundir.check_run_dir(only_notes, resume=True, overwrite=False)
  (only_notes / "notes.txt").unlink()
  with pytest.raises(rundir.RunDirError, match=f"{only_notes} is empty, so there is nothing"):
    rundir.check_run_dir(only_notes, resume=True, overwrite=False)
