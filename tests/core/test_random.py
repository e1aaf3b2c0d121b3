"""core.random: every draw is a pure function of (seed, round, purpose, client), on any strategy."""

from __future__ import annotations

import os
import subprocess
import sys
import zlib

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_proj.core import random as random_lib
from fedjax_proj.core.engine import ClientEngine, ClientProgram
from fedjax_proj.core.types import Batch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _bits(key) -> np.ndarray:
  return np.asarray(jax.random.key_data(key))


def test_round_keys_depend_only_on_seed_and_round():
  seed0, seed1 = jax.random.key(0), jax.random.key(1)
  np.testing.assert_array_equal(
    _bits(random_lib.round_key(seed0, 5)), _bits(random_lib.round_key(jax.random.key(0), 5))
  )
  # A traced round index (the jitted loop) gives the key a Python int gives.
  traced = jax.jit(random_lib.round_key)(seed0, jnp.int32(5))
  np.testing.assert_array_equal(_bits(traced), _bits(random_lib.round_key(seed0, 5)))
  keys = {
    _bits(random_lib.round_key(seed, r)).tobytes() for seed in (seed0, seed1) for r in range(4)
  }
  assert len(keys) == 8  # another round or another seed is another key


def test_named_streams_are_distinct_and_fold_in_the_crc32_of_the_name():
  key = random_lib.round_key(jax.random.key(3), 2)
  names = ("broadcast", "clients", "aggregate", "init", "order", "begin", "end")
  streams = {_bits(random_lib.stream_key(key, n)).tobytes() for n in names}
  assert len(streams) == len(names)
  expected = jax.random.fold_in(key, zlib.crc32(b"clients") & 0x7FFFFFFF)
  np.testing.assert_array_equal(_bits(random_lib.stream_key(key, "clients")), _bits(expected))


def test_streams_are_the_same_in_another_python_process():
  # Python's own hash() of a str changes between processes; the stream of a name must not.
  code = (
    "import jax, numpy as np; from fedjax_proj.core import random as r; "
    "print(np.asarray(jax.random.key_data(r.stream_key(r.round_key(jax.random.key(3), 2), "
    "'clients'))).tolist())"
  )
  env = {**os.environ, "PYTHONHASHSEED": "12345", "PYTHONPATH": ROOT, "JAX_PLATFORMS": "cpu"}
  out = subprocess.run(
    [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
  ).stdout
  here = _bits(random_lib.stream_key(random_lib.round_key(jax.random.key(3), 2), "clients"))
  assert out.strip() == str(here.tolist())


def test_every_client_gets_its_own_key():
  keys = random_lib.client_keys(jax.random.key(0), 8)
  assert keys.shape == (8,)
  assert len({_bits(k).tobytes() for k in keys}) == 8
  draws = jax.vmap(lambda k: jax.random.uniform(k))(keys)
  assert len(set(np.asarray(draws).tolist())) == 8


def test_numpy_rng_depends_on_seed_round_and_purpose_only():
  draw = lambda *args: random_lib.numpy_rng(*args).integers(0, 2**31, 8)
  np.testing.assert_array_equal(draw(0, 3, "batches"), draw(0, 3, "batches"))
  others = [draw(1, 3, "batches"), draw(0, 4, "batches"), draw(0, 3, "sample_clients")]
  for other in others:
    assert not np.array_equal(draw(0, 3, "batches"), other)


def _key_recorder() -> ClientProgram:
  """A client that records every key it is given: its init key and each step's two keys."""

  def init(shared, client_input, key):
    return {"init": jax.random.uniform(key), "steps": jnp.zeros(()), "batches": jnp.zeros(())}

  def step(shared, state, batch, key):
    # Weighted by a step counter so that a swapped order of the same keys would also show.
    n = state["steps"] + 1.0
    return {
      "init": state["init"],
      "steps": n,
      "batches": state["batches"] * 3.0 + batch.x.sum() + jax.random.uniform(key) * n,
    }

  return ClientProgram(init=init, step=step, final=lambda state: state)


def test_every_strategy_draws_identical_keys():
  images = jnp.zeros((12, 1))
  labels = jnp.zeros((12,), jnp.int32)

  def batch_fn(images, labels, idx, mask, key):
    # The batch key is drawn too (augmentation uses it).
    x = images[idx] + jax.random.uniform(key, (idx.shape[0], 1))
    return Batch(x=x, y=labels[idx], mask=mask.astype(jnp.float32))

  # Three clients of unequal size: 3, 1 and 2 active steps of the 3 (padded steps are masked).
  idx = jnp.arange(18, dtype=jnp.int32).reshape(3, 3, 2) % 12
  mask = jnp.asarray(
    [[[1, 1], [1, 1], [1, 0]], [[1, 0], [0, 0], [0, 0]], [[1, 1], [1, 1], [0, 0]]], bool
  )
  keys = random_lib.client_keys(random_lib.stream_key(jax.random.key(9), "clients"), 3)
  out = {
    strategy: ClientEngine(_key_recorder(), batch_fn, strategy).run(
      None, {}, images, labels, idx, mask, keys
    )
    for strategy in ("vmap_scan", "vmap_stepwise", "sequential")
  }
  np.testing.assert_array_equal(out["vmap_scan"]["steps"], [3.0, 1.0, 2.0])
  assert len(set(np.asarray(out["vmap_scan"]["init"]).tolist())) == 3
  for strategy in ("vmap_stepwise", "sequential"):
    for field in ("init", "steps", "batches"):
      np.testing.assert_array_equal(
        out[strategy][field], out["vmap_scan"][field], err_msg=f"{strategy} {field}"
      )
