"""Multi-teacher KD on FedSeq: AVER, EBKD and CA-MKD, SFedKD's KD ablations (papers/004, Table 2).

004 §4.3.1 replaces SFedKD's discrepancy-aware decoupled KD by three multi-teacher KD methods
"on FedSeq", keeping everything else: the FedSeq chain, and K teachers from the previous round
chosen by Algorithm 1 (sfedkd.teacher_kd_chain, shared with SFedKD; ``selection="random"`` swaps
in 004 Table 3's random draw). Each client from round 2 on minimises

  CE + α·s·mean_b Σ_k w_{k,b}·KL(σ(z^{T_k}_b/τ) ‖ σ(z^S_b/τ)),   s = τ² (default) or 1,

with w_{·,b} ≥ 0 summing to 1 over the K teachers for every example b. The three methods differ
only in w, so they are one module with one weight function each (:func:`teacher_weights`):

* AVER (You et al., "Learning from Multiple Teacher Networks", KDD 2017; 004 ref. [65]):
  w_k = 1/K. Σ_k KL(p_k ‖ q)/K and KL(mean_k p_k ‖ q) differ by a term free of the student, so
  averaging the losses (the CA-MKD code's ``AVERAGE_LOSS``) and distilling the averaged soft
  targets give the same gradients.
* EBKD (Kwon et al., "Adaptive Knowledge Distillation Based on Entropy", ICASSP 2020; ref. [25]):
  lower prediction entropy, larger weight. With H_{k,b} the entropy of σ(z^{T_k}_b) (τ = 1),
  w_{k,b} = (1 − H_{k,b}/Σ_j H_{j,b})/(K − 1), as the CA-MKD code's ``EBKD`` computes it.
* CA-MKD (Zhang, Chen & Wang, "Confidence-Aware Multi-Teacher Knowledge Distillation", ICASSP
  2022; ref. [67]): teachers that predict the true label well weigh more. With CE_{k,b} the
  cross-entropy of σ(z^{T_k}_b) (τ = 1) against the label, w_{·,b} = (1 − softmax_k(CE_{·,b}))/(K−1)
  (the paper's Eq. for w_KD; ``CAMKD`` in its code). Only its logit term: its intermediate-feature
  term needs per-teacher feature adaptors, which FedSeq's models do not have and 004 does not
  mention.

Where we read the public code (github.com/Rorozhl/CA-MKD, ``helper/loops.py``, which holds all
three): it divides EBKD's and CA-MKD's weighted sums by K again, and leaves EBKD's weights
unnormalised (they sum to K − 1). Ours normalises every w to sum to 1, so the three differ only in
w and α means the same for each; the code's scale is α = (K − 1)/K for EBKD and α = 1/K for
CA-MKD. With K = 1 every w is 1 (the formulas are 0/0). Defaults from that code's
``train_student.py``: α = 1, τ = 4 with the τ² factor (its ``DistillKL``, and this project's
convention, docs/methods.md "Conventions"); K = 5 and greedy selection from 004 §4.1.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import optax

from fedjax_proj.algorithms import losses
from fedjax_proj.algorithms.registry import MethodSpec, check_no_server_optimizer
from fedjax_proj.algorithms.sequential import teacher_selection
from fedjax_proj.algorithms.sequential.base import SequentialAlgorithm
from fedjax_proj.algorithms.sequential.sfedkd import TEACHER_FORWARDS, teacher_kd_chain
from fedjax_proj.core.types import Array, Batch, Model

WEIGHTINGS = ("aver", "ebkd", "camkd")


class MTKDConfig(NamedTuple):
  """Hyperparameters of the multi-teacher KD methods on FedSeq (module docstring).

  Attributes:
    weighting: "aver", "ebkd" or "camkd" (fixed by the registered name).
    num_teachers: K, teachers from the previous round's M clients (K <= M).
    kd_weight: α, weight of the KD term (the CA-MKD code's ``-a``, 1).
    temperature: τ of the KD softmaxes (the CA-MKD code's ``kd_T``, 4).
    temperature_squared: multiply the KD term by τ² (as the CA-MKD code's ``DistillKL``).
    selection: "greedy" (Algorithm 1 of 004) or "random" (004 Table 3).
    metric: distribution discrepancy d of Algorithm 1 (kl/l1/l2/js).
    smoothing: additive smoothing of class distributions before d (keeps KL finite).
    teacher_forward: "auto", "vmap" or "unrolled" (:class:`~.sfedkd.SFedKDConfig`).
  """

  weighting: str = "aver"
  num_teachers: int = 5
  kd_weight: float = 1.0
  temperature: float = 4.0
  temperature_squared: bool = True
  selection: str = "greedy"
  metric: str = "kl"
  smoothing: float = 1e-6
  teacher_forward: str = "auto"

  def validate(self) -> MTKDConfig:
    if self.weighting not in WEIGHTINGS:
      raise ValueError(f"Unknown weighting {self.weighting!r}; choose one of {WEIGHTINGS}.")
    teacher_selection.validate_metric(self.metric)
    teacher_selection.validate_selection(self.selection)
    if int(self.num_teachers) < 1:
      raise ValueError(f"num_teachers must be >= 1, got {self.num_teachers}.")
    if self.temperature <= 0:
      raise ValueError(f"temperature must be > 0, got {self.temperature}.")
    if self.kd_weight < 0 or self.smoothing < 0:
      raise ValueError("kd_weight and smoothing must be >= 0.")
    if self.teacher_forward not in TEACHER_FORWARDS:
      raise ValueError(
        f"Unknown teacher_forward {self.teacher_forward!r}; choose one of {TEACHER_FORWARDS}."
      )
    return self


def _complement_share(scores: Array) -> Array:
  """(1 − share_k)/(K − 1) over axis 0 for shares summing to 1; 1 when K = 1."""
  k = scores.shape[0]
  if k == 1:
    return jnp.ones_like(scores)
  return (1.0 - scores) / (k - 1)


def teacher_weights(weighting: str, teacher_logits: Array, labels: Array) -> Array:
  """[K, B] per-example teacher weights (each column sums to 1) from logits [K, B, C] (τ = 1)."""
  t = jax.lax.stop_gradient(teacher_logits.astype(jnp.float32))
  k, b = t.shape[:2]
  if weighting == "aver":
    return jnp.full((k, b), 1.0 / k, jnp.float32)
  if weighting == "ebkd":
    log_p = jax.nn.log_softmax(t, axis=-1)
    entropy = -jnp.sum(jnp.exp(log_p) * log_p, axis=-1)  # [K, B]
    total = jnp.sum(entropy, axis=0, keepdims=True)
    # Every teacher certain (H = 0 for all): no teacher is preferred.
    share = jnp.where(total > 0, entropy / jnp.where(total > 0, total, 1.0), 1.0 / k)
    return _complement_share(share)
  if weighting == "camkd":
    ce = jax.vmap(lambda z: optax.softmax_cross_entropy_with_integer_labels(z, labels))(t)
    return _complement_share(jax.nn.softmax(ce, axis=0))
  raise ValueError(f"Unknown weighting {weighting!r}; choose one of {WEIGHTINGS}.")


def multi_teacher_kd(
  teacher_logits: Array, student_logits: Array, labels: Array, mask: Array, config: MTKDConfig
) -> Array:
  """s·mean_b Σ_k w_{k,b}·KL(σ(z^{T_k}_b/τ) ‖ σ(z^S_b/τ)) over unmasked examples (without α)."""
  w = teacher_weights(config.weighting, teacher_logits, labels)
  kl = jax.vmap(lambda t: losses.kl_per_example(t, student_logits, config.temperature))(
    teacher_logits
  )
  scale = config.temperature**2 if config.temperature_squared else 1.0
  return scale * losses.masked_mean(jnp.sum(w * kl, axis=0), mask)


def mtkd(
  model: Model,
  client_optimizer: optax.GradientTransformation,
  num_classes: int,
  config: MTKDConfig | None = None,
) -> SequentialAlgorithm:
  """Builds FedSeq + AVER, EBKD or CA-MKD (``config.weighting``).

  Args:
    model: the model as pure functions.
    client_optimizer: local optimiser (re-initialised at every client).
    num_classes: C, for the class distributions of the teacher selection.
    config: hyperparameters (``None``: the defaults, AVER).
  """
  config = (config or MTKDConfig()).validate()

  def kd_loss(t_logits, s_logits, batch: Batch, extra):
    del extra
    return config.kd_weight * multi_teacher_kd(t_logits, s_logits, batch.y, batch.mask, config)

  name = f"fedseq_{config.weighting}"
  return teacher_kd_chain(name, model, client_optimizer, num_classes, config, kd_loss)


def _spec(weighting: str) -> MethodSpec:
  name = f"fedseq_{weighting}"

  def build(ctx, **hparams) -> SequentialAlgorithm:
    """Registry entry; ``hparams`` are :class:`MTKDConfig` fields other than ``weighting``."""
    check_no_server_optimizer(ctx.server_optimizer, name)
    config = MTKDConfig(weighting=weighting, **hparams)
    return mtkd(ctx.model, ctx.client_optimizer, ctx.num_classes, config)

  hparams = {k: v for k, v in MTKDConfig._field_defaults.items() if k != "weighting"}
  return MethodSpec(
    name,
    "sequential",
    build,
    hparams=hparams,
    choices={
      "selection": teacher_selection.SELECTIONS,
      "metric": teacher_selection.METRICS,
      "teacher_forward": TEACHER_FORWARDS,
    },
  )


AVER_SPEC = _spec("aver")
EBKD_SPEC = _spec("ebkd")
CAMKD_SPEC = _spec("camkd")
