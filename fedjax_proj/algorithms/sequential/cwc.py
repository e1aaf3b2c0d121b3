"""CWC: cyclical weight consolidation for sequential FL (baseline of SFedKD, papers/004).

Song, Wang & Wang, "Cyclical Weight Consolidation: Towards Solving Catastrophic Forgetting in
Serial Federated Learning" (arXiv 2405.10647). CWC regularises each client's local training with a
consolidation matrix that tracks each parameter's importance to the clients visited so far, and
decays that memory when a new round starts. The paper's code is not available here, so this is
our reading of it (an EWC-style rule, docs/methods.md "CWC"); the exact rule is:

* Server state: the global model θ and a consolidation matrix Ω ≥ 0 shaped like the parameters
  (zero at the start).
* Round start: Ω ← σ·Ω (``decay`` σ; the "cyclical" memory attenuation).
* Client m of the sequence receives θ_{m−1} and Ω_{m−1} and minimises
  CE(θ) + (λ/2)·Σ_i Ω_{m−1,i}·(θ_i − θ_{m−1,i})²     (``lam`` λ; anchor = the received model).
* Its importance is the diagonal empirical Fisher of its own data along its local trajectory,
  F_m = mean over its local steps of (∇_θ CE)² (mini-batch gradients, the cross-entropy part only),
  normalised to a maximum of 1: I_m = F_m / max_i F_{m,i}. Normalising makes λ comparable across
  models and datasets (an unnormalised mini-batch Fisher is tiny and model-dependent).
* Hand-off: Ω_m = Ω_{m−1} + I_m; the next client receives (θ_m, Ω_m).
* Round end: θ ← θ_M (as FedSeq), Ω ← Ω_M.

With λ = 0 (or in round 1, where Ω = 0) CWC is exactly FedSeq. Only ``params`` are consolidated;
BatchNorm statistics pass along the chain as in FedSeq.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import optax

from fedjax_proj.algorithms import client as client_lib
from fedjax_proj.algorithms.registry import factory_spec
from fedjax_proj.algorithms.sequential.base import (
  SequentialAlgorithm,
  chain_metrics,
)
from fedjax_proj.core import tree as tree_lib
from fedjax_proj.core.engine import ClientProgram
from fedjax_proj.core.types import Array, Model, PyTree


class CWCState(NamedTuple):
  round: Array
  variables: dict
  omega: PyTree  # consolidation matrix, shaped like variables["params"]


def normalized_importance(fisher_sum: PyTree, num_steps: Array) -> PyTree:
  """I = F / max(F) with F = fisher_sum / num_steps (all zeros if the client took no step)."""
  fisher = tree_lib.tree_scale(1.0 / jnp.maximum(num_steps, 1).astype(jnp.float32), fisher_sum)
  peak = jnp.max(jnp.stack([jnp.max(x) for x in jax.tree.leaves(fisher)]))
  return tree_lib.tree_scale(1.0 / jnp.maximum(peak, 1e-30), fisher)


def cwc_client(model: Model, optimizer: optax.GradientTransformation, lam: float) -> ClientProgram:
  """The CWC client: CE + consolidation penalty; accumulates the CE gradients' squares.

  ``shared`` holds ``variables`` (the received model, which is also the anchor) and ``omega``.
  The penalty enters as its analytic gradient λ·Ω⊙(θ − anchor) in ``transform_grads``, so the
  cross-entropy gradient (the Fisher's input) stays separate; the reported ``train_loss`` is the
  cross-entropy alone.
  """

  def init_extra(shared, client_input, key):
    del client_input, key
    return tree_lib.tree_zeros_like(shared["variables"]["params"])  # running Σ (∇CE)²

  def transform_grads(ce_grads, params, batch, ctx):
    del batch
    anchor, omega = ctx.shared["variables"]["params"], ctx.shared["omega"]
    grads = jax.tree.map(lambda g, p, a, o: g + lam * o * (p - a), ce_grads, params, anchor, omega)
    return grads, jax.tree.map(lambda f, g: f + jnp.square(g), ctx.extra, ce_grads)

  def finalize(state: client_lib.LocalState):
    return {"importance": normalized_importance(state.extra, state.num_steps)}

  return client_lib.local_training_client(
    model,
    optimizer,
    client_lib.cross_entropy_loss(model),
    init_extra=init_extra,
    transform_grads=transform_grads,
    finalize=finalize,
  )


def cwc(
  model: Model,
  client_optimizer: optax.GradientTransformation,
  lam: float = 1.0,
  decay: float = 0.5,
) -> SequentialAlgorithm:
  """Builds CWC.

  Args:
    model: the model as pure functions.
    client_optimizer: local optimiser (re-initialised at every client).
    lam: λ, penalty strength (on max-normalised importances).
    decay: σ in [0, 1], memory decay applied to Ω at the start of each round.
  """
  if lam < 0:
    raise ValueError(f"CWC lam must be >= 0, got {lam}.")
  if not 0.0 <= decay <= 1.0:
    raise ValueError(f"CWC decay must be in [0, 1], got {decay}.")

  def init(variables, key):
    del key
    variables = tree_lib.tree_copy(variables)
    return CWCState(
      jnp.zeros((), jnp.int32), variables, tree_lib.tree_zeros_like(variables["params"])
    )

  def begin(state, rd, key):
    del rd, key
    return {}, {"variables": state.variables, "omega": tree_lib.tree_scale(decay, state.omega)}, {}

  def handoff(carry, output, client_input):
    del client_input
    return {
      "variables": output["variables"],
      "omega": tree_lib.tree_add(carry["omega"], output["importance"]),
    }

  def end(state, rd, carry, outputs, order, key):
    del key
    new_state = CWCState(state.round + 1, carry["variables"], carry["omega"])
    metrics = chain_metrics(outputs, rd, order)
    metrics["omega_mean"] = jnp.mean(tree_lib.tree_ravel(carry["omega"]))
    return new_state, metrics

  return SequentialAlgorithm(
    name="cwc",
    init=init,
    begin=begin,
    client=cwc_client(model, client_optimizer, lam),
    handoff=handoff,
    end=end,
  )


SPEC = factory_spec("cwc", "sequential", cwc)
