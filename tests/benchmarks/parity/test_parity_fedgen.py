"""benchmarks/parity/fedgen.py: the torch-free pieces of the FedDistill+ and FedGen rows.

The rows hand our random draws to the reference and classify differences by recomputing them
under the reference's rule on our side; these tests check that those pieces are what they claim:
the draws are the ones our aggregate makes, the "code's rule" helpers reduce to ours exactly where
the codes agree and depart from it where they do not, the Adam and BatchNorm recomputations
match optax and the unbiased variance, and the script refuses bad flags before torch.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def pf():
  from benchmarks.parity import fedgen

  return fedgen


class Args:
  seed, classes = 0, 5


def test_client_labels_have_the_counts_asked_for(pf):
  y = pf.client_labels(16, 5, (6, 4, 3, 2, 1))
  assert np.bincount(y, minlength=5).tolist() == [6, 4, 3, 2, 1]
  assert np.bincount(pf.client_labels(15, 5), minlength=5).tolist() == [3] * 5
  with pytest.raises(ValueError, match="summing to 16"):
    pf.client_labels(16, 5, (1, 1, 1, 1, 1))


def test_our_distill_round_is_the_count_weighted_mean_and_the_code_rule_is_not(pf):
  """Our server row's side: Σ_k S_k / Σ_k n_k from the clients' own tables; the codes' rule
  (unweighted mean of S_k/(n_k + plus)) equals it only at equal counts with plus = 0."""
  from benchmarks.parity import common as pc

  inp = pc.tiny_inputs(0)
  for counts, agree in (([None] * 3, True), (list(pf.UNEQUAL[:2]), False)):  # no zero count
    clients = pf.distill_clients(Args, counts)
    outs, g, known = pf.our_distill_round(inp.model, clients, 5)
    sums = sum(o["logit_sums"] for o in outs)
    n = sum(o["label_counts"] for o in outs)
    assert known.all()
    np.testing.assert_allclose(g, sums / n[:, None], rtol=1e-5, atol=1e-6)
    # The tables are the clients' logits summed by class.
    for c, o in zip(clients, outs):
      logits = np.asarray(inp.model.apply(c["variables"], c["x"], train=True).logits)
      np.testing.assert_allclose(o["logit_sums"], np.eye(5)[c["y"]].T @ logits, atol=1e-5)
    rule = pf.unweighted_class_means(outs, 0.0)
    assert np.allclose(rule, g, atol=1e-5) == agree
    assert not np.allclose(pf.unweighted_class_means(outs, 1.0), g, atol=1e-3)


def _fedgen_round(pf, counts):
  from benchmarks.parity import common as pc

  inp = pc.tiny_inputs(0)
  alg, state, gen = pf.our_generator(inp, Args)
  clients = [pc.tiny_inputs(60 + k).variables for k in range(len(counts))]
  outputs = {
    "variables": pf.stack_outputs(clients),
    "num_steps": jnp.ones(len(counts), jnp.int32),
    "metrics": {"train_loss": jnp.zeros(len(counts)), "train_accuracy": jnp.zeros(len(counts))},
    "label_counts": jnp.asarray(counts),
  }
  key = jax.random.key(3)
  new, metrics = alg.aggregate(state, pf.round_data(len(counts)), outputs, key)
  labels, eps = pf.generator_draws(key, counts, len(inp.y), noise_dim=pf.GEN_NOISE)
  heads = outputs["variables"]["params"]["head"]
  return new, metrics, gen, heads, labels, eps


def test_generator_draws_are_the_aggregates(pf):
  """The draws handed to the reference reproduce our aggregate's step: the same losses, and the
  optimiser's first moment is 0.1·(g + λθ) of the same gradient; no draw is of a class no
  client holds."""
  counts = np.asarray([[6, 4, 3, 3, 0], [1, 2, 9, 4, 0], [0, 5, 5, 6, 0]], np.float32)
  new, metrics, gen, heads, labels, eps = _fedgen_round(pf, counts)
  assert 4 not in labels.tolist() and eps.shape == (16, pf.GEN_NOISE)
  ours = pf.generator_objective(gen, heads, counts, labels, eps, num_classes=5)
  assert ours["teacher"] == pytest.approx(float(metrics["generator_teacher_loss"]), rel=1e-6)
  assert ours["diversity"] == pytest.approx(float(metrics["generator_diversity"]), rel=1e-6)
  from fedjax_proj.algorithms.distillation import fedgen

  mu, nu = pf.adam_moments(new.generator_opt_state)
  m, v = pf.adam_first_moments(
    pc_flatten(ours["grads"]), pc_flatten(gen["params"]), fedgen.GENERATOR_WEIGHT_DECAY
  )
  for k in m:
    np.testing.assert_allclose(pc_flatten(mu)[k], m[k], rtol=1e-4, atol=1e-9)
    np.testing.assert_allclose(pc_flatten(nu)[k], v[k], rtol=1e-4, atol=1e-12)
  # Other draws give other losses: the check above can fail.
  other = pf.generator_objective(gen, heads, counts, labels, eps[::-1], num_classes=5)
  assert abs(other["diversity"] - ours["diversity"]) + abs(other["teacher"] - ours["teacher"]) > 0


def pc_flatten(tree):
  from benchmarks.parity import common as pc

  return pc.flatten(tree)


def test_code_teacher_rule_agrees_only_at_constant_weights(pf):
  """FedGen's code's teacher term, mean(CE)·mean(w), is ours, mean(w·CE), when every label has
  the same weight (equal counts), and not otherwise."""
  for counts, agree in (
    (np.full((3, 5), 4.0, np.float32), True),
    (np.asarray([[6, 4, 3, 3, 0], [1, 2, 9, 4, 0], [0, 5, 5, 6, 0]], np.float32), False),
  ):
    _, _, gen, heads, labels, eps = _fedgen_round(pf, counts)
    ours = pf.generator_objective(gen, heads, counts, labels, eps, num_classes=5)
    code = pf.generator_objective(
      gen, heads, counts, labels, eps, num_classes=5, teacher_rule="code"
    )
    assert code["diversity"] == ours["diversity"]
    assert (abs(code["teacher"] - ours["teacher"]) < 1e-6) == agree
  with pytest.raises(ValueError, match="teacher_rule"):
    pf.generator_objective(gen, heads, counts, labels, eps, num_classes=5, teacher_rule="x")


def test_unbiased_running_var_is_torchs_update(pf):
  """Our BatchNorm's running variance after one training pass, recomputed with the unbiased
  batch variance, is torch's update (1 − m)·before + m·var(ddof=1)."""
  import flax.linen as nn

  x = np.random.default_rng(0).standard_normal((16, 6)).astype(np.float32)
  bn = nn.BatchNorm(use_running_average=False, momentum=0.9, epsilon=1e-5)
  variables = bn.init(jax.random.key(0), x)
  before = np.linspace(0.5, 2.0, 6).astype(np.float32)
  variables = {**variables, "batch_stats": {"mean": jnp.zeros(6), "var": jnp.asarray(before)}}
  _, new = bn.apply(variables, x, mutable="batch_stats")
  ours = np.asarray(new["batch_stats"]["var"])
  np.testing.assert_allclose(ours, 0.9 * before + 0.1 * x.var(0), rtol=1e-5)
  np.testing.assert_allclose(
    pf.unbiased_running_var(ours, before, 16), 0.9 * before + 0.1 * x.var(0, ddof=1), rtol=1e-5
  )


