"""A 2-D convolution layer with interchangeable implementations for XLA:CPU.

``Conv`` has exactly the parameter layout of ``flax.linen.Conv`` (``kernel`` [kh, kw, cin, cout],
optional ``bias`` [cout]), so parameters and checkpoints move freely between implementations:

- ``"xla"``: ``lax.conv_general_dilated`` with autodiff gradients (the default; best on
  accelerators and for a plain loop of jitted steps on CPU).
- ``"patches_grad"``: the same forward convolution, wrapped in a ``jax.custom_vjp`` whose kernel
  gradient is one matmul, im2col patches transposed times the output gradient. The input
  gradient is still the usual transposed convolution.
- ``"gemm_grad"``: the same forward convolution and input gradient, wrapped in a
  ``jax.custom_vjp`` whose kernel gradient is one matmul per batch chunk in the layout XLA:CPU
  moves and multiplies fast: the input's im2col built channel-major, [(kh, kw, cin), (b, ho,
  wo)], from a few whole-slab copies, times the output gradient's free reshape [(b, ho, wo),
  cout]. The CPU placement's fallback where oneDNN's handler is unavailable
  (``fedjax_proj.training.placement.conv_impl_choice``); see docs/performance.md, "The CPU
  convolution kernel gradient".
- ``"onednn_grad"``: the same forward convolution and input gradient, wrapped in a
  ``jax.custom_vjp`` whose kernel gradient is an XLA FFI call into oneDNN's convolution
  backward-weights primitive (:mod:`fedjax_proj.models.onednn`, oneDNN's wheels, dependencies of
  the package on Linux x86-64; built on first use). Where the handler is unavailable (the wheels
  not installed, no compiler, build failed) or the call is outside its domain (not float32,
  negative padding, a backend other than CPU) the kernel gradient is ``gemm_grad``'s, with one
  warning line.
- ``"onednn"``: the forward convolution, the input gradient and the kernel gradient all by oneDNN's
  primitives (forward, backward-data, backward-weights) through the same FFI handlers, in a
  ``jax.custom_vjp``; each falls back as ``onednn_grad``'s does (to XLA's convolution and input
  gradient, and ``gemm_grad``'s kernel gradient). The CPU placement's choice where the handler
  loads.
- ``"patches"``: the whole convolution as im2col patches @ reshaped kernel, with no convolution
  primitive at all (patches are strided slices); gradients by autodiff (matmuls, slices, pads).
  Under ``vmap`` over per-client kernels this stays a batched matmul instead of becoming a grouped
  convolution. Its cost: the patch matrix is kh·kw times the activation.

Why: on XLA:CPU the kernel-gradient convolution inside a loop body (``lax.scan``) is about 10x
slower than outside it (jax-ml/jax issue 12868, "Convolution is significantly slower inside a loop
body (CPU)"); see docs/design.md ("Measured facts about XLA:CPU"), ``benchmarks/perf/conv_impl.py``.
im2col convolution as a matrix product is the classic formulation of Chellapilla, Puri and Simard,
"High Performance Convolutional Neural Networks for Document Processing" (IWFHR 2006).

All implementations agree with ``nn.Conv`` to float32 round-off (forward and gradients);
``tests/models/test_conv.py`` checks stride 1 and 2, SAME, VALID and explicit padding.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Sequence
from functools import partial
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax import lax

CONV_IMPLS = ("xla", "patches_grad", "gemm_grad", "onednn_grad", "onednn", "patches")

# NHWC activations and HWIO kernels are flax's conventions; fixing them here keeps the three
# implementations bit-compatible in their parameter layout.
_DIMENSION_NUMBERS = ("NHWC", "HWIO", "NHWC")

Padding = str | tuple[tuple[int, int], ...]


def _canonical_padding(padding: str | Sequence[Sequence[int]] | int) -> Padding:
  """Returns a hashable padding spec: "SAME" / "VALID" or ((lo, hi), (lo, hi))."""
  if isinstance(padding, str):
    padding = padding.upper()
    if padding not in ("SAME", "VALID"):
      raise ValueError(f"padding must be 'SAME', 'VALID' or explicit pairs, got {padding!r}")
    return padding
  if isinstance(padding, int):
    return ((padding, padding), (padding, padding))
  pairs = tuple(tuple(int(v) for v in p) for p in padding)
  if len(pairs) != 2 or any(len(p) != 2 for p in pairs):
    raise ValueError(f"explicit padding must be two (lo, hi) pairs, got {padding!r}")
  return pairs


def _xla_conv(x: jax.Array, kernel: jax.Array, strides: tuple[int, int], padding: Padding):
  return lax.conv_general_dilated(
    x, kernel, window_strides=strides, padding=padding, dimension_numbers=_DIMENSION_NUMBERS
  )


def _patches(x: jax.Array, kernel_hw: tuple[int, int], strides: tuple[int, int], padding: Padding):
  """im2col: [B, Ho, Wo, kh·kw·cin], feature order (kh, kw, cin), i.e. the kernel's own order.

  Built from kh·kw strided slices of the padded input rather than with
  ``lax.conv_general_dilated_patches``: that primitive is itself a convolution (with a one-hot
  kernel) and so is its transpose (the input gradient); on XLA:CPU it made the "patches" train step
  6-8x slower in a Python loop, 2-3x slower inside ``lax.scan`` (``benchmarks/perf/conv_impl.py``).
  Slices transpose to pads, so autodiff's col2im is pads and adds.
  """
  (kh, kw), (sh, sw) = kernel_hw, strides
  if isinstance(padding, str):
    padding = tuple(lax.padtype_to_pads(x.shape[1:3], kernel_hw, strides, padding))
  (plo, phi), (qlo, qhi) = padding
  xp = jnp.pad(x, ((0, 0), (plo, phi), (qlo, qhi), (0, 0)))
  ho = (xp.shape[1] - kh) // sh + 1
  wo = (xp.shape[2] - kw) // sw + 1
  cols = [
    xp[:, i : i + sh * (ho - 1) + 1 : sh, j : j + sw * (wo - 1) + 1 : sw, :]
    for i in range(kh)
    for j in range(kw)
  ]
  patches = jnp.stack(cols, axis=3)  # [B, Ho, Wo, kh·kw, cin]
  return patches.reshape(*patches.shape[:3], -1)


def conv_patches(x: jax.Array, kernel: jax.Array, strides: tuple[int, int], padding: Padding):
  """Convolution as one matmul of im2col patches with the reshaped kernel."""
  patches = _patches(x, kernel.shape[:2], strides, padding)
  # [kh, kw, cin, cout] -> [kh·kw·cin, cout] is the patch feature order: a free reshape.
  wmat = kernel.reshape(-1, kernel.shape[-1]).astype(patches.dtype)
  return lax.dot_general(patches, wmat, (((3,), (0,)), ((), ())))


@partial(jax.custom_vjp, nondiff_argnums=(2, 3))
def conv_patches_grad(x: jax.Array, kernel: jax.Array, strides: tuple[int, int], padding: Padding):
  """XLA convolution whose kernel gradient is computed as patchesᵀ @ output-gradient."""
  return _xla_conv(x, kernel, strides, padding)


def _conv_patches_grad_fwd(x, kernel, strides, padding):
  # Keep x, not its patches: the patch matrix is kh·kw times larger and cheap to recompute.
  return _xla_conv(x, kernel, strides, padding), (x, kernel)


def _conv_patches_grad_bwd(strides, padding, residuals, g):
  x, kernel = residuals
  _, input_vjp = jax.vjp(lambda x_: _xla_conv(x_, kernel, strides, padding), x)
  (dx,) = input_vjp(g)
  patches = _patches(x, kernel.shape[:2], strides, padding)
  # One contraction over batch and output positions replaces the slow kernel-gradient conv.
  dmat = lax.dot_general(patches, g, (((0, 1, 2), (0, 1, 2)), ((), ())))
  return dx, dmat.reshape(kernel.shape).astype(kernel.dtype)


conv_patches_grad.defvjp(_conv_patches_grad_fwd, _conv_patches_grad_bwd)

# Bytes of one batch chunk's channel-major patch matrix in ``gemm_grad``'s kernel gradient. A
# larger matrix is written to fresh pages each step (XLA:CPU allocates its temporaries per call) and
# leaves the cache; chunks of about this size were 1.2-1.4x faster than the whole batch at batch
# 256 and no slower at 64 (docs/performance.md, "The CPU convolution kernel gradient").
GEMM_GRAD_CHUNK_BYTES = 16 * 2**20


def _concat(parts: list[jax.Array], axis: int) -> jax.Array:
  """``jnp.concatenate`` in groups of at most 5: XLA:CPU copied 5 slabs at memory speed but 25
  at a tenth of it (``benchmarks/perf/cpu_step.py``, the kernel-gradient candidates)."""
  while len(parts) > 5:
    parts = [
      jnp.concatenate(parts[i : i + 5], axis) if len(parts[i : i + 5]) > 1 else parts[i]
      for i in range(0, len(parts), 5)
    ]
  return jnp.concatenate(parts, axis) if len(parts) > 1 else parts[0]


def _channel_major_patches(x, kernel_hw, strides, padding, out_hw):
  """im2col of ``x`` [B, H, W, cin] as [(kh, kw, cin), (B, Ho, Wo)].

  Built on the small input first: the kw column shifts of the channel-major input [cin, B, Hp,
  Wp] (kw strided slices), then the kh row shifts of that, each a copy of whole rows. XLA:CPU's
  NHWC im2col (``_patches``) copies runs of cin values and was slower than the convolution it
  replaces.
  """
  (kh, kw), (sh, sw), (ho, wo) = kernel_hw, strides, out_hw
  if isinstance(padding, str):
    padding = tuple(lax.padtype_to_pads(x.shape[1:3], kernel_hw, strides, padding))
  (plo, phi), (qlo, qhi) = padding
  xc = jnp.transpose(x, (3, 0, 1, 2))  # [cin, B, H, W]
  # lax.pad takes negative padding (explicit pads may crop), as lax.conv_general_dilated does.
  xc = lax.pad(xc, jnp.zeros((), x.dtype), ((0, 0, 0), (0, 0, 0), (plo, phi, 0), (qlo, qhi, 0)))
  cols = _concat(
    [lax.slice_in_dim(xc, j, j + sw * (wo - 1) + 1, sw, axis=3) for j in range(kw)], 0
  )  # [(kw, cin), B, Hp, Wo]
  rows = _concat(
    [lax.slice_in_dim(cols, i, i + sh * (ho - 1) + 1, sh, axis=2) for i in range(kh)], 0
  )  # [(kh, kw, cin), B, Ho, Wo]
  return rows.reshape(rows.shape[0], -1)


def gemm_kernel_grad(
  x: jax.Array, g: jax.Array, kernel_shape, strides: tuple[int, int], padding: Padding
) -> jax.Array:
  """The kernel gradient of :func:`conv2d` at input ``x`` and output gradient ``g``, as matmuls.

  ``sum over b, ho, wo of patches(x)[(kh, kw, cin), (b, ho, wo)] * g[(b, ho, wo), cout]``, the
  batch cut into chunks whose patch matrix is about :data:`GEMM_GRAD_CHUNK_BYTES`.
  """
  kh, kw, cin, cout = kernel_shape
  b, ho, wo, _ = g.shape
  per_example = kh * kw * cin * ho * wo * x.dtype.itemsize
  chunk = max(1, min(b, GEMM_GRAD_CHUNK_BYTES // max(per_example, 1)))
  total = None
  for lo in range(0, b, chunk):
    hi = min(lo + chunk, b)
    patches = _channel_major_patches(x[lo:hi], (kh, kw), strides, padding, (ho, wo))
    part = lax.dot_general(
      patches,
      g[lo:hi].reshape(-1, cout),
      (((1,), (0,)), ((), ())),
      preferred_element_type=jnp.float32,
    )
    total = part if total is None else total + part
  return total.reshape(kernel_shape)


@partial(jax.custom_vjp, nondiff_argnums=(2, 3))
def conv_gemm_grad(x: jax.Array, kernel: jax.Array, strides: tuple[int, int], padding: Padding):
  """XLA convolution whose kernel gradient is :func:`gemm_kernel_grad`."""
  return _xla_conv(x, kernel, strides, padding)


def _bwd_with_kernel_grad(kernel_grad):
  """A custom_vjp backward rule: autodiff's input gradient (the transposed convolution, so it is
  unchanged) and ``kernel_grad(x, g, kernel_shape, strides, padding)``."""

  def bwd(strides, padding, residuals, g):
    x, kernel = residuals
    _, input_vjp = jax.vjp(lambda x_: _xla_conv(x_, kernel, strides, padding), x)
    (dx,) = input_vjp(g)
    dk = kernel_grad(x, g, kernel.shape, strides, padding)
    return dx, dk.astype(kernel.dtype)

  return bwd


conv_gemm_grad.defvjp(_conv_patches_grad_fwd, _bwd_with_kernel_grad(gemm_kernel_grad))


@functools.cache
def _warn_onednn_fallback(reason: str, impl: str = "onednn_grad") -> None:
  if impl == "onednn_grad":
    msg = f"{reason}; conv_impl='onednn_grad' computes the kernel gradient as gemm_grad's"
  else:
    msg = f"{reason}; conv_impl='onednn' computes XLA's convolution and gemm_grad's kernel gradient"
  warnings.warn(msg, stacklevel=4)


def _onednn_pads(impl: str, x_shape, kernel_shape, strides, padding, *operands):
  """The explicit (lo, hi) pads when oneDNN's handler can take this call (float32 operands,
  non-negative padding, handler loaded), else None: the caller computes XLA's or gemm_grad's. An
  unloaded handler warns once per process with its one line."""
  from fedjax_proj.models import onednn

  if (reason := onednn.unavailable_reason()) is not None:
    _warn_onednn_fallback(reason, impl)
    return None
  if isinstance(padding, str):
    padding = tuple(lax.padtype_to_pads(x_shape[1:3], kernel_shape[:2], strides, padding))
  pads = tuple(tuple(int(v) for v in p) for p in padding)
  if any(a.dtype != jnp.float32 for a in operands) or min(min(p) for p in pads) < 0:
    return None
  return pads


def onednn_kernel_grad(
  x: jax.Array, g: jax.Array, kernel_shape, strides: tuple[int, int], padding: Padding
) -> jax.Array:
  """The kernel gradient of :func:`conv2d` by oneDNN's backward-weights primitive on CPU, else
  :func:`gemm_kernel_grad` (another backend, another dtype, negative padding, or the handler
  unavailable: the last says so once per process); an empty batch gives zeros."""
  from fedjax_proj.models import onednn

  def gemm(x, g):
    return gemm_kernel_grad(x, g, kernel_shape, strides, padding)

  pads = _onednn_pads("onednn_grad", x.shape, kernel_shape, strides, padding, x, g)
  if pads is None:
    return gemm(x, g)
  if 0 in x.shape or 0 in g.shape:  # oneDNN rejects empty tensors; the gradient is zeros
    return jnp.zeros(kernel_shape, jnp.float32)
  # The handler is registered for CPU only; elsewhere the same gradient as gemm_grad computes it.
  return lax.platform_dependent(
    x, g, cpu=lambda x, g: onednn.kernel_grad(x, g, kernel_shape, strides, pads), default=gemm
  )


def onednn_forward(x: jax.Array, kernel: jax.Array, strides: tuple[int, int], padding: Padding):
  """:func:`conv2d` by oneDNN's forward primitive on CPU, else XLA's (as
  :func:`onednn_kernel_grad` falls back)."""
  from fedjax_proj.models import onednn

  def xla(x, kernel):
    return _xla_conv(x, kernel, strides, padding)

  pads = _onednn_pads("onednn", x.shape, kernel.shape, strides, padding, x, kernel)
  if pads is None or 0 in x.shape:  # oneDNN rejects empty tensors
    return xla(x, kernel)
  return lax.platform_dependent(
    x, kernel, cpu=lambda x, k: onednn.forward(x, k, strides, pads), default=xla
  )


def onednn_input_grad(
  g: jax.Array, kernel: jax.Array, x_shape, strides: tuple[int, int], padding: Padding
) -> jax.Array:
  """The input gradient of :func:`conv2d` at output gradient ``g`` by oneDNN's backward-data
  primitive on CPU, else autodiff's of XLA's convolution (as :func:`onednn_kernel_grad` falls
  back)."""
  from fedjax_proj.models import onednn

  def xla(g, kernel):
    conv = lambda x: _xla_conv(x, kernel, strides, padding)  # noqa: E731
    return jax.vjp(conv, jnp.zeros(x_shape, g.dtype))[1](g)[0]

  pads = _onednn_pads("onednn", x_shape, kernel.shape, strides, padding, g, kernel)
  if pads is None or 0 in g.shape:  # oneDNN rejects empty tensors; the gradient is zeros
    return xla(g, kernel) if pads is None else jnp.zeros(x_shape, jnp.float32)
  return lax.platform_dependent(
    g, kernel, cpu=lambda g, k: onednn.input_grad(g, k, x_shape, strides, pads), default=xla
  )


@partial(jax.custom_vjp, nondiff_argnums=(2, 3))
def conv_onednn_grad(x: jax.Array, kernel: jax.Array, strides: tuple[int, int], padding: Padding):
  """XLA convolution whose kernel gradient is :func:`onednn_kernel_grad`."""
  return _xla_conv(x, kernel, strides, padding)


conv_onednn_grad.defvjp(_conv_patches_grad_fwd, _bwd_with_kernel_grad(onednn_kernel_grad))


@partial(jax.custom_vjp, nondiff_argnums=(2, 3))
def conv_onednn(x: jax.Array, kernel: jax.Array, strides: tuple[int, int], padding: Padding):
  """The convolution, its input gradient and its kernel gradient all by oneDNN's primitives on
  CPU (:func:`onednn_forward`, :func:`onednn_input_grad`, :func:`onednn_kernel_grad`)."""
  return onednn_forward(x, kernel, strides, padding)


def _conv_onednn_fwd(x, kernel, strides, padding):
  return onednn_forward(x, kernel, strides, padding), (x, kernel)


def _conv_onednn_bwd(strides, padding, residuals, g):
  x, kernel = residuals
  dx = onednn_input_grad(g, kernel, x.shape, strides, padding)
  dk = onednn_kernel_grad(x, g, kernel.shape, strides, padding)
  return dx.astype(x.dtype), dk.astype(kernel.dtype)


conv_onednn.defvjp(_conv_onednn_fwd, _conv_onednn_bwd)


def conv2d(
  x: jax.Array,
  kernel: jax.Array,
  strides: Sequence[int] = (1, 1),
  padding: str | Sequence[Sequence[int]] | int = "SAME",
  impl: str = "xla",
) -> jax.Array:
  """Functional NHWC/HWIO 2-D convolution with a selectable implementation.

  Args:
    x: [B, H, W, cin] input.
    kernel: [kh, kw, cin, cout] kernel.
    strides: (sh, sw) window strides.
    padding: "SAME", "VALID", an int, or explicit ((lo, hi), (lo, hi)).
    impl: one of :data:`CONV_IMPLS`.

  Returns:
    [B, Ho, Wo, cout] output.
  """
  strides = tuple(int(s) for s in strides)
  pad = _canonical_padding(padding)
  if impl == "xla":
    return _xla_conv(x, kernel, strides, pad)
  if impl == "patches_grad":
    return conv_patches_grad(x, kernel, strides, pad)
  if impl == "gemm_grad":
    return conv_gemm_grad(x, kernel, strides, pad)
  if impl == "onednn_grad":
    return conv_onednn_grad(x, kernel, strides, pad)
  if impl == "onednn":
    return conv_onednn(x, kernel, strides, pad)
  if impl == "patches":
    return conv_patches(x, kernel, strides, pad)
  raise ValueError(f"unknown conv impl {impl!r}; valid: {CONV_IMPLS}")


class Conv(nn.Module):
  """Drop-in for ``nn.Conv`` (2-D, NHWC, no dilation or groups) with a ``impl`` switch.

  Attributes:
    features: number of output channels.
    kernel_size: (kh, kw).
    strides: (sh, sw).
    padding: "SAME", "VALID", an int, or explicit ((lo, hi), (lo, hi)).
    use_bias: whether to add a bias.
    impl: one of :data:`CONV_IMPLS` (see the module docstring).
    kernel_init: kernel initializer (``nn.Conv``'s default).
    bias_init: bias initializer.
  """

  features: int
  kernel_size: Sequence[int]
  strides: Sequence[int] = (1, 1)
  padding: Any = "SAME"
  use_bias: bool = True
  impl: str = "xla"
  kernel_init: Any = nn.initializers.lecun_normal()
  bias_init: Any = nn.initializers.zeros_init()

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    if self.impl not in CONV_IMPLS:
      raise ValueError(f"unknown conv impl {self.impl!r}; valid: {CONV_IMPLS}")
    if x.ndim != 4:
      raise ValueError(f"Conv expects NHWC input, got shape {x.shape}")
    kh, kw = self.kernel_size
    kernel = self.param("kernel", self.kernel_init, (kh, kw, x.shape[-1], self.features))
    y = conv2d(x, kernel, self.strides, self.padding, self.impl)
    if self.use_bias:
      y = y + self.param("bias", self.bias_init, (self.features,))
    return y
