"""Failure handling: non-finite runs stop naming round and method and keep the last good checkpoint;
invalid configurations are rejected before the model is built or anything is compiled.
"""

from __future__ import annotations

import importlib
import re
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_proj.algorithms.base import make_round
from fedjax_proj.algorithms.fedavg import fedavg
from fedjax_proj.data.federated import FederatedData
from fedjax_proj.data.partition import PartitionError
from fedjax_proj.data.sources import load_dataset
from fedjax_proj.training import experiment, placement
from fedjax_proj.training.checkpoint import Checkpointer, config_fingerprint
from fedjax_proj.training.config import base_config, validate_config
from fedjax_proj.training.loop import NonFiniteError, train
from fedjax_proj.training.metrics import read_metrics
from fedjax_proj.training.session import RunIO
from tests import helpers

ROOT = Path(__file__).resolve().parents[2]


def _cifar10_entry_point():
  from fedjax_proj.configs import cifar10, common

  return cifar10, common


def test_nan_parameters_stop_the_run_and_keep_the_last_good_checkpoint(tmp_path):
  x, y = helpers.synthetic_data(64)
  fed = FederatedData(helpers.unequal_clients(64, (10, 20, 20, 14)), batch_size=8)
  model = helpers.tiny_model()
  alg = fedavg(model, helpers.sgd(0.1))
  round_fn = make_round(alg, "vmap_scan", helpers.float_batch_fn())

  def poisoned(state, rd, key):  # injects a NaN into the global model in round 4
    state, metrics = round_fn(state, rd, key)
    if int(state.round) == 4:
      params = state.variables["params"]
      params = {**params, "w1": params["w1"].at[0, 0].set(jnp.nan)}
      state = state._replace(variables={**state.variables, "params": params})
    return state, metrics

  checkpointer = Checkpointer(tmp_path / "checkpoints", config_fingerprint({"t": 1}))
  with pytest.raises(NonFiniteError) as e:
    train(
      alg,
      poisoned,
      fed,
      (x, y),
      None,
      None,
      model.init(jax.random.key(0), x[:2]),
      rounds=8,
      clients_per_round=2,
      seed=0,
      run=RunIO(output_dir=tmp_path, checkpointer=checkpointer, checkpoint_every=3, progress=False),
    )
  message = str(e.value)
  assert "Round 4 of fedavg produced non-finite global parameters" in message
  assert "last good checkpoint (round 3)" in message
  assert checkpointer.steps() == [3]
  state, meta = checkpointer.restore_latest(alg.init(model.init(jax.random.key(0), x[:2]), None))
  assert meta["round"] == 3 and all(np.isfinite(v).all() for v in jax.tree.leaves(state))
  assert [r["round"] for r in read_metrics(tmp_path)] == [1, 2, 3]  # the bad round is not logged
  assert not (tmp_path / "summary.json").exists()


def test_divergent_learning_rate_exits_3_naming_round_and_method(tmp_path, capsys):
  entry, common = _cifar10_entry_point()
  # SGD at lr=20 on digits diverges after a couple of finite rounds (round 3 with seed 0).
  flags = ["--preset=smoke", "--dataset=digits", "--model=mlp", "--optimizer=sgd", "--lr=20"]
  flags += ["--rounds=8", "--eval_every=8", "--checkpoint_every=1", "--progress=false"]
  rc = common.main([*flags, f"--output_dir={tmp_path}"], "", entry.get_config, {})
  assert rc == common.EXIT_NONFINITE == 3  # told apart from a refusal's 1
  err = capsys.readouterr().err
  found = re.search(r"Round (\d+) of fedavg produced non-finite train_loss", err)
  assert found and "Lower the learning rate" in err, err
  bad = int(found.group(1))
  assert bad >= 2, "diverged at once: the test no longer shows a checkpoint being kept"
  assert f"last good checkpoint (round {bad - 1}) is kept in {tmp_path}/checkpoints" in err
  checkpointer = Checkpointer(tmp_path / "checkpoints", {"hash": "", "config": {}})
  assert checkpointer.steps()[-1] == bad - 1
  assert len(read_metrics(tmp_path)) == bad - 1


@pytest.fixture
def no_compute(monkeypatch):
  """Fails the test if the model is built or a round is compiled."""

  def fail(*args, **kwargs):
    raise AssertionError("the model was built / the round compiled before the config was checked")

  monkeypatch.setattr(experiment, "get_model", fail)
  monkeypatch.setattr(placement, "make_round", fail)


def _config(**overrides):
  c = base_config()
  c.update(
    dataset="digits",
    model="mlp",
    num_clients=10,
    clients_per_round=2,
    rounds=2,
    local_epochs=1,
    progress=False,
  )
  method_kwargs = overrides.pop("method_kwargs", {})
  c.update(overrides)
  c.method_kwargs.update(method_kwargs)
  return c


@pytest.fixture
def small_public(tmp_path) -> Path:
  digits = load_dataset("digits", "test")
  path = tmp_path / "public.npz"
  np.savez(path, image=digits.images[:50], label=digits.labels[:50])
  return path


