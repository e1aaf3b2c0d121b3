"""benchmarks/parity/fedproj.py exports exactly the inputs our runner uses (no torch needed).

The parity benchmark feeds the authors' code what :func:`export_inputs` returns, so the comparison
is only paired if that is what ``run_experiment`` itself trains on. A tiny real run records what
the runner consumed (partition, the clients sampled and their batches in each round, initial
weights, the train/test/public arrays and the public normaliser) and the export must equal it.
"""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_proj.algorithms import registry
from fedjax_proj.data.federated import FederatedData
from fedjax_proj.data.sources import load_dataset
from fedjax_proj.training import experiment
from fedjax_proj.training.config import base_config


def _parity_module():
  from benchmarks.parity import fedproj

  return fedproj


def _config(tmp_path, public, seed):
  c = base_config()
  c.update(
    method="fedproj",
    dataset="digits",
    model="mlp",
    num_clients=6,
    clients_per_round=3,
    rounds=3,
    local_epochs=2,
    eval_every=1,
    progress=False,
    public_data=str(public),
    public_size=50,
    memory_size=50,
    train_subset=300,
    batch_size=16,  # the digits subset's clients hold tens of examples
    test_subset=100,
    seed=seed,
    normalization="code",
    output_dir=str(tmp_path / f"run{seed}"),
    checkpoint_every=0,
  )
  return c


def _record_run(c, monkeypatch) -> dict:
  """Runs ``c`` and returns what the runner consumed."""
  seen = {"rounds": []}
  round_data = FederatedData.round_data

  def recording_round_data(self, images, labels, sampled, round_idx, seed, extra):
    rd = round_data(self, images, labels, sampled, round_idx, seed, extra)
    seen["rounds"].append((round_idx, np.asarray(rd.client_ids), np.asarray(rd.idx)))
    seen["masks"] = seen.get("masks", []) + [np.asarray(rd.mask)]
    seen["public"] = np.asarray(extra["public_images"])
    seen["parts"] = self.client_indices
    return rd

  train = experiment.train

  def recording_train(algorithm, round_fn, fed, train_set, test_set, evaluate, variables, **kw):
    seen["train"], seen["test"] = train_set, test_set
    seen["variables"] = jax.tree.map(np.asarray, variables)
    return train(algorithm, round_fn, fed, train_set, test_set, evaluate, variables, **kw)

  build = registry.build_algorithm

  def recording_build(method, ctx, **hp):
    seen["ctx"] = ctx
    return build(method, ctx, **hp)

  monkeypatch.setattr(FederatedData, "round_data", recording_round_data)
  monkeypatch.setattr(experiment, "train", recording_train)
  monkeypatch.setattr(experiment.registry, "build_algorithm", recording_build)
  experiment.run_experiment(c, log=lambda *a: None)
  return seen


@pytest.mark.parametrize("seed", [0, 3])
def test_exported_inputs_are_the_runners(tmp_path, monkeypatch, seed):
  parity = _parity_module()
  digits = load_dataset("digits", "test")
  public = tmp_path / "public.npz"
  np.savez(public, image=digits.images[:80], label=digits.labels[:80])
  c = _config(tmp_path, public, seed)
  exported = parity.export_inputs(c)
  seen = _record_run(c, monkeypatch)

  assert len(exported["parts"]) == len(seen["parts"]) == 6
  for a, b in zip(exported["parts"], seen["parts"]):
    np.testing.assert_array_equal(a, b)
  assert [r for r, *_ in seen["rounds"]] == [0, 1, 2]
  for (_, sampled, idx), mask, ex in zip(seen["rounds"], seen["masks"], exported["rounds"]):
    np.testing.assert_array_equal(ex["sampled"], sampled)  # the same clients in round r
    np.testing.assert_array_equal(ex["idx"], idx)  # the same batches, in the same order
    np.testing.assert_array_equal(ex["mask"], mask)
  # The sample really varies over rounds (the check above is not comparing constants).
  assert len({tuple(ex["sampled"]) for ex in exported["rounds"]}) > 1
  for key in ("train", "test"):
    for a, b in zip(exported[key], seen[key]):
      np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  np.testing.assert_array_equal(exported["public"], seen["public"])
  for a, b in zip(jax.tree.leaves(exported["variables"]), jax.tree.leaves(seen["variables"])):
    np.testing.assert_array_equal(a, b)
  # The public set's own normaliser (--normalization=code), as the runner built it.
  x = jnp.asarray(exported["public"][:5])
  np.testing.assert_array_equal(
    np.asarray(exported["public_normalize"](x)), np.asarray(seen["ctx"].public_normalize(x))
  )
  # Steps per epoch let the adapter replay each epoch of the layout in turn.
  for ex in exported["rounds"]:
    for j, k in enumerate(ex["sampled"]):
      spe = exported["steps_per_epoch"][k]
      assert ex["mask"][j][:spe].sum() == len(exported["parts"][k])


def test_projection_window_scales_the_codes_rounds():
  parity = _parity_module()

  class Args:
    proj_rounds = ""
    rounds = 8

  assert parity.proj_window(Args) == (1, 7)
  Args.rounds = 100
  assert parity.proj_window(Args) == (10, 90)
  Args.proj_rounds = "2:5"
  assert parity.proj_window(Args) == (2, 5)


