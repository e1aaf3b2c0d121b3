"""keep_freed_memory: XLA:CPU's per-execution buffers reused from the heap, the results unchanged
(fedjax_proj/training/host_memory.py; docs/performance.md, "The step's page faults")."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from fedjax_proj.training import host_memory
from tests.core.multiprocess import ROOT, cpu_env

# Each process: (1) a program whose intermediate (the first convolution's output, 64 x 32 x 32 x
# 272 float32, 68 MB: above the 64 MB a worker thread's malloc heap can hold) is freed after every
# call; the page faults of its later calls; (2) two steps of a FedAvg client of the CNN through the
# sequential strategy's engine, its output saved; (3) keep_freed_memory (again), after computing.
_PROGRAM = textwrap.dedent(
  """
  import json, resource, sys
  from fedjax_proj.training import host_memory
  keep = sys.argv[1] == "keep"
  first = host_memory.keep_freed_memory() if keep else None
  import jax, jax.numpy as jnp, numpy as np, optax
  from jax import lax
  from fedjax_proj.algorithms import client as client_lib
  from fedjax_proj.core.engine import ClientEngine
  from fedjax_proj.data import pipeline
  from fedjax_proj.models import get_model

  def conv(x, k):
    dims = ("NHWC", "HWIO", "NHWC")
    return lax.conv_general_dilated(x, k, (1, 1), "SAME", dimension_numbers=dims)

  probe = jax.jit(lambda x, a, b: jnp.max(conv(jax.nn.relu(conv(x, a)), b), axis=(1, 2)))
  r = np.random.default_rng(0)
  shapes = ((64, 32, 32, 3), (3, 3, 3, 272), (3, 3, 272, 1))
  args = [r.standard_normal(s).astype(np.float32) for s in shapes]
  for _ in range(3):  # compiled, and XLA's threads' own buffers warmed
    probe(*args).block_until_ready()
  faults = []
  for _ in range(5):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    probe(*args).block_until_ready()
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)

  images = r.integers(0, 256, (16, 32, 32, 3)).astype(np.uint8)
  labels = r.integers(0, 10, 16).astype(np.int32)
  model = get_model("cnn", 10)
  variables = model.init(jax.random.key(0), jnp.zeros((1, 32, 32, 3)))
  program = client_lib.local_training_client(
    model, optax.sgd(0.01, momentum=0.9), client_lib.cross_entropy_loss(model)
  )
  batch_fn = pipeline.make_batch_fn(pipeline.normalizer(0.0, 1.0))
  engine = ClientEngine(program, batch_fn, "sequential")
  idx = np.arange(16, dtype=np.int32).reshape(1, 2, 8)
  out = engine.run({"variables": variables}, {}, images, labels, idx, np.ones_like(idx, bool),
                   jax.random.split(jax.random.key(1), 1))
  np.savez(sys.argv[2], *[np.asarray(v) for v in jax.tree.leaves(out)])
  again = host_memory.keep_freed_memory()
  print(json.dumps({"first": first, "again": again, "faults": faults}))
  """
)
# The probe's intermediate in 4 KiB pages: every one faulted in again per call when it is mapped
# afresh.
_PAGES = 64 * 32 * 32 * 272 * 4 // 4096


def _run_both(tmp_path) -> tuple[dict, dict]:
  """(the kept process's record, the plain one's), the two run at once."""
  procs = [
    subprocess.Popen(
      [sys.executable, "-c", _PROGRAM, mode, str(tmp_path / f"{mode}.npz")],
      stdout=subprocess.PIPE,
      stderr=subprocess.PIPE,
      text=True,
      env=cpu_env(),
      cwd=ROOT,
    )
    for mode in ("keep", "plain")
  ]
  records = []
  for proc in procs:
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-3000:]
    records.append(json.loads(out.strip().splitlines()[-1]))
  return records[0], records[1]


def test_keep_freed_memory_reuses_the_step_buffers_and_changes_no_result(tmp_path):
  if host_memory._glibc() is None:
    pytest.skip("not glibc's malloc: keep_freed_memory leaves its thresholds as they are")
  kept, plain = _run_both(tmp_path)
  assert kept["first"] == {} and kept["again"] == {}  # both parts applied, before computing
  # First called after computing: the dispatch part cannot apply any more, and says so.
  assert list(plain["again"]) == ["dispatch"], plain
  assert "backends had started" in plain["again"]["dispatch"]
  # Mapped afresh, each call faults in the whole intermediate again; kept, it reuses it. (The
  # median call: now and then a call of either faults in some other buffer of XLA's anew.)
  assert np.median(plain["faults"]) > 0.9 * _PAGES, plain
  assert np.median(kept["faults"]) < 0.1 * _PAGES, kept
  # The same programs on the same inputs: the client's output bit for bit.
  with np.load(tmp_path / "keep.npz") as a, np.load(tmp_path / "plain.npz") as b:
    assert len(a.files) == len(b.files) > 0
    for name in a.files:
      np.testing.assert_array_equal(a[name], b[name])
