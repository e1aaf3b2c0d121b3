"""FedProj: gradient projection against a public-data memory loss, plus server distillation.

Papers: "Avoid Forgetting by Preserving Global Knowledge Gradients in Federated Learning with
Non-IID Data" (000) and its revision "Towards Preventing Global Knowledge Forgetting in Federated
Learning with Non-IID Data" (001, Algorithm 1).

Client step on a private batch (x, y), for ONE client (the engine vmaps it):
1. g_new = ∇ CE(f(x; θ), y);
2. g_mem = ∇ L_mem(θ) on one mini-batch of the round's memory buffer (cycled), with
   L_mem(θ) = KL(σ(Z_ens(x_m)) ‖ σ(f(x_m; θ))), batchmean (000 Eq. 3, 001 Eq. 4 and Algorithm 1,
   line 14: no temperature). Ablations: ``temperature`` T divides both logits, and
   ``temperature_squared`` multiplies by T² (the authors' code uses T = 3 without T²). The memory
   forward runs in inference mode (public data never touches BatchNorm statistics). A memory
   mini-batch per step follows 001, C.6 and Table 5 ("one additional forward-backward pass on a
   public buffer mini-batch"); ``memory_batch_size >= M`` gives Algorithm 1's literal
   full-buffer mean;
3. one inner product over the whole flattened gradient: if ‖g_mem‖² ≤ τ or ⟨g_new, g_mem⟩ ≥ 0 then
   g = g_new, else g = g_new − (⟨g_new, g_mem⟩/‖g_mem‖²)·g_mem; only g goes to the optimiser.
   Ablations: projection probability p per step; optional clamp of the coefficient's magnitude.
Round 0 has no ensemble: projection is skipped (default) or, when the public labels share the
private label space, g_mem is the CE gradient on labelled public data (001, Alg. 1, line 16).
Steps 2-3 act only in rounds where the projection can act (an ensemble exists, or round 0 with
``round0="ce"``, and inside ``proj_rounds``); in the others the step is FedAvg's, as in the
authors' code, and the client diagnostics (``mean_cos``, ``lmem_before``, ``lmem_after``) are NaN,
logged as null. Their work is skipped there too: the host-looped strategies (``sequential``,
``vmap_stepwise``) pick a step program without the memory pass per round on the host; the
one-program round does so with ``memory_cond=True`` (a ``lax.cond``), which is off on XLA:CPU,
where a conditional's convolutions run about 12x slower, so there it computes them and selects
(docs/fedproj.md, "What runs where").

Settings of the authors' code (``--preset=paper_code``; docs/fedproj.md, "Parity with the authors'
code"): ``proj_rounds=(start, stop)`` projects only in rounds start <= t < stop (the code: 10 and
90 of 100); ``memory_order="shuffle"`` draws the memory mini-batches from a fresh permutation of
the buffer per pass and per client (the code's DataLoader(shuffle=True)) instead of cycling it in
a fixed order. ``int_cast_memory`` reproduces a defect of the code, off even in ``paper_code``:
the memory's normalised images and teacher logits truncated to integers before the memory loss.
Server: :mod:`.distill_server` (FedAvg, ensemble distillation with the
weight-divergence term α anchored on the previous global model by default, memory).
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import optax

from fedjax_proj.algorithms import client as client_lib
from fedjax_proj.algorithms import losses
from fedjax_proj.algorithms.base import FederatedAlgorithm
from fedjax_proj.algorithms.distillation import distill
from fedjax_proj.algorithms.distillation.distill_server import MemoryBuffer, distillation_server
from fedjax_proj.algorithms.registry import MethodSpec, factory_hparams
from fedjax_proj.core import tree as tree_lib
from fedjax_proj.core.types import Array, Model, PyTree

ROUND0_MODES = ("skip", "ce")
# The broadcast's round-level flags that make up the projection window; the client declares them
# static (ClientProgram.static_shared), so host-looped strategies pick the step program per round.
WINDOW_FLAGS = ("use_memory", "round0_ce")
MEMORY_ORDERS = ("cycle", "shuffle")


def project_gradient(
  g_new: PyTree, g_mem: PyTree, tau: float = 1e-6, max_coef: float | None = None
) -> tuple[PyTree, Array, Array]:
  """Projects g_new off the memory gradient when they conflict (one dot over all leaves).

  Args:
    g_new: the private-loss gradient.
    g_mem: the memory-loss gradient.
    tau: threshold on ‖g_mem‖² below which nothing is projected.
    max_coef: optional clamp of |⟨g_new, g_mem⟩| / ‖g_mem‖² (None = the paper's rule).

  Returns:
    (g, fired, cos): the gradient to apply, whether the projection fired, cos(g_new, g_mem).
  """
  dot = tree_lib.tree_dot(g_new, g_mem)
  sq = tree_lib.tree_sq_norm(g_mem)
  fired = (sq > tau) & (dot < 0)
  coef = dot / jnp.where(sq > 0, sq, 1.0)
  if max_coef is not None:
    coef = jnp.maximum(coef, -max_coef)
  coef = jnp.where(fired, coef, 0.0)
  g = jax.tree.map(lambda a, b: a - (coef * b).astype(a.dtype), g_new, g_mem)
  cos = dot / jnp.maximum(jnp.sqrt(tree_lib.tree_sq_norm(g_new) * sq), 1e-12)
  return g, fired, cos


def memory_kl(
  ens_logits: Array, logits: Array, temperature: float = 1.0, temperature_squared: bool = False
) -> Array:
  """L_mem = [T²·]KL(σ(Z_ens/T) ‖ σ(z/T)), batchmean, with ``z`` the client model's
  inference-mode logits on the memory batch (the client step computes them).

  The defaults (T = 1, no T²) are the papers' plain KL (000 Eq. 3, 001 Eq. 4).
  """
  # kl_from_logits carries the distillation convention's T² factor; undo it unless asked for.
  scale = 1.0 if temperature_squared else 1.0 / temperature**2
  return scale * losses.kl_from_logits(ens_logits, logits, temperature)


def memory_batch_rows(cursor: Array, key_data: Array, m: int, batch: int, order: str) -> Array:
  """Buffer rows of a client's ``cursor``-th memory mini-batch of ``batch`` rows out of ``m``.

  ``order="cycle"``: rows ``cursor·batch + j (mod m)``, the same for every client and round.
  ``order="shuffle"``: a fresh permutation of the buffer per pass, drawn from the client's key
  (the code's DataLoader(shuffle=True), re-iterated when exhausted); a batch that straddles two
  passes takes the end of one permutation and the start of the next, where the code's last batch
  of a pass is short instead (the same when ``batch`` divides ``m``).
  """
  pos = cursor * batch + jnp.arange(batch)
  if order == "cycle":
    return pos % m
  key = jax.random.wrap_key_data(key_data)
  passes = pos // m
  first = jax.random.permutation(jax.random.fold_in(key, passes[0]), m)
  second = jax.random.permutation(jax.random.fold_in(key, passes[0] + 1), m)
  return jnp.where(passes == passes[0], first[pos % m], second[pos % m])


class ProjExtra(NamedTuple):
  cursor: Array
  mem_key: Array
  projected: Array
  cos_sum: Array
  lmem_first: Array
  lmem_last: Array


def projection_client(
  model: Model,
  optimizer: optax.GradientTransformation,
  normalize,
  *,
  temperature: float,
  tau: float,
  memory_batch_size: int,
  temperature_squared: bool = False,
  projection_prob: float = 1.0,
  max_coef: float | None = None,
  memory_order: str = "cycle",
  int_cast_memory: bool = False,
  memory_cond: bool = False,
):
  """The FedProj client (see module docstring) as a :class:`ClientProgram`.

  ``shared`` carries ``memory_images`` [M, ...] (raw), ``memory_logits`` [M, K],
  ``memory_labels`` [M], ``use_memory`` (bool: an ensemble exists) and ``round0_ce`` (bool).
  ``memory_cond``: in a traced window flag (the one-program strategy), compute the memory
  gradient under ``lax.cond`` (only in rounds where the projection can act) rather than on every
  step with a select. The host-looped strategies get the window as a Python bool
  (:data:`WINDOW_FLAGS` are ``static_shared``) and run a step without the memory pass outside it,
  whatever ``memory_cond`` says.
  """

  def init_extra(shared, client_input, key):
    z = jnp.zeros((), jnp.float32)
    mem_key = jax.random.key_data(jax.random.fold_in(key, 11))
    return ProjExtra(jnp.zeros((), jnp.int32), mem_key, z, z, z, z)

  def transform_grads(g_new, params, batch, ctx):
    sh, ex = ctx.shared, ctx.extra
    m = sh["memory_images"].shape[0]
    rows = memory_batch_rows(ex.cursor, ex.mem_key, m, memory_batch_size, memory_order)
    x_mem = normalize(sh["memory_images"][rows])
    mem_logits = sh["memory_logits"][rows]
    if int_cast_memory:
      # The code's `.type(torch.LongTensor).float()` on images and logits: truncation toward 0.
      x_mem, mem_logits = jnp.trunc(x_mem), jnp.trunc(mem_logits)

    def mem_loss(p):
      out = client_lib.forward(model, p, ctx.model_state, x_mem, train=False)
      kl = memory_kl(mem_logits, out.logits, temperature, temperature_squared)
      ce = losses.cross_entropy(out.logits, sh["memory_labels"][rows])
      return jnp.where(sh["use_memory"], kl, ce)

    def with_memory(g_new):
      lmem, g_mem = jax.value_and_grad(mem_loss)(params)
      g, fired, cos = project_gradient(g_new, g_mem, tau, max_coef)
      return g, fired, cos, lmem

    def without_memory(g_new):
      # Outside the window the step is FedAvg's (the authors' code runs its plain client there);
      # the diagnostics of a memory gradient that is not used are NaN, logged as null.
      nan = jnp.full((), jnp.nan, jnp.float32)
      return g_new, jnp.zeros((), bool), nan, nan

    # The window is a round-level value of the broadcast (WINDOW_FLAGS). The host-looped
    # strategies hand it over as a Python bool (ClientProgram.static_shared) and jit one step per
    # value, so outside the window the step has no memory pass at all. The one-program round
    # traces it; the engine never batches the broadcast over clients, so under vmap a cond stays a
    # conditional (only one branch runs) rather than a select that computes both
    # (tests/algorithms/distillation/test_fedproj.py checks both programs).
    window = sh["use_memory"] | sh["round0_ce"]
    if isinstance(window, bool):
      branch = _python_branch
    else:
      branch = jax.lax.cond if memory_cond else _select
    g, fired, cos, lmem = branch(window, with_memory, without_memory, g_new)
    active = window
    if projection_prob < 1.0:
      active &= jax.random.bernoulli(jax.random.fold_in(ctx.key, 7), projection_prob)
    g = tree_lib.tree_where(active, g, g_new)
    extra = ProjExtra(
      ex.cursor + 1,
      ex.mem_key,
      ex.projected + (fired & active),
      ex.cos_sum + cos,
      jnp.where(ex.cursor == 0, lmem, ex.lmem_first),
      lmem,
    )
    return g, extra

  def finalize(state):
    ex = state.extra
    steps = jnp.maximum(state.num_steps, 1).astype(jnp.float32)
    return {
      "proj_metrics": {
        "projected_fraction": ex.projected / steps,
        "mean_cos": ex.cos_sum / steps,
        "lmem_before": ex.lmem_first,
        "lmem_after": ex.lmem_last,
      }
    }

  return client_lib.local_training_client(
    model,
    optimizer,
    client_lib.cross_entropy_loss(model),
    init_extra=init_extra,
    transform_grads=transform_grads,
    finalize=finalize,
  )._replace(static_shared=WINDOW_FLAGS)


def _python_branch(pred: bool, true_fn, false_fn, operand):
  """``lax.cond`` on a predicate the host already knows: only the taken branch is traced."""
  return true_fn(operand) if pred else false_fn(operand)


def _select(pred: Array, true_fn, false_fn, operand):
  """``lax.cond``'s result computed as both branches and a select: what a conditional costs
  where its branches would run slower than inline code (convolutions on XLA:CPU)."""
  return jax.tree.map(lambda a, b: jnp.where(pred, a, b), true_fn(operand), false_fn(operand))


def check_memory(size: int, public_size: int, source: str = "the public set") -> None:
  """The one check of FedProj's memory size M (001, Algorithm 1: M examples drawn from the P
  public ones ``source`` holds) against its public set: 1 <= M <= P, or a ValueError naming the
  fix. The run checks a given ``--public_size`` with it before any data is loaded
  (training/config.py), and the factory the set it is built with; M's default and range are its
  config field's (training/fields.py)."""
  if not 1 <= size <= public_size:
    raise ValueError(
      f"--memory_size={size} must be from 1 to the size of {source} ({public_size} examples); "
      "lower --memory_size or use more public data (--public_size=0 uses all of it)."
    )


def fedproj(
  model: Model,
  client_optimizer: optax.GradientTransformation,
  normalize,
  *,
  public_size: int,
  memory_size: int,
  memory_batch_size: int = 256,
  temperature: float = 1.0,
  tau: float = 1e-6,
  projection_prob: float = 1.0,
  max_coef: float | None = None,
  round0: str = "skip",
  distill_epochs: int = 1,
  distill_lr: float = 1e-4,
  distill_batch_size: int = 256,
  distill_temperature: float = 3.0,
  alpha: float = 0.0,
  temperature_squared: bool = False,
  divergence_anchor: str = "previous",
  proj_rounds: tuple[int, int | None] = (0, None),
  memory_order: str = "cycle",
  int_cast_memory: bool = False,
  lmem_global: bool = False,
  memory_cond: bool | None = None,
) -> FederatedAlgorithm:
  """Builds FedProj. ``distill_epochs=0`` turns server distillation off.

  The memory size M has no default here: a run passes its config field, whose default and range
  are declared once (training/fields.py); :func:`check_memory` holds it to the public set.

  The memory loss defaults to the papers' plain KL (``temperature=1``, no T²); the divergence
  term α anchors on the previous global model (Algorithm 1; ``divergence_anchor`` picks another
  of :data:`distill.ANCHORS`). ``max_coef=10`` clamps the projection coefficient as the authors'
  code does. See docs/fedproj.md for every default and its source.
  ``round0="ce"`` needs ``RoundData.extra["public_labels"]`` in the private label space.
  ``proj_rounds=(start, stop)`` projects only in rounds ``start <= t < stop`` (0-based; stop
  None = to the end), ``memory_order`` is ``"cycle"`` or ``"shuffle"`` and ``int_cast_memory``
  the code's integer cast (module docstring). ``lmem_global=True`` logs the server's L_mem drift
  metric (001, C.4), one extra forward pass of the new global model on the memory per round; the
  claim runner turns it on for its reports (docs/fedproj.md, "What runs where").
  ``memory_cond`` skips the memory gradient's work in rounds where the projection cannot act
  in the one-program round (``vmap_scan``; None: on unless the backend is XLA:CPU, whose
  conditionals run convolutions about 12x slower than inline code; module docstring). The
  host-looped strategies skip it whatever ``memory_cond`` says: they run one jitted step per
  window value, chosen on the host each round. Either way the parameters are the same up to
  float round-off.
  """
  if divergence_anchor not in distill.ANCHORS:
    raise ValueError(
      f"divergence_anchor must be one of {distill.ANCHORS}, got {divergence_anchor!r}."
    )
  if temperature <= 0:
    raise ValueError(f"temperature must be > 0, got {temperature}.")
  if round0 not in ROUND0_MODES:
    raise ValueError(f"round0 must be one of {ROUND0_MODES}, got {round0!r}.")
  check_memory(memory_size, public_size)
  memory = MemoryBuffer(memory_size)
  if memory_batch_size < 1:
    raise ValueError(f"memory_batch_size must be >= 1, got {memory_batch_size}.")
  if not 0.0 <= projection_prob <= 1.0:
    raise ValueError(f"projection_prob must be in [0, 1], got {projection_prob}.")
  if memory_order not in MEMORY_ORDERS:
    raise ValueError(f"memory_order must be one of {MEMORY_ORDERS}, got {memory_order!r}.")
  proj_start, proj_stop = _check_proj_rounds(proj_rounds)
  cfg = distill.DistillConfig(
    distill_epochs,
    distill_batch_size,
    distill_lr,
    distill_temperature,
    alpha,
    anchor=divergence_anchor,
  )
  init, aggregate = distillation_server(
    model,
    normalize,
    cfg,
    public_size=public_size,
    memory=memory,
    lmem_metric=lmem_global,
  )
  program = projection_client(
    model,
    client_optimizer,
    normalize,
    temperature=temperature,
    tau=tau,
    memory_batch_size=min(memory_batch_size, memory.size),
    temperature_squared=temperature_squared,
    projection_prob=projection_prob,
    max_coef=max_coef,
    memory_order=memory_order,
    int_cast_memory=int_cast_memory,
    memory_cond=jax.default_backend() != "cpu" if memory_cond is None else memory_cond,
  )

  def broadcast(state, rd, key):
    del key
    public = rd.extra["public_images"]
    idx = state.memory_idx
    labels = rd.extra.get("public_labels")
    round0_ce = round0 == "ce" and labels is not None
    in_window = state.round >= proj_start
    if proj_stop is not None:
      in_window &= state.round < proj_stop
    if round0 == "ce" and labels is None:
      raise ValueError(
        "round0='ce' needs RoundData.extra['public_labels']: labelled public data in the private "
        "label space (experiments pass them only when the public set is the private dataset); "
        "use round0='skip' otherwise."
      )
    shared = {
      "variables": state.variables,
      "memory_images": public[idx],
      "memory_logits": state.memory_logits,
      "memory_labels": labels[idx] if round0_ce else jnp.zeros(idx.shape, jnp.int32),
      "use_memory": state.has_memory & in_window,
      "round0_ce": jnp.asarray(round0_ce) & ~state.has_memory & in_window,
    }
    return shared, {}

  def aggregate_with_diagnostics(agg):
    def wrapped(state, rd, outputs, key):
      new_state, metrics = agg(state, rd, outputs, key)
      for k, v in outputs["proj_metrics"].items():
        metrics[k] = jnp.mean(v)
      return new_state, metrics

    return wrapped

  return FederatedAlgorithm(
    name="fedproj",
    init=init,
    broadcast=broadcast,
    client=program,
    aggregate=aggregate.map(aggregate_with_diagnostics),
  )


def _check_proj_rounds(proj_rounds) -> tuple[int, int | None]:
  """(start, stop) of ``proj_rounds``, refused unless 0 <= start < stop (stop None: no end)."""
  try:
    if isinstance(proj_rounds, str):  # --method_kwargs gives text, e.g. "10:90" or "10:"
      head, _, tail = proj_rounds.partition(":")
      proj_rounds = (int(head or 0), int(tail) if tail.strip() else None)
    start, stop = proj_rounds
  except (TypeError, ValueError):
    raise ValueError(
      f"proj_rounds must be (start, stop) or 'start:stop', got {proj_rounds!r}."
    ) from None
  if start < 0 or (stop is not None and stop <= start):
    raise ValueError(
      f"proj_rounds=({start}, {stop}) must satisfy 0 <= start < stop (stop None: no end)."
    )
  return int(start), None if stop is None else int(stop)


def build(ctx, **hp) -> FederatedAlgorithm:
  """Registry entry."""
  normalize = ctx.public_normalize or ctx.normalize
  return fedproj(ctx.model, ctx.client_optimizer, normalize, public_size=ctx.public_size, **hp)


SPEC = MethodSpec(
  "fedproj",
  "fl",
  build,
  needs_public=True,
  config_kwargs=("memory_size", "lmem_global"),
  hparams=factory_hparams(fedproj),
)
