"""The benchmark scripts check their flags, then torch, before they pin, import or time anything.

Each bad flag is one line and exit 2 from the script's parser (benchmarks/flag_checks.py,
docs/design.md, "Input rules"). torch is made unimportable here (``sys.modules["torch"] = None``)
and pinning fails the test, so a check that came after either would show as another error.
"""

from __future__ import annotations

import importlib
import os
import sys

import pytest

# Each script's module, by its name (benchmarks/README.md lists the shelves).
MODULES = {
  **{
    name: f"benchmarks.perf.{name}"
    for name in (
      "cpu_step",
      "cpu_step_profile",
      "smoke_times",
      "strategies",
      "conv_impl",
      "gpse_cost",
      "torch_reference",
      "scaling",
      "fedproj_overhead",
      "nlp_memory",
      "onednn_stress",
      "compile_seconds",
    )
  },
  **{
    f"parity_{n}": f"benchmarks.parity.{n}"
    for n in ("methods", "fedproj", "gpm_basis", "fot_basis", "mkd", "fedgen")
  },
  "sfedkd_pilot": "benchmarks.pilots.sfedkd_pilot",
  "drift_pilot": "benchmarks.pilots.drift_pilot",
  "accuracy_cifar10": "benchmarks.accuracy.accuracy_cifar10",
  "continual_pmnist": "benchmarks.accuracy.continual_pmnist",
  "make_device_data": "benchmarks.device.make_device_data",
  "gpu_suite": "benchmarks.device.gpu_suite",
  "distillation_effect": "studies.distillation_effect.study",
  "ewc_stability": "studies.ewc_stability.study",
  "behaviour_fingerprint": "tools.behaviour_fingerprint",
}


def _script(name):
  return importlib.import_module(MODULES[name])


@pytest.fixture
def no_torch(monkeypatch):
  """torch unimportable (as in a venv without the bench/parity extra) and no core pinned."""
  monkeypatch.setitem(sys.modules, "torch", None)
  monkeypatch.setitem(sys.modules, "torch.nn", None)
  monkeypatch.setattr(os, "sched_setaffinity", lambda *a: pytest.fail("pinned before checks"))


def _refused(capsys, main, argv) -> str:
  with pytest.raises(SystemExit) as e:
    main(argv)
  assert e.value.code == 2
  err = capsys.readouterr().err
  assert "Traceback" not in err
  return err.strip().splitlines()[-1]


@pytest.mark.parametrize(
  "argv, message",
  [
    (["--cases=bogus"], "--cases=bogus: unknown bogus; choose from conv, pool, cnn_step,"),
    (["--cases=conv,pool,conv"], "--cases=conv,pool,conv lists conv more than once"),
    (["--cases="], "--cases= lists nothing; list one or more"),
    (["--rounds=0"], "--rounds must be >= 1, got 0"),
    (["--reps=-1"], "--reps must be >= 1, got -1"),
    (["--conv_impls=bogus"], "unknown bogus; choose from xla, gemm_grad, onednn_grad, onednn"),
    (["--cpu=99999", "--cases=conv"], "--cpu=99999 is not a core this process may run on"),
    (["--cpu=0", "--unpinned"], "--cpu pins to one core; --unpinned runs on every core"),
    (["--cases=fedproj_step"], "--cases fedproj_step needs --authors_repo="),
    (["--cases=conv"], 'torch is not installed: pip install -e ".[bench]"'),
  ],
)
def test_cpu_step_refuses_before_torch_or_pinning(argv, message, no_torch, capsys):
  assert message in _refused(capsys, _script("cpu_step").main, argv)


def test_cpu_step_columns_are_the_models_conv_impls():
  from fedjax_proj.models.conv import CONV_IMPLS

  # Named in the script (JAX must not load first): each must be one the models accept.
  assert set(_script("cpu_step").COLUMNS) <= set(CONV_IMPLS)


@pytest.mark.parametrize(
  "argv, message",
  [
    (["--steps=0"], "--steps must be >= 1, got 0"),
    (["--conv_impls=gemm_grad,gemm_grad"], "lists gemm_grad more than once"),
    ([], 'torch is not installed: pip install -e ".[bench]"'),
  ],
)
def test_cpu_step_profile_refuses_before_torch_or_pinning(argv, message, no_torch, capsys):
  assert message in _refused(capsys, _script("cpu_step_profile").main, argv)


@pytest.mark.parametrize(
  "argv, message",
  [
    (["--methods=moon,moon"], "--methods=moon,moon lists moon more than once"),
    (["--methods="], "--methods= lists nothing"),
    (["--methods=fedavg"], "unknown fedavg; choose from fedntd, fedgkd, moon"),
    (["--methods=moon"], 'torch is not installed: pip install -e ".[parity]"'),
  ],
)
def test_parity_rows_refuse_before_torch(argv, message, no_torch, capsys, tmp_path):
  main = _script("parity_methods").main
  assert message in _refused(capsys, main, [f"--refs_dir={tmp_path}", *argv])


