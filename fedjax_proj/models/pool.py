"""Max pooling with flax's semantics and a fast path for non-overlapping windows on XLA:CPU.

:func:`max_pool` is ``flax.linen.max_pool`` (same arguments, same output bit for bit, same
gradient bit for bit). Where the windows tile the input (window == stride, padding ``"VALID"``,
or ``"SAME"`` / all-zero explicit padding with every spatial size divisible by the window) it
computes the maximum as a reshape to the windows and ``jnp.max``; elsewhere (overlapping windows,
real padding) it calls ``nn.max_pool``.

Why: on XLA:CPU flax's ``reduce_window`` and its gradient (``select_and_scatter``) are slow: ReLU
plus 2x2 pooling, forward and gradient, takes 80 ms at the FedAvg CNN's first activation
(batch 64, one core) against 7.6 ms this way, and the CNN's FedAvg step 0.259 against 0.195 s
(docs/performance.md, "The CPU max pooling"). The CNN of McMahan et al., "Communication-Efficient
Learning of Deep Networks from Decentralized Data" (AISTATS 2017), pools every convolution's
output this way.

Ties. XLA's ``select_and_scatter`` (the gradient of ``reduce_window`` max) and JAX's JVP of it
(``select_and_gather_add``) give the whole cotangent to ONE element of each window: the first
maximal one in row-major window order (with a NaN in the window, where XLA's walk with JAX's
``ge`` select ends). ``jnp.max``'s own JVP splits it equally among tied maxima, which
differs whenever two values of a window are equal and positive (e.g. a constant image region
gives equal convolution outputs). So the reshape path carries a ``jax.custom_jvp`` whose tangent
is the tangent of that same element, found by the same walk; being linear in the tangent, it
transposes to the reverse-mode rule (the cotangent scattered to that element), and forward mode
keeps working.

The choice of path is made at trace time from the default backend (:func:`pool_impl_for`): the
reshape path on CPU, flax's elsewhere, whose cost on accelerators was not measured against it.
Both compute the same numbers, so the choice changes speed only.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp

POOL_IMPLS = ("reduce_window", "reshape")


def pool_impl_for(backend: str | None = None) -> str:
  """The max pooling implementation for a backend (default: JAX's default backend).

  ``"reshape"`` on CPU, where it is several times faster (docs/performance.md, "The CPU max
  pooling"); ``"reduce_window"`` (flax's ``nn.max_pool``) elsewhere.
  """
  backend = jax.default_backend() if backend is None else backend
  return "reshape" if backend == "cpu" else "reduce_window"


def _tiling_crop(
  spatial: Sequence[int], window: Sequence[int], strides: Sequence[int], padding
) -> tuple[int, ...] | None:
  """Each spatial size the non-overlapping windows cover, or None when they do not tile.

  The windows tile when window == stride and there is no padding: ``"VALID"`` (flax crops the
  trailing rows a window does not fit, so we crop them too), ``"SAME"`` with every size divisible
  by its window (then SAME pads nothing), or explicit all-zero pairs.
  """
  if tuple(window) != tuple(strides):
    return None
  if isinstance(padding, str):
    mode = padding.upper()
    if mode == "VALID":
      return tuple((n // k) * k for n, k in zip(spatial, window, strict=True))
    if mode == "SAME" and all(n % k == 0 for n, k in zip(spatial, window, strict=True)):
      return tuple(spatial)
    return None
  if all(tuple(p) == (0, 0) for p in padding):
    return tuple((n // k) * k for n, k in zip(spatial, window, strict=True))
  return None


def _split_windows(x: jax.Array, window: tuple[int, ...]) -> jax.Array:
  """[B, n1*k1, n2*k2, ..., C] -> [B, n1, k1, n2, k2, ..., C] (a free reshape)."""
  shape = [x.shape[0]]
  for n, k in zip(x.shape[1:-1], window, strict=True):
    shape += [n // k, k]
  return x.reshape(*shape, x.shape[-1])


@jax.custom_jvp
def _window_max(xw: jax.Array) -> jax.Array:
  """Max over the window axes (2, 4, ...) of :func:`_split_windows`' output."""
  return jnp.max(xw, axis=tuple(range(2, xw.ndim - 1, 2)))


@_window_max.defjvp
def _window_max_jvp(primals, tangents):
  (xw,), (tw,) = primals, tangents
  axes = tuple(range(2, xw.ndim - 1, 2))

  # XLA's select_and_scatter with JAX's ``ge`` select, element by element: walk each window in
  # row-major order, starting from its first element, and move to the next element whenever
  # ``not (chosen >= next)``. Without NaN that is the first maximal element; with NaN it is
  # wherever XLA's walk ends, which this reproduces. The tangent is the chosen element's, picked
  # by selects (no arithmetic, so exact).
  def at(a, pos):
    index = [slice(None)] * a.ndim
    for axis, p in zip(axes, pos, strict=True):
      index[axis] = p
    return a[tuple(index)]

  positions = list(itertools.product(*(range(xw.shape[a]) for a in axes)))
  chosen, t_out = at(xw, positions[0]), at(tw, positions[0])
  for pos in positions[1:]:
    value = at(xw, pos)
    move = jnp.logical_not(chosen >= value)
    chosen = jnp.where(move, value, chosen)
    t_out = jnp.where(move, at(tw, pos), t_out)
  return _window_max(xw), t_out


def max_pool(
  inputs: jax.Array,
  window_shape: Sequence[int],
  strides: Sequence[int] | None = None,
  padding: str | Sequence[tuple[int, int]] = "VALID",
  impl: str | None = None,
) -> jax.Array:
  """``flax.linen.max_pool`` with a reshape fast path for non-overlapping windows.

  Args:
    inputs: [*batch, *spatial, features] (or [*spatial, features], as flax allows).
    window_shape: the window's spatial shape.
    strides: the window's strides (default: 1 in every dimension, as flax).
    padding: ``"VALID"``, ``"SAME"`` or one (lo, hi) pair per spatial dimension, as flax.
    impl: one of :data:`POOL_IMPLS`; None: :func:`pool_impl_for` the default backend.
      ``"reshape"`` still calls flax where the windows do not tile the input.

  Returns:
    The pooled array, equal bit for bit to ``nn.max_pool``'s, with the same gradient (on ties,
    the cotangent goes to the first maximal element of the window in row-major order).

  Raises:
    ValueError: unknown ``impl``.
  """
  impl = pool_impl_for() if impl is None else impl
  if impl not in POOL_IMPLS:
    raise ValueError(f"impl must be one of {POOL_IMPLS} (or None for the backend's), got {impl!r}")
  window = tuple(int(k) for k in window_shape)
  strides = (1,) * len(window) if strides is None else tuple(int(s) for s in strides)
  nd = len(window)
  if impl == "reduce_window" or inputs.ndim < nd + 1:
    return nn.max_pool(inputs, window, strides=strides, padding=padding)
  spatial = inputs.shape[inputs.ndim - 1 - nd : -1]
  crop = _tiling_crop(spatial, window, strides, padding)
  if crop is None or any(c == 0 for c in crop):
    return nn.max_pool(inputs, window, strides=strides, padding=padding)
  batch = inputs.shape[: inputs.ndim - 1 - nd]
  x = inputs.reshape(math.prod(batch), *spatial, inputs.shape[-1])
  x = x[(slice(None), *(slice(0, c) for c in crop))]
  y = _window_max(_split_windows(x, window))
  return y.reshape(*batch, *y.shape[1:])
