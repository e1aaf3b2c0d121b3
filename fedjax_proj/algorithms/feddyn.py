"""FedDyn (Acar et al., "Federated Learning Based on Dynamic Regularization", ICLR 2021).

Client k minimises (docs/methods.md "FedDyn", α = 0.01)
  CE(θ) − ⟨h_k, θ⟩ + (α/2)‖θ − θ_g‖²,
where h_k = ∇L_k at the client's previous local model (zero before its first round). The linear and
quadratic terms enter through their gradient, −h_k + α(θ − θ_g), so the reported ``train_loss`` is
the CE part only. After training (θ_k the local model):
  h_k ← h_k − α(θ_k − θ_g)                                   (sampled clients only)
  h   ← h − (α/N) Σ_{k sampled} (θ_k − θ_g)                   (N = all clients)
  θ_g ← (1/|P|) Σ_{k sampled} θ_k − h/α.
As in the paper's Algorithm 1 the model mean is unweighted over the sampled set P (FedAvg's n_k
weights are not used); BatchNorm statistics, which are not regularised, take the same plain mean.
FedDyn's server step is fixed, so a server optimiser is rejected.

Per-client state: h_k for every client, stacked [num_clients, ...] in the server state (one
parameter-sized float32 copy per client, e.g. 100 clients × 78k ResNet-8 parameters ≈ 31 MB), plus
the server's h; gathered/scattered by ``round_data.client_ids`` inside the round.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import optax

from fedjax_proj.algorithms import client as client_lib
from fedjax_proj.algorithms.base import FederatedAlgorithm
from fedjax_proj.algorithms.fedavg import client_metrics
from fedjax_proj.algorithms.registry import factory_spec
from fedjax_proj.core import tree as tree_lib
from fedjax_proj.core.types import Array, Model, PyTree


class FedDynState(NamedTuple):
  round: Array
  variables: dict
  h: PyTree  # server state h, parameter-shaped
  h_clients: PyTree  # [num_clients, ...] per-client h_k (previous local gradients)


def feddyn(
  model: Model,
  client_optimizer: optax.GradientTransformation,
  num_clients: int,
  alpha: float = 0.01,
  server_optimizer: optax.GradientTransformation | None = None,
) -> FederatedAlgorithm:
  """Builds FedDyn.

  Args:
    model: the model as pure functions.
    client_optimizer: local optimiser.
    num_clients: total number of clients N.
    alpha: dynamic-regularisation coefficient α > 0.
    server_optimizer: must be None (FedDyn defines its own server update).
  """
  if alpha <= 0:
    raise ValueError(f"FedDyn needs alpha > 0 (the server divides by it), got alpha={alpha}.")
  if num_clients < 1:
    raise ValueError(f"FedDyn needs num_clients >= 1, got {num_clients}.")
  if server_optimizer is not None:
    raise ValueError(
      "FedDyn has its own server update (θ = mean θ_k − h/α); use --server_optimizer=none."
    )
  h_k_rows = client_lib.PerClientState("h_k")

  def transform_grads(grads, params, batch, ctx: client_lib.StepContext):
    del batch
    global_params = ctx.shared["variables"]["params"]
    corrected = jax.tree.map(
      lambda g, hk, p, pg: g - hk + alpha * (p - pg), grads, ctx.extra, params, global_params
    )
    return corrected, ctx.extra

  program = client_lib.local_training_client(
    model,
    client_optimizer,
    client_lib.cross_entropy_loss(model),
    init_extra=h_k_rows.init_extra,
    transform_grads=transform_grads,
  )

  def init(variables, key):
    del key
    variables = tree_lib.tree_copy(variables)
    h, h_clients = client_lib.zeros_per_client(variables["params"], num_clients)
    return FedDynState(jnp.zeros((), jnp.int32), variables, h, h_clients)

  def broadcast(state: FedDynState, rd, key):
    del key
    return {"variables": state.variables}, h_k_rows.client_input(state.h_clients, rd)

  def aggregate(state: FedDynState, rd, outputs, key):
    del key
    global_params = state.variables["params"]
    local_params = outputs["variables"]["params"]
    drift = jax.tree.map(
      lambda t, g: t.astype(jnp.float32) - g[None].astype(jnp.float32), local_params, global_params
    )
    h_k = h_k_rows.gather(state.h_clients, rd)
    h_clients = h_k_rows.scatter(
      state.h_clients, rd, jax.tree.map(lambda hk, d: hk - alpha * d, h_k, drift)
    )
    h = jax.tree.map(lambda h, d: h - alpha / num_clients * tree_lib.sum_clients(d), state.h, drift)
    uniform = jnp.ones_like(rd.num_examples)
    mean_vars = tree_lib.weighted_mean(outputs["variables"], uniform)
    params = jax.tree.map(
      lambda m, hh: (m.astype(jnp.float32) - hh / alpha).astype(m.dtype), mean_vars["params"], h
    )
    variables = {**mean_vars, "params": params}
    metrics = client_metrics(outputs, rd)
    metrics["h_norm"] = tree_lib.tree_norm(h)
    return FedDynState(state.round + 1, variables, h, h_clients), metrics

  return FederatedAlgorithm(
    name="feddyn",
    init=init,
    broadcast=broadcast,
    client=program,
    aggregate=aggregate,
  )


SPEC = factory_spec(
  "feddyn",
  "fl",
  feddyn,
  ctx_args=("model", "client_optimizer", "num_clients"),
  ctx_kwargs=("server_optimizer",),
)
