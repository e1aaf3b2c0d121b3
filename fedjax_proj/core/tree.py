"""Pytree utilities over a leading client axis, and whole-model vector algebra.

A "stacked" pytree has a leading client axis on every leaf. Everything here is pure and jit-safe.
The flattened dot/norm treat a whole pytree as one vector: FedProj's projection takes ONE inner
product across every parameter leaf, never one per tensor.
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import jax.numpy as jnp
import optax

from fedjax_proj.core.types import Array, PyTree

tree_add = optax.tree_utils.tree_add
tree_sub = optax.tree_utils.tree_sub
tree_scale = optax.tree_utils.tree_scale
tree_zeros_like = optax.tree_utils.tree_zeros_like


def tree_copy(tree: PyTree) -> PyTree:
  """Fresh device copies of every leaf, so donating a state never deletes the caller's arrays."""
  return jax.tree.map(jnp.array, tree)


def stack_clients(trees: Sequence[PyTree]) -> PyTree:
  """Stacks per-client pytrees into one pytree with a leading client axis."""
  if not trees:
    raise ValueError("stack_clients needs at least one pytree.")
  return jax.tree.map(lambda *leaves: jnp.stack(leaves), *trees)


def unstack_clients(tree: PyTree) -> list[PyTree]:
  """Inverse of :func:`stack_clients`."""
  leaves, treedef = jax.tree.flatten(tree)
  if not leaves:
    return []
  n = leaves[0].shape[0]
  return [treedef.unflatten([leaf[i] for leaf in leaves]) for i in range(n)]


def broadcast_clients(tree: PyTree, num_clients: int) -> PyTree:
  """Repeats one pytree along a new leading client axis."""
  return jax.tree.map(lambda x: jnp.broadcast_to(x, (num_clients, *jnp.shape(x))), tree)


def index_clients(tree: PyTree, idx: Array | int) -> PyTree:
  """Gathers clients ``idx`` (int or int array) from a stacked pytree."""
  return jax.tree.map(lambda x: x[idx], tree)


def scatter_clients(tree: PyTree, idx: Array, values: PyTree) -> PyTree:
  """Writes stacked ``values`` into rows ``idx`` of a stacked pytree; other rows are unchanged."""
  return jax.tree.map(lambda x, v: x.at[idx].set(v.astype(x.dtype)), tree, values)


def sum_clients(stacked: PyTree) -> PyTree:
  """Σ_k x_k over the leading client axis of every leaf, as a contraction with ones.

  XLA:CPU lowers ``jnp.sum(x, axis=0)`` over a leading axis to a reduction that is 40-100x slower
  than the same sum as a [C] x [C, ...] contraction (measured 167 ms vs 3.8 ms for [64, 784, 400]
  float32; 0.5 s vs 5 ms for FOT's [64, 784, 784] sketches), so client-axis sums go through here.
  """
  return jax.tree.map(lambda x: jnp.tensordot(jnp.ones(x.shape[0], x.dtype), x, axes=1), stacked)


def weighted_mean(stacked: PyTree, weights: Array) -> PyTree:
  """Σ_k w_k x_k / Σ_k w_k over the leading client axis of every leaf (a contraction, as
  :func:`sum_clients` explains)."""
  w = jnp.asarray(weights, jnp.float32)
  w = w / jnp.sum(w)

  def mean(x):
    return jnp.tensordot(w, x.astype(jnp.float32), axes=1).astype(x.dtype)

  return jax.tree.map(mean, stacked)


def tree_dot(a: PyTree, b: PyTree) -> Array:
  """Inner product of two pytrees viewed as single flat vectors (float32 accumulation)."""
  parts = jax.tree.map(lambda x, y: jnp.vdot(x.astype(jnp.float32), y.astype(jnp.float32)), a, b)
  return sum(jax.tree.leaves(parts), jnp.zeros((), jnp.float32))


def tree_sq_norm(a: PyTree) -> Array:
  """Squared L2 norm of a pytree viewed as one flat vector."""
  return tree_dot(a, a)


def tree_norm(a: PyTree) -> Array:
  """L2 norm of a pytree viewed as one flat vector."""
  return jnp.sqrt(tree_sq_norm(a))


def tree_where(cond: Array, a: PyTree, b: PyTree) -> PyTree:
  """Selects the whole pytree ``a`` where scalar ``cond`` is true, else ``b``."""
  return jax.tree.map(lambda x, y: jnp.where(cond, x, y), a, b)


def tree_ravel(a: PyTree) -> Array:
  """Concatenates all leaves into one flat float32 vector (for tests and diagnostics)."""
  leaves = jax.tree.leaves(a)
  if not leaves:
    return jnp.zeros((0,), jnp.float32)
  return jnp.concatenate([jnp.ravel(x).astype(jnp.float32) for x in leaves])


def tree_all_finite(a: PyTree) -> Array:
  """True iff every element of every leaf is finite."""
  leaves = [jnp.all(jnp.isfinite(x)) for x in jax.tree.leaves(a)]
  return jnp.all(jnp.stack(leaves)) if leaves else jnp.array(True)
