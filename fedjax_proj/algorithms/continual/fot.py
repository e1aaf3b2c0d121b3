"""FOT: Federated Orthogonal Training (Bakman et al., ICLR 2024; paper 003 in the project).

Task-incremental continual FL (docs/methods.md, "FOT"). Clients run plain local SGD on the current
task's head (code duygunuryldz/Federated_Orthogonal_Training). The server keeps, per projected layer
(every Dense/Conv kernel), an orthonormal basis U of the global principal input subspace of the past
tasks, stored zero-padded as [d, d] so the round compiles once:

* FedProject (every round): Δ = θ_g − Σ_k (n_k/n) θ_k; for every projected kernel (conv kernels
  reshaped to (k·k·C_in) x C_out) Δ ← Δ − U Uᵀ Δ; θ_g ← θ_g − μ Δ (μ = 1). Biases, norms and heads
  are not projected; non-parameter collections take the plain average.
* GPSE (after each task, one extra round over ALL clients; :mod:`.gpse`):
  clients sketch their residual layer inputs (vmap over clients, scan over batches, inside one
  jit), the server sums the sketches, picks the rank with the threshold rule and extends U, on the
  device (:func:`gpse.extend_step`). The threshold is ε_t = ε_0 + t·ε_inc (PMNIST 0.94–0.96 with
  increment 0, Split-CIFAR100 0.87 + 0.001/task: Table 9 of paper 003, docs/reproduction.md; the
  Appendix text says 0.93). ``threshold_rule`` says what ε is a threshold on (docs/fot.md, "The
  threshold rule"): the share of the input energy covered (the paper's text, the default) or the
  authors' code's ε'.

FRZ (``freeze_first``, 003 Sec. 5.2.2 and Table 6): the first projected layer trains on the first
task only and is frozen from the second task on, so the raw samples (that layer's inputs) never
enter a GPSE sketch: GPSE sketches only the inner layers' activations, at every task's end. From
task 1 on the clients' gradient of the frozen layer (kernel and bias) is zero and the server
keeps its parameters exactly (bitwise) whatever the clients send.

DP (003 Appendix H, Table 6): each client clips its sketch to Frobenius norm L (``dp_clip``) and
adds Gaussian noise of std σ (``dp_noise``); ``dp_epsilon`` > 0 sets σ from (ε, δ), L and the
number of clients instead (:func:`gpse.gaussian_sigma`: Table 6 uses ε = 5, δ = 1e-5, L = 1).

Sketch width s = ``sketch_multiplier`` x d (docs/methods.md "FOT": 5 for CIFAR, 1 for the MNIST
MLP; the authors' AlexNet code uses 1 for convolutions and 5 for the fully connected layers —
``conv_sketch_multiplier``). The run's chunk (``--client_chunk``, the executor's
:attr:`~fedjax_proj.core.executor.Executor.client_chunk`) bounds how many clients' [d, s] sketches
are in memory at once during GPSE, as it bounds the rounds' clients (all clients without one).
"""

from __future__ import annotations

import time
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from fedjax_proj.algorithms import client as client_lib
from fedjax_proj.algorithms.base import FederatedAlgorithm
from fedjax_proj.algorithms.continual import gpse
from fedjax_proj.algorithms.continual.base import ContinualMethod, mean_aggregate, task_loss
from fedjax_proj.algorithms.registry import factory_spec
from fedjax_proj.core import ranges
from fedjax_proj.core import tree as tree_lib
from fedjax_proj.core.engine import ClientProgram
from fedjax_proj.core.executor import Executor
from fedjax_proj.core.types import Array, Model, RoundData


class FOTState(NamedTuple):
  round: Array
  variables: dict
  bases: dict  # layer key -> [d, d], orthonormal columns then zeros
  ranks: dict  # layer key -> int32 scalar


