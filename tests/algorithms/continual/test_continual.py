"""Continual FL: ACC/FGT, benchmarks as datasets, the task loop with every method, the CLI."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_proj.core import tree as tree_lib
from fedjax_proj.data.continual import (
  input_transform,
  permuted_mnist,
  split_classes,
  task_model,
  task_partition,
)
from fedjax_proj.data.federated import FederatedData
from fedjax_proj.data.sources import ArrayDataset
from fedjax_proj.models import mlp
from fedjax_proj.training.continual import (
  TaskSchedule,
  acc_fgt,
  task_round_data,
  train_continual,
)
from fedjax_proj.training.session import RunIO
from tests import helpers

REPO = Path(__file__).resolve().parents[3]


def test_acc_fgt_on_hand_made_matrix():
  nan = np.nan
  a = np.array([[0.9, 0.8, 0.7], [nan, 0.95, 0.9], [nan, nan, 0.85]])
  acc, fgt = acc_fgt(a)
  assert acc == pytest.approx((0.7 + 0.9 + 0.85) / 3)
  assert fgt == pytest.approx(((0.9 - 0.7) + (0.95 - 0.9)) / 2)
  assert acc_fgt(np.array([[0.5]])) == (0.5, 0.0)
  with pytest.raises(ValueError, match="square"):
    acc_fgt(np.zeros((2, 3)))


def test_permuted_mnist_tasks_and_partitions():
  train, test = helpers.fake_mnist(200, 0), helpers.fake_mnist(50, 1)
  bench = permuted_mnist(train, test, num_tasks=3, seed=0, train_per_task=100)
  assert bench.num_tasks == 3 and bench.permutations.shape == (3, 36)
  assert all(len(t.train_idx) == 100 for t in bench.tasks)
  assert not np.array_equal(bench.permutations[0], bench.permutations[1])
  again = permuted_mnist(train, test, num_tasks=3, seed=0, train_per_task=100)
  np.testing.assert_array_equal(again.permutations, bench.permutations)
  tf = input_transform(bench)
  x = jnp.asarray(train.images[:2], jnp.float32)
  y = np.asarray(tf(x, jnp.int32(1))).reshape(2, -1)
  np.testing.assert_array_equal(y, np.asarray(x).reshape(2, -1)[:, bench.permutations[1]])
  # A task per example: each row through its own task's permutation.
  rows = np.asarray(tf(x, jnp.asarray([2, 0], jnp.int32))).reshape(2, -1)
  flat = np.asarray(x).reshape(2, -1)
  np.testing.assert_array_equal(rows[0], flat[0, bench.permutations[2]])
  np.testing.assert_array_equal(rows[1], flat[1, bench.permutations[0]])
  # Shared head (the authors' PMNIST): the task only selects the permutation.
  single = task_model(mlp(10, hidden=(8,)), tf, shared_head=True)
  v = single.init(jax.random.key(0), x)
  out1 = single.apply(v, x, train=False, task=jnp.int32(1))
  out0 = single.apply(v, x, train=False, task=0)
  assert out1.logits.shape == (2, 10)
  assert not np.allclose(out0.logits, out1.logits)
  parts = task_partition(bench, 1, 5, iid=False, seed=0)
  assert sorted(np.concatenate(parts).tolist()) == sorted(bench.tasks[1].train_idx.tolist())
  # Shards: each client sees few classes.
  assert max(len(np.unique(bench.labels[p])) for p in parts) <= 4


def test_split_classes_relabels_within_task():
  rng = np.random.default_rng(0)
  labels = np.repeat(np.arange(20), 5).astype(np.int32)
  ds = ArrayDataset(rng.integers(0, 255, (100, 4, 4, 3)).astype(np.uint8), labels, 20, "x")
  bench = split_classes(ds, ds, num_tasks=4, seed=0)
  assert bench.classes_per_task == 5
  seen = np.concatenate([t.classes for t in bench.tasks])
  assert sorted(seen.tolist()) == list(range(20))
  for t in bench.tasks:
    assert set(np.unique(labels[t.train_idx])) == set(t.classes.tolist())
    assert set(np.unique(bench.labels[t.train_idx])) == set(range(5))
  with pytest.raises(ValueError, match="evenly"):
    split_classes(ds, ds, num_tasks=3)


class _ConvBackbone(nn.Module):
  """A conv layer first, so EWC's per-example Fisher and GPM's bases meet a convolution."""

  @nn.compact
  def __call__(self, x, train, mask=None):
    h = nn.relu(nn.Conv(4, (3, 3), padding="VALID")(x))
    return None, nn.relu(nn.Dense(16)(h.reshape(h.shape[0], -1)))


def _tiny_run(method, *, iid=True, num_tasks=None, output_dir=None, conv=False, **hparams):
  """4 clients (2 per round), 1 round per task on fake 6x6 MNIST: (round_fn, state, summary)."""
  backbone = _ConvBackbone() if conv else None
  bench, cm, round_fn, evaluate, variables = helpers.tiny_continual(method, backbone, **hparams)
  state, summary = train_continual(
    cm,
    round_fn,
    bench,
    evaluate,
    variables,
    TaskSchedule((1,) * (num_tasks or 2), 4, 2, batch_size=16, iid=iid),
    seed=0,
    run=RunIO(output_dir=output_dir, progress=False),
  )
  return round_fn, state, summary


@pytest.mark.parametrize(
  "method,conv",
  [("fl", False), ("ewc", False), ("er", False), ("rgo", False), ("gpm", False)]
  + [("glfc", False), ("fedcil", False), ("fot", False)]
  + [("ewc", True), ("rgo", True), ("gpm", True), ("fot", True)],
)
def test_task_loop_runs_every_method(method, conv, tmp_path):
  kwargs = {"fot": {"eps": 0.9}, "er": {"buffer_per_task": 4}, "gpm": {"gpm_samples": 20}}
  kwargs["glfc"] = kwargs["er"]
  kwargs["fedcil"] = {"md_iter": 2, "gen_batch_size": 8, "gen_arch": "mlp", "gen_hidden": (16,)}
  round_fn, _, summary = _tiny_run(method, output_dir=tmp_path, conv=conv, **kwargs.get(method, {}))
  a = summary["acc_matrix"]
  assert a[1][0] is None and a[0][0] is not None and a[1][1] is not None
  assert summary["acc"] == pytest.approx((a[0][1] + a[1][1]) / 2)
  assert summary["fgt"] == pytest.approx(a[0][0] - a[0][1])
  assert (tmp_path / "summary.json").exists() and (tmp_path / "metrics.jsonl").exists()
  # Round functions compile once for every task (the task id is traced).
  if hasattr(round_fn, "_cache_size"):
    assert round_fn._cache_size() == 1


@pytest.mark.parametrize("method", ["fot", "ewc"])
def test_the_runs_chunk_streams_the_task_round(method):
  """--client_chunk runs a continual round's clients in chunks (the methods' aggregates stream):
  the same round as all clients at once, up to float summation order."""
  bench, whole, whole_round, _, variables = helpers.tiny_continual(method)
  _, chunked, chunked_round, _, _ = helpers.tiny_continual(method, client_chunk=2)
  fed = FederatedData(task_partition(bench, 0, 4, iid=True, seed=0), 16, 1)
  rd = task_round_data(bench.images, bench.labels, fed, np.arange(3, dtype=np.int32), 0, 0, 0)
  key = jax.random.key(0)
  a, ma = whole_round(whole.algorithm.init(variables, key), rd, key)
  b, mb = chunked_round(chunked.algorithm.init(variables, key), rd, key)  # chunks of 2 and 1
  np.testing.assert_allclose(
    tree_lib.tree_ravel(a.variables), tree_lib.tree_ravel(b.variables), atol=1e-6
  )
  assert set(ma) == set(mb)
  np.testing.assert_allclose(ma["train_loss"], mb["train_loss"], rtol=1e-5)


def test_unknown_method_fails_with_choices(capsys):
  # split_cifar100.py as a process (no other test starts it); pmnist.py's main in this process
  # (tests/configs/test_continual_cli_resume.py starts that script).
  proc = subprocess.run(
    [sys.executable, str(REPO / "experiments" / "split_cifar100.py"), "--method=bogus"],
    capture_output=True,
    text=True,
    timeout=120,
  )
  from fedjax_proj.configs import pmnist

  with pytest.raises(SystemExit) as e:
    pmnist.main(["--method=bogus"])
  for code, err in ((proc.returncode, proc.stderr), (e.value.code, capsys.readouterr().err)):
    assert code == 2 and "--method" in err and "bogus" in err
    assert all(m in err for m in ("fl", "ewc", "er", "rgo", "gpm", "glfc", "fot")), err


def _ewc_after_one_task(fisher, normalize=False):
  _, state, _ = _tiny_run("ewc", iid=False, num_tasks=1, fisher=fisher, normalize=normalize)
  return state.method["fisher"]


def test_ewc_keeps_each_clients_fisher_and_server_mode_averages_them():
  per_client = _ewc_after_one_task("client")
  shared = _ewc_after_one_task("server")
  leaf_c, leaf_s = jax.tree.leaves(per_client)[0], jax.tree.leaves(shared)[0]
  assert leaf_c.shape == (4, *leaf_s.shape)
  # Non-IID clients hold different classes, so their Fishers differ.
  assert not np.allclose(leaf_c[0], leaf_c[1])
  # The server mode is the n_k-weighted mean of the same clients' Fishers (60 examples each).
  for c, s in zip(jax.tree.leaves(per_client), jax.tree.leaves(shared)):
    np.testing.assert_allclose(np.mean(np.asarray(c), axis=0), s, rtol=1e-4, atol=1e-8)
  normalized = _ewc_after_one_task("client", normalize=True)
  peaks = np.max(
    np.stack([np.asarray(f).reshape(4, -1).max(1) for f in jax.tree.leaves(normalized)]), 0
  )
  np.testing.assert_allclose(peaks, 1.0, rtol=1e-6)
  with pytest.raises(ValueError, match="fisher must be one of"):
    _ewc_after_one_task("global")
