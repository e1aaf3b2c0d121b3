"""Sharding the client axis of a round over local devices (jax.sharding).

Architecture: docs/design.md, "Scale-out".

A round's per-client inputs ([clients, ...]: indices, masks, example counts, client ids) are placed
with ``NamedSharding(mesh, P("clients"))`` and everything else is replicated; the jitted
``vmap_scan`` round is then partitioned along clients by XLA, and the server's weighted mean over
clients becomes a cross-device reduction. The same code runs on one device (a mesh of one).
On CPU, test with ``XLA_FLAGS=--xla_force_host_platform_device_count=N``.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from fedjax_proj.core.types import RoundData

CLIENT_AXIS = "clients"


def client_mesh(devices=None) -> Mesh:
  """A 1-D mesh over ``devices`` (default: all local devices) named ``"clients"``."""
  devices = jax.local_devices() if devices is None else list(devices)
  return Mesh(np.asarray(devices), (CLIENT_AXIS,))


def place_round_data(rd: RoundData, mesh: Mesh, put: Callable) -> RoundData:
  """Places ``rd`` with ``put(array, sharding)``: client-axis fields split, the rest replicated.

  Shared by the single-process (:func:`shard_round_data`, ``jax.device_put``) and multi-process
  (:func:`fedjax_proj.core.distributed.shard_round_data`, global arrays) placements.

  Raises:
    ValueError: the number of sampled clients is not a multiple of the number of devices.
  """
  num_devices = mesh.devices.size
  num_clients = int(rd.idx.shape[0])
  if num_clients % num_devices:
    processes = f" ({jax.process_count()} processes)" if jax.process_count() > 1 else ""
    raise ValueError(
      f"{num_clients} clients per round cannot be split evenly over {num_devices} devices"
      f"{processes}; use a multiple of {num_devices} clients per round (or fewer devices)."
    )
  split = NamedSharding(mesh, P(CLIENT_AXIS))
  replicated = NamedSharding(mesh, P())
  return RoundData(
    images=put(rd.images, replicated),
    labels=put(rd.labels, replicated),
    client_ids=put(rd.client_ids, split),
    idx=put(rd.idx, split),
    mask=put(rd.mask, split),
    num_examples=put(rd.num_examples, split),
    extra=jax.tree.map(lambda x: put(x, replicated), rd.extra),
  )


def shard_round_data(rd: RoundData, mesh: Mesh) -> RoundData:
  """Places the client-axis fields of ``rd`` split over the (local) mesh; the rest replicated."""
  return place_round_data(rd, mesh, jax.device_put)


def replicate(tree, mesh: Mesh):
  """Places every leaf of ``tree`` (e.g. the server state) replicated on the mesh."""
  return jax.device_put(tree, NamedSharding(mesh, P()))