def test_adam_first_moments_match_optax(pf):
  params = {"w": np.array([1.0, -2.0, 0.5], np.float32)}
  grads = {"w": np.array([0.3, 0.0, -1.0], np.float32)}
  opt = optax.chain(optax.add_decayed_weights(0.01), optax.scale_by_adam())
  _, state = opt.update(grads, opt.init(params), params)
  m, v = pf.adam_first_moments(grads, params, 0.01)
  np.testing.assert_allclose(state[1].mu["w"], m["w"], rtol=1e-6)
  np.testing.assert_allclose(state[1].nu["w"], v["w"], rtol=1e-6)


def test_moment_entries_leave_out_the_zero_gradient_bias(pf):
  m = {"fc/bias": np.ones(2), "fc/kernel": np.ones((2, 2))}
  out = pf.moment_entries(1.0, m, m)
  assert set(out) == {"loss", "adam_m/fc/kernel", "adam_v/fc/kernel"}


def test_draws_hand_out_the_queue_and_refuse_a_mismatch(pf):
  draws = pf.Draws(np, choice=[np.array([2, 0, 2])])
  assert draws.random.choice([0, 1, 2], 3).tolist() == [2, 0, 2] and draws.used_up()
  assert draws.arange(3).tolist() == [0, 1, 2]  # the rest is numpy
  with pytest.raises(ValueError, match="queued"):
    pf.Draws(np, choice=[np.array([3])]).random.choice([0, 1, 2], 1)  # 3 is not a choice
  with pytest.raises(ValueError, match="queued"):
    pf.Draws(np, choice=[np.array([1, 1])]).random.choice([0, 1, 2], 3)


def test_module_constant_reads_a_literal_without_running_the_file(pf, tmp_path):
  path = tmp_path / "server.py"
  path.write_text("import torchvision\nMIN_SAMPLES_PER_LABEL=1\n")
  assert pf.module_constant(path, "MIN_SAMPLES_PER_LABEL") == 1
  with pytest.raises(ValueError, match="sets no OTHER"):
    pf.module_constant(path, "OTHER")


@pytest.mark.parametrize(
  "argv, message",
  [
    (["--methods=fedgen,fedgen"], "--methods=fedgen,fedgen lists fedgen more than once"),
    (["--methods=moon"], "unknown moon; choose from feddistill_plus, feddistill_fedgen, fedgen"),
    (["--methods=fedgen"], 'torch is not installed: pip install -e ".[parity]"'),
  ],
)
def test_parity_fedgen_refuses_before_torch(pf, argv, message, capsys, monkeypatch, tmp_path):
  monkeypatch.setitem(sys.modules, "torch", None)
  monkeypatch.setattr(os, "sched_setaffinity", lambda *a: pytest.fail("pinned before checks"))
  with pytest.raises(SystemExit) as e:
    pf.main([f"--refs_dir={tmp_path}", *argv])
  assert e.value.code == 2
  err = capsys.readouterr().err
  assert "Traceback" not in err and message in err.strip().splitlines()[-1]


def test_rows_refuse_a_class_count_their_tables_are_not_written_for(pf):
  pf.five_classes(Args)

  class Four(Args):
    classes = 4

  with pytest.raises(ValueError, match="run them with --classes=5"):
    pf.five_classes(Four)
