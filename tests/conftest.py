"""Settings for the whole test suite."""

from __future__ import annotations

import os
import shutil
import tempfile

import pytest

from fedjax_proj.training import compilation_cache
from tests.core.multiprocess import FAST_COMPILE

# The suite's processes compile like its child processes (tests/core/multiprocess.py,
# FAST_COMPILE): XLA:CPU's backend optimisation level 0, fusions by the classic emitter. The suite
# is compile-bound: level 0
# cut the CPU time of an EWC task-loop test and FedProj's conformance test by 28%, and of
# FedProj's real-MNIST learning test by 30%, its slower compiled code included. What the tests
# check is that programs agree with each other or with a closed form, within tolerances, or that
# a path runs; every program a test compares is compiled with the same flags. Set before JAX
# starts its backend; xdist's workers inherit it. FEDJAX_PROJ_TEST_FAST_COMPILE=off keeps XLA's
# defaults.
if os.environ.get("FEDJAX_PROJ_TEST_FAST_COMPILE", "on").strip().lower() != "off":
  _flags = os.environ.get("XLA_FLAGS", "")
  if FAST_COMPILE not in _flags:
    os.environ["XLA_FLAGS"] = f"{_flags} {FAST_COMPILE}".strip()

# The suite's own persistent compilation cache, shared by the xdist workers and the entry points
# they start as subprocesses, and deleted when the session ends. Many tests build the same small
# programs again (a fresh engine for the same model, an entry point run twice to test resuming);
# with the cache the second build loads the executable instead of compiling it. JAX keys an
# entry by the program, its options and the JAX/XLA versions, so a hit runs the identical
# executable: results do not change (docs/performance.md, "Compilation cache"). The suite never
# writes into the user's cache folder. FEDJAX_PROJ_TEST_COMPILATION_CACHE=off runs without it.
_SESSION_DIR = "FEDJAX_PROJ_TEST_CACHE_DIR"
_CHOICE = os.environ.get("FEDJAX_PROJ_TEST_COMPILATION_CACHE", "on").strip().lower()
_OWNER = False

if _CHOICE == compilation_cache.OFF:
  os.environ[compilation_cache.ENV] = compilation_cache.OFF
else:
  if not os.environ.get(_SESSION_DIR):
    # The first process of the session (pytest itself, before xdist starts its workers, which
    # inherit the environment) makes the folder and removes it at the end.
    os.environ[_SESSION_DIR] = tempfile.mkdtemp(prefix="fedjax_proj_test_jax_cache_")
    _OWNER = True
  os.environ[compilation_cache.ENV] = os.environ[_SESSION_DIR]
  # Every program of the suite's own processes is stored, not only those that compile for 0.5 s
  # or more (the entry points' floor): with FAST_COMPILE most of the suite's programs compile
  # faster than that, and a program built again in another xdist worker or by another test is then
  # loaded. Set on the module, so that entry points a test calls in-process (which enable the
  # cache again) keep it. A hit is keyed by the program, its options and XLA_FLAGS, so it is the
  # executable the test would have compiled. On test_fedproj.py in one process it cut the CPU
  # time by 4% (89.4 s -> 85.5 s, one run each on a loaded machine).
  compilation_cache.MIN_COMPILE_SECONDS = 0.0
  compilation_cache.enable(os.environ[_SESSION_DIR])


# Tests marked `compute_bound` run long enough that the speed of their compiled code, not its
# compile time, dominates: SFedKD's real-MNIST learning runs (20 rounds) and the distillation-effect
# benchmark's runs. Their jitted programs compile at XLA's backend optimisation level 2 instead of
# the suite's level 0 (FAST_COMPILE): a compiler option per program (models/base.py passes one the
# same way), since XLA_FLAGS are read once per process. Programs a caller compiles with its own
# options keep them; eager operations stay at level 0; what a test compares is compiled alike. CPU
# seconds, level 0 -> 2, one run each on a loaded machine: the 4 real-MNIST runs 107.8 -> 73.5,
# the distillation-effect module 58.7 -> 42.4. Level 3 (XLA's default) compiled longer for no
# faster run (FedSeq's and FedAvg's runs: 31.7 s against 27.9), and tests whose compile dominates
# (the text-learning runs, the paper budgets' first rounds, the FOT presets) got slower at level 2,
# so they stay at 0.
COMPUTE_BOUND_OPTIONS = {"xla_backend_optimization_level": 2}


@pytest.fixture(autouse=True)
def _compute_bound_compile(request, monkeypatch):
  if request.node.get_closest_marker("compute_bound") is None:
    return
  import jax

  jit = jax.jit

  def optimised_jit(*args, compiler_options=None, **kwargs):
    options = {**COMPUTE_BOUND_OPTIONS, **(compiler_options or {})}
    return jit(*args, compiler_options=options, **kwargs)

  monkeypatch.setattr(jax, "jit", optimised_jit)


def pytest_unconfigure(config):
  if _OWNER:
    shutil.rmtree(os.environ[_SESSION_DIR], ignore_errors=True)


