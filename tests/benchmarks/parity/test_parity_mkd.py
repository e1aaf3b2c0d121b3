"""benchmarks/parity/mkd.py: its torch-free pieces and its flag checks (docs/parity.md).

The rows compare our side with the reference's; these tests hold our side to independent
computations, so each row compares what it says it compares: the α scale that makes our
multi-teacher KD weights the CA-MKD code's (its formulas as 004's references define them),
FedCurv's penalty and Fisher as the sums they stand for, and the GLFC loss's weighting by group.
"""

from __future__ import annotations

import sys

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from benchmarks.parity import common as pc
from benchmarks.parity import mkd as parity


def _softmax(z, axis=-1):
  z = z - z.max(axis, keepdims=True)
  e = np.exp(z)
  return e / e.sum(axis, keepdims=True)


@pytest.fixture(scope="module")
def mtkd_inputs():
  return parity.mtkd_inputs(0, 5)


def test_alpha_scale_makes_our_weights_the_codes(mtkd_inputs):
  """α·w (ours) equals the weight the code's loop puts on each batch-mean KL: 1/K for AVER,
  (1 − H_k/Σ_j H_j)/K for EBKD and (1 − softmax_k(CE))/(K − 1)/K for CA-MKD (Kwon et al. 2020,
  Zhang et al. 2022, each divided by the code's B·K)."""
  inp, names = mtkd_inputs
  k = len(names)
  logits = np.stack([parity.teacher_logits(inp, n) for n in names]).astype(np.float64)
  p = _softmax(logits)
  entropy = -(p * np.log(p)).sum(-1)
  ce = -np.log(p[:, np.arange(len(inp.y)), inp.y])
  code = {
    "aver": np.full((k, len(inp.y)), 1.0 / k),
    "ebkd": (1.0 - entropy / entropy.sum(0)) / k,
    "camkd": (1.0 - _softmax(ce, axis=0)) / (k - 1) / k,
  }
  for weighting, expected in code.items():
    ours = parity.code_alpha_scale(weighting, k) * parity.our_mtkd_weights(inp, names, weighting)
    np.testing.assert_allclose(ours, expected, rtol=1e-5, atol=1e-7)
  # The rows' teachers differ in confidence, so the weights are away from 1/K.
  spread = np.abs(parity.our_mtkd_weights(inp, names, "ebkd") - 1.0 / k).max()
  assert spread > 0.05


def test_alpha_scale_refuses_a_single_teacher_for_the_weighted_methods():
  assert parity.code_alpha_scale("aver", 1) == 1.0
  with pytest.raises(ValueError, match="ebkd needs K >= 2"):
    parity.code_alpha_scale("ebkd", 1)


def test_our_mtkd_step_is_ce_plus_alpha_times_the_weighted_kl(mtkd_inputs):
  """The row's ours: the client step's loss is CE + α·τ²·mean_b Σ_k w·KL, independently here."""
  inp, names = mtkd_inputs
  alpha, t = 0.5, parity.KD_T
  got = parity.our_mtkd_step(inp, names, "camkd", alpha)
  student = np.asarray(inp.model.apply(inp.variables, inp.x, train=False).logits, np.float64)
  logits = np.stack([parity.teacher_logits(inp, n) for n in names]).astype(np.float64)
  ce = -np.log(_softmax(student)[np.arange(len(inp.y)), inp.y]).mean()
  pt, log_ps = _softmax(logits / t), np.log(_softmax(student / t))
  kl = (pt * (np.log(pt) - log_ps[None])).sum(-1)  # [K, B]
  w = parity.our_mtkd_weights(inp, names, "camkd")
  expected = ce + alpha * t**2 * (w * kl).sum(0).mean()
  assert got["loss"] == pytest.approx(expected, rel=1e-5)


@pytest.fixture(scope="module")
def fedcurv_case():
  inp = pc.tiny_inputs(0, others=("global", "prev0", "prev1"))
  params = inp.variables["params"]
  thetas = [inp.others[p]["params"] for p in ("prev0", "prev1")]
  fishers = parity.random_fishers(0, params, 2)
  return inp, params, thetas, fishers


def test_fedcurv_step_is_ce_plus_the_penalty_sum_over_previous_clients(fedcurv_case):
  """λ·Σ_j Σ_i F_{j,i}(θ_i − θ̂_{j,i})² and its gradient 2λ·Σ_j F_j(θ − θ̂_j) added to CE's."""
  inp, params, thetas, fishers = fedcurv_case
  lam = 0.3
  got = parity.our_fedcurv_step(inp, params, *parity.uvw(fishers, thetas), lam)
  pen = sum(
    float(np.sum(f * (np.float64(p) - t) ** 2))
    for fj, tj in zip(fishers, thetas)
    for f, p, t in zip(jax.tree.leaves(fj), jax.tree.leaves(params), jax.tree.leaves(tj))
  )
  assert got["penalty"] == pytest.approx(lam * pen, rel=1e-5)

  def ce(p):
    logits = inp.model.apply({**inp.variables, "params": p}, inp.x, train=False).logits
    return optax.softmax_cross_entropy_with_integer_labels(logits, inp.y).mean()

  ce_value, ce_grad = jax.value_and_grad(ce)(params)
  assert got["loss"] == pytest.approx(float(ce_value) + lam * pen, rel=1e-5)
  pen_grad = jax.tree.map(
    lambda p, *ft: 2 * lam * sum(f * (p - t) for f, t in zip(ft[::2], ft[1::2])),
    params,
    *[x for pair in zip(fishers, thetas) for x in pair],
  )
  expected = pc.flatten(jax.tree.map(lambda a, b: np.asarray(a + b), ce_grad, pen_grad))
  for name, value in expected.items():
    np.testing.assert_allclose(got[name], value, rtol=1e-4, atol=1e-6)


