"""FedSeq: plain local cross-entropy training passed along the client sequence.

Li & Lyu, NeurIPS 2023, as used by SFedKD (papers/004; docs/methods.md "Sequential FL (FedSeq)"):
each round the sampled clients form a random sequence, each trains from the model it received,
and the last client's model is the round's global model. There is no averaging. The chain round
itself (order, keys, strategies) is :mod:`fedjax_proj.algorithms.sequential.base`.
"""

from __future__ import annotations

from typing import NamedTuple

import jax.numpy as jnp
import optax

from fedjax_proj.algorithms import client as client_lib
from fedjax_proj.algorithms.registry import factory_spec
from fedjax_proj.algorithms.sequential.base import (
  SequentialAlgorithm,
  chain_metrics,
  default_handoff,
)
from fedjax_proj.core import tree as tree_lib
from fedjax_proj.core.types import Array, Model


class FedSeqState(NamedTuple):
  round: Array
  variables: dict


def fedseq(
  model: Model,
  client_optimizer: optax.GradientTransformation,
  name: str = "fedseq",
) -> SequentialAlgorithm:
  """Builds FedSeq: plain local cross-entropy training passed along the client sequence.

  Args:
    model: the model as pure functions.
    client_optimizer: local optimiser (re-initialised at every client, as in FedAvg).
    name: method name reported in logs.
  """
  program = client_lib.local_training_client(
    model, client_optimizer, client_lib.cross_entropy_loss(model)
  )

  def init(variables, key):
    del key
    return FedSeqState(jnp.zeros((), jnp.int32), tree_lib.tree_copy(variables))

  def begin(state, rd, key):
    del rd, key
    return {}, {"variables": state.variables}, {}

  def end(state, rd, carry, outputs, order, key):
    del key
    return FedSeqState(state.round + 1, carry["variables"]), chain_metrics(outputs, rd, order)

  return SequentialAlgorithm(
    name=name,
    init=init,
    begin=begin,
    client=program,
    handoff=default_handoff,
    end=end,
  )


SPEC = factory_spec("fedseq", "sequential", fedseq, fixed={"name": "fedseq"})
