"""Federated algorithms, one module per method, behind the FederatedAlgorithm interface."""

from fedjax_proj.algorithms.base import FederatedAlgorithm, make_round
from fedjax_proj.algorithms.registry import (
  BuildContext,
  MethodSpec,
  build_algorithm,
  methods,
  register,
)
from fedjax_proj.core.rounds import StreamingAggregate  # the aggregate form methods build

__all__ = [
  "BuildContext",
  "FederatedAlgorithm",
  "MethodSpec",
  "StreamingAggregate",
  "build_algorithm",
  "make_round",
  "methods",
  "register",
]
