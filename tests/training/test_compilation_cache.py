"""The persistent compilation cache of the entry points (fedjax_proj/training/compilation_cache.py,
docs/performance.md, "Compilation cache")."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest

from fedjax_proj.training import compilation_cache
from tests.core.multiprocess import cpu_env

ROOT = Path(__file__).resolve().parents[2]


def test_default_folder_follows_the_override_then_xdg_then_home():
  env = {compilation_cache.ENV: "/data/jax-cache", "XDG_CACHE_HOME": "/xdg"}
  assert compilation_cache.default_setting(env) == "/data/jax-cache"
  assert compilation_cache.default_setting({compilation_cache.ENV: "off"}) == "off"
  assert compilation_cache.default_setting({"XDG_CACHE_HOME": "/xdg"}) == "/xdg/fedjax_proj/jax"
  home = str(Path("~/.cache/fedjax_proj/jax").expanduser())
  assert compilation_cache.default_setting({}) == home
  assert compilation_cache.default_setting({"XDG_CACHE_HOME": " "}) == home


def test_the_suite_never_writes_into_the_users_cache_folder():
  """tests/conftest.py: the suite's cache is its own temporary folder, or off."""
  setting = compilation_cache.default_setting()
  user_default = compilation_cache.default_setting(
    {k: v for k, v in os.environ.items() if k != compilation_cache.ENV}
  )
  assert setting != user_default
  if setting != compilation_cache.OFF:
    assert Path(setting).name.startswith("fedjax_proj_test_jax_cache_")
    assert Path(setting).parent == Path(tempfile.gettempdir())


def test_the_suite_compiles_like_its_child_processes():
  """tests/conftest.py: the suite's own processes get FAST_COMPILE, as its subprocesses do."""
  from tests.core.multiprocess import FAST_COMPILE

  if os.environ.get("FEDJAX_PROJ_TEST_FAST_COMPILE", "").strip().lower() == "off":
    pytest.skip("FEDJAX_PROJ_TEST_FAST_COMPILE=off")
  assert FAST_COMPILE in os.environ.get("XLA_FLAGS", "")


def test_a_file_or_an_uncreatable_folder_is_refused_naming_it_and_the_fix(tmp_path):
  a_file = tmp_path / "cache.txt"
  a_file.write_text("not a folder")
  with pytest.raises(ValueError, match="is a file, not a folder") as e:
    compilation_cache.enable(a_file)
  assert str(a_file) in str(e.value) and "--compilation_cache=off" in str(e.value)
  below_a_file = a_file / "jax"
  with pytest.raises(ValueError, match="cannot create the compilation cache folder") as e:
    compilation_cache.enable(below_a_file, flag="--cache")
  assert str(below_a_file) in str(e.value) and "--cache=off" in str(e.value)
  with pytest.raises(ValueError, match="is empty"):
    compilation_cache.enable(" ")


@pytest.mark.skipif(os.geteuid() == 0, reason="root may write to any folder")
def test_a_read_only_folder_is_refused(tmp_path):
  tmp_path.chmod(0o500)
  try:
    with pytest.raises(ValueError, match="is not writable"):
      compilation_cache.enable(tmp_path)
  finally:
    tmp_path.chmod(0o700)


def test_entry_point_refuses_a_bad_cache_folder_before_any_compute(tmp_path):
  a_file = tmp_path / "cache"
  a_file.write_text("")
  proc = subprocess.run(
    [
      sys.executable,
      str(ROOT / "experiments" / "cifar10.py"),
      "--preset=smoke",
      "--dataset=digits",
      "--model=mlp",
      f"--compilation_cache={a_file}",
      f"--output_dir={tmp_path / 'run'}",
    ],
    capture_output=True,
    text=True,
    env=cpu_env(),
  )
  assert proc.returncode == 2
  assert f"the compilation cache {a_file} is a file" in proc.stderr
  assert not (tmp_path / "run").exists()


# One process compiles a program with the cache on; a second process of the same program must
# load it (a cache hit) rather than compile it again.
_PROGRAM = textwrap.dedent(
  """
  import sys
  import jax
  import jax.monitoring
  import jax.numpy as jnp
  from fedjax_proj.training import compilation_cache

  hits = []
  jax.monitoring.register_event_listener(
    lambda event, **kw: hits.append(event) if event.endswith("cache_hits") else None
  )
  folder = compilation_cache.enable(sys.argv[1])
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)  # store even a tiny program
  print(float(jax.jit(lambda x: jnp.sin(x) @ x.T)(jnp.ones((8, 8))).sum()), len(hits))
  """
)


def test_a_second_process_loads_the_program_the_first_compiled(tmp_path):
  folder = tmp_path / "cache" / "jax"
  env = cpu_env()
  run = lambda: subprocess.run(  # noqa: E731
    [sys.executable, "-c", _PROGRAM, str(folder)],
    capture_output=True,
    text=True,
    env=env,
    check=True,
  ).stdout.split()
  first, second = run(), run()
  assert oct(folder.stat().st_mode & 0o777) == oct(0o700)  # private: JAX runs what it loads
  assert any(folder.iterdir())
  assert first[1] == "0" and int(second[1]) >= 1
  assert first[0] == second[0]  # the loaded executable computes what the compiled one did