@pytest.mark.parametrize(
  "argv, message",
  [
    (["--seeds=0,0"], "--seeds=0,0 lists 0 more than once"),
    (["--seeds=0,x"], "--seeds must be comma-separated non-negative integers"),
    (["--methods=fedprox"], "unknown fedprox; choose from fedavg, fedproj"),
    (["--rounds=0"], "--rounds must be >= 1, got 0"),
    (["--proj_rounds=3"], "--proj_rounds must be start:stop, two integers"),
  ],
)
def test_parity_fedproj_refuses_before_torch(argv, message, no_torch, capsys):
  assert message in _refused(capsys, _script("parity_fedproj").main, argv)


def test_parity_gpm_basis_needs_torch_before_loading_the_reference(no_torch, capsys, tmp_path):
  (tmp_path / "main_pmnist.py").write_text("raise AssertionError('imported before the check')\n")
  err = _refused(capsys, _script("parity_gpm_basis").main, [f"--gpm_repo={tmp_path}"])
  assert 'torch is not installed: pip install -e ".[parity]"' in err


@pytest.mark.parametrize(
  "script, argv, message",
  [
    ("accuracy_cifar10", ["--seeds=0,1,0"], "--seeds=0,1,0 lists 0 more than once"),
    ("accuracy_cifar10", ["--seeds=0,a"], "--seeds must be comma-separated non-negative"),
    ("accuracy_cifar10", ["--methods=fedavg,fedavg"], "lists fedavg more than once"),
    ("accuracy_cifar10", ["--methods=fedbogus,fedbogus"], "unknown fedbogus; choose from cwc,"),
    ("sfedkd_pilot", ["--methods=fedseq,fedseq"], "lists fedseq more than once"),
    ("continual_pmnist", ["--methods=fl,fot,fl"], "--methods=fl,fot,fl lists fl more than once"),
    ("continual_pmnist", ["--methods=fedavg"], "unknown fedavg; choose from fl, ewc, er,"),
    ("continual_pmnist", ["--rounds_per_task=0"], "--rounds_per_task must be >= 1, got 0"),
    ("smoke_times", ["--methods=moon,moon"], "--methods=moon,moon lists moon more than once"),
    ("smoke_times", ["--timeout=0"], "--timeout must be > 0 seconds, got 0.0"),
    ("strategies", ["--clients=4,x"], "--clients must be comma-separated non-negative integers"),
    ("strategies", ["--clients=0"], "--clients and --conv_clients must list cohort sizes >= 1"),
    ("strategies", ["--models=mlp,mlp"], "--models=mlp,mlp lists mlp more than once"),
    ("conv_impl", ["--impls=xla,bogus"], "--impls=xla,bogus: unknown bogus; choose from xla,"),
    ("conv_impl", ["--models=cnn", "--reps=0"], "--reps must be >= 1, got 0"),
    ("gpse_cost", ["--models=resnet8"], "unknown resnet8; choose from mlp, alexnet"),
    ("gpse_cost", ["--sketch_dists=gaussian,gaussian"], "lists gaussian more than once"),
    ("torch_reference", ["--cpr=10,10"], "--cpr=10,10 lists 10 more than once"),
    ("torch_reference", ["--models=resnet8"], "unknown resnet8; choose from mlp, cnn"),
    ("torch_reference", [], 'torch is not installed: pip install -e ".[bench]"'),
    ("parity_fot_basis", ["--hidden=400,x"], "--hidden must be comma-separated sizes >= 1"),
    ("distillation_effect", ["--seeds=3,3"], "--seeds=3,3 lists 3 more than once"),
    ("behaviour_fingerprint", ["--out=x", "--runs=bogus"], "--runs=bogus: unknown bogus; choose"),
  ],
)
def test_other_benchmarks_refuse_bad_lists_before_any_work(script, argv, message, no_torch, capsys):
  assert message in _refused(capsys, _script(script).main, argv)


@pytest.fixture
def no_children(monkeypatch):
  """A script that starts a child process (a timed configuration, a chunk) fails the test."""
  import subprocess

  monkeypatch.setattr(subprocess, "run", lambda *a, **k: pytest.fail("started a child first"))


