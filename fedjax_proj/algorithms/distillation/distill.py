"""Server-side ensemble distillation on public data, shared by FedDF, FedET and FedProj.

FedDF (Lin et al., NeurIPS 2020) and FedProj (paper 001, Algorithm 1, lines 31-42): the student
starts from the FedAvg result and is trained for E_d epochs over the public set with Adam on
T²·KL(σ(Z_teacher/T) ‖ σ(f(X; θ_g)/T)) + α·L_div, where Z_teacher combines the sampled clients'
logits (plain mean, or FedET's uncertainty weighting). The weight-divergence anchor
(:data:`ANCHORS`, docs/fedproj.md):

- ``"previous"`` (default): L_div = ‖θ_g − θ_g^(t)‖², the previous round's global model
  (papers 000 and 001, Algorithm 1, line 38 / line 24);
- ``"fedavg"``: L_div = ‖θ_g − θ_avg‖², this round's FedAvg result (paper 000, Sec. 4's "remain
  close to the averaged model"; this library's default before 2026-11);
- ``"clients"``: L_div = Σ_k ‖θ_k − θ_g‖² over the K participating clients (paper 001, C.1),
  computed as K‖θ_g − θ̄‖² with θ̄ the unweighted client mean: the same gradient, and a value
  lower by Σ_k ‖θ_k − θ̄‖², a constant of the round;
- ``"live"``: the authors' code's defect, kept as an explicit switch for parity runs: its anchor
  is ``list(net_glob.parameters())``, the very tensors being trained, so ‖θ_g − θ_g‖² is
  identically zero in value and gradient whatever α is (docs/fedproj.md, "Parity with the
  authors' code"). Computed as α·0.

Only parameters enter L_div (BatchNorm statistics are not trained). Teachers AND student run
public data in inference mode, so public data never
touches BatchNorm statistics (one of the authors' bugs this project does not copy; nor does it cast
images or logits to integers, or anchor the divergence term on the live parameters).

Two loop forms with identical semantics: ``*_scan`` (pure, traceable: one compiled round) and
``*_host`` (a host loop of jitted steps: on XLA:CPU convolutions inside ``scan`` are ~10x slower).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
import optax

from fedjax_proj.algorithms import losses
from fedjax_proj.algorithms.client import merge_variables, split_variables
from fedjax_proj.core import tree as tree_lib
from fedjax_proj.core.types import Array, Model

ANCHORS = ("previous", "fedavg", "clients", "live")


class DistillConfig(NamedTuple):
  """Server distillation settings (docs/methods.md, "FedDF and FedET"; docs/fedproj.md).

  Attributes:
    epochs: E_d, passes over the public set (0 disables distillation).
    batch_size: public mini-batch size.
    lr: Adam learning rate (FedDF used 1e-3, the FedProj code 1e-5; default 1e-4).
    temperature: T.
    alpha: weight α of the weight-divergence term (0 = off).
    teacher_batch_size: batch size for computing teacher logits.
    anchor: what the divergence term pulls towards, one of :data:`ANCHORS` (module docstring).
  """

  epochs: int = 1
  batch_size: int = 256
  lr: float = 1e-4
  temperature: float = 3.0
  alpha: float = 0.0
  teacher_batch_size: int = 500
  anchor: str = "previous"


# ---------------------------------------------------------------------------------------------
# Teacher logits


def _forward_logits(model: Model, variables: dict, normalize, images: Array) -> Array:
  return model.apply(variables, normalize(images), train=False).logits.astype(jnp.float32)


def _batched(n: int, batch_size: int) -> tuple[int, int]:
  b = min(batch_size, n)
  return b, math.ceil(n / b)


def _even_batches(n: int, batch_size: int) -> tuple[int, int]:
  """(rows per batch, batches) for inference over ``n`` rows in batches of at most ``batch_size``.

  As many batches as ``batch_size`` needs, of equal size, so the last is padded by fewer rows than
  there are batches: 512 public images in batches of at most 500 are 2 of 256, where batches of
  500 would forward 488 rows of zeros (49% of the work). Inference-mode rows are independent, so
  the batch size changes no row beyond float round-off.
  """
  steps = math.ceil(n / min(batch_size, n))
  return math.ceil(n / steps), steps


def client_logits_scan(
  model: Model, stacked_variables: dict, normalize, images: Array, batch_size: int
) -> Array:
  """Every client's inference-mode logits on ``images``: [clients, N, classes] (traceable)."""
  n = images.shape[0]
  b, steps = _even_batches(n, batch_size)
  padded = jnp.concatenate([images, jnp.zeros((steps * b - n, *images.shape[1:]), images.dtype)])
  chunks = padded.reshape(steps, b, *images.shape[1:])
  per_client = lambda v: jax.lax.map(lambda x: _forward_logits(model, v, normalize, x), chunks)
  out = jax.vmap(per_client)(stacked_variables)  # [C, steps, b, K]
  return out.reshape(out.shape[0], steps * b, -1)[:, :n]


