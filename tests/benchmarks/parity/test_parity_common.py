"""benchmarks/parity/common.py: the parity suite's torch-free pieces (docs/parity.md).

The parity benchmarks compare our numbers with a reference's; these tests check that our side of
each comparison is what it claims to be (the gradient a client step hands its optimiser, our
weights in torch's layout), that the comparison flags a real difference and refuses a mapping
error, and that a reference checkout at another commit is refused before anything runs.
"""

from __future__ import annotations

from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_proj.algorithms import client as client_lib
from fedjax_proj.algorithms import losses

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def pc():
  from benchmarks.parity import common

  return common


def test_tolerance_is_ulps_times_reduction_length(pc):
  assert pc.float32_tolerance(16) == pytest.approx(pc.CHAIN_ULPS * 16 * 2.0**-23)
  assert pc.float32_tolerance(64) == 4 * pc.float32_tolerance(16)
  with pytest.raises(ValueError, match="reduction_length"):
    pc.float32_tolerance(0)


def test_compare_flags_a_difference_per_entry_and_refuses_other_entries(pc):
  rng = np.random.default_rng(0)
  ref = {"a": rng.standard_normal(8), "small": 1e-3 * rng.standard_normal(4)}
  tol = pc.float32_tolerance(8)
  same = {k: v * (1 + 1e-7) for k, v in ref.items()}
  assert pc.compare(same, ref, tol)["verdict"] == "match"
  # A 1% error in the small entry is 1% of its own scale, not 1e-5 of the large entry's.
  off = {**ref, "small": ref["small"] * 1.01}
  out = pc.compare(off, ref, tol)
  assert out["verdict"] == "differ" and out["worst_entry"] == "small"
  assert out["max_rel"] == pytest.approx(0.01, rel=1e-6)
  with pytest.raises(ValueError, match="only ours"):
    pc.compare({**ref, "extra": np.zeros(1)}, ref, tol)
  with pytest.raises(ValueError, match="shapes differ"):
    pc.relative_difference(np.zeros(3), np.zeros(4))
  assert pc.relative_difference(np.zeros(3), np.zeros(3)) == 0.0
  assert pc.relative_difference(np.ones(3), np.zeros(3)) == float("inf")


def test_tiny_inputs_and_torch_layout(pc):
  inp = pc.tiny_inputs(0, batch=10, classes=5, others=("global", "prev"))
  assert sorted(inp.others) == ["global", "prev"]
  assert set(inp.y.tolist()) == set(range(5))  # every class in the batch
  p0, p1 = inp.variables["params"], inp.others["global"]["params"]
  assert not np.allclose(p0["head"]["kernel"], p1["head"]["kernel"])
  assert pc.dense_layers(p0) == ["dense_0", "head"]
  state = pc.torch_linear_state(p0, {"dense_0": "fc0", "head": "fc1"})
  # torch's Linear computes x Wᵀ + b; the state must give our Dense's x K + b.
  h = np.maximum(inp.x @ state["fc0.weight"].T + state["fc0.bias"], 0)
  logits = h @ state["fc1.weight"].T + state["fc1.bias"]
  ours = inp.model.apply(inp.variables, jnp.asarray(inp.x), train=False).logits
  np.testing.assert_allclose(logits, np.asarray(ours), rtol=1e-5, atol=1e-5)


def test_client_step_returns_the_gradient_the_optimiser_receives(pc):
  inp = pc.tiny_inputs(1, batch=8, classes=4)
  program = client_lib.local_training_client(
    inp.model, pc.grad_stash(), client_lib.cross_entropy_loss(inp.model)
  )
  shared = {"variables": inp.others["global"]}

  def ce(params):
    logits = inp.model.apply({"params": params}, jnp.asarray(inp.x), train=True).logits
    return losses.cross_entropy(logits, jnp.asarray(inp.y))

  heads = []
  for start in (None, inp.variables["params"]):  # None: the step starts at the global model
    params = shared["variables"]["params"] if start is None else start
    loss, grads = pc.client_step(program, shared, {}, inp.x, inp.y, params=start)
    want_loss, want = jax.jit(jax.value_and_grad(ce))(jax.tree.map(jnp.asarray, params))
    assert loss == pytest.approx(float(want_loss), rel=1e-6)
    for g, w in zip(jax.tree.leaves(grads), jax.tree.leaves(want)):
      np.testing.assert_allclose(g, np.asarray(w), rtol=1e-5, atol=1e-7)
    heads.append(grads["head"]["kernel"])
  assert not np.allclose(heads[0], heads[1])  # ``params`` did move the step's starting point


def test_reference_checkout_pins_the_commit(pc, tmp_path):
  ref = pc.REFERENCES["fedntd"]
  with pytest.raises(ValueError, match="has no algorithms/fedntd/criterion.py"):
    pc.reference_checkout("fedntd", tmp_path)
  path = tmp_path / "FedNTD"
  (path / ref.marker).parent.mkdir(parents=True)
  (path / ref.marker).write_text("")
  with pytest.raises(ValueError, match="commit unknown"):
    pc.reference_checkout("fedntd", tmp_path)
  (path / pc.COMMIT_FILE).write_text("0" * 40 + "\n")
  with pytest.raises(ValueError, match=f"pins {ref.commit}"):
    pc.reference_checkout("fedntd", tmp_path)
  (path / pc.COMMIT_FILE).write_text(ref.commit + "\n")
  assert pc.reference_checkout("fedntd", tmp_path) == path
  with pytest.raises(ValueError, match="no reference 'nope'"):
    pc.reference_checkout("nope", tmp_path)


def test_load_definitions_runs_only_the_named_definitions(pc, tmp_path):
  src = tmp_path / "ref.py"
  src.write_text(
    "import torchvision_is_not_here\n"
    "def scale(x):\n  return FACTOR * x\n"
    "class Unused(Missing):\n  pass\n"
  )
  ns = pc.load_definitions(src, ("scale",), {"FACTOR": 3})
  assert ns["scale"](2) == 6 and "Unused" not in ns
  with pytest.raises(ValueError, match="defines no"):
    pc.load_definitions(src, ("absent",), {})


def test_checkout_commit_reads_git_or_the_archive_marker(pc, tmp_path):
  """A reference folder's commit: an archive's marker file, else unknown (None), never a guess."""
  assert pc.checkout_commit(tmp_path) is None
  (tmp_path / pc.COMMIT_FILE).write_text(pc.REFERENCES["fedproj"].commit + "\n")
  assert pc.checkout_commit(tmp_path) == pc.REFERENCES["fedproj"].commit


def test_suite_lists_every_reference_and_the_older_benchmarks(pc):
  methods = [e.method for e in pc.SUITE]
  assert methods[:3] == ["fedproj", "fot", "gpm"]
  # Every reference has its rows; the FOT code's ("fot") are the continual ones, the FedProj
  # authors' code ("fedproj") runs in parity_fedproj.py, listed first.
  assert set(methods[3:]) == set(pc.REFERENCES) - {"fot", "fedproj"}
  assert set(pc.CONTINUAL) <= set(methods) and methods.count("fedproj") == 1
  for entry in pc.SUITE:
    assert (ROOT / entry.script).is_file()