@pytest.mark.parametrize(
  "script, argv, message",
  [
    ("scaling", ["--steps=0"], "--steps must be >= 1, got 0"),
    ("scaling", ["--timeout=-1"], "--timeout must be > 0 seconds, got -1.0"),
    ("scaling", ["--out=sub/x"], "--out=sub/x must be a file name stem under results/"),
    ("drift_pilot", ["--partition=dirichlet"], "--partition=dirichlet: Bad partition spec"),
    ("drift_pilot", ["--train_subset=-5"], "--train_subset must be >= 0, got -5"),
    ("drift_pilot", ["--lr=nan"], "--lr must be a finite number > 0, got nan"),
    ("drift_pilot", ["--clients_per_round=9", "--num_clients=8"], "exceeds --num_clients=8"),
    ("ewc_stability", ["--claim=fedgkd-cifar10"], "is not a claim that runs EWC; choose from"),
    ("ewc_stability", ["--budget=drift"], "--budget=drift is not fot-pmnist-noniid's; choose"),
    ("ewc_stability", ["--stop_round=0"], "--stop_round must be >= 1, got 0"),
    ("ewc_stability", ["--data=/nonexistent"], "--data=/nonexistent is not a folder"),
    ("fedproj_overhead", ["--repeats=0"], "--repeats must be >= 1, got 0"),
    ("fedproj_overhead", ["--clients=50", "--steps=20"], "= 64000 examples, more than CIFAR-10's"),
    ("fedproj_overhead", ["--public=20001"], "--public=20001 exceeds the public set's 20000"),
    ("nlp_memory", ["--chunks=none,1,none"], "--chunks=none,1,none lists none more than once"),
    ("nlp_memory", ["--chunks="], "--chunks= lists nothing"),
    ("nlp_memory", ["--clients=1"], "--chunks=none,2,1: 2 is not none or a chunk size in 1..--c"),
    (
      "nlp_memory",
      ["--chunks=3", "--clients=2"],
      "3 is not none or a chunk size in 1..--clients=2",
    ),
    ("onednn_stress", ["--threads=0"], "--threads must be >= 1, got 0"),
    ("onednn_stress", ["--shapes=8"], "--shapes=8 exceeds the 7 shapes; choose 1..7"),
    ("onednn_stress", ["--repeat=-1"], "--repeat must be >= 0, got -1"),
    ("compile_seconds", [], "name the entry point to run"),
    ("compile_seconds", ["nope.py", "--preset=smoke"], "nope.py is not a file; name the entry"),
  ],
)
def test_more_benchmarks_refuse_bad_flags_before_any_work(
  script, argv, message, no_torch, no_children, capsys
):
  assert message in _refused(capsys, _script(script).main, argv)


def test_make_device_data_names_what_the_shared_folder_lacks(no_torch, capsys, tmp_path):
  main = _script("make_device_data").main
  out = tmp_path / "out"
  (tmp_path / "cifar10" / "train").mkdir(parents=True)
  (tmp_path / "cifar10" / "test").mkdir()
  err = _refused(capsys, main, [f"--shared={tmp_path}", f"--out_dir={out}"])
  assert f"lacks {tmp_path}/cifar100/public_20k.npz, {tmp_path}/mnist/train.npz" in err
  assert err.endswith("or --mnist_train=0 to leave MNIST out")
  for argv, message in [
    (["--cifar10_test=0"], "--cifar10_test must be >= 1, got 0"),
    (["--mnist_test=0"], "--mnist_test must be >= 1, got 0"),
    (["--public_quality=101"], "--public_quality must be a JPEG quality in 1..100, got 101"),
    (["--max_mib=nan"], "--max_mib must be > 0, got nan"),
    ([f"--shared={tmp_path / 'none'}"], f"--shared={tmp_path / 'none'} is not a folder"),
  ]:
    assert message in _refused(capsys, main, [f"--shared={tmp_path}", f"--out_dir={out}", *argv])
  assert not out.exists()  # refused before anything was packed


@pytest.mark.parametrize(
  "argv, message",
  [
    (["--steps="], "--steps= lists nothing; list one or more, comma-separated; choose from corr"),
    (["--steps=accuracy,accuracy"], "--steps=accuracy,accuracy lists accuracy more than once"),
    (["--tolerance=0"], "--tolerance must be a finite number > 0, got 0.0"),
    (["--budget_accuracy=inf"], "--budget_accuracy must be a finite number of seconds > 0"),
    (["--data=/nonexistent.npz"], "--data=/nonexistent.npz is not a file; name an existing one"),
    (["--accuracy_state=/no.tar.gz"], "--accuracy_state=/no.tar.gz is not a file; name an exis"),
  ],
)
def test_gpu_suite_refuses_before_it_writes_or_loads(argv, message, no_torch, capsys, tmp_path):
  out = tmp_path / "out"
  assert message in _refused(capsys, _script("gpu_suite").main, [f"--out_dir={out}", *argv])
  assert not out.exists()