class HostClientLogits:
  """:func:`client_logits_scan` as a host loop over clients and batches of one jitted forward."""

  def __init__(self, model: Model, normalize, batch_size: int):
    self.batch_size = batch_size
    self._fwd = jax.jit(lambda v, x: _forward_logits(model, v, normalize, x))

  def __call__(self, stacked_variables: dict, images: Array) -> Array:
    n = images.shape[0]
    b, steps = _even_batches(n, self.batch_size)
    num_clients = jax.tree.leaves(stacked_variables)[0].shape[0]
    rows = []
    for c in range(num_clients):
      v = tree_lib.index_clients(stacked_variables, c)
      parts = []
      for s in range(steps):
        x = images[s * b : (s + 1) * b]
        if x.shape[0] < b:  # pad so every call has one shape (one compilation)
          x = jnp.concatenate([x, jnp.zeros((b - x.shape[0], *x.shape[1:]), x.dtype)])
        parts.append(self._fwd(v, x))
      rows.append(jnp.concatenate(parts)[:n])
    return jnp.stack(rows)


def mean_teacher(client_logits: Array, weights: Array | None = None) -> Array:
  """Plain ensemble: the (optionally weighted) mean of the clients' logits. [C, N, K] -> [N, K]."""
  if weights is None:
    weights = jnp.ones(client_logits.shape[0], jnp.float32)
  return tree_lib.weighted_mean(client_logits, weights)


def uncertainty_weighted_teacher(client_logits: Array, eps: float = 1e-6) -> Array:
  """FedET-style ensemble (our documented rule; FedET has no official code).

  For each sample n and class j, client k's logit gets weight
  w_knj ∝ conf_kn / (var_nj + eps), normalised over clients, where conf_kn = max_j σ(z_kn)_j is
  the client's confidence on that sample and var_nj the across-client variance of class j's
  probability. Because var_nj is shared by all clients, it only sets how strongly the weights
  deviate from uniform: w_knj = softmax_k(log conf_kn · s_nj) with s_nj = 1 / (1 + var_nj / v̄),
  v̄ the mean variance — confident clients dominate where clients agree (low variance) and the
  ensemble falls back towards the plain mean where they disagree (high variance).
  """
  probs = jax.nn.softmax(client_logits, axis=-1)  # [C, N, K]
  conf = jnp.max(probs, axis=-1, keepdims=True)  # [C, N, 1]
  var = jnp.var(probs, axis=0, keepdims=True)  # [1, N, K]
  sharp = 1.0 / (1.0 + var / (jnp.mean(var) + eps))
  w = jax.nn.softmax(jnp.log(conf + eps) * sharp * client_logits.shape[0], axis=0)
  return jnp.sum(w * client_logits, axis=0)


# How the clients' logits combine into the ensemble teacher, by ``teacher`` name (not to be confused
# with SFedKD's choice of teacher CLIENTS, fedjax_proj.algorithms.sequential.teacher_selection).
TEACHER_COMBINERS: dict[str, Callable[[Array], Array]] = {
  "mean": mean_teacher,
  "uncertainty": uncertainty_weighted_teacher,
}


# ---------------------------------------------------------------------------------------------
# Student distillation


class _DistillState(NamedTuple):
  params: dict
  opt_state: optax.OptState
  loss_sum: Array
  steps: Array


def _distill_schedule(key: Array, n: int, cfg: DistillConfig) -> tuple[Array, Array]:
  """Shuffled public indices laid out [steps, batch] with a mask, E_d epochs."""
  b, per_epoch = _batched(n, cfg.batch_size)
  idx, mask = [], []
  for e in range(cfg.epochs):
    perm = jax.random.permutation(jax.random.fold_in(key, e), n)
    pad = per_epoch * b - n
    idx.append(jnp.concatenate([perm, jnp.zeros((pad,), perm.dtype)]).reshape(per_epoch, b))
    mask.append(jnp.arange(per_epoch * b).reshape(per_epoch, b) < n)
  return jnp.concatenate(idx), jnp.concatenate(mask)


