"""Settings for the whole test suite."""

from __future__ import annotations

import os
import shutil
import tempfile

from fedjax_proj.training import compilation_cache
from tests.core.multiprocess import FAST_COMPILE

# The suite's processes compile like its child processes (tests/core/multiprocess.py,
# FAST_COMPILE): XLA:CPU's backend optimisation level 0. The suite is compile-bound: level 0
# cut the CPU time of an EWC task-loop test and FedProj's conformance test by 28%, and of
# FedProj's real-MNIST learning test by 30%, its slower compiled code included. What the tests
# check is that programs agree with each other or with a closed form, within tolerances, or that
# a path runs; every program a test compares is compiled with the same flags. Set before JAX
# starts its backend; xdist's workers inherit it. FEDJAX_PROJ_TEST_FAST_COMPILE=off keeps XLA's
# default level.
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
  compilation_cache.enable(os.environ[_SESSION_DIR])


def pytest_unconfigure(config):
  if _OWNER:
    shutil.rmtree(os.environ[_SESSION_DIR], ignore_errors=True)
