"""FOT's entry points against the paper (docs/reproduction.md, "FOT (paper 003)").

* The ``paper`` presets of ``experiments/pmnist.py`` and ``experiments/split_cifar100.py`` and
  their per-method hyperparameters equal the tables' ``ours`` column (drift fails).
* Every method x every preset of both entry points parses and builds; at smoke size every method
  completes its rounds on a tiny synthetic data set.
* Conformance: every method of ``pmnist.py`` beats chance (10%) clearly on real MNIST at a small
  budget (skipped when ../shared/data/mnist is absent).
"""

from __future__ import annotations

import functools
import importlib
import json
import os
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_proj.data.sources.resolve import find_shared_data
from tests.paper_table import check_table, read_tables

REPO = Path(__file__).resolve().parents[2]
pmnist = importlib.import_module("fedjax_proj.configs.pmnist")
split_cifar100 = importlib.import_module("fedjax_proj.configs.split_cifar100")
continual_tasks = importlib.import_module("fedjax_proj.training.continual_tasks")

ENTRY = {"pmnist": pmnist, "split_cifar100": split_cifar100}
METHODS = ("fl", "ewc", "er", "rgo", "gpm", "fot")
# ../shared/data/mnist beside the checkout (find_shared_data), unless $FEDJAX_MNIST_DIR names one.
_SHARED = find_shared_data()
MNIST_DIR = Path(
  os.environ.get("FEDJAX_MNIST_DIR") or (_SHARED / "mnist" if _SHARED else "/nonexistent")
)


def _model(name: str, c):
  from fedjax_proj.models import mlp, multi_head

  if name == "pmnist":
    hidden = tuple(int(h) for h in c.hidden.split(","))
    dropout = tuple(float(d) for d in c.dropout.split(","))
    return mlp(10, hidden=hidden, dropout=dropout), jnp.zeros((2, 28, 28, 1))
  model = multi_head("alexnet", 10, 10, head_bias=False, norm=c.norm, fc_features=c.fc_features)
  return model, jnp.zeros((2, 32, 32, 3))


def _resolver(name: str, preset: str = "paper"):
  """``key`` -> value: a config field, ``params``, or ``method.kwarg`` (``@iid`` for IID)."""
  module = ENTRY[name]

  def resolve(key: str):
    key, _, mode = key.partition("@")
    c = module.get_config(preset)
    c.iid = mode == "iid"
    if key in ("hidden", "dropout"):
      return tuple(float(v) if "." in v else int(v) for v in c[key].split(","))
    if key == "params":
      from fedjax_proj.models.base import count_params

      model, x = _model(name, c)
      return count_params(model.init(jax.random.key(0), x))
    if "." in key:
      c.method, kwarg = key.split(".", 1)
      return module.method_defaults(c)[kwarg]
    return c[key]

  return resolve


@pytest.mark.parametrize(
  "table,name",
  [
    ("pmnist-paper", "pmnist"),
    ("pmnist-methods", "pmnist"),
    ("split_cifar100-paper", "split_cifar100"),
    ("split_cifar100-methods", "split_cifar100"),
  ],
)
def test_paper_preset_matches_reproduction_table(table, name):
  rows = read_tables()[table]
  assert check_table(rows, _resolver(name)) >= 5


def test_fl_runs_the_papers_shorter_schedule():
  from fedjax_proj.training.continual import rounds_schedule

  c = pmnist.get_config("paper")
  # F.4: FL runs 200 + 9 x 100 = 1100 rounds, every other method 10 x 200 = 2000.
  assert sum(rounds_schedule("fl", c.rounds_per_task, 10, c.fl_later_rounds)) == 1100
  assert sum(rounds_schedule("fot", c.rounds_per_task, 10, c.fl_later_rounds)) == 2000
  c = split_cifar100.get_config("paper")
  assert rounds_schedule("fl", c.rounds_per_task, 10, c.fl_later_rounds) == [1000] * 10


@pytest.mark.parametrize("name", ["pmnist", "split_cifar100"])
@pytest.mark.parametrize("preset", pmnist.PRESETS)
def test_every_method_parses_under_every_preset(name, preset):
  """Each preset's config parses, and the method accepts every hyperparameter it is given."""
  from fedjax_proj.algorithms import registry

  module = ENTRY[name]
  for method in METHODS:
    c = pmnist.parse(
      [f"--preset={preset}", f"--method={method}", "--output_dir=unused"],
      "test",
      module.get_config,
      module.method_defaults,
      module.FIELDS,
    )
    assert c.clients_per_round <= c.num_clients and c.rounds_per_task >= 1
    # A misspelt, unknown or mistyped key in method_defaults raises here, not after compiling.
    registry.check_hparams(method, dict(c.method_kwargs))


