"""The sequential-FL family: its contract and its chain round (Li & Lyu, NeurIPS 2023; papers/004).

What a round computes: each round the M sampled clients form a sequence in a random order (a pure
function of the round key, hence of (seed, round)); the model passes from one client to the next,
each running E local epochs of the client optimiser from the model it received; the last client's
model is the round's global model (docs/methods.md "Sequential FL (FedSeq)"). There is no averaging.

The chain is inherently sequential, so it does not fit ``FederatedAlgorithm`` (vmap over
clients + aggregate). :class:`SequentialAlgorithm` is the small extension: ``begin`` (server ->
first client), a per-client :class:`~fedjax_proj.core.engine.ClientProgram` (written for ONE
client, as everywhere else), ``handoff`` (client m's output -> client m+1's carry) and ``end``
(chain -> server state). It has the attributes :func:`fedjax_proj.training.loop.train` reads
(``name``, ``init``, ``global_variables``), and :func:`fedjax_proj.algorithms.base.make_round`
builds its chain round (:func:`make_sequential_round`) for any strategy and the run's batch
builder, so the experiment runner and every other caller of ``make_round`` work unchanged. FedSeq
(fedseq.py), CWC (cwc.py) and SFedKD (sfedkd.py) are built on it.

Execution strategies (identical semantics; tests/algorithms/sequential/test_base.py
proves it):

* ``vmap_scan``: one jitted round, ``lax.scan`` over the sequence; each client runs through the
  engine's ``run_vmap_scan`` on a client axis of size 1 (scan over its steps). * ``sequential`` /
``vmap_stepwise``: a host loop over the sequence; each client runs through a
:class:`~fedjax_proj.core.engine.ClientEngine` of that strategy (one jitted call per local step).
docs/design.md ("Measured facts about XLA:CPU") records convolutions inside ``lax.scan`` ~10x slower
on XLA:CPU, so ``auto`` (resolved by :func:`fedjax_proj.core.engine.choose_strategy`) picks this for
conv models on CPU.

PRNG: the round key is split into named streams ``order``, ``begin``, ``clients`` and ``end``;
client keys are indexed by position in the sequence, and inside a client the engine's own key
derivation applies, so both strategies draw the same numbers.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_proj.algorithms.families import server_variables
from fedjax_proj.core import random as random_lib
from fedjax_proj.core import tree as tree_lib
from fedjax_proj.core.engine import BatchFn, ClientEngine, ClientProgram, run_vmap_scan
from fedjax_proj.core.engine import validate_strategy as _validate_strategy
from fedjax_proj.core.types import Array, PyTree, RoundData

# begin(state, rd, key) -> (context, carry, client_inputs)
BeginFn = Callable[[PyTree, RoundData, Array], tuple[dict, dict, PyTree]]
# handoff(carry, client_output, client_input) -> carry for the next client
HandoffFn = Callable[[dict, PyTree, PyTree], dict]
# end(state, rd, carry, outputs (stacked in sequence order), order, key) -> (state, metrics)
EndFn = Callable[[PyTree, RoundData, dict, PyTree, Array, Array], tuple[PyTree, dict]]


def sequence_order(key: Array, num_clients: int) -> Array:
  """The round's client order: a permutation of positions ``0..M-1`` of ``round_data``."""
  return jax.random.permutation(random_lib.stream_key(key, "order"), num_clients)


def _keys(key: Array, num_clients: int) -> tuple[Array, Array, Array, Array]:
  return (
    sequence_order(key, num_clients),
    random_lib.stream_key(key, "begin"),
    random_lib.client_keys(random_lib.stream_key(key, "clients"), num_clients),
    random_lib.stream_key(key, "end"),
  )


def default_handoff(carry: dict, output: PyTree, client_input: PyTree) -> dict:
  """FedSeq: the next client receives this client's model."""
  del client_input
  return {**carry, "variables": output["variables"]}


