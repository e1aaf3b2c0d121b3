"""Global Principal Subspace Extraction (GPSE) and FedProject: FOT's two building blocks.

From Bakman et al., "Federated Orthogonal Training: Mitigating Global Catastrophic Forgetting in
Continual Federated Learning" (ICLR 2024; code duygunuryldz/Federated_Orthogonal_Training).

Projected layers are the model's ``Dense`` and ``Conv`` layers (found by intercepting their calls,
so any Flax backbone works; task heads are not ``Dense`` and are never projected). A layer's
"inputs" are rows of a matrix X [M, d] in the layer's input space:

* dense: the input vectors, d = in_features;
* conv: im2col patches (``lax.conv_general_dilated_patches`` with the layer's strides/padding),
  d = k·k·C_in, features permuted to exactly the order of the kernel reshape [k, k, C_in, C_out]
  -> (k·k·C_in) x C_out (:func:`kernel_matrix`), so that ``conv(x, W) == im2col(x) @ W.reshape``.

GPSE, per layer, with the stored orthonormal basis U [d, d] (columns beyond the rank are zero):

* client k: residual R_k = X_k − X_k U Uᵀ; sketch A_k = R_kᵀ G_k with G_k ~ N(0, 1) of shape
  [M_k, s] (one draw per row shared by the layers with the same rows, see :func:`sketch_step`);
  ratio r_k = ‖R_k‖_F / ‖X_k‖_F (optionally A_k clipped to Frobenius norm L and
  Gaussian noise added: the paper's Appendix H Gaussian mechanism). All clients at once (vmap).
  Computed as: clients send the raw X_kᵀ G_k, the server projects the SUM once (the projection is
  linear, so this equals Σ_k R_kᵀ G_k exactly and saves every client 2·M·d² flops per layer; the
  DP clip then bounds the raw sketch).
* server: A = Σ_k A_k (= [R_1; …; R_C]ᵀ [G_1; …; G_C], the sketch of the concatenated data, which is
  why it is secure-aggregation compatible); k = the smallest rank that meets the threshold rule
  (:data:`THRESHOLD_RULES`: by default GPM's energy criterion, which the paper's text describes;
  the authors' ε' rule as an option; docs/fot.md, "The threshold rule"); U ← orthonormal
  [U, U_A[:, :k]].

The server step runs on the device, jitted (:func:`extend_step`): the decomposition of A is exact
(eigh of A Aᵀ) for small sketches and a randomized range finder (Halko, Martinsson and Tropp, 2011,
Alg. 4.4 with power iterations) for large ones, growing the target rank until the rule is met
inside it (‖A‖_F² is exact, so the rule is decided exactly).

FedProject: Δ ← Δ − U Uᵀ Δ for every projected kernel (rows in input space); biases, norms and heads
are untouched.
"""

from __future__ import annotations

import contextlib
import functools
import math
from typing import Any, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from fedjax_proj.core.types import Array, Model
from fedjax_proj.models import conv as conv_lib


class LayerSpec(NamedTuple):
  """A projected layer: parameter path, kind and input-space geometry."""

  path: tuple[str, ...]
  kind: str  # "dense" or "conv"
  in_dim: int
  kernel_size: tuple[int, int] = (1, 1)
  strides: tuple[int, int] = (1, 1)
  padding: Any = "VALID"

  @property
  def key(self) -> str:
    return "/".join(self.path)


def _is_layer(module: nn.Module) -> bool:
  return isinstance(module, nn.Dense | nn.Conv | conv_lib.Conv)


def capture_inputs(model: Model, variables: dict, x: Array, **apply_kwargs):
  """Runs ``model.apply`` (inference) and returns (output, {module path: layer input})."""
  captured: dict[tuple[str, ...], tuple[nn.Module, Array]] = {}

  def interceptor(next_fun, args, kwargs, context):
    if context.method_name == "__call__" and _is_layer(context.module):
      captured[tuple(context.module.path)] = (context.module, args[0])
    return next_fun(*args, **kwargs)

  with nn.intercept_methods(interceptor):
    out = model.apply(variables, x, train=False, **apply_kwargs)
  return out, captured


