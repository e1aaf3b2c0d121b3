"""The three method families as typed Protocols, and the one each registry family must meet.

A method's factory returns a value of its family (docs/design.md, "The algorithm contract"):

* ``"fl"``, parallel FL, :class:`FLFamily`: ``broadcast`` -> one ``client`` program per sampled
  client -> ``aggregate`` (:class:`fedjax_proj.algorithms.base.FederatedAlgorithm`).
* ``"sequential"``, sequential FL, :class:`SequentialFamily`: a chain of clients, ``begin`` ->
  ``client`` -> ``handoff`` -> ... -> ``end``
  (:class:`fedjax_proj.algorithms.sequential.base.SequentialAlgorithm`).
* ``"continual"``, continual FL, :class:`ContinualFamily`: an FL round algorithm plus an
  ``end_task`` hook (:class:`fedjax_proj.algorithms.continual.base.ContinualMethod`).

The FL and sequential families are both a :class:`RoundAlgorithm`, which is all the training loop
needs; ``make_round(algorithm, executor)`` builds either one's round on the run's
:class:`~fedjax_proj.core.executor.Executor` (strategy, batch builder, mesh, chunk: how clients run,
not part of the algorithm), dispatching on these Protocols. The registry
checks that what a method's ``build`` returns meets its declared family
(:data:`FAMILY_PROTOCOLS`).
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

from fedjax_proj.core.engine import ClientProgram
from fedjax_proj.core.types import Array, PyTree, RoundData


def server_variables(state: PyTree) -> dict:
  """The default ``global_variables`` of every family: the server state's ``variables`` field."""
  return state.variables


@runtime_checkable
class RoundAlgorithm(Protocol):
  """What the training loop needs of a one-task method: a name, the server state's ``init``, the
  per-client program and the global model of a state; ``make_round`` builds its round."""

  name: str
  client: ClientProgram

  def init(self, variables: dict, key: Array) -> PyTree: ...

  def global_variables(self, state: PyTree) -> dict: ...


@runtime_checkable
class FLFamily(RoundAlgorithm, Protocol):
  """Parallel FL: ``broadcast`` -> every sampled client's program -> ``aggregate``."""

  def broadcast(
    self, state: PyTree, round_data: RoundData, key: Array
  ) -> tuple[PyTree, PyTree]: ...

  def aggregate(
    self, state: PyTree, round_data: RoundData, outputs: PyTree, key: Array
  ) -> tuple[PyTree, dict]: ...


@runtime_checkable
class SequentialFamily(RoundAlgorithm, Protocol):
  """Sequential FL: ``begin`` -> client -> ``handoff`` -> ... -> ``end`` along the client chain."""

  def begin(
    self, state: PyTree, round_data: RoundData, key: Array
  ) -> tuple[dict, dict, PyTree]: ...

  def handoff(self, carry: dict, output: PyTree, client_input: PyTree) -> dict: ...

  def end(
    self,
    state: PyTree,
    round_data: RoundData,
    carry: dict,
    outputs: PyTree,
    order: Array,
    key: Array,
  ) -> tuple[PyTree, dict]: ...


@runtime_checkable
class ContinualFamily(Protocol):
  """Continual FL: an FL round ``algorithm`` and an optional ``end_task`` hook run after each task
  (a client pass it runs uses the executor the method was built with)."""

  algorithm: FLFamily
  end_task: Any  # end_task(state, rd_all_clients, key, task) -> (state, metrics), or None


FAMILY_PROTOCOLS: dict[str, type] = {
  "fl": FLFamily,
  "sequential": SequentialFamily,
  "continual": ContinualFamily,
}


def meets_family(value: Any, family: str) -> bool:
  """Whether ``value`` meets the Protocol of ``family`` (for continual: its round algorithm too)."""
  if not isinstance(value, FAMILY_PROTOCOLS[family]):
    return False
  return family != "continual" or isinstance(value.algorithm, FLFamily)
