"""RGO+FL: recursive gradient optimization on every client inside FedAvg.

Compared with FOT in Bakman et al., "Federated Orthogonal Training" (ICLR 2024), Table 1 (paper
003; docs/methods.md "Continual baselines"): each centralised continual-learning method runs on
every client inside FedAvg (:mod:`fedjax_proj.algorithms.continual.base`).

* RGO+FL (Liu and Liu, "Continual Learning with Recursive Gradient Optimization", ICLR 2022),
  adapted as 003 F.2 describes: "each client calculates the Hessian matrix on its local data and
  maintains its own local projection matrix. The server performs regular FedAvg". RGO modifies
  the gradient with a projection matrix updated recursively after each task, layer by layer, and
  normalises its trace so the step size stays that of plain SGD.

Per projected layer (every Dense/Conv kernel, rows in the layer's input space exactly as GPM and
FOT: :mod:`.gpse`) client k keeps P_k [d, d], the identity before any task (per-client state
[num_clients, d, d]). Every local step replaces the kernel's gradient G [d, out] by P_k G (biases,
norms and heads plain). After task t, a random ``store_fraction`` of all clients (003 F.4: "40%
... that store projection matrix per task", drawn anew each task from the end-of-task key; the
others keep theirs) fold the layer inputs X [M, d] of all their task data at the task's final
global model, the input factor XᵀX of the layer's Hessian, into P by the recursive least-squares
(Sherman-Morrison) recursion P ← P − P x xᵀ P / (α + xᵀ P x) over the rows x of X, done for all
rows at once:

  P' = (P⁻¹ + XᵀX / α)⁻¹ = (I + P XᵀX / α)⁻¹ P,

then P ← d · P' / tr(P') (``trace_norm``; tr(I) = d). Without the normalisation P after tasks
1..t is (I + Σ_τ X_τᵀX_τ / α)⁻¹ in closed form: directions the old inputs fill are damped by
their energy, free directions keep a unit step. docs/fot.md, "RGO+FL", gives the readings taken.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax

from fedjax_proj.algorithms import client as client_lib
from fedjax_proj.algorithms.continual import gpse
from fedjax_proj.algorithms.continual.base import ContinualMethod, task_algorithm, task_loss
from fedjax_proj.algorithms.registry import factory_spec
from fedjax_proj.core import ranges
from fedjax_proj.core import tree as tree_lib
from fedjax_proj.core.executor import Executor
from fedjax_proj.core.types import Array, Model


def update_projector(p: np.ndarray, gram: np.ndarray, alpha: float, trace_norm: bool) -> np.ndarray:
  """One task's RGO update of one layer's projector (see the module docstring).

  Args:
    p: the current projector [d, d] (symmetric positive definite).
    gram: XᵀX [d, d] of the task's layer inputs X [M, d] (masked rows zero).
    alpha: α > 0, the recursion's regulariser: a row x with xᵀ P x ≫ α is all but removed.
    trace_norm: rescale the result to trace d.

  Returns:
    (I + P XᵀX / α)⁻¹ P in float64, symmetrised (it is symmetric in exact arithmetic), and
    rescaled to trace d with ``trace_norm``.
  """
  p = np.asarray(p, np.float64)
  d = p.shape[0]
  new = np.linalg.solve(np.eye(d) + p @ np.asarray(gram, np.float64) / alpha, p)
  new = 0.5 * (new + new.T)
  if trace_norm:
    new = new * (d / np.trace(new))
  return new


def precondition(grads: dict, specs: list[gpse.LayerSpec], projectors: dict) -> dict:
  """Every projected kernel's gradient G [d, out] (conv kernels as (k·k·C_in) x C_out) ← P G."""
  out = grads
  for spec in specs:
    kernel = gpse.get_kernel(out, spec)
    mat = projectors[spec.key] @ gpse.kernel_matrix(kernel).astype(jnp.float32)
    out = gpse.set_kernel(out, spec, gpse.matrix_kernel(mat, kernel.shape).astype(kernel.dtype))
  return out


