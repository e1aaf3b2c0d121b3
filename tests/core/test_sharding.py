"""A round sharded over 4 forced host devices equals the single-device round (FedAvg, FedProj),
also when the cohort runs in chunks (streaming aggregation) with each chunk sharded."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

from tests.core.multiprocess import ROOT, cpu_env

SCRIPT = textwrap.dedent(
  """
  import jax, jax.numpy as jnp, numpy as np, optax
  from fedjax_proj.algorithms.base import make_round
  from fedjax_proj.algorithms.fedavg import fedavg
  from fedjax_proj.algorithms.distillation.fedproj import fedproj
  from fedjax_proj.core import sharding, tree as T
  from fedjax_proj.data.federated import FederatedData
  from tests import helpers

  assert jax.device_count() == 4, jax.devices()
  x, y = helpers.synthetic_data(n=200)
  public = jnp.asarray(helpers.synthetic_data(n=40, seed=5)[0])
  model = helpers.tiny_model()
  fd = FederatedData(np.array_split(np.arange(200), 8), batch_size=6, local_epochs=2)
  variables = model.init(jax.random.key(0), jnp.asarray(x[:2]))
  algs = {
    "fedavg": fedavg(model, optax.sgd(0.1)),
    "fedproj": fedproj(model, optax.sgd(0.1), lambda z: z,
                       public_size=40, memory_size=32, memory_batch_size=8, distill_batch_size=16),
  }
  mesh = sharding.client_mesh()
  for name, alg in algs.items():
    finals = []
    for sharded in (False, True):
      round_fn = make_round(alg, "vmap_scan", helpers.float_batch_fn())
      state = alg.init(variables, jax.random.key(0))
      for r in range(2):
        rd = helpers.round_data(fd, x, y, round_idx=r)._replace(extra={"public_images": public})
        if sharded:
          rd, state = sharding.shard_round_data(rd, mesh), sharding.replicate(state, mesh)
        state, _ = round_fn(state, rd, jax.random.key(r))
      if sharded:
        assert len(rd.idx.sharding.device_set) == 4
      finals.append(np.asarray(T.tree_ravel(alg.global_variables(state))))
    diff = float(np.abs(finals[0] - finals[1]).max())
    print(name, diff)
    assert diff < 1e-5, (name, diff)
  try:
    sharding.shard_round_data(helpers.round_data(fd, x, y, cpr=6), mesh)
  except ValueError as e:
    assert "multiple of 4" in str(e)
  else:
    raise AssertionError("uneven split accepted")
  print("OK")
  """
)


CHUNKED_SCRIPT = textwrap.dedent(
  """
  import re
  import jax, jax.numpy as jnp, numpy as np, optax
  from fedjax_proj.algorithms.base import make_round
  from fedjax_proj.core.chunked import make_chunked_round
  from fedjax_proj.algorithms.fedavg import fedavg
  from fedjax_proj.algorithms.fedprox import fedprox
  from fedjax_proj.core import sharding, tree as T
  from fedjax_proj.data.federated import FederatedData
  from tests import helpers

  assert jax.device_count() == 4, jax.devices()
  x, y = helpers.synthetic_data(n=200)
  model = helpers.tiny_model()
  # 12 clients of unequal size (weights matter): 3 per device.
  sizes = (3, 7, 19, 11, 5, 23, 9, 14, 30, 8, 12, 17)
  fd = FederatedData(helpers.unequal_clients(len(x), sizes), batch_size=4, local_epochs=2)
  variables = model.init(jax.random.key(0), jnp.asarray(x[:2]))
  bf = helpers.float_batch_fn()
  algs = {
    "fedavg+adam": fedavg(model, optax.sgd(0.1, momentum=0.9), optax.adam(0.05)),
    "fedprox": fedprox(model, optax.sgd(0.1), mu=0.1),
  }
  mesh = sharding.client_mesh()

  def run(alg, round_fn, shard):
    state = alg.init(variables, jax.random.key(0))
    for r in range(2):
      rd = helpers.round_data(fd, x, y, round_idx=r)
      if shard:
        rd, state = sharding.shard_round_data(rd, mesh), sharding.replicate(state, mesh)
      state, metrics = round_fn(state, rd, jax.random.key(r))
    return np.asarray(T.tree_ravel(alg.global_variables(state))), metrics

  for name, alg in algs.items():
    ref, ref_m = run(alg, make_round(alg, "vmap_scan", bf), False)
    assert np.abs(ref - np.asarray(T.tree_ravel(variables))).max() > 1e-3  # It trained.
    # 4 = one client per device per chunk (3 chunks); 6 = 2 per device, the last chunk padded.
    for chunk in (4, 6) if name == "fedavg+adam" else (6,):
      got, m = run(alg, make_chunked_round(alg, "vmap_scan", bf, chunk, mesh=mesh), True)
      diff = max([float(np.abs(got - ref).max())] + [abs(float(m[k] - ref_m[k])) for k in ref_m])
      print(name, chunk, diff)
      assert diff < 1e-5, (name, chunk, diff)

  # Cutting a sharded cohort into chunks moves no client between devices: the only collective in
  # the compiled round is the all-reduce of each chunk's sums (a contiguous chunking of the same
  # sharded input needs an all-gather).
  alg = algs["fedavg+adam"]
  rd = sharding.shard_round_data(helpers.round_data(fd, x, y), mesh)
  state = sharding.replicate(alg.init(variables, jax.random.key(0)), mesh)
  pattern = r"(all-gather|all-to-all|all-reduce|collective-permute|reduce-scatter)[.(]"
  collectives = lambda rf: set(
    re.findall(pattern, rf.lower(state, rd, jax.random.key(0)).compile().as_text())
  )
  sharded_ops = collectives(make_chunked_round(alg, "vmap_scan", bf, 4, mesh=mesh))
  plain_ops = collectives(make_chunked_round(alg, "vmap_scan", bf, 4))
  print(sharded_ops, plain_ops)
  assert sharded_ops == {"all-reduce"}, sharded_ops
  assert plain_ops - {"all-reduce"}, plain_ops
  try:
    make_chunked_round(alg, "vmap_scan", bf, 2, mesh=mesh)(
      alg.init(variables, jax.random.key(0)), helpers.round_data(fd, x, y, cpr=6), jax.random.key(0)
    )
  except ValueError as e:
    assert "multiple of 4" in str(e), e
  else:
    raise AssertionError("6 clients accepted on 4 devices")
  try:
    make_chunked_round(alg, "sequential", bf, 2, mesh=mesh)
  except ValueError as e:
    assert "vmap_scan" in str(e), e
  else:
    raise AssertionError("mesh accepted for a host-looped strategy")
  print("OK")
  """
)


def _run_on_4_devices(script: str) -> str:
  env = cpu_env("--xla_force_host_platform_device_count=4")
  proc = subprocess.run(
    [sys.executable, "-c", script], capture_output=True, text=True, timeout=600, env=env, cwd=ROOT
  )
  assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
  assert "OK" in proc.stdout
  return proc.stdout


def test_sharded_round_equals_single_device():
  _run_on_4_devices(SCRIPT)


def test_chunked_sharded_round_equals_single_device():
  """FedAvg (server Adam) and FedProx: chunks of a sharded cohort = the plain one-device round."""
  _run_on_4_devices(CHUNKED_SCRIPT)


# The three runs of the entry point in one process with 4 forced host devices: its ``main`` with
# the flags (the parser, the config and the run, as the script calls it). A process per run paid
# the Python and JAX start-up and compiled the programs the runs share (the evaluation, the
# initialisation) three times; what differs between the runs is only their flags.
CLI_SCRIPT = textwrap.dedent(
  """
  import contextlib, io, json, sys
  from fedjax_proj.configs import cifar10

  out = {}
  for name, argv in json.loads(sys.argv[1]).items():
    text = io.StringIO()
    with contextlib.redirect_stdout(text):
      code = cifar10.main(argv)
    assert code == 0, (name, code, text.getvalue()[-3000:])
    out[name] = text.getvalue()
  print(json.dumps(out))
  """
)


def test_experiment_cli_shards_over_forced_devices(tmp_path):
  """Sharded, sharded + chunked (each chunk over all 4 devices) and plain CLI runs agree."""
  env = cpu_env("--xla_force_host_platform_device_count=4")
  runs = {
    "sharded": ("--shard_clients=true", "--client_chunk=none"),
    "plain": ("--shard_clients=false", "--client_chunk=none"),
    "sharded_chunked": ("--shard_clients=true", "--client_chunk=4"),
  }
  flags = (
    "--preset=smoke",
    "--dataset=digits",
    "--model=mlp",
    "--clients_per_round=8",
    "--rounds=2",
    "--optimizer=sgd",
    "--lr=0.05",
    "--progress=false",
  )
  argvs = {name: [*flags, *own, f"--output_dir={tmp_path / name}"] for name, own in runs.items()}
  proc = subprocess.run(
    [sys.executable, "-c", CLI_SCRIPT, json.dumps(argvs)],
    capture_output=True,
    text=True,
    timeout=600,
    env=env,
    cwd=ROOT,
  )
  assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
  stdout = json.loads(proc.stdout.splitlines()[-1])
  finals = {}
  for name in runs:
    assert ("sharding the client axis over 4 devices" in stdout[name]) == (name != "plain")
    # 8 clients in chunks of 4: one client per device per chunk, two chunks.
    assert ("chunks of 4 (1 per device)" in stdout[name]) == (name == "sharded_chunked")
    finals[name] = (tmp_path / name / "metrics.jsonl").read_text()
  strip = lambda text: [
    {k: v for k, v in json.loads(line).items() if k != "round_seconds"}
    for line in text.splitlines()
  ]
  ref = strip(finals["plain"])
  assert len(ref) == 2
  for name in ("sharded", "sharded_chunked"):
    got = strip(finals[name])
    assert len(got) == 2
    for ra, rb in zip(got, ref, strict=True):
      for k in ra:
        assert abs(ra[k] - rb[k]) < 1e-5, (name, k, ra[k], rb[k])
