"""The chain round of sequential FL: each client starts from the model its predecessor trained.

Execution of the sequential family's contract (``begin`` -> client -> ``handoff`` -> ... ->
``end``; :class:`fedjax_proj.algorithms.sequential.base.SequentialAlgorithm`, docs/design.md,
"Families"). The algorithm is read by attribute, so core needs no algorithm type.

* The one-program strategy (``vmap_scan``): one jitted round, ``lax.scan`` over the sequence; each
  client runs through the engine on a client axis of size 1 (a scan over its steps).
* Host-looped strategies: a host loop over the sequence, each client through the engine (one
  jitted call per local step); ``begin``, ``handoff`` and ``end`` are jitted once each.
  docs/design.md ("Measured facts about XLA:CPU") records convolutions inside ``lax.scan`` ~10x
  slower on XLA:CPU, so ``auto`` picks this for conv models on CPU.

PRNG: the round key is split into named streams ``order``, ``begin``, ``clients`` and ``end``;
client keys are indexed by position in the sequence, and inside a client the engine's own key
derivation applies, so every strategy draws the same numbers.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_proj.core import random as random_lib
from fedjax_proj.core import tree as tree_lib
from fedjax_proj.core.engine import ClientEngine
from fedjax_proj.core.types import Array, RoundData


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


def _traced_round(alg, engine: ClientEngine, state, rd: RoundData, key):
  m = rd.idx.shape[0]
  order, b_key, c_keys, e_key = _keys(key, m)
  context, carry, inputs = alg.begin(state, rd, b_key)

  def body(carry, xs):
    c, c_key = xs
    out = engine.run(
      {**context, **carry},
      tree_lib.index_clients(inputs, c[None]),
      rd.images,
      rd.labels,
      rd.idx[c][None],
      rd.mask[c][None],
      c_key[None],
    )
    out = tree_lib.index_clients(out, 0)
    return alg.handoff(carry, out, tree_lib.index_clients(inputs, c)), out

  carry, outputs = jax.lax.scan(body, carry, (order, c_keys))
  return alg.end(state, rd, carry, outputs, order, e_key)


def make_chain_round(alg, engine: ClientEngine) -> Callable:
  """``round_fn(state, round_data, key) -> (state, metrics)`` of a sequential algorithm ``alg``
  whose client program ``engine`` runs (see the module docstring); the server state is donated.
  """
  if engine.traceable:
    return jax.jit(lambda s, rd, k: _traced_round(alg, engine, s, rd, k), donate_argnums=0)

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