def _make_distill_step(
  model: Model, normalize, cfg: DistillConfig, opt: optax.GradientTransformation
):
  def loss_fn(params, model_state, anchor, anchor_weight, x, teacher, mask):
    out = model.apply(merge_variables(params, model_state), x, train=False)
    loss = losses.kl_from_logits(teacher, out.logits, cfg.temperature, mask)
    if cfg.alpha:
      div = tree_lib.tree_sq_norm(tree_lib.tree_sub(params, anchor))
      loss = loss + cfg.alpha * anchor_weight * div
    return loss

  def step(st: _DistillState, model_state, anchor, images, teacher_logits, idx, mask, weight=1.0):
    x = normalize(images[idx])
    loss, grads = jax.value_and_grad(loss_fn)(
      st.params, model_state, anchor, weight, x, teacher_logits[idx], mask
    )
    updates, opt_state = opt.update(grads, st.opt_state, st.params)
    return _DistillState(
      optax.apply_updates(st.params, updates), opt_state, st.loss_sum + loss, st.steps + 1
    )

  return step


def distill_scan(
  model: Model,
  student: dict,
  teacher_logits: Array,
  public_images: Array,
  normalize,
  key: Array,
  cfg: DistillConfig,
  anchor: dict | None = None,
  anchor_weight: float = 1.0,
) -> tuple[dict, Array]:
  """Distils ``teacher_logits`` [P, K] into ``student`` (traceable).

  Args:
    model: the model.
    student: the student's variables (the FedAvg result).
    teacher_logits: [P, K] combined teacher logits.
    public_images: [P, ...] raw public images.
    normalize: raw images -> model inputs.
    key: PRNG key of the shuffling.
    cfg: distillation settings.
    anchor: the divergence term's anchor PARAMETERS (None: the student's starting parameters).
    anchor_weight: multiplies α (K for the ``"clients"`` anchor).

  Returns:
    (student variables, mean distillation loss over the steps).
  """
  if cfg.epochs <= 0:
    return student, jnp.zeros((), jnp.float32)
  opt = optax.adam(cfg.lr)
  params, model_state = split_variables(student)
  step = _make_distill_step(model, normalize, cfg, opt)
  idx, mask = _distill_schedule(key, public_images.shape[0], cfg)
  st = _DistillState(params, opt.init(params), jnp.zeros((), jnp.float32), jnp.zeros((), jnp.int32))
  anchor = params if anchor is None else anchor

  def body(st, xs):
    return step(st, model_state, anchor, public_images, teacher_logits, *xs, anchor_weight), None

  st, _ = jax.lax.scan(body, st, (idx, mask))
  return merge_variables(st.params, model_state), st.loss_sum / jnp.maximum(st.steps, 1)


class HostDistiller:
  """:func:`distill_scan` as a host loop of jitted steps (identical results, faster on XLA:CPU)."""

  def __init__(self, model: Model, normalize, cfg: DistillConfig):
    self.cfg = cfg
    self.opt = optax.adam(cfg.lr)
    self._step = jax.jit(_make_distill_step(model, normalize, cfg, self.opt), donate_argnums=0)
    self._schedule = jax.jit(lambda k, n: _distill_schedule(k, n, cfg), static_argnums=1)

  def __call__(self, student, teacher_logits, public_images, key, anchor=None, anchor_weight=1.0):
    if self.cfg.epochs <= 0:
      return student, jnp.zeros((), jnp.float32)
    params, model_state = split_variables(student)
    anchor = params if anchor is None else anchor
    idx, mask = self._schedule(key, int(public_images.shape[0]))
    st = _DistillState(
      tree_lib.tree_copy(params),
      self.opt.init(params),
      jnp.zeros((), jnp.float32),
      jnp.zeros((), jnp.int32),
    )
    for s in range(idx.shape[0]):
      st = self._step(
        st, model_state, anchor, public_images, teacher_logits, idx[s], mask[s], anchor_weight
      )
    return merge_variables(st.params, model_state), st.loss_sum / jnp.maximum(st.steps, 1)