def _fake_npz(path: Path, n: int, shape, classes: int, seed: int):
  rng = np.random.default_rng(seed)
  images = rng.integers(0, 256, (n, *shape), dtype=np.uint8)
  np.savez(path, image=images, label=(np.arange(n) % classes).astype(np.int64))


@pytest.fixture(scope="module")
def tiny_data(tmp_path_factory):
  root = tmp_path_factory.mktemp("tiny")
  (root / "mnist").mkdir()
  _fake_npz(root / "mnist" / "train.npz", 160, (28, 28, 1), 10, 0)
  _fake_npz(root / "mnist" / "test.npz", 40, (28, 28, 1), 10, 1)
  _fake_npz(root / "cifar100.npz", 400, (32, 32, 3), 100, 2)
  return {"pmnist": root / "mnist", "split_cifar100": root / "cifar100.npz"}


# Every method at pmnist's smoke size; on split_cifar100 (an AlexNet, whose compiles dominate: EWC
# 112 s, GPM 64 s and FOT 60 s on one loaded core) FL and ER, which run the AlexNet task loop.
# EWC's per-example conv Fisher, GPM's conv bases and FOT's conv subspaces run in
# tests/algorithms/continual (test_task_loop_runs_every_method on a conv backbone), and their
# split_cifar100 hyperparameters in test_every_method_parses_under_every_preset.
# RGO's task loop runs there too, and its PMNIST entry point in the real-MNIST test below.
SMOKE_CASES = [("pmnist", m) for m in METHODS if m != "rgo"]
SMOKE_CASES += [("split_cifar100", m) for m in ("fl", "er")]


@pytest.mark.parametrize("name,method", SMOKE_CASES)
def test_smoke_preset_completes_every_method(name, method, tiny_data, tmp_path):
  out = tmp_path / "run"
  argv = [
    "--preset=smoke",
    f"--method={method}",
    f"--data_dir={tiny_data[name]}",
    f"--output_dir={out}",
    "--eval_batch_size=50",
    "--num_tasks=2",
    "--rounds_per_task=1",
  ]
  assert ENTRY[name].main(argv) == 0
  summary = json.loads((out / "summary.json").read_text())
  k = summary["num_tasks"]
  final = [row[-1] for row in summary["acc_matrix"]]  # every task after the last one
  assert len(final) == k and all(0 <= a <= 1 for a in final)
  lines = [json.loads(s) for s in (out / "metrics.jsonl").read_text().splitlines()]
  assert sum("task_end" in r for r in lines) == k


def test_split_cifar100_builds_the_placements_convolution(tiny_data, monkeypatch):
  # build takes the backend's conv_impl (on CPU onednn where it loads, else gemm_grad), as
  # the one-task runner does: an impl the model refuses, planted in the placement, must reach it.
  c = split_cifar100.get_config("smoke")
  c.data_dir = str(tiny_data["split_cifar100"])
  _, model, _ = continual_tasks.build_split_cifar100(c)
  jax.eval_shape(model.init, jax.random.key(0), jnp.zeros((1, 32, 32, 3)))
  monkeypatch.setattr(continual_tasks, "conv_impl_choice", lambda: ("fft", None))
  _, model, _ = continual_tasks.build_split_cifar100(c)
  with pytest.raises(ValueError, match="conv impl"):
    jax.eval_shape(model.init, jax.random.key(0), jnp.zeros((1, 32, 32, 3)))


@pytest.mark.skipif(not (MNIST_DIR / "train.npz").exists(), reason=f"no MNIST at {MNIST_DIR}")
@pytest.mark.parametrize("method", METHODS)
def test_every_pmnist_method_beats_chance_on_real_mnist(method, tmp_path):
  # 2 tasks, 10 clients (5 per round), 4 rounds of 2 local epochs on 2,000 examples per task.
  argv = [
    "--preset=smoke",
    f"--method={method}",
    f"--data_dir={MNIST_DIR}",
    f"--output_dir={tmp_path}",
    "--num_tasks=2",
    "--rounds_per_task=4",
    "--local_epochs=2",
    "--lr=0.05",
    "--train_per_task=2000",
    "--test_per_task=500",
    "--iid",
  ]
  assert pmnist.main(argv) == 0
  summary = json.loads((tmp_path / "summary.json").read_text())
  # Chance is 10% on every task. ACC must be 4x chance and every task's final accuracy 2x chance
  # (forgetting may pull task 1 down: ER with 1 example per client lost 0.756 -> 0.366 once).
  final = [row[-1] for row in summary["acc_matrix"]]
  assert summary["acc"] > 0.4 and min(final) > 0.2, summary["acc_matrix"]