def fot(
  model: Model,
  optimizer: optax.GradientTransformation,
  executor: Executor,
  *,
  variables: dict,
  sample_x: Array,
  eps: float = 0.95,
  eps_inc: float = 0.0,
  mu: float = 1.0,
  sketch_multiplier: float = 5.0,
  conv_sketch_multiplier: float | None = None,
  dp_clip: float = 0.0,
  dp_noise: float = 0.0,
  max_exact_svd: int = 2_000_000,
  sketch_dist: str = "gaussian",
  server_blas_threads: int = 1,
  threshold_rule: str = "energy",
  freeze_first: bool = False,
  dp_epsilon: float = 0.0,
  dp_delta: float = 1e-5,
  dp_calibration: str = "paper",
  num_clients: int | None = None,
) -> ContinualMethod:
  """Builds FOT.

  Args:
    model: a multi-head model (``apply(..., task=t)``).
    optimizer: client optimiser (the paper: SGD 0.01).
    executor: the run's executor, which runs the end-of-task GPSE sketch pass over the clients
      (the same one the run builds its rounds on), its chunk at a time
      (:meth:`Executor.client_chunks`).
    variables: initial variables (their shapes locate the projected layers).
    sample_x: a normalised input batch (shape only).
    eps: initial threshold ε_0.
    eps_inc: threshold increment per task.
    mu: server step on the projected update.
    sketch_multiplier: s = multiplier x d for dense layers.
    conv_sketch_multiplier: the same for conv layers (default: ``sketch_multiplier``).
    dp_clip: Frobenius clip L of each client sketch (0 = off; paper Appendix H uses 1).
    dp_noise: std of the Gaussian noise added to each clipped client sketch (0 = off).
    max_exact_svd: matrices with more entries use the randomized range finder.
    sketch_dist: "gaussian" (the paper's G ~ N(0, 1)) or "rademacher" (±1 entries; cheaper).
    server_blas_threads: BLAS threads for the server's SVD/QR on CPU (0 = leave the BLAS
      default; see :func:`gpse.blas_threads` for why one is the default).
    threshold_rule: how ε picks the rank (:data:`gpse.THRESHOLD_RULES`; docs/fot.md, "The
      threshold rule"): "energy", the paper's text (003 Sec. 4.1.2: the threshold is the portion
      of the input covered in total), measured as GPM's squared-energy criterion; or "authors",
      the authors' code's ε' = (ρ − (1 − ε))/ρ on the unsquared ratios.
    freeze_first: FRZ of 003 Table 6: freeze the first projected layer after the first task and
      leave it out of every GPSE round (see the module docstring).
    dp_epsilon: ε of the Gaussian mechanism on the GPSE sketches (003 Appendix H, Table 6: 5);
      0 = not calibrated (``dp_noise`` is used as given). With ε > 0 the noise std is
      :func:`gpse.gaussian_sigma` of (ε, ``dp_delta``, the clip ``dp_clip``, ``num_clients``).
    dp_delta: δ of the Gaussian mechanism (Table 6: 1e-5).
    dp_calibration: :data:`gpse.DP_CALIBRATIONS`: "paper" (Appendix H's σ) or "classical"
      (Dwork and Roth's, √2 larger).
    num_clients: all clients of the run, C of the calibration (every client joins GPSE).

  Returns:
    The :class:`ContinualMethod` (round algorithm + GPSE end-of-task hook).
  """
  if not 0.0 < eps <= 1.0:
    raise ValueError(f"FOT threshold eps must be in (0, 1], got {eps}")
  if threshold_rule not in gpse.THRESHOLD_RULES:
    raise ValueError(
      f"unknown threshold_rule {threshold_rule!r}; choose one of {gpse.THRESHOLD_RULES} ('energy': "
      "the paper's text, GPM's criterion; 'authors': the authors' code)"
    )
  if sketch_dist not in gpse.SKETCH_DISTS:
    raise ValueError(f"unknown sketch_dist {sketch_dist!r}; choose one of {gpse.SKETCH_DISTS}")
  if dp_epsilon > 0:
    # Checked before any compute: a calibrated run names (ε, δ) and the clip, never σ itself.
    if dp_clip <= 0 or dp_noise > 0:
      raise ValueError(
        "dp_epsilon calibrates the noise to the clip: pass dp_clip > 0 (003 Appendix H uses 1) "
        "and leave dp_noise at 0, e.g. dp_epsilon=5,dp_delta=1e-5,dp_clip=1"
      )
    if num_clients is None:
      raise ValueError("dp_epsilon needs num_clients (the C of 003 Appendix H's calibration)")
    dp_noise = gpse.gaussian_sigma(dp_epsilon, dp_delta, dp_clip, num_clients, dp_calibration)
  elif dp_calibration not in gpse.DP_CALIBRATIONS:
    raise ValueError(
      f"unknown dp_calibration {dp_calibration!r}; choose one of {gpse.DP_CALIBRATIONS}"
    )
  if (dp_noise > 0) != (dp_clip > 0):
    raise ValueError("FOT's Gaussian mechanism needs both dp_clip > 0 and dp_noise > 0")
  specs = gpse.find_layers(model, variables, sample_x, task=0)
  if freeze_first and len(specs) < 2:
    raise ValueError(
      f"freeze_first freezes the first of the model's Dense/Conv layers and sketches the others, "
      f"but {model.name!r} has {len(specs)}; use a deeper model or freeze_first=False"
    )
  # FRZ: the frozen layer's parameters (its whole module: kernel and bias) and the layers GPSE
  # sketches. Without FRZ every projected layer is sketched, as before.
  frozen = specs[0].path if freeze_first else None
  sketched = specs[1:] if freeze_first else specs
  conv_mult = sketch_multiplier if conv_sketch_multiplier is None else conv_sketch_multiplier
  widths = {
    s.key: gpse.sketch_width(s, conv_mult if s.kind == "conv" else sketch_multiplier)
    for s in sketched
  }

  def freeze_grads(grads, params, batch, ctx):
    # From the second task on the frozen layer takes no gradient step on any client.
    after_first = ctx.shared["task"] > 0
    sub = jax.tree.map(
      lambda g: jnp.where(after_first, jnp.zeros_like(g), g), _module(grads, frozen)
    )
    return _with_module(grads, frozen, sub), ctx.extra

  program = client_lib.local_training_client(
    model, optimizer, task_loss(model), transform_grads=freeze_grads if freeze_first else None
  )

  def init(variables, key):
    del key
    return FOTState(
      jnp.zeros((), jnp.int32),
      tree_lib.tree_copy(variables),
      gpse.empty_bases(specs),
      {s.key: jnp.zeros((), jnp.int32) for s in specs},
    )

  def broadcast(state, rd, key):
    del key
    return {"variables": state.variables, "task": jnp.asarray(rd.extra["task"], jnp.int32)}, {}

  def fed_project(state, averaged, rd):
    params = state.variables["params"]
    delta = tree_lib.tree_sub(params, averaged["params"])
    delta = gpse.fed_project(delta, specs, state.bases)
    new_params = tree_lib.tree_sub(params, tree_lib.tree_scale(mu, delta))
    if frozen is not None:
      # A select, not arithmetic: the frozen layer keeps exactly the server's bits.
      after_first = jnp.asarray(rd.extra["task"], jnp.int32) > 0
      kept = jax.tree.map(
        lambda old, new: jnp.where(after_first, old, new),
        _module(params, frozen),
        _module(new_params, frozen),
      )
      new_params = _with_module(new_params, frozen, kept)
    variables = {**averaged, "params": new_params}
    return state._replace(round=state.round + 1, variables=variables)

  algorithm = FederatedAlgorithm(
    "fot", init, broadcast, program, mean_aggregate(fed_project, takes_round_data=True)
  )

  # ---- GPSE -------------------------------------------------------------------------------
  def g_init(shared, client_input, key):
    return gpse.init_sketch(sketched, widths), key

  def g_step(shared, state, batch, key):
    sk, final_key = state
    sk = gpse.sketch_step(
      model,
      sketched,
      widths,
      shared["variables"],
      shared["bases"],
      shared["ranks"],
      sk,
      batch.x,
      batch.mask,
      key,
      sketch_dist,
      task=shared["task"],
    )
    return sk, final_key

  def g_final(state):
    sk, key = state
    return gpse.finish_sketch(sk, key, dp_clip, dp_noise)

  def sum_sketches(out):
    # Server-side sum (the secure-aggregation sum), inside the chunk's program when it is one.
    return tree_lib.sum_clients(out["a"]), (out["ratio"], out["r_sq"], out["x_sq"]), out["n"]

  # The GPSE client pass: only one chunk's [d, s] sketches are alive besides the running sum.
  sketch_pass = executor.client_chunks(ClientProgram(g_init, g_step, g_final), sum_sketches)

  def client_sketches(state: FOTState, rd: RoundData, key, task: int):
    """Σ_k A_k per layer (on the device) and the clients' scalars [C] on the host: ratios,
    ‖R_k‖², ‖X_k‖² per layer, and example counts."""
    shared = {
      "variables": state.variables,
      "bases": state.bases,
      "ranks": state.ranks,
      "task": jnp.int32(task),
    }
    keys = jax.random.split(key, rd.idx.shape[0])
    a_sum, stats, ns = None, [], []
    for a, s, n in sketch_pass(shared, {}, rd.images, rd.labels, rd.idx, rd.mask, keys):
      a_sum = a if a_sum is None else jax.tree.map(jnp.add, a_sum, a)
      stats.append(s)
      ns.append(n)
    ratio, r_sq, x_sq = (
      {k: np.concatenate([np.asarray(s[i][k]) for s in stats]) for k in stats[0][i]}
      for i in range(3)
    )
    return a_sum, ratio, r_sq, x_sq, np.concatenate([np.asarray(n) for n in ns])

  def end_task(state: FOTState, rd: RoundData, key, task: int):
    """GPSE: extends every layer's basis with the new task's principal input subspace."""
    t0 = time.perf_counter()
    a_sum, ratio, r_sq, x_sq, n = client_sketches(state, rd, key, task)
    jax.block_until_ready(a_sum)
    t1 = time.perf_counter()
    eps_t = min(eps + eps_inc * task, 1.0)
    bases, ranks, metrics = dict(state.bases), dict(state.ranks), {"eps": eps_t}
    if dp_noise > 0:
      metrics["dp_noise"] = dp_noise
    added = {}
    with gpse.blas_threads(server_blas_threads):
      for s in sketched:
        target, rho, q = gpse.rule_target(
          threshold_rule, eps_t, ratio[s.key], n, r_sq[s.key], x_sq[s.key]
        )
        bases[s.key], ranks[s.key], added[s.key], solver = gpse.extend_layer(
          a_sum[s.key],
          state.bases[s.key],
          state.ranks[s.key],
          target,
          rule=threshold_rule,
          max_exact=max_exact_svd,
        )
        metrics[f"rho/{s.key}"] = rho
        metrics[f"residual_energy/{s.key}"] = q
        # The share of the residual sketch's energy the rule asked for, under either rule: the
        # authors' ε', or (ε − (1 − q))/q for the energy rule.
        metrics[f"eps_prime/{s.key}"] = target
        metrics[f"solver/{s.key}"] = solver
      jax.block_until_ready((bases, ranks))
    for s in sketched:
      metrics[f"rank/{s.key}"] = int(ranks[s.key])
      metrics[f"added/{s.key}"] = int(added[s.key])
    metrics["client_seconds"] = t1 - t0
    metrics["server_seconds"] = time.perf_counter() - t1
    return state._replace(bases=bases, ranks=ranks), metrics

  method = ContinualMethod(algorithm, end_task)
  return method


def _module(params: dict, path: tuple[str, ...]) -> dict:
  """The parameters of the module at ``path`` (all its leaves: kernel, bias, ...)."""
  for p in path:
    params = params[p]
  return params


def _with_module(params: dict, path: tuple[str, ...], sub: dict) -> dict:
  """``params`` with the module at ``path`` replaced by ``sub`` (shallow copies along the path)."""
  if not path:
    return sub
  return {**params, path[0]: _with_module(params[path[0]], path[1:], sub)}


SPEC = factory_spec(
  "fot",
  "continual",
  fot,
  ctx_args=("model", "client_optimizer", "executor"),
  ctx_kwargs=("variables", "sample_x", "num_clients"),
  ranges={
    "eps": ranges.FRACTION,
    "dp_delta": ranges.Interval(0.0, 1.0, low_open=True, high_open=True),
  },
  choices={
    "threshold_rule": gpse.THRESHOLD_RULES,
    "sketch_dist": gpse.SKETCH_DISTS,
    "dp_calibration": gpse.DP_CALIBRATIONS,
  },
  requires=("executor", "variables", "sample_x"),
)