def rgo(
  model: Model,
  optimizer: optax.GradientTransformation,
  executor: Executor,
  *,
  variables: dict,
  sample_x: Array,
  num_clients: int,
  store_fraction: float = 0.4,
  alpha: float = 1.0,
  trace_norm: bool = True,
) -> ContinualMethod:
  """RGO+FL (see the module docstring).

  Args:
    model: a multi-head model.
    optimizer: client optimiser (it receives the modified gradient P G).
    executor: the run's executor (its batch builder lays out each client's task data).
    variables: initial variables (their shapes locate the projected layers).
    sample_x: a normalised input batch (shape only).
    num_clients: clients holding data (the per-client projectors' leading axis).
    store_fraction: share of all clients, drawn anew each task, that fold the task into their
      projectors (003 F.4: 40%); round(store_fraction · num_clients) clients.
    alpha: the recursion's regulariser α > 0.
    trace_norm: keep every projector at trace d (RGO's trace normalisation).

  Returns:
    The :class:`ContinualMethod`.
  """
  if not 0.0 <= store_fraction <= 1.0:
    raise ValueError(f"RGO store_fraction must be in [0, 1] (003 F.4: 0.4), got {store_fraction}")
  if not alpha > 0:
    raise ValueError(f"RGO alpha must be > 0 (the recursion divides by it), got {alpha}")
  specs = gpse.find_layers(model, variables, sample_x, task=0)
  storing = int(round(store_fraction * num_clients))

  def transform_grads(grads, params, batch, ctx):
    return precondition(grads, specs, ctx.extra), ctx.extra

  program = client_lib.local_training_client(
    model,
    optimizer,
    task_loss(model),
    init_extra=lambda sh, ci, k: ci,
    transform_grads=transform_grads,
  )

  def init_method(v):
    eye = {s.key: jnp.eye(s.in_dim, dtype=jnp.float32) for s in specs}
    return {k: jnp.broadcast_to(e, (num_clients, *e.shape)) + 0.0 for k, e in eye.items()}

  def broadcast_extra(state, rd, key):
    return {}, tree_lib.index_clients(state.method, rd.client_ids)

  @jax.jit
  def client_gram(variables, images, labels, idx, mask, task):
    b = executor.batch_fn(images, labels, idx, mask, jax.random.key(0))
    _, cap = gpse.capture_inputs(model, variables, b.x, mask=b.mask, task=task)
    grams = {}
    for s in specs:
      x = gpse.input_rows(s, cap[s.path][1].astype(jnp.float32), b.mask)
      grams[s.key] = jnp.matmul(x.T, x, precision=jax.lax.Precision.HIGHEST)
    return grams

  def end_task(state, rd, key, task):
    # Hundreds of small host-side solves: single-threaded BLAS (see gpse.blas_threads).
    with gpse.blas_threads(1):
      return _end_task(state, rd, key, task)

  def _end_task(state, rd, key, task):
    ids = np.asarray(rd.client_ids)
    seed = np.asarray(jax.random.key_data(key)).ravel()
    chosen = set(np.random.default_rng(seed).choice(num_clients, storing, replace=False).tolist())
    idx = np.asarray(rd.idx).reshape(rd.idx.shape[0], -1)
    mask = np.asarray(rd.mask).reshape(rd.idx.shape[0], -1)
    projectors = {k: np.array(v) for k, v in state.method.items()}
    updated = 0
    for c in range(idx.shape[0]):
      if int(ids[c]) not in chosen:
        continue
      grams = client_gram(state.variables, rd.images, rd.labels, idx[c], mask[c], jnp.int32(task))
      for s in specs:
        p = projectors[s.key][ids[c]]
        projectors[s.key][ids[c]] = update_projector(p, np.asarray(grams[s.key]), alpha, trace_norm)
      updated += 1
    method = {k: jnp.asarray(v) for k, v in projectors.items()}
    return state._replace(method=method), {"clients_updated": updated}

  algorithm = task_algorithm("rgo", init_method, broadcast_extra, program)
  return ContinualMethod(algorithm, end_task)


SPEC = factory_spec(
  "rgo",
  "continual",
  rgo,
  ctx_args=("model", "client_optimizer", "executor"),
  ctx_kwargs=("variables", "sample_x", "num_clients"),
  ranges={"store_fraction": ranges.FRACTION, "alpha": ranges.POSITIVE},
  requires=("executor", "variables", "sample_x"),
)