@pytest.mark.parametrize(
  "overrides, error, message",
  [
    ({"clients_per_round": 11}, ValueError, "lower clients_per_round or raise num_clients"),
    ({"partition": "dirichlet:0.5:500"}, PartitionError, "min_size"),
    ({"method": "fedproj"}, ValueError, "needs public data: pass --public_data"),
    ({"method": "fedproj", "public_size": 40, "memory_size": 41}, ValueError, "--public_size=40"),
    ({"method": "fedproj", "memory_size": 51}, ValueError, "size of the public set (50 examples)"),
    ({"resume": True, "output_dir": ""}, ValueError, "--resume needs --output_dir"),
    ({"checkpoint_every": -1}, ValueError, "--checkpoint_every must be >= 0"),
    ({"keep_checkpoints": 0}, ValueError, "--keep_checkpoints must be >= 1"),
  ],
)
def test_invalid_configuration_rejected_before_compute(
  overrides, error, message, no_compute, small_public, tmp_path
):
  if overrides.get("method") == "fedproj" and "memory_size" in overrides:
    overrides = {**overrides, "public_data": str(small_public)}
  c = _config(**{"output_dir": str(tmp_path / "run"), **overrides})
  with pytest.raises(error) as e:
    experiment.run_experiment(c, log=lambda *a: None)
  assert message in str(e.value)
  assert not (tmp_path / "run").exists()


def test_missing_tensorboardx_names_the_extra(monkeypatch, no_compute):
  monkeypatch.setitem(sys.modules, "tensorboardX", None)  # import fails as if not installed
  with pytest.raises(ValueError, match=r"pip install 'fedjax_proj\[tensorboard\]'"):
    validate_config(_config(tensorboard=True))


def test_resume_refuses_other_flags_and_a_new_run_replaces_a_finished_one(tmp_path, capsys):
  entry, common = _cifar10_entry_point()
  flags = ["--preset=smoke", "--dataset=digits", "--model=mlp", "--rounds=2", "--progress=false"]
  out = f"--output_dir={tmp_path}"
  assert common.main([*flags, out, "--checkpoint_every=1"], "", entry.get_config, {}) == 0
  assert common.main([*flags, out, "--lr=0.1", "--resume"], "", entry.get_config, {}) == 1
  assert "belong to another config (lr: 0.001 -> 0.1)" in capsys.readouterr().err
  # The same flags resume (nothing left to run) and rewrite the same outputs.
  assert common.main([*flags, out, "--resume", "--progress"], "", entry.get_config, {}) == 0
  assert "resuming from the checkpoint of round 2" in capsys.readouterr().err
  # Without --resume a finished run is replaced only with --overwrite (README, "Paper presets
  # and run management").
  new_run = [*flags, out, "--lr=0.1", "--checkpoint_every=0"]
  assert common.main(new_run, "", entry.get_config, {}) == 1
  assert "already holds a finished run" in capsys.readouterr().err
  assert common.main([*new_run, "--overwrite"], "", entry.get_config, {}) == 0
  assert "replacing the finished run" in capsys.readouterr().err
  assert not (tmp_path / "checkpoints").exists()


def _entry_point(name):
  return importlib.import_module(f"fedjax_proj.configs.{name}")


@pytest.mark.parametrize(
  "name, expected",
  [
    ("cifar100", dict(dataset="cifar100", model="resnet18", num_clients=50, clients_per_round=5)),
    ("cinic10", dict(dataset="cinic10", model="resnet18", num_clients=100, rounds=60)),
  ],
)
def test_paper_presets_are_valid_and_match_the_paper(name, expected):
  module = _entry_point(name)
  for preset in ("paper", "cpu", "smoke"):
    validate_config(module.get_config(preset))
  paper = module.get_config("paper")
  assert {k: paper[k] for k in expected} == expected
  assert paper.local_epochs == 20 and paper.partition == "dirichlet:0.3"


def test_cifar100_preset_names_the_public_set_it_expects(capsys, tmp_path):
  module = _entry_point("cifar100")
  from fedjax_proj.configs import common

  run = lambda *flags: common.main(
    ["--preset=smoke", *flags], "", module.get_config, {}, prepare=module.prepare
  )
  assert run("--method=fedproj") == 2
  assert "ImageNet-100 at 32x32" in capsys.readouterr().err
  public = tmp_path / "cifar100" / "public_20k.npz"  # exists (checked first), but is CIFAR-100
  public.parent.mkdir()
  public.write_bytes(b"")
  assert run("--method=fedproj", f"--public_data={public}") == 2
  assert "must be disjoint" in capsys.readouterr().err
  config = module.prepare(module.get_config("paper"))  # fedavg: no public set, no distillation
  assert "distill_epochs" not in config.method_kwargs
  config = module.get_config("paper")
  config.method, config.public_data = "feddf", "/data/imagenet100_32.npz"
  assert module.prepare(config).method_kwargs.distill_epochs == 3  # paper 001, Sec. 6


def test_cinic10_without_its_image_folder_gives_offline_instructions(tmp_path, capsys):
  module = _entry_point("cinic10")
  from fedjax_proj.configs import common

  rc = common.main(["--preset=smoke", f"--data_dir={tmp_path}"], "", module.get_config, {})
  assert rc == 1
  err = capsys.readouterr().err
  assert "cinic10" in err and "--data_dir" in err and "FEDJAX_PROJ_DATA_DIR" in err
