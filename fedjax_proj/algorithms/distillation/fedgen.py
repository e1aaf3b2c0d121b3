"""FedGen (Zhu, Hong and Zhou, "Data-Free Knowledge Distillation for Heterogeneous Federated
Learning", ICML 2021; code zhuangdizhu/FedGen), a baseline of paper 002 (Tables 3-6).

The server keeps a conditional generator G(ε, y) of the features the classifier layer reads
(``params["head"]``'s input): ε ~ U[0, 1)^noise_dim concatenated with one-hot(y), a 2-layer MLP
(Dense(hidden_dim) → BatchNorm → ReLU → Dense(D)), hidden_dim = 512 (002 "Parameter Setting": "the
hidden dimension of 2-layer MLP generator is set 512 ... for ResNet-8"), noise_dim = 64 (the FedGen
code's CIFAR generator). Writing h_k(·) for client k's classifier layer applied to features:

* **Server**, each round after local training: ``generator_steps`` Adam steps (lr 3e-4, weight
  decay 1e-2 added to the gradient, the rate × 0.98 per round) on a batch of
  ``generator_batch_size`` labels drawn uniformly from the classes some sampled client holds, of
  Σ_k mean_i(w_{y_i,k}·CE(h_k(G(ε_i, y_i)), y_i)) + η·exp(−mean_{i,j}(d_ε(i,j)·d_G(i,j))), with
  w_{y,k} = ñ_{k,y} / Σ_j ñ_{j,y}, ñ = this round's label counts + 1 (the code's counts start at
  1), d_ε the mean squared and d_G the mean absolute difference of two rows (the diversity term),
  η = 1; the generator trains in BatchNorm training mode. Then FedAvg of the parameters.
* **Client**, from round 1 on (the generator is untrained before): CE + (B_g/B)·α_t·CE(h(G(ε, ŷ)),
  ŷ) + β_t·KL(σ(h(G(ε', y))) ‖ σ(f(x; θ))), ŷ ~ U{0..K−1} (B_g = ``gen_batch_size`` of them), y the
  batch's labels, h the local model's own classifier layer (the first term trains it on generated
  features, the second distils the batch toward the generator's class features, a constant
  target), the generator in inference mode; α_t = max(1e-4, α·0.98^t), β_t likewise (the code's
  ``exp_lr_scheduler``). 002 tunes "the local regularization coefficient from {0.1, 1, 10}";
  α = β = 1 by default. The code's ``early_stop`` (no regulariser after local epoch 20) is not
  kept: 002 trains 20 local epochs, where it never applies.

A model whose classifier is not a ``head`` layer (docs/design.md, "Data layout") is refused when
the method is initialised. The aggregate trains on all sampled clients' classifiers at once, so
it has no streaming form (``--client_chunk`` is refused). docs/methods.md, "FedGen".
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

from fedjax_proj.algorithms import client as client_lib
from fedjax_proj.algorithms import losses
from fedjax_proj.algorithms.base import FederatedAlgorithm
from fedjax_proj.algorithms.fedavg import FedAvgState, fedavg
from fedjax_proj.algorithms.registry import factory_spec
from fedjax_proj.core import ranges
from fedjax_proj.core.types import Array, Batch, Model

# The FedGen code's server constants (RUNCONFIGS: ensemble_alpha 1, ensemble_eta 1,
# weight_decay 1e-2; ExponentialLR gamma 0.98 for the generator and the client coefficients).
TEACHER_WEIGHT, DIVERSITY_WEIGHT, GENERATOR_WEIGHT_DECAY, DECAY = 1.0, 1.0, 1e-2, 0.98
MIN_COEFFICIENT = 1e-4


class Generator(nn.Module):
  """G(ε, y): [ε, one-hot(y)] → Dense(hidden) → BatchNorm → ReLU → Dense(latent)."""

  hidden_dim: int
  latent_dim: int
  num_classes: int

  @nn.compact
  def __call__(self, eps: Array, labels: Array, train: bool) -> Array:
    y = jax.nn.one_hot(labels, self.num_classes, dtype=jnp.float32)
    z = nn.Dense(self.hidden_dim, name="fc")(jnp.concatenate([eps, y], axis=-1))
    # momentum 0.9 here is torch's BatchNorm1d momentum 0.1.
    z = nn.BatchNorm(use_running_average=not train, momentum=0.9, epsilon=1e-5, name="bn")(z)
    return nn.Dense(self.latent_dim, name="representation")(nn.relu(z))


class FedGenState(NamedTuple):
  fedavg: FedAvgState
  generator: dict  # {"params", "batch_stats"}
  generator_opt_state: optax.OptState


def head_logits(params: dict, features: Array) -> Array:
  """The classifier layer ``params["head"]`` on features [B, D]."""
  head = params["head"]
  logits = features @ head["kernel"]
  return logits + head["bias"] if "bias" in head else logits


def diversity_loss(eps: Array, features: Array) -> Array:
  """exp(−mean_{i,j}(mean_n (ε_i − ε_j)² · mean_d |g_i − g_j|)) (the FedGen code's l1 metric)."""
  noise = jnp.mean(jnp.square(eps[:, None] - eps[None]), axis=-1)
  layer = jnp.mean(jnp.abs(features[:, None] - features[None]), axis=-1)
  return jnp.exp(-jnp.mean(noise * layer))


def label_weights(counts: Array) -> tuple[Array, Array]:
  """(w [K, C] with w[y, k] = ñ_{k,y} / Σ_j ñ_{j,y}, ñ = counts + 1; the classes some client
  holds [K] bool) from the sampled clients' label counts [C, K]."""
  smoothed = counts + 1.0
  weights = (smoothed / jnp.sum(smoothed, axis=0, keepdims=True)).T
  return weights, jnp.max(counts, axis=0) > 0


def teacher_loss(heads: dict, features: Array, labels: Array, weights: Array) -> Array:
  """Σ_k mean_i(w[y_i, k]·CE(h_k(g_i), y_i)); ``heads`` stacked [C, ...], ``weights`` [K, C]."""
  logits = jax.vmap(lambda h: head_logits({"head": h}, features))(heads)  # [C, B, K]
  log_p = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
  ce = -jnp.take_along_axis(log_p, labels[None, :, None], axis=-1)[..., 0]  # [C, B]
  return jnp.sum(jnp.mean(ce * weights[labels].T, axis=1))


def client_keys(key: Array) -> tuple[Array, Array, Array]:
  """(ε' for the batch's labels, ŷ, ε for ŷ): a stream apart from the step's dropout key."""
  k1, k2, k3 = jax.random.split(jax.random.fold_in(key, 1), 3)
  return k1, k2, k3


def generate_features(
  gen_vars: dict,
  key: Array,
  labels: Array,
  train: bool,
  *,
  hidden_dim: int,
  num_classes: int,
  noise_dim: int,
) -> tuple[Array, Array, dict]:
  """(G(ε, labels), ε ~ U[0, 1), the BatchNorm statistics after the pass); D is read from the
  variables. ``train``: batch statistics (the server's generator steps), else running ones."""
  gen = Generator(hidden_dim, gen_vars["params"]["representation"]["kernel"].shape[1], num_classes)
  eps = jax.random.uniform(key, (labels.shape[0], noise_dim))
  if train:
    feats, new = gen.apply(gen_vars, eps, labels, True, mutable=["batch_stats"])
    return feats, eps, new["batch_stats"]
  return gen.apply(gen_vars, eps, labels, False), eps, gen_vars["batch_stats"]


def fedgen_loss(
  model: Model,
  num_classes: int,
  alpha: float,
  beta: float,
  hidden_dim: int,
  noise_dim: int,
  gen_batch_size: int,
):
  """``loss_fn``: CE + [t > 0]·((B_g/B)·α_t·CE(h(G(ε, ŷ)), ŷ) + β_t·KL(σ(h(G(ε', y))) ‖ σ(z)))."""
  generate = functools.partial(
    generate_features, hidden_dim=hidden_dim, num_classes=num_classes, noise_dim=noise_dim
  )

  def loss_fn(params, batch: Batch, ctx: client_lib.StepContext):
    out, ce = client_lib.train_forward(model, params, batch, ctx)
    sh = ctx.shared
    k_same, k_y, k_gen = client_keys(ctx.key)
    scale = DECAY ** sh["round"].astype(jnp.float32)
    a = jnp.maximum(MIN_COEFFICIENT, alpha * scale)
    b = jnp.maximum(MIN_COEFFICIENT, beta * scale)
    g_same = jax.lax.stop_gradient(generate(sh["generator"], k_same, batch.y, False)[0])
    latent = b * losses.kl_from_logits(head_logits(params, g_same), out.logits, 1.0, batch.mask)
    y_hat = jax.random.randint(k_y, (gen_batch_size,), 0, num_classes)
    g = jax.lax.stop_gradient(generate(sh["generator"], k_gen, y_hat, False)[0])
    teach = a * losses.cross_entropy(head_logits(params, g), y_hat)
    reg = (gen_batch_size / batch.y.shape[0]) * teach + latent
    return ce + jnp.where(sh["round"] > 0, reg, 0.0), client_lib.LossAux(out.logits, out.state)

  return loss_fn


def fedgen(
  model: Model,
  client_optimizer: optax.GradientTransformation,
  num_classes: int,
  server_optimizer: optax.GradientTransformation | None = None,
  *,
  alpha: float = 1.0,
  beta: float = 1.0,
  hidden_dim: int = 512,
  noise_dim: int = 64,
  gen_batch_size: int = 32,
  generator_batch_size: int = 32,
  generator_steps: int = 50,
  generator_lr: float = 3e-4,
) -> FederatedAlgorithm:
  """Builds FedGen (module docstring).

  Args:
    model: the model; its classifier layer must be ``params["head"]``.
    client_optimizer: local optimiser.
    num_classes: K.
    server_optimizer: optional server optimiser (see fedavg).
    alpha: α, the client's generated-feature CE weight (decays × 0.98 per round).
    beta: β, the client's distillation weight toward the generator's class features.
    hidden_dim: the generator's hidden width (002: 512 for ResNet-8).
    noise_dim: the width of ε.
    gen_batch_size: B_g, generated features per client step.
    generator_batch_size: labels per server generator step.
    generator_steps: server generator steps per round (the code: 10 epochs × 5 iterations).
    generator_lr: the generator's Adam learning rate in round 0.
  """
  if num_classes < 2:
    raise ValueError(f"fedgen needs num_classes >= 2, got {num_classes}.")
  for name, value in (
    ("hidden_dim", hidden_dim),
    ("noise_dim", noise_dim),
    ("gen_batch_size", gen_batch_size),
    ("generator_batch_size", generator_batch_size),
    ("generator_steps", generator_steps),
  ):
    if value < 1:
      raise ValueError(f"fedgen needs {name} >= 1, got {value}.")
  base = fedavg(model, client_optimizer, server_optimizer)
  gen_opt = optax.chain(
    optax.add_decayed_weights(GENERATOR_WEIGHT_DECAY),  # torch Adam's weight_decay
    optax.scale_by_adam(),
    optax.scale_by_learning_rate(
      optax.exponential_decay(generator_lr, generator_steps, DECAY, staircase=True)
    ),
  )

  loss_fn = fedgen_loss(model, num_classes, alpha, beta, hidden_dim, noise_dim, gen_batch_size)
  generate = functools.partial(
    generate_features, hidden_dim=hidden_dim, num_classes=num_classes, noise_dim=noise_dim
  )

  def count_labels(grads, params, batch: Batch, ctx: client_lib.StepContext):
    del params
    onehot = jax.nn.one_hot(batch.y, num_classes, dtype=jnp.float32) * batch.mask[:, None]
    return grads, ctx.extra + jnp.sum(onehot, axis=0)

  program = client_lib.local_training_client(
    model,
    client_optimizer,
    loss_fn,
    init_extra=lambda shared, client_input, key: jnp.zeros(num_classes, jnp.float32),
    transform_grads=count_labels,
    finalize=lambda state: {"label_counts": state.extra},
  )

  def init(variables, key):
    if "head" not in variables.get("params", {}):
      raise ValueError(
        f"fedgen feeds generated features to the classifier layer params['head'], which model "
        f"{model.name!r} does not have; use a model built with models.base.output_heads (mlp, "
        "cnn, resnet8, ...)."
      )
    # D: the classifier layer's input width (the features, or MOON's projection).
    gen = Generator(hidden_dim, variables["params"]["head"]["kernel"].shape[0], num_classes)
    k_init, k_eps = jax.random.split(key)
    eps = jax.random.uniform(k_eps, (2, noise_dim))
    gen_vars = gen.init(k_init, eps, jnp.zeros(2, jnp.int32), False)
    return FedGenState(base.init(variables, key), gen_vars, gen_opt.init(gen_vars["params"]))

  def broadcast(state: FedGenState, rd, key):
    shared, inputs = base.broadcast(state.fedavg, rd, key)
    return {**shared, "generator": state.generator, "round": state.fedavg.round}, inputs

  def train_generator(state: FedGenState, heads, counts, key):
    weights, held = label_weights(counts)
    label_logits = jnp.where(held, 0.0, -jnp.inf)

    def step(carry, k):
      gen_vars, opt_state = carry
      k_y, k_eps = jax.random.split(k)
      labels = jax.random.categorical(k_y, label_logits, shape=(generator_batch_size,))

      def objective(p):
        feats, eps, stats = generate({**gen_vars, "params": p}, k_eps, labels, True)
        t = teacher_loss(heads, feats, labels, weights)
        d = diversity_loss(eps, feats)
        return TEACHER_WEIGHT * t + DIVERSITY_WEIGHT * d, (stats, t, d)

      (_, (stats, t, d)), grads = jax.value_and_grad(objective, has_aux=True)(gen_vars["params"])
      updates, opt_state = gen_opt.update(grads, opt_state, gen_vars["params"])
      params = optax.apply_updates(gen_vars["params"], updates)
      return ({"params": params, "batch_stats": stats}, opt_state), (t, d)

    keys = jax.random.split(key, generator_steps)
    (gen_vars, opt_state), (t, d) = jax.lax.scan(
      step, (state.generator, state.generator_opt_state), keys
    )
    return gen_vars, opt_state, {"generator_teacher_loss": t[-1], "generator_diversity": d[-1]}

  def aggregate(state: FedGenState, rd, outputs, key):
    heads = outputs["variables"]["params"]["head"]
    gen_vars, opt_state, gen_metrics = train_generator(state, heads, outputs["label_counts"], key)
    inner, metrics = base.aggregate(state.fedavg, rd, outputs, key)
    return FedGenState(inner, gen_vars, opt_state), {**metrics, **gen_metrics}

  return FederatedAlgorithm(
    name="fedgen",
    init=init,
    broadcast=broadcast,
    client=program,
    aggregate=aggregate,
    global_variables=lambda state: state.fedavg.variables,
  )


SPEC = factory_spec(
  "fedgen",
  "fl",
  fedgen,
  ctx_args=("model", "client_optimizer", "num_classes"),
  ctx_kwargs=("server_optimizer",),
  ranges=dict.fromkeys(
    ("hidden_dim", "noise_dim", "gen_batch_size", "generator_batch_size", "generator_steps"),
    ranges.AT_LEAST_ONE,
  ),
)