def test_continual_run_directory_is_never_overwritten_silently(tiny_data, tmp_path, capsys):
  from fedjax_proj.training.rundir import RunLock

  out = tmp_path / "run"
  argv = [
    "--preset=smoke",
    "--method=fl",
    f"--data_dir={tiny_data['pmnist']}",
    f"--output_dir={out}",
    "--num_tasks=1",
    "--rounds_per_task=1",
  ]
  assert pmnist.main(argv) == 0
  before = (out / "summary.json").read_bytes()
  capsys.readouterr()
  assert pmnist.main([*argv[:1], "--method=fot", *argv[2:]]) == 1
  err = capsys.readouterr().err
  assert "already holds a finished run" in err and "--overwrite" in err
  assert (out / "summary.json").read_bytes() == before
  with RunLock(out, command="another run"):  # a second writer holds the directory
    assert pmnist.main([*argv, "--overwrite"]) == 1
  assert str(os.getpid()) in capsys.readouterr().err
  assert (out / "summary.json").read_bytes() == before
  assert pmnist.main([*argv[:1], "--method=fot", *argv[2:], "--overwrite"]) == 0
  assert json.loads((out / "summary.json").read_text())["method"] == "fot"


def test_threshold_rule_follows_the_text_and_paper_code_follows_the_authors(capsys):
  """003 Sec. 4.1.2's energy rule by default; ``paper_code`` is the authors' ε' (docs/fot.md)."""

  def fot_kwargs(module, preset, *flags):
    argv = [f"--preset={preset}", "--method=fot", "--output_dir=unused", *flags]
    c = pmnist.parse(argv, "test", module.get_config, module.method_defaults, module.FIELDS)
    return dict(c.method_kwargs)

  for name, code_only in (("pmnist", {}), ("split_cifar100", {"conv_sketch_multiplier": 1.0})):
    kwargs = functools.partial(fot_kwargs, ENTRY[name])
    paper, code = kwargs("paper"), kwargs("paper_code")
    assert paper["threshold_rule"] == "energy" and code["threshold_rule"] == "authors"
    # Nothing else of FOT changes, besides what the code does differently.
    assert {k: v for k, v in code.items() if paper[k] != v} == {
      "threshold_rule": "authors",
      **code_only,
    }
    assert kwargs("paper", "--fot_threshold_rule=authors")["threshold_rule"] == "authors"
    assert (
      kwargs("paper_code", "--method_kwargs=threshold_rule=energy")["threshold_rule"] == "energy"
    )
  for flags, message in (
    (["--fot_threshold_rule=gpm"], "invalid choice: 'gpm'"),
    (["--method_kwargs=threshold_rule=squared"], "threshold_rule='squared' is not one of fot's"),
  ):
    with pytest.raises(SystemExit):
      pmnist.parse(["--method=fot", "--output_dir=unused", *flags], "test", pmnist.get_config)
    assert message in capsys.readouterr().err


def test_client_chunk_is_the_runs_flag_not_fots(capsys):
  """The run's --client_chunk bounds FOT's GPSE pass (Executor.client_chunks): a chunk given to
  FOT itself, or a bad chunk, is refused naming the flag, before any data is loaded."""
  parse = functools.partial(pmnist.parse, description="test", get_config_fn=pmnist.get_config)
  assert parse(["--method=fot", "--output_dir=unused"]).client_chunk == "auto"
  assert parse(["--method=fot", "--output_dir=unused", "--client_chunk=4"]).client_chunk == "4"
  for flags, message in (
    (["--method_kwargs=client_chunk=4"], "fot no longer takes client_chunk: pass --client_chunk"),
    (["--client_chunk=0"], "--client_chunk must be auto, none or a positive integer, got '0'"),
  ):
    with pytest.raises(SystemExit):
      parse(["--method=fot", "--output_dir=unused", *flags])
    assert message in capsys.readouterr().err


def test_fot_claim_budgets_take_the_energy_rule_by_default():
  # claims/ pins ε, its increment and the sketch width but not the rule: the budgets resolve it
  # from the entry point's paper preset, and their fingerprint changes with it (earlier results,
  # made with the authors' rule, turn stale instead of pairing with new ones).
  from fedjax_proj.reproduce.claims import fot as fot_claims
  from fedjax_proj.reproduce.resolve import resolve_config

  for claim in (fot_claims.FOT_NONIID, fot_claims.FOT_IID):
    for budget in ("cpu", "smoke", "paper"):
      config = resolve_config(claim, budget, "fot", 0, data_root=REPO)
      assert config["method_kwargs"]["threshold_rule"] == "energy", (claim.name, budget)