# The quick tier (`pytest -m "not slow"`, README "Tests"): CI runs everything; during development
# the tests below, which start entry points as subprocesses, train on real data or loop over
# several tasks, can wait. Measured per-test CPU (2026-11-27) put the continual task loops at
# 6-29 s and the conformance parametrizations at 5-11 s each; a module here is slow as a whole,
# a "module::test" entry only for that test (all its parametrizations).
SLOW = (
  "tests/algorithms/continual/test_continual.py::test_task_loop_runs_every_method",
  "tests/algorithms/continual/test_continual.py::test_ewc_keeps_each_clients_fisher",
  "tests/algorithms/continual/test_fedcil.py::test_vmap_scan_equals_sequential",
  "tests/algorithms/test_conformance.py::test_vmap_scan_equals_sequential",
  "tests/algorithms/test_conformance.py::test_learns_on_real_mnist",
  "tests/configs/test_presets_fot.py::test_every_pmnist_method_beats_chance_on_real_mnist",
  "tests/algorithms/sequential/test_sfedkd.py::test_vmapped_and_unrolled_teacher_forward_agree",
  "tests/benchmarks/accuracy/test_accuracy.py",
  "tests/studies/test_distillation_effect.py",
  "tests/benchmarks/device/test_gpu_suite.py",
  "tests/core/test_distributed.py",
  "tests/core/test_sharding.py",
  "tests/configs/test_continual_cli_resume.py",
  "tests/configs/test_interrupt_startup.py",
  "tests/configs/test_presets_fot.py",
  "tests/reproduce/test_cli.py",
  "tests/training/test_cifar10_cli.py",
  "tests/training/test_continual_resume.py",
  "tests/training/test_failures.py",
  "tests/training/test_multihost_cli.py",
  "tests/training/test_notebook.py",
  "tests/training/test_pilot_iris.py",
  "tests/training/test_resume.py",
  "tests/training/test_run_safety.py",
  # Measured in the quick tier itself (2026-12-02, 338.7 s wall on 2 cores with these in it):
  # real-data and text learning runs, the paper budgets' first rounds, end-to-end runs through an
  # entry point or the claim runner, child processes, and the three largest models' contract
  # (3.5-29 s each).
  "tests/configs/test_nlp.py::test_smoke_run_learns_the_words",
  "tests/configs/test_quickstart.py::test_quickstart_runs_both_methods_and_plots",
  "tests/reproduce/test_paper_first_round.py::test_paper_budget_first_rounds_run",
  "tests/reproduce/test_nlp_claims.py::test_smoke_budget_runs_through_the_runner",
  "tests/reproduce/test_resume_claim.py::test_a_stopped_claim_run_continues_and_equals",
  "tests/models/test_bert.py::test_pretrained_minilm_matches_numpy_reference",
  "tests/models/test_models_contract.py::test_shapes_purity_jit_vmap[resnet18]",
  "tests/models/test_models_contract.py::test_shapes_purity_jit_vmap[resnet10]",
  "tests/models/test_models_contract.py::test_shapes_purity_jit_vmap[alexnet8]",
  "tests/training/test_host_memory.py",
  "tests/training/test_reproducible.py::test_same_seed_same_metrics_bytes_and_parameters",
  "tests/training/test_compilation_cache.py::test_a_second_process_loads_the_program",
  "tests/benchmarks/parity/test_parity_inputs.py::test_exported_inputs_are_the_runners",
  "tests/benchmarks/parity/test_parity_continual.py::test_our_fishers_are_each_clients_empirical",
)


# The suite runs its 2 xdist workers with `--dist loadfile` (pyproject.toml): all of a module's
# tests run in one worker, so a module's shared fixtures are built once and its tests reuse the
# programs the worker already compiled, instead of both workers building them. On 8 fixture-heavy
# modules (test_fedproj, test_conformance, test_engine, test_chunked, test_sfedkd, test_base,
# test_cwc, test_executor; their quick tier, -n 2) it cut the CPU time from 254 to 205 s (-19%, one
# run each on a loaded machine). Whole modules are then the unit of balance: a heavy module handed
# out last leaves the other worker idle, so the heaviest run first (xdist's
# `--no-loadscope-reorder` keeps this order; its own reorders by test count). CPU seconds per
# module, measured in one process (-n 0) at 4a84590, the first three, test_models_contract,
# test_bert and test_conv again on 2026-11-28 (after test_conv's cut, docs/performance.md, "The
# test suite's heaviest modules"); a module not listed keeps its place after them. A stale figure
# only makes the balance worse, never a test's outcome.
MODULE_CPU_SECONDS = {
  "tests/reproduce/test_paper_first_round.py": 126,
  "tests/configs/test_entry_points_sfedkd.py": 118,
  "tests/benchmarks/device/test_gpu_suite.py": 103,
  "tests/algorithms/distillation/test_fedproj.py": 85,
  "tests/configs/test_presets_fot.py": 76,
  "tests/models/test_models_contract.py": 69,
  "tests/configs/test_nlp.py": 60,
  "tests/algorithms/test_conformance.py": 60,
  "tests/studies/test_distillation_effect.py": 59,
  "tests/algorithms/continual/test_continual.py": 49,
  "tests/models/test_conv.py": 42,
  "tests/core/test_sharding.py": 38,
  "tests/algorithms/continual/test_gpse.py": 36,
  "tests/models/test_bert.py": 36,
  "tests/training/test_cifar10_cli.py": 26,
  "tests/configs/test_continual_cli_resume.py": 23,
  "tests/algorithms/distillation/test_fedgkd.py": 22,
  "tests/core/test_engine.py": 21,
  "tests/algorithms/test_fedrcl.py": 21,
}


def pytest_collection_modifyitems(config, items):
  # A stable sort: the tests of a module keep their order, and unlisted modules theirs.
  items.sort(key=lambda item: -MODULE_CPU_SECONDS.get(item.nodeid.partition("::")[0], 0))
  for item in items:
    module, _, name = item.nodeid.partition("::")
    for entry in SLOW:
      slow_module, _, slow_test = entry.partition("::")
      if module == slow_module and (not slow_test or name.startswith(slow_test)):
        item.add_marker(pytest.mark.slow)
        break
