"""CWC: cyclical weight consolidation for sequential FL (baseline of SFedKD, papers/004).

Song, Wang & Wang, "Cyclical Weight Consolidation: Towards Solving Catastrophic Forgetting in
Serial Federated Learning" (arXiv 2405.10647). CWC regularises each client's local training with a
consolidation matrix that tracks each parameter's importance to the clients visited so far, and
decays that memory when a new round starts. The paper's code is not available here, so this is
our reading of it (an EWC-style rule, METHODS.md "CWC baseline"); the exact rule is:

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
from fedjax_proj.algorithms import losses
from fedjax_proj.algorithms.sequential import (
  SequentialAlgorithm,
  chain_metrics,
  check_no_server_optimizer,
)
from fedjax_proj.core import tree as tree_lib
from fedjax_proj.core.engine import BatchFn, ClientProgram
from fedjax_proj.core.types import Array, Batch, Model, PyTree


class CWCState(NamedTuple):
  round: Array
  variables: dict
  omega: PyTree  # consolidation matrix, shaped like variables["params"]


def normalized_importance(fisher_sum: PyTree, num_steps: Array) -> PyTree:
  """I = F / max(F) with F = fisher_sum / num_steps (all zeros if the client took no step)."""
  fisher = tree_lib.tree_scale(1.0 / jnp.maximum(num_steps, 1).astype(jnp.float32), fisher_sum)
  peak = jnp.max(jnp.stack([jnp.max(x) for x in jax.tree.leaves(fisher)]))
  return tree_lib.tree_scale(1.0 / jnp.maximum(peak, 1e-30), fisher)


def consolidation_penalty(params: PyTree, anchor: PyTree, omega: PyTree) -> Array:
  """Σ_i Ω_i (θ_i − anchor_i)² (without the λ/2)."""
  parts = jax.tree.map(lambda p, a, o: jnp.sum(o * jnp.square(p - a)), params, anchor, omega)
  return sum(jax.tree.leaves(parts), jnp.zeros((), jnp.float32))


def cwc_client(model: Model, optimizer: optax.GradientTransformation, lam: float) -> ClientProgram:
  """The CWC client: CE + consolidation penalty; accumulates the CE gradients' squares.

  ``shared`` holds ``variables`` (the received model, which is also the anchor) and ``omega``.
  """
  ce_loss = client_lib.cross_entropy_loss(model)

  def init(shared, client_input, key):
    del client_input, key
    params, model_state = client_lib.split_variables(shared["variables"])
    zero = jnp.zeros((), jnp.float32)
    return client_lib.LocalState(
      params,
      model_state,
      optimizer.init(params),
      tree_lib.tree_zeros_like(params),  # extra: running Σ (∇CE)²
      jnp.zeros((), jnp.int32),
      zero,
      zero,
      zero,
    )

  def step(shared, state: client_lib.LocalState, batch: Batch, key):
    ctx = client_lib.StepContext(state.model_state, shared, state.extra, key)
    (ce, aux), ce_grads = jax.value_and_grad(ce_loss, has_aux=True)(state.params, batch, ctx)
    anchor, omega = shared["variables"]["params"], shared["omega"]
    # Gradient of (λ/2)·Σ Ω(θ − anchor)², added analytically so the CE part stays separate.
    grads = jax.tree.map(
      lambda g, p, a, o: g + lam * o * (p - a), ce_grads, state.params, anchor, omega
    )
    loss = ce + 0.5 * lam * consolidation_penalty(state.params, anchor, omega)
    updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
    return state._replace(
      params=optax.apply_updates(state.params, updates),
      model_state=aux.model_state,
      opt_state=opt_state,
      extra=jax.tree.map(lambda f, g: f + jnp.square(g), state.extra, ce_grads),
      num_steps=state.num_steps + 1,
      loss_sum=state.loss_sum + loss,
      correct=state.correct + losses.accuracy_count(aux.logits, batch.y, batch.mask),
      seen=state.seen + jnp.sum(batch.mask),
    )

  def final(state: client_lib.LocalState):
    steps = jnp.maximum(state.num_steps, 1).astype(jnp.float32)
    return {
      "variables": client_lib.merge_variables(state.params, state.model_state),
      "importance": normalized_importance(state.extra, state.num_steps),
      "num_steps": state.num_steps,
      "metrics": {
        "train_loss": state.loss_sum / steps,
        "train_accuracy": state.correct / jnp.maximum(state.seen, 1.0),
      },
    }

  return ClientProgram(init, step, final)


def cwc(
  model: Model,
  client_optimizer: optax.GradientTransformation,
  batch_fn: BatchFn,
  lam: float = 1.0,
  decay: float = 0.5,
) -> SequentialAlgorithm:
  """Builds CWC.

  Args:
    model: the model as pure functions.
    client_optimizer: local optimiser (re-initialised at every client).
    batch_fn: the engine's batch builder.
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
    batch_fn=batch_fn,
    global_variables=lambda state: state.variables,
  )


NEEDS_PUBLIC = False


def build(ctx, **hparams) -> SequentialAlgorithm:
  """Registry entry; hyperparameters ``lam`` (λ) and ``decay`` (σ)."""
  unknown = set(hparams) - {"lam", "decay"}
  if unknown:
    raise ValueError(f"Unknown CWC hyperparameters {sorted(unknown)}; valid: lam, decay.")
  check_no_server_optimizer(ctx.server_optimizer, "cwc")
  return cwc(ctx.model, ctx.client_optimizer, ctx.batch_fn, **hparams)
