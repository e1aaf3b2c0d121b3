"""FedNova (Wang et al., "Tackling the Objective Inconsistency Problem in Heterogeneous Federated
Optimization", NeurIPS 2020).

Clients train exactly as in FedAvg; the server normalises each client's change by how many
"gradient units" its local optimiser accumulated (docs/methods.md, "FedNova"):

  Δ_k = θ_g − θ_k,   d = Σ_k p_k Δ_k / a_k,   τ_eff = Σ_k p_k a_k,   θ ← θ_g − τ_eff · d,

with p_k = n_k / Σ_j n_j over the sampled clients. BatchNorm statistics take the FedAvg average; an
optional server optimiser receives θ_g − (θ_g − τ_eff d) as its pseudo-gradient.

Which a_k. FedNova writes a client's change as Δ_k = η Σ_s w_s g_s and a_k = ‖w‖₁. This module gets
a_k from the client optimiser itself (:func:`unit_gradient_displacement`): a_k = D(τ_k) / D(1),
where D(t) is how far the optimiser moves a scalar parameter in t steps when every gradient is 1.
For a linear optimiser that is exactly ‖w‖₁ (up to the common learning rate, which cancels in
τ_eff · d):
  * plain SGD: a_k = τ_k;
  * SGD with heavy-ball momentum ρ (``optax.sgd(lr, momentum=ρ)``): a_k = Σ_{s≤τ_k} counter_s with
    counter ← ρ·counter + 1, the paper's momentum rule (tests check the two agree);
  * Nesterov momentum: the corresponding Nesterov weights, with no extra code.
Adam (our choice, with the reason): the probe gives a_k = τ_k, because the bias-corrected first
moment of a constant gradient is that gradient, so each Adam step moves by one learning rate.
Adam's m̂ is a convex combination of past gradients (weights sum to 1), unlike heavy-ball momentum
whose weights add up to ``counter``, and its per-coordinate preconditioner plays the role of a
learning rate, which FedNova's analysis takes to be shared by clients. So an Adam client's
"number of gradient units" is its number of steps. The probe holds the parameter at 0, so weight
decay chained in front of the optimiser does not enter a_k.

Per-client state: none.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax

from fedjax_proj.algorithms.base import FederatedAlgorithm
from fedjax_proj.algorithms.fedavg import FedAvgState, client_metrics, fedavg, server_update
from fedjax_proj.algorithms.registry import factory_spec
from fedjax_proj.core import tree as tree_lib
from fedjax_proj.core.types import Array, Model


def unit_gradient_displacement(optimizer: optax.GradientTransformation, num_steps: int) -> Array:
  """D[t], t = 0..num_steps: total displacement after t steps when every gradient is 1.

  The scalar parameter is held at 0 (so weight decay contributes nothing) and the optimiser's own
  state evolves as in training. Traceable; ``num_steps`` must be static.

  Returns:
    float32 [num_steps + 1] with D[0] = 0.
  """
  param = jnp.zeros((), jnp.float32)
  one = jnp.ones((), jnp.float32)

  def body(carry, _):
    opt_state, total = carry
    updates, opt_state = optimizer.update(one, opt_state, param)
    total = total - updates
    return (opt_state, total), total

  _, totals = jax.lax.scan(body, (optimizer.init(param), param), None, length=num_steps)
  return jnp.concatenate([jnp.zeros((1,), jnp.float32), totals.astype(jnp.float32)])


def normalized_steps(optimizer: optax.GradientTransformation, num_steps: Array, max_steps: int):
  """a_k = D(τ_k) / D(1) for each client's step count τ_k (0 for clients that took no step)."""
  table = unit_gradient_displacement(optimizer, max(int(max_steps), 1))
  unit = jnp.where(table[1] != 0, table[1], 1.0)
  return table[num_steps] / unit


def fednova(
  model: Model,
  client_optimizer: optax.GradientTransformation,
  server_optimizer: optax.GradientTransformation | None = None,
) -> FederatedAlgorithm:
  """Builds FedNova (clients as in FedAvg, normalised averaging on the server).

  Args:
    model: the model as pure functions.
    client_optimizer: local optimiser; a_k is derived from it (see the module docstring).
    server_optimizer: optional server optimiser applied to the normalised pseudo-gradient.
  """
  base = fedavg(model, client_optimizer, server_optimizer)

  def aggregate(state: FedAvgState, rd, outputs, key):
    del key
    p = rd.num_examples / jnp.sum(rd.num_examples)
    a = normalized_steps(client_optimizer, outputs["num_steps"], rd.idx.shape[1])
    # A client that took no step has Δ_k = 0; give it zero weight instead of dividing by a_k = 0.
    coef = jnp.where(a > 0, p / jnp.where(a > 0, a, 1.0), 0.0)
    tau_eff = jnp.sum(p * a)
    global_params = state.variables["params"]
    deltas = jax.tree.map(lambda g, t: g[None] - t, global_params, outputs["variables"]["params"])
    d = jax.tree.map(lambda x: jnp.tensordot(coef, x.astype(jnp.float32), axes=1), deltas)
    new_params = jax.tree.map(lambda g, x: (g - tau_eff * x).astype(g.dtype), global_params, d)
    averaged = tree_lib.weighted_mean(outputs["variables"], rd.num_examples)
    averaged = {**averaged, "params": new_params}
    variables, opt_state = server_update(
      state.variables, averaged, server_optimizer, state.server_opt_state
    )
    metrics = client_metrics(outputs, rd)
    metrics["tau_eff"] = tau_eff
    return FedAvgState(state.round + 1, variables, opt_state), metrics

  return base._replace(name="fednova", aggregate=aggregate)


SPEC = factory_spec("fednova", "fl", fednova, ctx_kwargs=("server_optimizer",))
