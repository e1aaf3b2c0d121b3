"""FedDistill+ (paper 002, "Evaluation Methods" and Tables 3-6): FedDistill's shared per-class
logits (Jeong et al., "Communication-Efficient On-Device Machine Learning: Federated Distillation
and Augmentation under Non-IID Private Data", 2018; Seo et al. 2020) plus FedAvg of the parameters.

Client k, while it trains, sums its training-forward logits per true class over its real
examples: S_k[c] = Σ_{i: y_i = c} z_i (a K × K table) and n_k[c] = #{i: y_i = c}, over every local
step of the round (as both public codes track them; an example seen in E epochs counts E times).
Its local loss is

  CE + β·T²·KL(σ(G[y]/T) ‖ σ(f(x; θ)/T)),

the KL a batch mean over the real examples whose class c = y has a global logit G[c] yet (the
teacher a constant); β = 0.1 (002, "Parameter Setting": "for the distillation coefficient, we set
it as 0.1 for all the datasets"), T = 1 (002's sentence leaves the value out; the authors'
``--temperature`` defaults to 1). The server averages the parameters as FedAvg and sets, for every
class some sampled client holds,

  G[c] = Σ_k S_k[c] / Σ_k n_k[c],

the per-class mean logit over the cohort's examples, i.e. each client's per-class average
weighted by its count of that class; a client without class c adds nothing to G[c], and a class no
sampled client holds keeps its previous G[c] (before any client has held it, it has no target and
its examples no KD term). Round 0 therefore trains as FedAvg, as both codes skip the term there.

Decisions where the references differ (measured in docs/parity.md, the FedDistill+ rows):
FedGen's ``FedDistill`` (zhuangdizhu/FedGen, ``share_model``) averages the sampled users'
per-class averages unweighted, and an absent class enters that mean as a zero logit (its tracker
starts every count at 1);
002's authors' code (CGCL-codes/FedGKD, ``MasterFedDistill``) sends client k the unweighted mean
of the other N − 1 clients' last reported averages (leave-one-out, as Jeong et al.). Both codes'
trackers accumulate over the rounds; ours are this round's. docs/methods.md, "FedDistill+".

The aggregate is a ``StreamingAggregate`` (the sums above are sums over clients), so large
cohorts run in chunks as FedAvg's do.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import optax

from fedjax_proj.algorithms import client as client_lib
from fedjax_proj.algorithms import losses
from fedjax_proj.algorithms.base import FederatedAlgorithm
from fedjax_proj.algorithms.fedavg import FedAvgState, fedavg
from fedjax_proj.algorithms.registry import factory_spec
from fedjax_proj.core.rounds import StreamingAggregate
from fedjax_proj.core.types import Array, Batch, Model


class FedDistillState(NamedTuple):
  fedavg: FedAvgState
  global_logits: Array  # [K, K] G[c], row c the mean logit vector of class c
  known: Array  # [K] bool: class c has had a global logit


def class_logit_sums(logits: Array, labels: Array, mask: Array, num_classes: int):
  """(S[c] = Σ_{i real, y_i = c} z_i as [K, K], n[c] as [K]) of one batch, float32."""
  onehot = jax.nn.one_hot(labels, num_classes, dtype=jnp.float32) * mask[:, None]
  z = jax.lax.stop_gradient(logits.astype(jnp.float32))
  return onehot.T @ z, jnp.sum(onehot, axis=0)


def global_class_logits(
  logit_sums: Array, counts: Array, previous: Array, known: Array
) -> tuple[Array, Array]:
  """G[c] = Σ_k S_k[c] / Σ_k n_k[c] where Σ_k n_k[c] > 0, else the previous G[c].

  Args:
    logit_sums: [K, K] the cohort's summed per-class logits Σ_k S_k.
    counts: [K] the cohort's per-class counts Σ_k n_k.
    previous: [K, K] the current global logits.
    known: [K] whether each class had a global logit before.

  Returns:
    (the new global logits, the new ``known``).
  """
  held = counts > 0
  fresh = logit_sums / jnp.maximum(counts, 1.0)[:, None]
  return jnp.where(held[:, None], fresh, previous), known | held


def feddistill_loss(model: Model, beta: float, temperature: float, num_classes: int):
  """``loss_fn``: CE + β·T²·KL(σ(G[y]/T) ‖ σ(z/T)) over the examples whose class is known."""

  def loss_fn(params, batch: Batch, ctx: client_lib.StepContext):
    out, ce = client_lib.train_forward(model, params, batch, ctx)
    teacher = ctx.shared["global_logits"][batch.y]
    has_target = ctx.shared["known"][batch.y].astype(jnp.float32) * batch.mask
    kd = losses.kl_from_logits(teacher, out.logits, temperature, has_target)
    return ce + beta * kd, client_lib.LossAux(out.logits, out.state)

  return loss_fn


def feddistill_plus(
  model: Model,
  client_optimizer: optax.GradientTransformation,
  num_classes: int,
  server_optimizer: optax.GradientTransformation | None = None,
  *,
  beta: float = 0.1,
  temperature: float = 1.0,
) -> FederatedAlgorithm:
  """Builds FedDistill+ (module docstring).

  Args:
    model: the model.
    client_optimizer: local optimiser.
    num_classes: K, the width of the logits and the number of per-class rows.
    server_optimizer: optional server optimiser (see fedavg).
    beta: β, the distillation coefficient (002: 0.1).
    temperature: T > 0.
  """
  if num_classes < 2:
    raise ValueError(f"feddistill_plus needs num_classes >= 2, got {num_classes}.")
  if temperature <= 0:
    raise ValueError(f"feddistill_plus needs temperature > 0, got {temperature}.")
  base = fedavg(model, client_optimizer, server_optimizer)
  inner = base.aggregate  # FedAvg's StreamingAggregate: its direct form keeps FedAvg's numbers

  def init_extra(shared, client_input, key):
    del shared, client_input, key
    return (jnp.zeros((num_classes, num_classes), jnp.float32), jnp.zeros(num_classes, jnp.float32))

  def track(grads, params, batch: Batch, ctx: client_lib.StepContext):
    # The hook sees no logits: the same training forward again (same parameters, state and key,
    # so the loss's logits), outside the differentiated loss.
    logits = client_lib.forward(
      model, params, ctx.model_state, batch.x, train=True, key=ctx.key, mask=batch.mask
    ).logits
    sums, counts = class_logit_sums(logits, batch.y, batch.mask, num_classes)
    return grads, (ctx.extra[0] + sums, ctx.extra[1] + counts)

  program = client_lib.local_training_client(
    model,
    client_optimizer,
    feddistill_loss(model, beta, temperature, num_classes),
    init_extra=init_extra,
    transform_grads=track,
    finalize=lambda state: {"logit_sums": state.extra[0], "label_counts": state.extra[1]},
  )

  def init(variables, key):
    zeros = jnp.zeros((num_classes, num_classes), jnp.float32)
    return FedDistillState(base.init(variables, key), zeros, jnp.zeros(num_classes, bool))

  def broadcast(state: FedDistillState, rd, key):
    shared, inputs = base.broadcast(state.fedavg, rd, key)
    return {**shared, "global_logits": state.global_logits, "known": state.known}, inputs

  def class_sums(outputs):
    # Padding clients have an all-False mask, so their tables are zero.
    return {
      "logit_sums": jnp.sum(outputs["logit_sums"], axis=0),
      "label_counts": jnp.sum(outputs["label_counts"], axis=0),
    }

  def with_logits(state, inner_state, sums, metrics):
    logits, known = global_class_logits(
      sums["logit_sums"], sums["label_counts"], state.global_logits, state.known
    )
    return FedDistillState(inner_state, logits, known), metrics

  def reduce(state, rd, outputs):
    return {"fedavg": inner.reduce(state.fedavg, rd, outputs), **class_sums(outputs)}

  def finish(state, rd, sums, key):
    inner_state, metrics = inner.finish(state.fedavg, rd, sums["fedavg"], key)
    return with_logits(state, inner_state, sums, metrics)

  def aggregate(state, rd, outputs, key):
    inner_state, metrics = inner(state.fedavg, rd, outputs, key)
    return with_logits(state, inner_state, class_sums(outputs), metrics)

  return FederatedAlgorithm(
    name="feddistill_plus",
    init=init,
    broadcast=broadcast,
    client=program,
    aggregate=StreamingAggregate(reduce, finish, direct=aggregate),
    global_variables=lambda state: state.fedavg.variables,
  )


SPEC = factory_spec(
  "feddistill_plus",
  "fl",
  feddistill_plus,
  ctx_args=("model", "client_optimizer", "num_classes"),
  ctx_kwargs=("server_optimizer",),
)
