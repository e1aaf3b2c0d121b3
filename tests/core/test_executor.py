"""The Executor: one value for how a run's clients run (docs/design.md, "Execution")."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_proj.algorithms.base import make_round
from fedjax_proj.algorithms.fedavg import fedavg
from fedjax_proj.algorithms.sequential.fedseq import fedseq
from fedjax_proj.core import tree as tree_lib
from fedjax_proj.core.engine import ClientProgram
from fedjax_proj.core.executor import Executor
from fedjax_proj.core.sharding import client_mesh
from fedjax_proj.data.federated import FederatedData
from tests import helpers

BATCH_FN = helpers.float_batch_fn()
PACKAGE = Path(__file__).resolve().parents[2] / "fedjax_proj"


@pytest.fixture(scope="module")
def setup():
  x, y = helpers.synthetic_data(n=80)
  model = helpers.tiny_model()
  fd = FederatedData(helpers.unequal_clients(len(x), (3, 9, 14, 6)), batch_size=4)
  variables = model.init(jax.random.key(0), jnp.asarray(x[:2]))
  return x, y, model, fd, variables


def test_bad_executors_are_refused_before_anything_is_built(setup):
  *_, model, _, _ = setup
  with pytest.raises(ValueError, match="Resolve strategy='auto'"):
    Executor("auto", BATCH_FN)
  with pytest.raises(ValueError, match="Unknown execution strategy 'bogus'"):
    Executor("bogus", BATCH_FN)
  with pytest.raises(ValueError, match="needs strategy='vmap_scan'"):
    Executor("sequential", BATCH_FN, mesh=client_mesh())
  for chunk in (0, -2, "auto", 2.0, True):
    with pytest.raises(ValueError, match="must be a positive int"):
      Executor("vmap_scan", BATCH_FN, client_chunk=chunk)
  alg = fedavg(model, helpers.sgd())
  with pytest.raises(ValueError, match="from the executor"):
    make_round(alg, Executor("vmap_scan", BATCH_FN), BATCH_FN)
  with pytest.raises(ValueError, match="needs the run's batch_fn"):
    make_round(alg, "vmap_scan")


def _label_sum_program() -> ClientProgram:
  """Each client's output: the sum of its masked labels over every local step (exact in f32)."""
  return ClientProgram(
    lambda shared, ci, key: jnp.zeros((), jnp.float32),
    lambda shared, s, batch, key: s + jnp.sum(batch.y * batch.mask),
    lambda s: {"s": s},
  )


@pytest.mark.parametrize(
  "strategy,chunk,parts",
  [("vmap_scan", None, 1), ("vmap_scan", 3, 2), ("sequential", None, 4), ("vmap_stepwise", 2, 2)],
)
def test_client_chunks_reduce_each_chunk_and_cover_every_client(setup, strategy, chunk, parts):
  x, y, _, fd, _ = setup
  rd = helpers.round_data(fd, x, y)
  run = Executor(strategy, BATCH_FN).client_chunks(
    _label_sum_program(), lambda out: tree_lib.sum_clients(out["s"]), chunk
  )
  keys = jax.random.split(jax.random.key(0), 4)
  chunks = run({}, {}, rd.images, rd.labels, rd.idx, rd.mask, keys)
  assert inspect.isgenerator(chunks)  # the next chunk runs only when the caller asks for it
  sums = [float(s) for s in chunks]
  assert len(sums) == parts
  assert sum(sums) == float(np.sum(y[: 3 + 9 + 14 + 6]))


@pytest.mark.parametrize("strategy", ["vmap_scan", "sequential"])
def test_client_chunks_default_to_the_runs_chunk(setup, strategy):
  x, y, _, fd, _ = setup
  rd = helpers.round_data(fd, x, y)
  keys = jax.random.split(jax.random.key(0), 4)
  executor = Executor(strategy, BATCH_FN, client_chunk=3)

  def counts(chunk=None):
    # Each chunk's reduction is its client count: the chunk sizes, in order.
    run = executor.client_chunks(
      _label_sum_program(), lambda out: out["s"].shape[0] * jnp.ones((), jnp.int32), chunk
    )
    return [int(n) for n in run({}, {}, rd.images, rd.labels, rd.idx, rd.mask, keys)]

  assert counts() == [3, 1]  # the run's chunk bounds a pass that names none
  assert counts(2) == [2, 2]  # a caller's own chunk wins


def test_a_chunk_the_run_chose_yields_to_a_method_that_cannot_stream(setup):
  x, y, model, fd, variables = setup
  streaming = fedavg(model, helpers.sgd())
  plain = streaming._replace(aggregate=streaming.aggregate.direct)  # not a StreamingAggregate
  chosen = Executor("vmap_scan", BATCH_FN, client_chunk=2, chunk_optional=True)
  asked = Executor("vmap_scan", BATCH_FN, client_chunk=2)
  assert chosen.runs_in_chunks(streaming) and not chosen.runs_in_chunks(plain)
  assert asked.runs_in_chunks(plain)
  rd, key = helpers.round_data(fd, x, y), jax.random.key(1)
  got, _ = make_round(plain, chosen)(plain.init(variables, key), rd, key)
  ref, _ = make_round(plain, "vmap_scan", BATCH_FN)(plain.init(variables, key), rd, key)
  # The same program as the ordinary round, run twice: bit for bit.
  np.testing.assert_array_equal(
    tree_lib.tree_ravel(got.variables), tree_lib.tree_ravel(ref.variables)
  )
  with pytest.raises(ValueError, match="no streaming aggregate"):
    make_round(plain, asked)
  chain = fedseq(model, helpers.sgd())
  with pytest.raises(ValueError, match="no streaming aggregate"):
    make_round(chain, asked)
  make_round(chain, chosen)  # the chain round: all clients, one after another


STRATEGY_NAMES = {"vmap_scan", "vmap_stepwise", "sequential"}


def _decodes_strategy(node: ast.AST) -> bool:
  """A comparison with a strategy name: ``x == "vmap_scan"``, ``strategy in (..)``, ... (the name
  ``sequential`` is also a family, so it counts only against something named ``strategy``)."""
  if not isinstance(node, ast.Compare):
    return False
  operands = [node.left, *node.comparators]
  consts = set()
  for op in operands:
    elts = op.elts if isinstance(op, ast.Tuple | ast.List | ast.Set) else [op]
    consts |= {e.value for e in elts if isinstance(e, ast.Constant) and isinstance(e.value, str)}
  if consts & {"vmap_scan", "vmap_stepwise"}:
    return True
  return "sequential" in consts and "strategy" in ast.unparse(node)


def test_only_core_decodes_the_strategy():
  """Outside fedjax_proj/core nothing compares a strategy name or builds a ClientEngine: code asks
  the run's Executor (docs/design.md, "Execution")."""
  found = []
  for f in sorted(PACKAGE.rglob("*.py")):
    if f.relative_to(PACKAGE).parts[0] == "core":
      continue
    for node in ast.walk(ast.parse(f.read_text())):
      call = isinstance(node, ast.Call) and ast.unparse(node.func).endswith("ClientEngine")
      if call or _decodes_strategy(node):
        found.append(f"{f.relative_to(PACKAGE)}:{node.lineno}: {ast.unparse(node)[:80]}")
  assert not found, "strategy decoded outside core:\n" + "\n".join(found)
  # The check sees what it looks for.
  assert _decodes_strategy(ast.parse('s == "vmap_scan"').body[0].value)
  assert _decodes_strategy(ast.parse('strategy not in ("auto", "sequential")').body[0].value)
  assert not _decodes_strategy(ast.parse('family == "sequential"').body[0].value)