def find_layers(model: Model, variables: dict, sample_x: Array, **apply_kwargs) -> list[LayerSpec]:
  """The projected layers of a Flax model, in call order."""
  specs: list[LayerSpec] = []

  def record(v, x):
    _, cap = capture_inputs(model, v, x, **apply_kwargs)
    for path, (module, inp) in cap.items():
      if isinstance(module, nn.Dense):
        specs.append(LayerSpec(path, "dense", int(inp.shape[-1])))
      else:
        if getattr(module, "feature_group_count", 1) != 1:
          raise ValueError(f"layer {path}: grouped convolutions are not supported by GPSE")
        kh, kw = module.kernel_size
        # flax takes an int for equal strides (nn.Conv's default is the int 1).
        strides = module.strides if module.strides is not None else 1
        strides = (strides, strides) if isinstance(strides, int) else tuple(strides)
        pad = module.padding
        pad = _padding(pad)
        specs.append(LayerSpec(path, "conv", int(inp.shape[-1]) * kh * kw, (kh, kw), strides, pad))
    return 0

  jax.eval_shape(record, variables, sample_x)
  if not specs:
    raise ValueError(f"model {model.name!r} has no Dense/Conv layers to project")
  return specs


def _padding(pad: Any) -> Any:
  """A hashable padding spec: "SAME" / "VALID" or ((lo, hi), (lo, hi))."""
  if isinstance(pad, str):
    return pad.upper()
  if isinstance(pad, int):
    return ((pad, pad), (pad, pad))
  return tuple(tuple(int(v) for v in p) for p in pad)


def im2col(x: Array, kernel_hw: tuple[int, int], strides: tuple[int, int], padding: Any) -> Array:
  """NHWC im2col patches [B, Ho, Wo, kh·kw·cin], features in the kernel's (kh, kw, cin) order.

  ``lax.conv_general_dilated_patches`` returns features ordered (cin, kh, kw); they are permuted
  so that ``im2col(x) @ kernel.reshape(-1, cout)`` equals the convolution.
  """
  kh, kw = kernel_hw
  p = lax.conv_general_dilated_patches(
    x, (kh, kw), tuple(strides), padding, dimension_numbers=("NHWC", "HWIO", "NHWC")
  )
  cin = x.shape[-1]
  p = p.reshape(*p.shape[:3], cin, kh, kw)
  return jnp.transpose(p, (0, 1, 2, 4, 5, 3)).reshape(*p.shape[:3], kh * kw * cin)


def kernel_matrix(kernel: Array) -> Array:
  """A projected kernel as a matrix [d, out] whose rows live in the layer's input space."""
  if kernel.ndim == 2:
    return kernel
  return kernel.reshape(-1, kernel.shape[-1])  # [kh, kw, cin, cout] -> [kh·kw·cin, cout]


def matrix_kernel(mat: Array, shape: tuple[int, ...]) -> Array:
  """Inverse of :func:`kernel_matrix`."""
  if len(shape) == 2:
    return mat
  return mat.reshape(shape)


def input_rows(spec: LayerSpec, inp: Array, mask: Array | None = None) -> Array:
  """The layer's input matrix X [M, d] (dense vectors or im2col patches); masked rows are zero."""
  if spec.kind == "dense":
    rows = inp.reshape(inp.shape[0], -1, inp.shape[-1])
  else:
    patches = im2col(inp, spec.kernel_size, spec.strides, spec.padding)
    rows = patches.reshape(patches.shape[0], -1, patches.shape[-1])
  if mask is not None:
    rows = rows * mask.astype(rows.dtype)[:, None, None]
  return rows.reshape(-1, rows.shape[-1])


def get_kernel(params: dict, spec: LayerSpec) -> Array:
  node = params
  for p in spec.path:
    node = node[p]
  return node["kernel"]


def set_kernel(params: dict, spec: LayerSpec, kernel: Array) -> dict:
  """Returns ``params`` with the layer's kernel replaced (shallow copies along the path)."""

  def go(node, i):
    node = dict(node)
    if i == len(spec.path):
      node["kernel"] = kernel
    else:
      node[spec.path[i]] = go(node[spec.path[i]], i + 1)
    return node

  return go(params, 0)


# ---------------------------------------------------------------------------------------------
# Client side.


def residual(x_rows: Array, basis: Array) -> Array:
  """R = X − X U Uᵀ (rows in input space)."""
  return x_rows - (x_rows @ basis) @ basis.T


