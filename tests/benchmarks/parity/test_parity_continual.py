"""benchmarks/parity/continual.py: its torch-free pieces (docs/parity.md, "EWC and ER").

Our side of the EWC rows is the Fisher our ``ewc`` method's end-of-task pass stores, read through
:func:`our_fishers`; the test holds it to the empirical Fisher computed here independently (the
mean over each client's examples of the squared per-example gradient, summed over tasks), so the
row compares what it says it compares. The FOT code's inventory must see an EWC trainer where
there is one.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from benchmarks.parity import common as pc
from benchmarks.parity import continual as parity
from fedjax_proj.algorithms import losses


def _empirical_fisher(model, variables, x, y):
  def ce_one(p, xi, yi):
    out = model.apply({**variables, "params": p}, xi[None], train=False, task=0)
    return losses.cross_entropy(out.logits, yi[None])

  g = jax.vmap(jax.grad(ce_one), in_axes=(None, 0, 0))(variables["params"], x, y)
  return jax.tree.map(lambda a: np.asarray(jnp.mean(jnp.square(a), axis=0)), g)


def test_our_fishers_are_each_clients_empirical_fisher_summed_over_tasks():
  inp = pc.tiny_inputs(0, batch=32, hidden=(8,), classes=3, others=("anchor",))
  model = parity.our_task_model(inp)
  anchor = inp.others["anchor"]
  tasks = [(inp.x[:16], inp.y[:16]), (inp.x[16:], inp.y[16:])]
  cm = parity.our_continual("ewc", model, 2, 2, lam=40.0, fisher="client")
  after = parity.our_fishers(cm, anchor, tasks, clients=2, batch=4)
  for c in range(2):
    sl = slice(8 * c, 8 * (c + 1))
    first = _empirical_fisher(model, anchor, tasks[0][0][sl], tasks[0][1][sl])
    second = _empirical_fisher(model, anchor, tasks[1][0][sl], tasks[1][1][sl])
    got1, got2 = parity.client_slice(after[0], c), parity.client_slice(after[1], c)
    for want, got in ((first, got1), (jax.tree.map(np.add, first, second), got2)):
      for w, g in zip(jax.tree.leaves(want), jax.tree.leaves(got)):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-9)
  assert not np.allclose(after[0]["head"]["kernel"][0], after[0]["head"]["kernel"][1])


def test_fot_code_inventory_sees_a_trainer_and_the_algo_choices(tmp_path):
  (tmp_path / "experiment").mkdir()
  (tmp_path / "experiment" / "main.py").write_text(
    'parser.add_argument( "--algo", type=str, default="normal",\n'
    '                     help="Algorithm list: normal, orth", )\n'
  )
  (tmp_path / "trainer.py").write_text(
    "def normal_train(model):\n  return model\n\n# fisher_dict = info\n"
  )
  inv = parity.fot_code_inventory(tmp_path)
  assert inv["algo_help"] == "Algorithm list: normal, orth"
  assert inv["definitions"] == [] and inv["lines"] == ["trainer.py:4: # fisher_dict = info"]
  (tmp_path / "ewc.py").write_text("class EWCTrainer:\n  def ewc_loss(self):\n    pass\n")
  inv = parity.fot_code_inventory(tmp_path)
  assert inv["definitions"] == ["ewc.py:1: EWCTrainer", "ewc.py:2: ewc_loss"]


def test_which_replayed_reads_the_example_from_the_step_loss():
  batch_ce = np.array([0.5, 1.0, 2.0])
  stored_ce = np.array([0.1, 0.7, 3.0])
  for j in range(3):
    assert parity.which_replayed((batch_ce.sum() + stored_ce[j]) / 4, batch_ce, stored_ce) == j
  with pytest.raises(ValueError, match="not identifiable"):
    parity.which_replayed(batch_ce.sum() / 4 + 0.1, batch_ce, stored_ce)
