"""MOON (Li, He and Song, "Model-Contrastive Federated Learning", CVPR 2021).

Client loss (docs/methods.md "MOON"; official code QinbinLi/MOON):
  CE(f(x; θ), y) + μ · CE([cos(z, z_g), cos(z, z_prev)] / τ, label 0),
where z are the local model's projection-head features (``ModelOutput.features`` of the same
training forward pass that gives the logits; the registry builds the model with
``projection_dim=256``, a 2-layer MLP head, with the output layer on top of that head), z_g the
received global model's and z_prev the client's previous local model's features on the same
batch. Both reference models run in inference mode with stopped gradients, as the official code
freezes them; the contrastive term is a masked mean over real examples. μ = 1 (the paper uses 5 on
CIFAR-10), τ = 0.5. The server is FedAvg.

Per-client state: every client's previous local model (all variables, including BatchNorm
statistics), stacked [num_clients, ...] in the server state: num_clients full model copies, i.e.
num_clients × (model + projection head) float32 values (e.g. 100 clients × ResNet-8's 78k
parameters + its 64→64→256 head ≈ 100 × 99k ≈ 40 MB; 20 clients × the 2.2M-parameter CNN with a
512→512→256 head ≈ 210 MB). Before a client's first round its
"previous" model is the initial global model. Sampled clients' entries are gathered in
``broadcast`` and replaced by their new local models in ``aggregate``.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import optax

from fedjax_proj.algorithms import client as client_lib
from fedjax_proj.algorithms import losses
from fedjax_proj.algorithms.base import FederatedAlgorithm
from fedjax_proj.algorithms.fedavg import average_and_update, client_metrics, init_server
from fedjax_proj.algorithms.registry import factory_spec
from fedjax_proj.core import tree as tree_lib
from fedjax_proj.core.types import Array, Batch, Model, PyTree

# The paper's network is a base encoder, a projection head and an output layer, in that order
# (Sec. 3.2: R_w is "the network before the output layer"), and the official code computes the
# logits from the projection as well (docs/parity.md, "What the rows found", MOON). Runs before the
# fix computed the logits from the encoder's features; fedproj-cifar10's cpu budget keeps that
# layout for its v1 verdicts (fedjax_proj/reproduce/claims/fedproj.py).
MODEL_KWARGS = {"projection_dim": 256, "classifier_on_projection": True}


class MoonState(NamedTuple):
  round: Array
  variables: dict
  server_opt_state: PyTree
  prev_models: dict  # [num_clients, ...] each client's last local model (all collections)


def cosine_similarity(a: Array, b: Array, eps: float = 1e-8) -> Array:
  """Row-wise cosine similarity of [B, D] arrays (PyTorch's clamped-denominator convention)."""
  a = a.astype(jnp.float32)
  b = b.astype(jnp.float32)
  # losses.l2_norm: a zero feature row gives cosine 0 and a zero gradient, not NaN.
  denom = jnp.maximum(losses.l2_norm(a) * losses.l2_norm(b), eps)
  return jnp.sum(a * b, axis=-1) / denom


def model_contrastive_loss(
  z: Array, z_global: Array, z_prev: Array, temperature: float, mask: Array | None = None
) -> Array:
  """CE([cos(z, z_g), cos(z, z_prev)] / τ, label 0), masked mean over the batch."""
  logits = jnp.stack([cosine_similarity(z, z_global), cosine_similarity(z, z_prev)], -1)
  per_example = -jax.nn.log_softmax(logits / temperature, axis=-1)[:, 0]
  return losses.masked_mean(per_example, mask)


def moon(
  model: Model,
  client_optimizer: optax.GradientTransformation,
  num_clients: int,
  mu: float = 1.0,
  temperature: float = 0.5,
  server_optimizer: optax.GradientTransformation | None = None,
) -> FederatedAlgorithm:
  """Builds MOON.

  Args:
    model: the model; its ``features`` should be the projection head's output (build it with
      ``projection_dim``; see :data:`MODEL_KWARGS`).
    client_optimizer: local optimiser.
    num_clients: total number of clients (rows of the stacked previous models).
    mu: weight μ of the model-contrastive term.
    temperature: τ > 0.
    server_optimizer: optional server optimiser (see fedavg).
  """
  if temperature <= 0:
    raise ValueError(f"MOON needs temperature > 0, got {temperature}.")
  if num_clients < 1:
    raise ValueError(f"MOON needs num_clients >= 1, got {num_clients}.")
  prev_rows = client_lib.PerClientState("prev")

  def loss_fn(params, batch: Batch, ctx: client_lib.StepContext):
    out, ce = client_lib.train_forward(model, params, batch, ctx)
    z_global = model.apply(ctx.shared["variables"], batch.x, train=False).features
    z_prev = model.apply(ctx.extra, batch.x, train=False).features
    con = model_contrastive_loss(
      out.features,
      jax.lax.stop_gradient(z_global),
      jax.lax.stop_gradient(z_prev),
      temperature,
      batch.mask,
    )
    return ce + mu * con, client_lib.LossAux(out.logits, out.state)

  program = client_lib.local_training_client(
    model,
    client_optimizer,
    loss_fn,
    init_extra=prev_rows.init_extra,
  )

  def init(variables, key):
    del key
    variables, opt_state = init_server(variables, server_optimizer)
    prev = tree_lib.broadcast_clients(variables, num_clients)
    return MoonState(jnp.zeros((), jnp.int32), variables, opt_state, prev)

  def broadcast(state: MoonState, rd, key):
    del key
    return {"variables": state.variables}, prev_rows.client_input(state.prev_models, rd)

  def aggregate(state: MoonState, rd, outputs, key):
    del key
    variables, opt_state = average_and_update(
      state.variables, state.server_opt_state, outputs, rd, server_optimizer
    )
    prev = prev_rows.scatter(state.prev_models, rd, outputs["variables"])
    return MoonState(state.round + 1, variables, opt_state, prev), client_metrics(outputs, rd)

  return FederatedAlgorithm(
    name="moon",
    init=init,
    broadcast=broadcast,
    client=program,
    aggregate=aggregate,
  )


SPEC = factory_spec(
  "moon",
  "fl",
  moon,
  ctx_args=("model", "client_optimizer", "num_clients"),
  ctx_kwargs=("server_optimizer",),
  model_kwargs=MODEL_KWARGS,
)