def test_summary_verdict_rule():
  """Identical curves are within noise; a shift far beyond the between-seed spread differs."""
  parity = _parity_module()
  seeds = [0, 1, 2]
  runs = {}
  for s in seeds:
    base = np.array([20.0, 25.0, 30.0]) + 2.0 * s
    runs[("fedavg", "ours", s)] = {"accuracy": base.tolist(), "wall_seconds": 1.0}
    runs[("fedavg", "authors", s)] = {
      "accuracy": (base + 0.1 * (s - 1)).tolist(),
      "wall_seconds": 2.0,
    }
    runs[("fedproj", "ours", s)] = {"accuracy": base.tolist(), "wall_seconds": 1.0}
    runs[("fedproj", "authors", s)] = {
      "accuracy": (base + 30 + 0.1 * s).tolist(),
      "wall_seconds": 2.0,
    }
  for code in ("ours", "authors"):
    for s in seeds:
      runs[("fedproj", code, s)].update(
        projected_fraction=[None, 0.4, 0.2], mean_cos=[None, 0.1, 0.3]
      )
  out = parity.summarize(runs, seeds, (1, 3), ["fedavg", "fedproj"])
  proj = out["projection"]["ours"]
  assert proj["projected_fraction"] == pytest.approx(0.3) and proj["mean_cos"] == pytest.approx(0.2)
  assert out["fedavg"]["verdict"] == "within seed noise"
  assert out["fedproj"]["verdict"] == "differ"
  assert out["fedavg"]["wall_ratio_authors_over_ours"] == pytest.approx(2.0)
  # Runs recorded before CPU time was measured give no CPU ratio; with it, the ratio of the sums.
  assert out["fedavg"]["cpu_ratio_authors_over_ours"] is None
  for s in seeds:
    runs[("fedavg", "ours", s)]["cpu_seconds"] = 1.0 + s
    runs[("fedavg", "authors", s)]["cpu_seconds"] = 0.5
  out = parity.summarize(runs, seeds, (1, 3), ["fedavg", "fedproj"])
  assert out["fedavg"]["cpu_ratio_authors_over_ours"] == pytest.approx(1.5 / 6.0)
  # Ours less its compiling: none without compile_seconds, then the sums' ratio less them.
  assert out["fedavg"]["cpu_ratio_authors_over_ours_without_compile"] is None
  for s in seeds:
    runs[("fedavg", "ours", s)]["compile_seconds"] = 0.5
  out = parity.summarize(runs, seeds, (1, 3), ["fedavg", "fedproj"])
  assert out["fedavg"]["cpu_ratio_authors_over_ours_without_compile"] == pytest.approx(1.5 / 4.5)
  assert out["fedavg"]["compile_seconds_ours"] == [0.5, 0.5, 0.5]


def test_compile_seconds_count_only_programs_built_while_active():
  parity = _parity_module()
  f = jax.jit(lambda x: jnp.sin(x) * 3.0 + x)
  x = jnp.arange(7.0)
  with parity._CompileSeconds() as compiling:
    f(x).block_until_ready()
  built = compiling.seconds
  assert built > 0
  with parity._CompileSeconds() as again:
    f(x).block_until_ready()  # the same program: nothing traced or compiled
  assert again.seconds == 0.0
  jax.jit(lambda x: jnp.cos(x) - x)(x).block_until_ready()  # after the context: not counted
  assert compiling.seconds == built


def test_torch_cnn_reproduces_the_flax_logits():
  """The adapter's torch ``cnn`` with our weights gives our logits (needs the parity extra)."""
  pytest.importorskip("torch.nn", reason="torch is not installed (pip install -e .[parity])")
  import torch

  from fedjax_proj.models import get_model

  model = get_model("cnn", 10)
  variables = model.init(jax.random.key(0), jnp.zeros((2, 32, 32, 3)))
  from benchmarks.perf import torch_reference

  net = torch_reference.torch_cnn()
  net.load_state_dict(torch_reference.torch_state_from_flax(jax.tree.map(np.asarray, variables)))
  x = np.random.default_rng(0).normal(size=(4, 32, 32, 3)).astype(np.float32)
  with torch.no_grad():
    got = net(torch.from_numpy(np.ascontiguousarray(x.transpose(0, 3, 1, 2)))).numpy()
  np.testing.assert_allclose(got, model.apply(variables, x, train=False).logits, atol=1e-4)


def test_merge_combines_disjoint_seeds_and_refuses_overlaps(tmp_path):
  parity = _parity_module()
  base = {"defects": "code", "proj_rounds": [1, 3], "budget": {"rounds": 3}, "commit": "abc"}

  def part(name, seeds):
    runs = {}
    for s in seeds:
      for code in ("ours", "authors"):
        runs[f"fedavg/{code}/{s}"] = {"accuracy": [10.0 + s, 20.0, 30.0], "wall_seconds": 1.0}
    path = tmp_path / name
    path.write_text(
      json.dumps(
        {**base, "command": name, "seeds": seeds, "logits_max_abs_diff": 1e-6, "runs": runs}
      )
    )
    return path

  a, b = part("a.json", [0, 1]), part("b.json", [2])
  out = parity.merge([a, b], tmp_path / "out")
  assert out["seeds"] == [0, 1, 2]
  assert out["summary"]["fedavg"]["paired"]["n"] == 3
  assert (tmp_path / "out" / "parity_code.md").read_text().count("| fedavg |") == 7
  with pytest.raises(ValueError, match="appears in two files"):
    parity.merge([a, part("c.json", [1])], tmp_path / "out2")