def test_fedcurv_fisher_is_the_mean_squared_minibatch_gradient(fedcurv_case):
  """Ours after 3 steps at fixed weights: the mean over the batches of (∇CE)², F⊙θ, Σ F⊙θ²."""
  inp, params, _, _ = fedcurv_case
  big = pc.tiny_inputs(7, batch=48)
  batches = [(big.x[i::3], big.y[i::3]) for i in range(3)]

  def ce(p, x, y):
    logits = inp.model.apply({**inp.variables, "params": p}, x, train=False).logits
    return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()

  squares = [jax.tree.map(jnp.square, jax.grad(ce)(params, x, y)) for x, y in batches]
  mean = jax.tree.map(lambda *s: np.mean(s, 0), *squares)
  f, v, w = parity.our_fisher(inp, params, batches)
  for a, b in zip(jax.tree.leaves(f), jax.tree.leaves(mean)):
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-9)
  for a, b, p in zip(jax.tree.leaves(v), jax.tree.leaves(mean), jax.tree.leaves(params)):
    np.testing.assert_allclose(a, b * p, rtol=1e-4, atol=1e-9)
  total = sum(
    float(np.sum(m * p * p)) for m, p in zip(jax.tree.leaves(mean), jax.tree.leaves(params))
  )
  assert float(w) == pytest.approx(total, rel=1e-4)


def test_glfc_inputs_split_old_and_new_classes():
  """GLFC's grouping by learned class is ours by origin only when the classes are disjoint."""
  inp, y_new, x_old, y_old, learned = parity.glfc_inputs(0, 5)
  assert set(y_old.tolist()) == set(learned) == {0, 1}
  assert set(y_new.tolist()) == {2, 3, 4} and len(x_old) == len(y_old)


def test_glfc_loss_weighs_each_group_by_its_gradient_sizes():
  """Task 0: the mean CE over batch and memory; task 1: Σ w_i·CE_i / N with w_i = g_i / mean g
  within the current batch and within the replayed sample, g_i = 1 − p_i(y_i)."""
  inp, y_new, x_old, y_old, _ = parity.glfc_inputs(0, 5)
  logits = np.asarray(
    inp.model.apply(inp.variables, np.concatenate([inp.x, x_old]), train=False).logits, np.float64
  )
  y = np.concatenate([y_new, y_old])
  p_true = _softmax(logits)[np.arange(len(y)), y]
  ce = -np.log(p_true)
  assert parity.our_glfc_loss(inp, y_new, x_old, y_old, 0)["loss"] == pytest.approx(
    ce.mean(), rel=1e-5
  )
  g = 1.0 - p_true
  n = len(y_new)
  w = np.concatenate([g[:n] / g[:n].mean(), g[n:] / g[n:].mean()])
  assert parity.our_glfc_loss(inp, y_new, x_old, y_old, 1)["loss"] == pytest.approx(
    (w * ce).mean(), rel=1e-5
  )


def test_suite_lists_the_mkd_rows():
  entries = {e.method: e for e in pc.SUITE}
  for m in pc.MKD:
    assert entries[m].script == "benchmarks/parity/mkd.py"
    assert m in parity.ROWS
    assert m in pc.REFERENCES


# ---------------------------------------------------------------------------------------------
# Flag checks: one line and exit 2 from the parser, before torch loads (as test_flag_checks.py)


@pytest.fixture
def no_torch(monkeypatch):
  monkeypatch.setitem(sys.modules, "torch", None)
  monkeypatch.setitem(sys.modules, "torch.nn", None)


def _main():
  return parity.main


@pytest.mark.parametrize(
  "argv, message",
  [
    (["--methods=glfc,glfc"], "--methods=glfc,glfc lists glfc more than once"),
    (["--methods=fedprox"], "unknown fedprox; choose from mtkd, fedcurv, glfc"),
    (["--classes=3"], "--classes=3: the mtkd rows run CA-MKD's training loop"),
    (["--classes=1", "--methods=glfc"], "--classes must be >= 2"),
    (["--seed=-1"], "--seed must be >= 0, got -1"),
    (["--methods=glfc"], 'torch is not installed: pip install -e ".[parity]"'),
  ],
)
def test_parity_mkd_refuses_before_torch(argv, message, no_torch, capsys, tmp_path):
  with pytest.raises(SystemExit) as e:
    _main()([f"--refs_dir={tmp_path}", *argv])
  assert e.value.code == 2
  err = capsys.readouterr().err
  assert "Traceback" not in err
  assert message in err.strip().splitlines()[-1]


def test_parity_mkd_refuses_a_checkout_at_another_commit(tmp_path):
  """The references are checked before anything runs (here as an extracted archive)."""
  ref = pc.REFERENCES["glfc"]
  folder = tmp_path / ref.repo.split("/")[1]
  (folder / "src").mkdir(parents=True)
  (folder / ref.marker).write_text("")
  (folder / pc.COMMIT_FILE).write_text("0" * 40 + "\n")
  with pytest.raises(ValueError, match="the suite pins " + ref.commit):
    pc.reference_checkout("glfc", tmp_path)
