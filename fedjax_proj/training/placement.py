"""Device placement and the chunking decision: how a round's clients meet the devices.

:func:`client_mesh_for` decides whether the client axis is sharded (and over which devices),
:func:`build_round` whether clients run in chunks with streaming aggregation, and
:func:`placed_round` puts each round's inputs on the mesh (docs/performance.md).
"""

from __future__ import annotations

import jax

from fedjax_proj.algorithms.base import make_round
from fedjax_proj.core import distributed, sharding
from fedjax_proj.core.chunked import auto_client_chunk, make_chunked_round, tree_bytes
from fedjax_proj.core.rounds import streaming_of


def client_mesh_for(c, strategy: str, log):
  """The mesh the client axis is sharded over, or None for the plain single-device round."""
  if jax.process_count() > 1:
    devices = jax.device_count()
    if strategy != "vmap_scan":
      raise ValueError(
        f"A multi-process run needs --strategy=vmap_scan (the sharded round); auto chose "
        f"{strategy!r} for this model and backend."
      )
    if c.clients_per_round % devices:
      raise ValueError(
        f"--clients_per_round={c.clients_per_round} is not a multiple of the {devices} devices of "
        f"the {jax.process_count()} processes; use a multiple of {devices} clients per round."
      )
    log(
      f"sharding the client axis over {devices} devices of {jax.process_count()} processes "
      f"(process {jax.process_index()} holds {jax.local_device_count()})"
    )
    return distributed.global_client_mesh()
  devices = jax.local_device_count()
  if not c.get("shard_clients", True) or devices == 1 or strategy != "vmap_scan":
    return None
  if c.clients_per_round % devices:
    log(
      f"note: not sharding clients: clients_per_round={c.clients_per_round} is not a multiple "
      f"of the {devices} local devices"
    )
    return None
  log(f"sharding the client axis over {devices} devices")
  return sharding.client_mesh()


def build_round(algorithm, strategy: str, batch_fn, c, variables, log, mesh=None):
  """The round function: chunked (streaming aggregation) when asked for and possible.

  ``batch_fn`` is the run's batch builder (:func:`fedjax_proj.data.pipeline.make_batch_fn`). With
  a ``mesh`` each chunk's clients are sharded over its devices, so ``auto`` budgets one device's
  share of the cohort.
  """
  chunk = str(c.get("client_chunk", "auto")).lower()
  if chunk == "none":
    return make_round(algorithm, strategy, batch_fn)
  shards = 1 if mesh is None else int(mesh.devices.size)
  per_device = f" ({-(-int(chunk) // shards)} per device)" if shards > 1 and chunk.isdigit() else ""
  if chunk == "auto":
    if streaming_of(algorithm) is None:
      return make_round(algorithm, strategy, batch_fn)
    local = c.clients_per_round // shards
    size = auto_client_chunk(local, tree_bytes(variables))
    if size >= local:  # the whole cohort fits: the ordinary round
      return make_round(algorithm, strategy, batch_fn)
    per_device = f" ({size} per device)" if shards > 1 else ""
    log(
      f"clients run in chunks of {size * shards}{per_device} with streaming aggregation "
      "(client_chunk=auto)"
    )
    return make_chunked_round(algorithm, strategy, batch_fn, size * shards, mesh=mesh)
  log(f"clients run in chunks of {int(chunk)}{per_device} with streaming aggregation")
  return make_chunked_round(algorithm, strategy, batch_fn, int(chunk), mesh=mesh)


def placed_round(round_fn, mesh):
  """Wraps ``round_fn`` to place its inputs on ``mesh`` (clients split, the rest replicated).

  The training set and the other shared inputs are the same objects every round, so they are
  placed once. Several processes: inputs become global arrays (each process fills its own devices
  from the identical host data it computed) and the outputs stay global.
  """
  if mesh is None:
    return round_fn
  if jax.process_count() > 1:
    place_rd, place_tree = distributed.shard_round_data, distributed.replicate
  else:
    place_rd, place_tree = sharding.shard_round_data, sharding.replicate
  shared: dict = {}

  def sharded(state, rd, key):
    source = (rd.images, rd.labels, rd.extra)
    cached = shared.get("source", ())
    # The cache keeps the sources alive, so an identity match cannot be a recycled object.
    if len(cached) != 3 or any(a is not b for a, b in zip(cached, source, strict=True)):
      shared["placed"], shared["source"] = place_rd(rd, mesh), source
    placed = shared["placed"]
    # Only the per-client fields change between rounds.
    rd = place_rd(rd._replace(images=placed.images, labels=placed.labels, extra=placed.extra), mesh)
    return round_fn(place_tree(state, mesh), rd, place_tree(key, mesh))

  return sharded