class SequentialAlgorithm(NamedTuple):
  """A sequential-FL algorithm as pure functions; meets
  :class:`~fedjax_proj.algorithms.families.SequentialFamily` (``"sequential"``).

  Attributes:
    name: method name.
    init: ``init(variables, key) -> server_state``.
    begin: ``begin(state, rd, key) -> (context, carry, client_inputs)``. Each client's program
      sees ``shared = {**context, **carry}``; ``context`` is fixed for the round (e.g. teachers),
      ``carry`` passes along the chain and must hold ``"variables"``; ``client_inputs`` is stacked
      over the round's clients in ``round_data`` order.
    client: the per-client :class:`ClientProgram` (output must hold ``"variables"`` and
      ``"metrics"``).
    handoff: ``handoff(carry, output, client_input) -> carry`` for the next client.
    end: ``end(state, rd, carry, outputs, order, key) -> (state, metrics)``; ``outputs`` are
      stacked in sequence order, ``order[m]`` is the ``round_data`` position of the m-th client.
    global_variables: ``global_variables(state) -> variables`` (evaluation); by default the
      state's ``variables`` field.
  """

  name: str
  init: Callable[[dict, Array], PyTree]
  begin: BeginFn
  client: ClientProgram
  handoff: HandoffFn
  end: EndFn
  global_variables: Callable[[PyTree], dict] = server_variables


def _traced_round(
  alg: SequentialAlgorithm, batch_fn: BatchFn, state, rd: RoundData, key, unroll: int = 1
):
  m = rd.idx.shape[0]
  order, b_key, c_keys, e_key = _keys(key, m)
  context, carry, inputs = alg.begin(state, rd, b_key)

  def body(carry, xs):
    c, c_key = xs
    out = run_vmap_scan(
      alg.client,
      batch_fn,
      {**context, **carry},
      tree_lib.index_clients(inputs, c[None]),
      rd.images,
      rd.labels,
      rd.idx[c][None],
      rd.mask[c][None],
      c_key[None],
      unroll=unroll,
    )
    out = tree_lib.index_clients(out, 0)
    return alg.handoff(carry, out, tree_lib.index_clients(inputs, c)), out

  carry, outputs = jax.lax.scan(body, carry, (order, c_keys))
  return alg.end(state, rd, carry, outputs, order, e_key)


def make_sequential_round(
  alg: SequentialAlgorithm, strategy: str, batch_fn: BatchFn, unroll: int = 1
) -> Callable:
  """Builds the round for ``strategy`` (``auto`` must be resolved first, as for ``make_round``);
  ``batch_fn`` builds each local step's batch.

  ``vmap_scan`` jits the whole round (server state donated). ``sequential`` and ``vmap_stepwise``
  loop over the sequence on the host; ``begin``, ``handoff`` and ``end`` are jitted once each.
  """
  _validate_strategy(strategy)
  if strategy == "auto":
    raise ValueError("Resolve strategy='auto' with choose_strategy() before building a round.")
  if strategy == "vmap_scan":
    return jax.jit(
      lambda s, rd, k: _traced_round(alg, batch_fn, s, rd, k, unroll), donate_argnums=0
    )

  engine = ClientEngine(alg.client, batch_fn, strategy)
  keys = jax.jit(_keys, static_argnums=1)
  begin = jax.jit(alg.begin)
  gather = jax.jit(lambda inputs, c: tree_lib.index_clients(inputs, c))
  handoff = jax.jit(
    lambda carry, out, inputs, c: alg.handoff(
      carry, tree_lib.index_clients(out, 0), tree_lib.index_clients(inputs, c)
    )
  )
  end = jax.jit(alg.end, donate_argnums=0)
  first = jax.jit(lambda out: tree_lib.index_clients(out, 0))

  def host_round(state, rd: RoundData, key):
    m = rd.idx.shape[0]
    order, b_key, c_keys, e_key = keys(key, m)
    context, carry, inputs = begin(state, rd, b_key)
    host_idx, host_mask = np.asarray(rd.idx), np.asarray(rd.mask)
    outputs = []
    for pos, c in enumerate(np.asarray(order).tolist()):
      out = engine.run(
        {**context, **carry},
        gather(inputs, jnp.asarray([c])),
        rd.images,
        rd.labels,
        host_idx[c : c + 1],
        host_mask[c : c + 1],
        c_keys[pos : pos + 1],
      )
      carry = handoff(carry, out, inputs, c)
      outputs.append(first(out))
    return end(state, rd, carry, tree_lib.stack_clients(outputs), order, e_key)

  return host_round


def chain_metrics(outputs: dict, rd: RoundData, order: Array) -> dict:
  """Example-weighted means of the clients' reported metrics (outputs in sequence order)."""
  weights = rd.num_examples[order]
  return {k: tree_lib.weighted_mean(v, weights) for k, v in outputs["metrics"].items()}


def check_no_server_optimizer(server_optimizer: Any, name: str) -> None:
  if server_optimizer is not None:
    raise ValueError(
      f"{name} is sequential FL: the last client's model is the global model, there is no server "
      "aggregation for a server optimiser. Use --server_optimizer=none."
    )
