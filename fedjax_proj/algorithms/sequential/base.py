"""The sequential-FL family: its contract (Li & Lyu, NeurIPS 2023; papers/004).

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
builds its chain round (:func:`fedjax_proj.core.chain.make_chain_round`, through the run's
:class:`~fedjax_proj.core.executor.Executor`) for any strategy, so the experiment runner and every
other caller of ``make_round`` work unchanged. The chain's execution strategies and PRNG streams
are described in :mod:`fedjax_proj.core.chain`; tests/algorithms/sequential/test_base.py proves
the strategies equal. FedSeq (fedseq.py), CWC (cwc.py) and SFedKD (sfedkd.py) are built on it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

from fedjax_proj.algorithms.families import server_variables
from fedjax_proj.core import tree as tree_lib
from fedjax_proj.core.engine import ClientProgram
from fedjax_proj.core.types import Array, PyTree, RoundData

# begin(state, rd, key) -> (context, carry, client_inputs)
BeginFn = Callable[[PyTree, RoundData, Array], tuple[dict, dict, PyTree]]
# handoff(carry, client_output, client_input) -> carry for the next client
HandoffFn = Callable[[dict, PyTree, PyTree], dict]
# end(state, rd, carry, outputs (stacked in sequence order), order, key) -> (state, metrics)
EndFn = Callable[[PyTree, RoundData, dict, PyTree, Array, Array], tuple[PyTree, dict]]


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


def chain_metrics(outputs: dict, rd: RoundData, order: Array) -> dict:
  """Example-weighted means of the clients' reported metrics (outputs in sequence order)."""
  weights = rd.num_examples[order]
  return {k: tree_lib.weighted_mean(v, weights) for k, v in outputs["metrics"].items()}