def sketch(r_rows: Array, g: Array) -> Array:
  """A = Rᵀ G [d, s]: Σ_j r_j g_jᵀ over the rows (eq. 9)."""
  return r_rows.T @ g


def sketch_width(spec: LayerSpec, multiplier: float) -> int:
  return max(1, int(round(multiplier * spec.in_dim)))


SKETCH_DISTS = ("gaussian", "rademacher")


def sketch_matrix(key: Array, rows: int, width: int, dist: str = "gaussian") -> Array:
  """The random matrix G [rows, width]: N(0, 1) (the paper), or ±1 signs (Rademacher).

  Rademacher entries are a sub-Gaussian Johnson-Lindenstrauss sketch with the same second moments
  (Achlioptas, 2003; the authors' PMNIST code itself uses uniform[-1, 1] entries). They are drawn
  32 per random word, which on CPU is much cheaper than one Threefry word per Gaussian entry.
  """
  if dist == "gaussian":
    return jax.random.normal(key, (rows, width))
  if dist == "rademacher":
    words = -(-width // 32)
    bits = jax.random.bits(key, (rows, words), jnp.uint32)
    signs = (bits[..., None] >> jnp.arange(32, dtype=jnp.uint32)) & 1
    return (2.0 * signs.reshape(rows, words * 32)[:, :width] - 1.0).astype(jnp.float32)
  raise ValueError(f"unknown sketch distribution {dist!r}; choose one of {SKETCH_DISTS}")


class SketchState(NamedTuple):
  a: dict  # key -> [d, s]
  x_sq: dict  # key -> ‖X‖_F²
  r_sq: dict  # key -> ‖R‖_F²
  n: Array


def init_sketch(specs: list[LayerSpec], widths: dict[str, int]) -> SketchState:
  zero = jnp.zeros((), jnp.float32)
  return SketchState(
    {s.key: jnp.zeros((s.in_dim, widths[s.key]), jnp.float32) for s in specs},
    {s.key: zero for s in specs},
    {s.key: zero for s in specs},
    zero,
  )


# Columns of the stored basis handled per block by :func:`covered_energy`.
COVER_BLOCK = 128


def covered_energy(
  rows: Array, weight: Array, basis: Array, rank: Array, block: int = COVER_BLOCK
) -> Array:
  """‖diag(w) X U‖_F² over the first ``rank`` columns of the zero-padded basis, at a cost ∝ rank.

  ``weight`` [M] is the row mask (0/1), applied to the small [M, block] products.

  ``rank`` may be traced (it is one unbatched scalar under the clients' ``vmap``): the loop runs
  ceil(rank / block) blocks of columns, so a layer whose basis fills 116 of 784 dimensions pays
  one [M, d] x [d, 128] product per batch instead of the full [M, d] x [d, d] one. Columns
  beyond the rank are zero, and a last block clamped back by ``dynamic_slice`` masks the columns
  an earlier block already counted.
  """
  d = basis.shape[1]
  block = min(block, d)
  num_blocks = (jnp.asarray(rank, jnp.int32) + block - 1) // block

  def body(j, acc):
    start = jnp.minimum(j * block, d - block)
    cols = lax.dynamic_slice_in_dim(basis, start, block, axis=1)
    proj = jnp.square(rows @ cols) * weight[:, None]
    fresh = (start + jnp.arange(block)) >= j * block
    return acc + jnp.sum(jnp.where(fresh, proj, 0.0))

  return lax.fori_loop(0, num_blocks, body, jnp.zeros((), jnp.float32))


def sketch_groups(specs: list[LayerSpec], rows: dict[str, int], widths: dict[str, int]):
  """Layers grouped by row count: {rows: (group index, widest sketch)}, in layer order."""
  groups: dict[int, tuple[int, int]] = {}
  for spec in specs:
    m = rows[spec.key]
    i, w = groups.get(m, (len(groups), 0))
    groups[m] = (i, max(w, widths[spec.key]))
  return groups


def sketch_step(
  model: Model,
  specs: list[LayerSpec],
  widths: dict[str, int],
  variables: dict,
  bases: dict,
  ranks: dict,
  state: SketchState,
  x: Array,
  mask: Array,
  key: Array,
  dist: str = "gaussian",
  **apply_kwargs,
) -> SketchState:
  """Adds one batch of a client's data to its RAW sketches Xᵀ G (G drawn fresh for these rows).

  The projection onto the complement of U is linear, so it commutes with the clients' sum: the
  server applies it once, (I − U Uᵀ) Σ_k X_kᵀ G_k = Σ_k R_kᵀ G_k (see :func:`extend_step`),
  instead of every client projecting every input row (which costs 2·M·d² per layer). The ratio
  still needs ‖R_k‖² = ‖X_k‖² − ‖X_k U‖², computed over the basis' filled columns only
  (:func:`covered_energy`).

  Layers whose inputs have the same rows (every dense layer of an MLP: one row per example)
  share one draw of G per row, each taking its first s_l columns. Every layer's sketch
  A_l = X_lᵀ G[:, :s_l] still has exactly the paper's distribution (G has i.i.d. N(0, 1)
  entries and the server decomposes each layer on its own); jointly they are one JL sketch of
  the concatenated layer inputs [X_1 | X_2 | ...]. Drawing G costs one Threefry word per entry
  on CPU, so this halves it for the PMNIST MLP (784 instead of 784 + 400 + 400 per row).
  """
  _, captured = capture_inputs(model, variables, x, mask=mask, **apply_kwargs)
  # Rows are used unmasked; the mask goes on G's rows and on the squared norms instead, so no
  # masked copy of every layer's input matrix is materialised next to the one the forward uses.
  layer_rows = {s.key: input_rows(s, captured[s.path][1].astype(jnp.float32)) for s in specs}
  groups = sketch_groups(specs, {k: r.shape[0] for k, r in layer_rows.items()}, widths)
  weights, draws = {}, {}
  for m, (i, w) in groups.items():
    weights[m] = jnp.repeat(mask.astype(jnp.float32), m // mask.shape[0])
    draws[m] = sketch_matrix(jax.random.fold_in(key, i), m, w, dist) * weights[m][:, None]
  a, x_sq, r_sq = dict(state.a), dict(state.x_sq), dict(state.r_sq)
  for spec in specs:
    rows = layer_rows[spec.key]
    weight = weights[rows.shape[0]]
    g = draws[rows.shape[0]][:, : widths[spec.key]]
    a[spec.key] = a[spec.key] + sketch(rows, g)
    sq = jnp.sum(jnp.square(rows) * weight[:, None])
    covered = covered_energy(rows, weight, bases[spec.key], ranks[spec.key])
    x_sq[spec.key] = x_sq[spec.key] + sq
    r_sq[spec.key] = r_sq[spec.key] + jnp.maximum(sq - covered, 0.0)
  return SketchState(a, x_sq, r_sq, state.n + jnp.sum(mask))


# How the Gaussian mechanism's noise is calibrated to (ε, δ) (:func:`gaussian_sigma`).
DP_CALIBRATIONS = ("paper", "classical")


def gaussian_sigma(
  epsilon: float,
  delta: float,
  sensitivity: float = 1.0,
  num_clients: int = 1,
  calibration: str = "paper",
) -> float:
  """Each client's noise std σ for (ε, δ)-DP of the clients' summed sketch (003 Appendix H).

  Every client adds N(0, σ²) to its clipped sketch and secure aggregation reveals only the sum,
  whose noise is N(0, C·σ²): C clients share the noise the sum needs. The sum's L2 sensitivity to
  one client is the clip L (``sensitivity``).

  * "paper": 003 Appendix H, σ² = log(1.25/δ) / (ε²·C) at L = 1 (the text asks for σ² above it;
    this is the boundary), scaled by L for another clip: σ = L·sqrt(log(1.25/δ)/C)/ε.
  * "classical": Dwork and Roth (2014), Thm A.1, σ_sum = L·sqrt(2·log(1.25/δ))/ε for the sum, so
    σ = σ_sum/sqrt(C). It is √2 times the paper's; the theorem is stated for ε < 1.

  Args:
    epsilon: ε > 0.
    delta: δ in (0, 1).
    sensitivity: the clip L > 0.
    num_clients: C >= 1, the clients whose noise adds up in the sum (FOT: all of them).
    calibration: one of :data:`DP_CALIBRATIONS`.

  Returns:
    σ, the std of each client's noise.
  """
  if calibration not in DP_CALIBRATIONS:
    raise ValueError(
      f"unknown DP calibration {calibration!r}; choose one of {DP_CALIBRATIONS} ('paper': 003 "
      "Appendix H; 'classical': Dwork and Roth's Gaussian mechanism)"
    )
  if not (epsilon > 0 and 0 < delta < 1 and sensitivity > 0 and num_clients >= 1):
    raise ValueError(
      f"the Gaussian mechanism needs epsilon > 0, 0 < delta < 1, a clip > 0 and at least one "
      f"client; got epsilon={epsilon}, delta={delta}, clip={sensitivity}, clients={num_clients} "
      "(003 Table 6: epsilon=5, delta=1e-5, clip 1)"
    )
  factor = 2.0 if calibration == "classical" else 1.0
  return sensitivity * math.sqrt(factor * math.log(1.25 / delta) / num_clients) / epsilon


def finish_sketch(
  state: SketchState, key: Array, dp_clip: float = 0.0, dp_noise: float = 0.0
) -> dict:
  """A client's message: sketches (optionally clipped and noised), ratios r_k, example count."""
  out_a = {}
  for i, (k, a) in enumerate(sorted(state.a.items())):
    if dp_clip > 0:
      a = a * jnp.minimum(1.0, dp_clip / jnp.maximum(jnp.linalg.norm(a), 1e-12))
    if dp_noise > 0:
      a = a + dp_noise * jax.random.normal(jax.random.fold_in(key, i), a.shape)
    out_a[k] = a
  ratio = {k: jnp.sqrt(state.r_sq[k] / jnp.maximum(state.x_sq[k], 1e-30)) for k in state.a}
  # ‖R_k‖² and ‖X_k‖² go out too: the energy rule pools them (:func:`residual_share`). Like the
  # sketches they are sums over the client's rows, so secure aggregation can add them up.
  return {
    "a": out_a,
    "ratio": ratio,
    "r_sq": dict(state.r_sq),
    "x_sq": dict(state.x_sq),
    "n": state.n,
  }


# ---------------------------------------------------------------------------------------------
# Server side.


def blas_threads(n: int):
  """A context limiting the BLAS thread pools to ``n`` threads (no-op for ``n <= 0``).

  The SVDs/QRs here are at most a few thousand wide; on a loaded machine a multi-threaded
  OpenBLAS degrades badly (threads spin-wait for descheduled peers: the 784 x 784 PMNIST layer's
  server step took 3-19 s instead of 0.25 s on two cores shared with another job). This covers
  GPM's host-side SVDs and, on CPU, FOT's device step too: XLA:CPU runs eigh and QR through
  SciPy's LAPACK, on the same BLAS.
  """
  if n <= 0:
    return contextlib.nullcontext()
  from threadpoolctl import threadpool_limits  # a declared dependency (also scikit-learn's)

  return threadpool_limits(n, user_api="blas")


# The rank rule. Paper 003 eq. 12 picks the smallest rank r whose directions, together with the
# stored basis, cover a threshold share of the task's layer inputs; the text (Sec. 4.1.2, after
# eq. 12) says the threshold "determines how much portion of the input in total for each layer is
# covered by the subspace". Two readings (docs/fot.md, "The threshold rule"):
#
# * "energy" (the default, the text): GPM's criterion (Saha et al., ICLR 2021, eq. 9; its
#   ``update_GPM``) on the pooled inputs X = [X_1; ...; X_C]: with q = ‖R‖_F² / ‖X‖_F² the share of
#   the squared input energy outside the stored basis, the smallest r with
#   (1 − q) + q · Σ_{j≤r} σ_j² / ‖A‖_F² ≥ ε, σ_j the singular values of the residual's sketch A.
#   ‖R‖_F² = Σ_k ‖R_k‖_F² and ‖X‖_F² = Σ_k ‖X_k‖_F² are exact sums of the clients' messages.
# * "authors" (the authors' ``expand_orth_set``): ρ = Σ_k (n_k/n) ‖R_k‖_F/‖X_k‖_F (unsquared),
#   ε' = (ρ − (1 − ε))/ρ, the smallest r with Σ_{j≤r} σ_j² / ‖A‖_F² > ε'. Mixing an unsquared ρ
#   with squared σ makes this GPM's rule at the effective threshold 1 − (1 − ε)·q/ρ (≈ 1 − (1 − ε)ρ
#   for equal clients, as q ≈ ρ²), which climbs towards 1 as the basis fills.
THRESHOLD_RULES = ("energy", "authors")


def check_rule(rule: str) -> None:
  """Raises a ValueError naming the rules for an unknown ``rule``."""
  if rule not in THRESHOLD_RULES:
    raise ValueError(f"unknown threshold rule {rule!r}; choose one of {THRESHOLD_RULES}")


def eps_prime(rho: float, eps: float) -> float:
  """The authors' ε' = (ρ − (1 − ε)) / ρ: the share of the new residual that must be captured."""
  return (rho - (1.0 - eps)) / max(rho, 1e-12)


def energy_target(residual_share: float, eps: float) -> float:
  """The energy rule's share of the residual's energy to capture: (ε − (1 − q)) / q.

  Args:
    residual_share: q = ‖R‖_F² / ‖X‖_F², the squared input energy outside the stored basis.
    eps: the threshold ε on the share of the whole input energy covered.

  Returns:
    The target on Σ_{j≤r} σ_j² / ‖A‖_F²; at most 0 when the stored basis already covers ε of the
    energy (GPM then adds nothing: its loop stops before the first direction).
  """
  return (eps - (1.0 - residual_share)) / max(residual_share, 1e-30)


def rule_target(
  rule: str, eps: float, ratio: np.ndarray, n: np.ndarray, r_sq: np.ndarray, x_sq: np.ndarray
) -> tuple[float, float, float]:
  """(target share of the sketch's energy, ρ, q) of one layer from the clients' messages.

  ``ratio`` [C] are the clients' ‖R_k‖_F/‖X_k‖_F, ``n`` [C] their example counts and ``r_sq`` /
  ``x_sq`` [C] their ‖R_k‖_F² / ‖X_k‖_F². Both statistics are returned for the metrics whatever
  the rule; float64 on the host (C scalars).
  """
  check_rule(rule)
  n = np.asarray(n, np.float64)
  rho = float(np.sum(n / max(n.sum(), 1.0) * np.asarray(ratio, np.float64)))
  x_total = float(np.sum(np.asarray(x_sq, np.float64)))
  q = float(np.sum(np.asarray(r_sq, np.float64))) / x_total if x_total > 0 else 0.0
  target = energy_target(q, eps) if rule == "energy" else eps_prime(rho, eps)
  return target, rho, q


def select_rank(sq_singular: Array, total: Array, target: Array, inclusive: bool):
  """(k, found): the smallest k with Σ_{j≤k} σ_j² / total reaching ``target``, as device scalars.

  ``inclusive`` compares with ≥ (the energy rule, as GPM's loop stops once the covered share is
  no longer below the threshold), otherwise with > (the authors' ``hand / total > new_eps``).
  k = 0 when nothing is to be added: ``target`` ≤ 0 (energy; the authors' rule: < 0, where their
  code keeps one direction all the same) or a zero sketch. ``found`` is False when the σ given
  fall short of the target (a randomized spectrum that is too narrow). The cumulative shares are
  nondecreasing, so k is one more than the count of shares below the target: a reduction over a
  fixed-length vector, whatever k is.
  """
  sq = jnp.maximum(jnp.asarray(sq_singular), 0.0)
  frac = jnp.cumsum(sq) / jnp.maximum(total, 1e-30)
  below = jnp.sum(frac < target if inclusive else frac <= target)
  nothing = (target <= 0 if inclusive else target < 0) | (total <= 0)
  k = jnp.where(nothing, 0, below + 1).astype(jnp.int32)
  return k, nothing | (below < sq.shape[0])


def _mm(a: Array, b: Array) -> Array:
  # Full float32 products: on GPUs the default precision may round the inputs to TF32 (10-bit
  # mantissa), which would leave ~1e-3 of the stored directions' energy in the projected sketch.
  return jnp.matmul(a, b, precision=lax.Precision.HIGHEST)


def _exact_spectrum(a: Array) -> tuple[Array, Array]:
  """All left singular vectors [d, min(d, s)] and squared singular values of ``a``, descending."""
  d, s = a.shape
  if d <= s:
    # From the eigendecomposition of the small Gram matrix A Aᵀ [d, d] (σ_j² are its eigenvalues):
    # several times cheaper than an SVD of the wide A.
    w, v = jnp.linalg.eigh(_mm(a, a.T))
    return v[:, ::-1], jnp.maximum(w[::-1], 0.0)
  u, sv, _ = jnp.linalg.svd(a, full_matrices=False)
  return u, sv**2


def _randomized_spectrum(
  a: Array, width: int, key: Array, oversample: int, power_iters: int
) -> tuple[Array, Array]:
  """The top-``width`` left singular vectors and squared values of ``a`` (a randomized range
  finder: Halko, Martinsson and Tropp, SIAM Review 2011, Alg. 4.4, with power iterations)."""
  m, n = a.shape
  q = min(width + oversample, m, n)
  basis, _ = jnp.linalg.qr(_mm(a, jax.random.normal(key, (n, q), a.dtype)))
  for _ in range(power_iters):
    z, _ = jnp.linalg.qr(_mm(a.T, basis))
    basis, _ = jnp.linalg.qr(_mm(a, z))
  b = _mm(basis.T, a)  # [q, n]: the SVD of this small matrix from its Gram matrix, as above
  w, v = jnp.linalg.eigh(_mm(b, b.T))
  return _mm(basis, v[:, ::-1])[:, :width], jnp.maximum(w[::-1], 0.0)[:width]


# A new direction whose component outside the stored basis is shorter than this (after two
# Gram-Schmidt passes on unit vectors) is taken to lie in its span. In float32 such a component is
# rounding noise of order 1e-6; a direction the rule selects from a nonzero singular value is
# orthogonal to the basis by construction (the sketch was projected), so its component is ~1.
IN_SPAN_TOL = 1e-3


def _append(basis: Array, rank: Array, new: Array, k: Array) -> tuple[Array, Array]:
  """The zero-padded basis [d, d] with the first ``k`` columns of ``new`` [d, w] orthonormalised
  against it and written to columns ``rank``, ``rank + 1``, ...; and the new rank."""
  d, w = new.shape
  cols = jnp.arange(w)
  v = new * (cols < k)
  for _ in range(2):  # columns beyond the rank are zero, so the whole padded basis can be used
    v = v - _mm(basis, _mm(basis.T, v))
  keep = (cols < k) & (jnp.linalg.norm(v, axis=0) > IN_SPAN_TOL)
  # Kept columns first (stable), so the QR's first columns span exactly them.
  order = jnp.argsort(~keep, stable=True)
  q, _ = jnp.linalg.qr(v[:, order] * keep[order])
  count = jnp.minimum(jnp.sum(keep), d - rank).astype(jnp.int32)
  q = jnp.pad(q * (cols < count), ((0, 0), (0, d - w)))
  # count <= d - rank: rolling by the rank moves the new columns to [rank, rank + count) and
  # wraps only zero columns.
  return basis + jnp.roll(q, rank, axis=1), rank + count


@functools.partial(jax.jit, static_argnames=("width", "inclusive", "oversample", "power_iters"))
def extend_step(
  a: Array,
  basis: Array,
  rank: Array,
  target: Array,
  key: Array,
  *,
  width: int | None,
  inclusive: bool,
  oversample: int = 10,
  power_iters: int = 2,
) -> tuple[Array, Array, Array, Array]:
  """One layer's GPSE server step on the device: (new basis, new rank, k, found).

  ``a`` [d, s] is the clients' summed RAW sketch Σ_k X_kᵀ G_k; the residual projection
  (I − U Uᵀ) is applied here once (it is linear, so this is Σ_k R_kᵀ G_k; :func:`sketch_step`).
  ``width`` None decomposes it exactly (always ``found``: if rounding leaves the target unmet,
  every direction is taken, as before); an int runs the randomized range finder for that many
  directions and is ``found`` only if the rule stops strictly inside them.

  Static shapes: the basis stays the zero-padded [d, d] array with a traced rank that FedProject
  already uses, and the rule's k is a device scalar masking a fixed-width set of directions
  (:func:`_append`). So one compile serves every task of a layer shape, and nothing of size d
  goes to the host: the host reads only ``found`` (one bool per randomized attempt). Returning
  the selected vectors to the host instead would need k there first (a sync), give each task a
  different shape, and send the basis back to the device for FedProject.
  """
  a = a.astype(jnp.float32)
  a = a - _mm(basis, _mm(basis.T, a))
  total = jnp.sum(a * a)
  if width is None:
    u, s2 = _exact_spectrum(a)
  else:
    u, s2 = _randomized_spectrum(a, width, key, oversample, power_iters)
  k, found = select_rank(s2, total, target, inclusive)
  if width is None:
    k, found = jnp.where(found, k, s2.shape[0]).astype(jnp.int32), jnp.bool_(True)
  else:
    found = found & (k < width)
  new_basis, new_rank = _append(basis, rank, u, k)
  return new_basis, new_rank, k, found


def solver_widths(d: int, s: int, max_exact: int) -> list[int | None]:
  """The attempts :func:`extend_layer` makes for a [d, s] sketch: randomized widths, then exact.

  Sketches with at most ``max_exact`` entries are decomposed exactly. Larger ones start with the
  randomized range finder at max(8, min(d, s) / 16) directions and double it while it stays within
  a quarter of min(d, s); beyond that the exact path is cheaper.
  """
  widths: list[int | None] = []
  if d * s > max_exact:
    w = max(8, min(d, s) // 16)
    while w <= min(d, s) // 4:
      widths.append(w)
      w *= 2
  return [*widths, None]


def extend_layer(
  a: Array,
  basis: Array,
  rank: Array,
  target: float,
  *,
  rule: str,
  max_exact: int = 2_000_000,
  seed: int = 0,
) -> tuple[Array, Array, Array, str]:
  """GPSE's server step for one layer: (new basis, new rank, k added by the rule, solver).

  Runs :func:`extend_step` over :func:`solver_widths` until an attempt meets the rule (the
  target is decided against the exact ‖A‖_F², so the randomized spectrum only has to contain it).
  """
  check_rule(rule)
  d, s = a.shape
  key = jax.random.key(seed)
  target = jnp.float32(target)
  rank = jnp.asarray(rank, jnp.int32)
  for width in solver_widths(d, s, max_exact):
    out = extend_step(a, basis, rank, target, key, width=width, inclusive=rule == "energy")
    if width is None:
      return (*out[:3], "exact")
    if bool(out[3]):
      return (*out[:3], "randomized")
  raise AssertionError("unreachable: the exact attempt always returns")


def expand_basis(basis: np.ndarray, rank: int, new: np.ndarray) -> tuple[np.ndarray, int]:
  """Appends the span of ``new`` [d, k] to the orthonormal ``basis[:, :rank]`` (zero-padded [d, d]).

  Two Gram-Schmidt passes against the old basis, then QR; directions already (numerically) in the
  span are dropped.
  """
  d = basis.shape[0]
  old = np.asarray(basis[:, :rank], np.float64)
  v = np.asarray(new, np.float64)
  for _ in range(2):
    v = v - old @ (old.T @ v)
  if v.shape[1] == 0 or rank >= d:
    return basis, rank
  q, r = np.linalg.qr(v)
  keep = np.abs(np.diag(r)) > 1e-6 * max(1.0, float(np.abs(np.diag(r)).max(initial=0.0)))
  q = q[:, keep][:, : d - rank]
  out = np.array(basis, np.float32)
  out[:, rank : rank + q.shape[1]] = q
  return out, rank + q.shape[1]


# ---------------------------------------------------------------------------------------------
# FedProject.


def project_out(delta_mat: Array, basis: Array) -> Array:
  """Δ − U Uᵀ Δ for Δ [d, out] with rows in input space."""
  return delta_mat - basis @ (basis.T @ delta_mat)


def fed_project(delta_params: dict, specs: list[LayerSpec], bases: dict) -> dict:
  """Projects every projected kernel of a parameter-shaped update out of its stored subspace."""
  out = delta_params
  for spec in specs:
    kernel = get_kernel(out, spec)
    mat = project_out(kernel_matrix(kernel).astype(jnp.float32), bases[spec.key])
    out = set_kernel(out, spec, matrix_kernel(mat, kernel.shape).astype(kernel.dtype))
  return out


def empty_bases(specs: list[LayerSpec]) -> dict:
  return {s.key: jnp.zeros((s.in_dim, s.in_dim), jnp.float32) for s in specs}
