"""SFedKD: sequential FL with discrepancy-aware multi-teacher decoupled KD (papers/004).

Xu et al., "SFedKD: Sequential Federated Learning with Discrepancy-Aware Multi-Teacher Knowledge
Distillation"; docs/methods.md "SFedKD". What it computes, per round r:

* The FedSeq chain (``base.py``'s chain round): M sampled clients in random order, the model
  passed along.
* Teachers: K of the M models trained in round r−1 (the model each client of that chain handed
  on), chosen at the end of round r−1 by greedy complementary selection on the clients' class
  distributions (teacher_selection.greedy_select, Algorithm 1) and kept stacked [K, ...] in the
  server state with their distributions. Round 1 has no teachers (plain FedSeq, Algorithm 2 line 5).
* Client loss (Eq. 7): CE + γ·Σ_k g_k·NCKD(T_k, S) + β·Σ_k h_k·TCKD(T_k, S), DKD terms at
  temperature τ (losses.dkd_per_example), with g_k, h_k from d(D^{T_k}, D^S) (Eq. 5,
  teacher_selection.teacher_weights). As in Eqs. 3–4 the terms are plain KL divergences: no τ²
  factor by default. DKD's own code (mdistiller, which the paper extends, [68]) multiplies each term
  by τ²; ``temperature_squared=True`` gives that reading. The paper uses τ without stating its
  value, so τ = 4 comes from DKD (docs/sfedkd.md, "Loss"). All K teachers' logits on a batch come
  from one forward over the stacked teacher parameters, vmapped (accelerators) or unrolled (CPU;
  see ``teacher_forward``), in inference mode (BatchNorm running statistics).
* D (a client's class distribution) is its label histogram, read from the round layout's labels
  and mask: with epoch-based local training every example appears E times, so this is exact.

Defaults (paper 004, Sect. 4.1 and 4.3.2; Eq. 5): K = 5 of M = 10, γ = 1, β = 3, d = KL,
ε = 1e-4; τ = 4 without τ² (see above).

Ablation switches (004 §4.3.1 Table 2 and §4.3.4 Table 3; off by default, which is the paper's
method): ``uniform_g`` / ``uniform_h`` replace g_k or h_k by 1/K (Table 2's ✗ columns), and
``selection="random"`` draws the K teachers uniformly from the previous round's M clients
(Table 3's "Random") instead of Algorithm 1, from the round's ``end`` key.

The teacher pool (selection at round end, the stacked teachers in the server state, their logits
inside the client step) is :func:`teacher_kd_chain`, which the other multi-teacher KD methods on
FedSeq (mtkd.py: 004 Table 2's AVER, EBKD, CA-MKD) share; only the KD term differs.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
import optax

from fedjax_proj.algorithms import client as client_lib
from fedjax_proj.algorithms import losses
from fedjax_proj.algorithms.registry import MethodSpec, check_no_server_optimizer
from fedjax_proj.algorithms.sequential import teacher_selection
from fedjax_proj.algorithms.sequential.base import (
  SequentialAlgorithm,
  chain_metrics,
  default_handoff,
)
from fedjax_proj.core import tree as tree_lib
from fedjax_proj.core.types import Array, Batch, Model, PyTree, RoundData

TEACHER_FORWARDS = ("auto", "vmap", "unrolled")


class SFedKDConfig(NamedTuple):
  """SFedKD hyperparameters (docs/methods.md "SFedKD" defaults).

  Attributes:
    num_teachers: K, teachers selected from the previous round's M clients (K <= M).
    gamma: γ, weight of the multi-teacher NCKD term.
    beta: β, weight of the multi-teacher TCKD term.
    temperature: DKD temperature τ (Eqs. 3–4; the paper states no value, 4 is DKD's).
    temperature_squared: multiply both DKD terms by τ² as DKD's code does; False (default)
      follows Eqs. 3–4, which have no τ² factor. With τ = 4 and β = 3, True scales TCKD's
      gradient 16-fold, which needs a smaller client step (docs/sfedkd.md, "Loss").
    metric: distribution discrepancy d: "kl" (default), "l1", "l2" or "js".
    eps: ε smoothing of h_k's inverse discrepancies.
    smoothing: additive smoothing of class distributions before d (keeps KL finite).
    teacher_forward: how the K teachers' logits are computed inside the step: "vmap" (one forward
      vmapped over the stacked teacher parameters), "unrolled" (K forwards in the same program) or
      "auto" ("unrolled" on CPU, "vmap" elsewhere). Identical results; on XLA:CPU a vmapped conv
      over weights becomes a grouped convolution, measured 2.8x slower here (FedAvg CNN, B=64,
      K=5: 1.08 s vs 0.38 s per call on the shared 2-core CPU; docs/design.md, "Measured facts
      about XLA:CPU", saw the same 2.3x).
    uniform_g: ablation (004 Table 2): g_k = 1/K instead of Eq. 5's discrepancy share.
    uniform_h: ablation (004 Table 2): h_k = 1/K instead of Eq. 5's inverse-discrepancy share.
    selection: "greedy" (Algorithm 1, default) or "random" (004 Table 3: K distinct clients drawn
      uniformly from the previous round's M).
  """

  num_teachers: int = 5
  gamma: float = 1.0
  beta: float = 3.0
  temperature: float = 4.0
  temperature_squared: bool = False
  metric: str = "kl"
  eps: float = 1e-4
  smoothing: float = 1e-6
  teacher_forward: str = "auto"
  uniform_g: bool = False
  uniform_h: bool = False
  selection: str = "greedy"

  def validate(self) -> SFedKDConfig:
    teacher_selection.validate_metric(self.metric)
    teacher_selection.validate_selection(self.selection)
    if int(self.num_teachers) < 1:
      raise ValueError(f"num_teachers must be >= 1, got {self.num_teachers}.")
    if self.temperature <= 0:
      raise ValueError(f"temperature must be > 0, got {self.temperature}.")
    if self.teacher_forward not in TEACHER_FORWARDS:
      raise ValueError(
        f"Unknown teacher_forward {self.teacher_forward!r}; choose one of {TEACHER_FORWARDS}."
      )
    if self.gamma < 0 or self.beta < 0 or self.eps <= 0 or self.smoothing < 0:
      raise ValueError("gamma and beta must be >= 0, eps > 0 and smoothing >= 0.")
    return self


def cap_num_teachers(
  num_teachers: int | None, clients_per_round: int, method: str = "sfedkd"
) -> tuple[int, str | None]:
  """K capped to the M clients per round (teachers come from the previous round's M models).

  Args:
    num_teachers: the requested K (None: the default, :class:`SFedKDConfig`'s, which the
      multi-teacher KD methods of mtkd.py share).
    clients_per_round: M.
    method: the method's name, for the note.

  Returns:
    (K to use, a note saying what was capped and why, or None when nothing was).
  """
  k = SFedKDConfig().num_teachers if num_teachers is None else int(num_teachers)
  if k <= clients_per_round:
    return k, None
  return clients_per_round, (
    f"{method} num_teachers={k} capped to {clients_per_round}: the teachers are models of the "
    f"previous round's {clients_per_round} clients (--clients_per_round). Raise "
    "--clients_per_round to use more teachers."
  )


class SFedKDState(NamedTuple):
  round: Array
  variables: dict
  teachers: dict  # stacked [K, ...] variables of the previous round's selected models
  teacher_dists: Array  # [K, C]
  has_teachers: Array  # bool; False in round 1


def client_distributions(rd: RoundData, num_classes: int) -> Array:
  """[M, C] class distribution of each sampled client, from its round layout."""
  labels = rd.labels[rd.idx]
  return jax.vmap(lambda y, m: teacher_selection.class_distribution(y, m, num_classes))(
    labels, rd.mask
  )


def multi_teacher_dkd(
  teacher_logits: Array,
  student_logits: Array,
  labels: Array,
  mask: Array,
  g: Array,
  h: Array,
  config: SFedKDConfig,
) -> tuple[Array, Array]:
  """(L_NCKD, L_TCKD) of Eqs. 3–4 for teacher logits [K, B, C] (times τ² if configured)."""
  tckd, nckd = jax.vmap(
    lambda t: losses.dkd_per_example(t, student_logits, labels, config.temperature)
  )(teacher_logits)
  t2 = config.temperature**2 if config.temperature_squared else 1.0
  per_teacher_nckd = jax.vmap(lambda v: losses.masked_mean(v, mask))(nckd)
  per_teacher_tckd = jax.vmap(lambda v: losses.masked_mean(v, mask))(tckd)
  return t2 * jnp.dot(g, per_teacher_nckd), t2 * jnp.dot(h, per_teacher_tckd)


def teacher_kd_chain(
  name: str,
  model: Model,
  client_optimizer: optax.GradientTransformation,
  num_classes: int,
  pool: SFedKDConfig | NamedTuple,
  kd_loss: Callable[[Array, Array, Batch, PyTree], Array],
  init_extra: Callable[[dict, PyTree], PyTree] | None = None,
) -> SequentialAlgorithm:
  """The FedSeq chain with a pool of K teachers from the previous round (SFedKD's machinery).

  Round 1 is plain FedSeq; at the end of every round K of its M handed-on models are kept as the
  next round's teachers (``pool.selection``: Algorithm 1 on the clients' class distributions, or
  uniformly at random from the ``end`` key). Each client minimises CE + ``kd_loss`` once there are
  teachers.

  Args:
    name: method name.
    model: the model as pure functions.
    client_optimizer: local optimiser (re-initialised at every client).
    num_classes: C, for the class distributions.
    pool: has ``num_teachers``, ``selection``, ``metric``, ``smoothing``, ``teacher_forward``
      (validated by the caller).
    kd_loss: ``kd_loss(teacher_logits [K, B, C], student_logits [B, C], batch, extra)`` -> the
      distillation part of the client loss (a scalar; teacher logits carry no gradient).
    init_extra: ``init_extra(shared, client_input) -> extra`` per-client constants of
      ``kd_loss`` (SFedKD's g_k, h_k; ``shared`` holds ``teacher_dists``, ``client_input["dist"]``
      is the client's class distribution); ``None``: none.
  """
  k = int(pool.num_teachers)
  vmap_teachers = pool.teacher_forward == "vmap" or (
    pool.teacher_forward == "auto" and jax.default_backend() != "cpu"
  )

  def teacher_logits(teachers, x, mask):
    """[K, B, C] logits of every teacher (inference mode) on one batch.

    ``mask`` matters for models whose BatchNorm uses batch statistics in inference (AlexNet-like):
    padding examples must not enter them.
    """
    forward = lambda v: model.apply(v, x, train=False, mask=mask).logits
    if vmap_teachers:
      return jax.lax.stop_gradient(jax.vmap(forward)(teachers))
    return jax.lax.stop_gradient(
      jnp.stack([forward(tree_lib.index_clients(teachers, i)) for i in range(k)])
    )

  def loss_fn(params, batch: Batch, ctx: client_lib.StepContext):
    out, ce = client_lib.train_forward(model, params, batch, ctx)

    def kd(_):
      t_logits = teacher_logits(ctx.shared["teachers"], batch.x, batch.mask)
      return kd_loss(t_logits, out.logits, batch, ctx.extra)

    kd_value = jax.lax.cond(ctx.shared["has_teachers"], kd, lambda _: jnp.zeros(()), None)
    return ce + kd_value, client_lib.LossAux(out.logits, out.state)

  def client_extra(shared, client_input, key):
    del key
    return init_extra(shared, client_input) if init_extra is not None else ()

  program = client_lib.local_training_client(
    model, client_optimizer, loss_fn, init_extra=client_extra
  )

  def init(variables, key):
    del key
    variables = tree_lib.tree_copy(variables)
    return SFedKDState(
      round=jnp.zeros((), jnp.int32),
      variables=variables,
      teachers=tree_lib.broadcast_clients(variables, k),
      teacher_dists=jnp.full((k, num_classes), 1.0 / num_classes, jnp.float32),
      has_teachers=jnp.zeros((), bool),
    )

  def begin(state, rd, key):
    del key
    if k > rd.idx.shape[0]:
      raise ValueError(
        f"{name} num_teachers={k} exceeds the {rd.idx.shape[0]} clients per round; lower "
        "num_teachers (--method_kwargs=num_teachers=...) or raise --clients_per_round."
      )
    context = {
      "teachers": state.teachers,
      "teacher_dists": state.teacher_dists,
      "has_teachers": state.has_teachers,
    }
    return context, {"variables": state.variables}, {"dist": client_distributions(rd, num_classes)}

  def end(state, rd, carry, outputs, order, key):
    dists = client_distributions(rd, num_classes)[order]  # sequence order, like ``outputs``
    picks = teacher_selection.select(dists, k, pool.selection, pool.metric, pool.smoothing, key)
    new_state = SFedKDState(
      round=state.round + 1,
      variables=carry["variables"],
      teachers=tree_lib.index_clients(outputs["variables"], picks),
      teacher_dists=dists[picks],
      has_teachers=jnp.ones((), bool),
    )
    metrics = chain_metrics(outputs, rd, order)
    metrics["teacher_clients"] = rd.client_ids[order][picks]
    return new_state, metrics

  return SequentialAlgorithm(
    name=name,
    init=init,
    begin=begin,
    client=program,
    handoff=default_handoff,
    end=end,
  )


def sfedkd(
  model: Model,
  client_optimizer: optax.GradientTransformation,
  num_classes: int,
  config: SFedKDConfig | None = None,
) -> SequentialAlgorithm:
  """Builds SFedKD.

  Args:
    model: the model as pure functions.
    client_optimizer: local optimiser (re-initialised at every client).
    num_classes: C, for the class distributions.
    config: hyperparameters (``None``: the defaults).
  """
  config = (config or SFedKDConfig()).validate()

  def kd_loss(t_logits, s_logits, batch: Batch, extra):
    g, h = extra
    nckd, tckd = multi_teacher_dkd(t_logits, s_logits, batch.y, batch.mask, g, h, config)
    return config.gamma * nckd + config.beta * tckd

  def init_extra(shared, client_input):
    return teacher_selection.teacher_weights(
      shared["teacher_dists"],
      client_input["dist"],
      config.metric,
      config.eps,
      config.smoothing,
      uniform_g=config.uniform_g,
      uniform_h=config.uniform_h,
    )

  return teacher_kd_chain(
    "sfedkd", model, client_optimizer, num_classes, config, kd_loss, init_extra
  )


def build(ctx, **hparams) -> SequentialAlgorithm:
  """Registry entry; ``hparams`` are :class:`SFedKDConfig` fields."""
  check_no_server_optimizer(ctx.server_optimizer, "sfedkd")
  return sfedkd(ctx.model, ctx.client_optimizer, ctx.num_classes, SFedKDConfig(**hparams))


SPEC = MethodSpec(
  "sfedkd",
  "sequential",
  build,
  hparams=SFedKDConfig._field_defaults,
  choices={
    "selection": teacher_selection.SELECTIONS,
    "metric": teacher_selection.METRICS,
    "teacher_forward": TEACHER_FORWARDS,
  },
)
