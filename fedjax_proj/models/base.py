"""Adapting Flax linen modules to the project's :class:`~fedjax_proj.core.types.Model` contract.

Algorithms never hold a Module: :func:`from_flax` turns a linen module whose
``__call__(x, train, mask=None, **kwargs)`` returns ``(logits, features)`` into a pair of pure
functions, handling the mutable ``batch_stats`` collection, dropout RNGs and padding masks.

Also here: the normalisation and output-head building blocks the backbones share:

- :func:`batch_norm`: ``nn.BatchNorm`` with an example mask [B] and PyTorch's defaults (momentum 0.1
  in PyTorch's convention, eps 1e-5), since the reference implementations are PyTorch code.
  Ioffe & Szegedy, "Batch Normalization" (ICML 2015).
- :class:`BatchStatNorm`: batch normalisation that always uses the current batch's statistics and
  keeps no running averages (PyTorch's ``track_running_stats=False``, as used by GPM).
- :func:`output_heads`: the classifier plus the optional MOON projection head (Li, He and Song,
  "Model-Contrastive Federated Learning", CVPR 2021).
"""

from __future__ import annotations

import math
from typing import Any

import flax.errors
import flax.linen as nn
import jax
import jax.numpy as jnp

from fedjax_proj.core.types import Model, ModelOutput, Variables

NORMS = ("batch", "group", "none")


def _broadcast_mask(mask: jax.Array | None, x: jax.Array) -> jax.Array | None:
  """[B] example mask -> boolean mask of x's shape (flax's norms want it broadcastable to x)."""
  if mask is None:
    return None
  mask = jnp.asarray(mask).astype(bool)
  return jnp.broadcast_to(mask.reshape(mask.shape + (1,) * (x.ndim - mask.ndim)), x.shape)


def batch_norm(
  x: jax.Array,
  *,
  train: bool,
  mask: jax.Array | None = None,
  name: str | None = None,
  momentum: float = 0.9,
  epsilon: float = 1e-5,
) -> jax.Array:
  """BatchNorm over all axes but the last, statistics over real (``mask``) examples only.

  Must be called inside a compact method; the ``nn.BatchNorm`` it creates belongs to the caller.

  Args:
    x: [B, ..., C] activations.
    train: batch statistics (and a running-average update) if True, running averages if False.
    mask: optional [B] example mask; padded examples neither enter the statistics nor the update.
    name: submodule name.
    momentum: flax convention (weight of the old running value); 0.9 is PyTorch's momentum=0.1.
    epsilon: PyTorch's default 1e-5 (flax's is 1e-6).

  The running variance is updated with the biased batch variance (PyTorch uses the unbiased one;
  the difference is a factor n/(n-1) on the update).

  Returns:
    Normalised x.
  """
  return nn.BatchNorm(
    use_running_average=not train,
    momentum=momentum,
    epsilon=epsilon,
    # The two-pass variance is exact where E[x²] - E[x]² can cancel; BN layers are few and small.
    use_fast_variance=False,
    name=name,
  )(x, mask=_broadcast_mask(mask, x) if train else None)


class BatchStatNorm(nn.Module):
  """Batch normalisation without running statistics (PyTorch ``track_running_stats=False``).

  Train and eval both normalise with the current batch's mean and (biased) variance over the
  examples where ``mask`` is true, so the model has no ``batch_stats`` collection, and in eval
  mode an example's output depends on the rest of its batch. Parameters ``scale`` and ``bias`` are
  named as in ``nn.BatchNorm``.

  Attributes:
    epsilon: added to the variance.
  """

  epsilon: float = 1e-5

  @nn.compact
  def __call__(self, x: jax.Array, mask: jax.Array | None = None) -> jax.Array:
    features = x.shape[-1]
    scale = self.param("scale", nn.initializers.ones_init(), (features,))
    bias = self.param("bias", nn.initializers.zeros_init(), (features,))
    axes = tuple(range(x.ndim - 1))
    m = _broadcast_mask(mask, x)
    mean = jnp.mean(x, axis=axes, where=m)
    var = jnp.mean(jnp.square(x - mean), axis=axes, where=m)
    return (x - mean) * jax.lax.rsqrt(var + self.epsilon) * scale + bias


def norm_layer(
  x: jax.Array,
  norm: str,
  *,
  train: bool,
  mask: jax.Array | None,
  name: str,
  num_groups: int | None = 2,
  group_size: int | None = None,
  batch_stats_at_eval: bool = False,
) -> jax.Array:
  """The normalisation selected by ``norm`` ("batch", "group" or "none"), named ``name``.

  Args:
    x: [B, ..., C] activations.
    norm: "batch" (BatchNorm), "group" (GroupNorm; no batch dependence, no state) or "none".
    train: see :func:`batch_norm`.
    mask: [B] example mask (BatchNorm statistics only).
    name: submodule name, so parameter trees are stable across norm choices.
    num_groups: GroupNorm groups (ignored when ``group_size`` is set).
    group_size: GroupNorm channels per group, overriding ``num_groups``.
    batch_stats_at_eval: BatchNorm without running statistics (:class:`BatchStatNorm`).

  Returns:
    Normalised x.
  """
  if norm == "batch":
    if batch_stats_at_eval:
      return BatchStatNorm(name=name)(x, mask)
    return batch_norm(x, train=train, mask=mask, name=name)
  if norm == "group":
    if group_size is not None:
      return nn.GroupNorm(num_groups=None, group_size=group_size, epsilon=1e-5, name=name)(x)
    return nn.GroupNorm(num_groups=num_groups, epsilon=1e-5, name=name)(x)
  if norm == "none":
    return x
  raise ValueError(f"unknown norm {norm!r}; valid: {NORMS}")


def output_heads(
  h: jax.Array,
  num_classes: int | None,
  projection_dim: int | None = None,
  *,
  classifier_on_projection: bool = False,
  head_bias: bool = True,
) -> tuple[jax.Array | None, jax.Array]:
  """Classifier and optional projection head on the pooled representation ``h`` [B, D].

  Must be called inside a compact method. Submodules: ``head`` (the classifier), and when
  ``projection_dim`` is set ``proj_hidden`` (D -> D, ReLU) and ``proj_out`` (D -> projection_dim).
  A backbone calls it with its classifier only; MOON's projection head is the wrapper
  :class:`fedjax_proj.models.projection.ProjectionHead`, which calls it on the backbone's features
  under the backbone's own scope (so the parameters sit beside the backbone's, as named here).

  Args:
    h: [B, D] pooled features.
    num_classes: classifier width; None builds no classifier (multi-head wrappers add their own).
    projection_dim: None, or the MOON projection head's output width.
    classifier_on_projection: False (the default): logits come from ``h``. True: from the
      projection, as in MOON's official code (QinbinLi/MOON, ``ModelFedCon``:
      ``l3(l2(relu(l1(h))))``).
    head_bias: whether the classifier has a bias.

  Returns:
    (logits [B, num_classes] or None, features [B, D or projection_dim]).
  """
  features = h
  if projection_dim is not None:
    z = nn.relu(nn.Dense(h.shape[-1], name="proj_hidden")(h))
    features = nn.Dense(projection_dim, name="proj_out")(z)
  if num_classes is None:
    return None, features
  logits_in = features if classifier_on_projection else h
  logits = nn.Dense(num_classes, use_bias=head_bias, name="head")(logits_in)
  return logits, features


def count_params(variables: Variables | Any) -> int:
  """Number of trainable scalars: ``variables["params"]`` if present, else all leaves."""
  tree = variables["params"] if isinstance(variables, dict) and "params" in variables else variables
  # math.prod of shapes also works on jax.eval_shape's ShapeDtypeStructs (count without compiling).
  return int(sum(math.prod(jnp.shape(leaf)) for leaf in jax.tree_util.tree_leaves(tree)))


def from_flax(name: str, module: nn.Module, num_classes: int) -> Model:
  """Wraps a linen module as a :class:`Model` (two pure, jit/vmap-friendly functions).

  The module's ``__call__(x, train: bool, mask=None, **kwargs)`` must return
  ``(logits, features)``; BatchNorm layers keep running averages in ``batch_stats`` and dropout
  layers draw from the ``"dropout"`` RNG stream.

  Returned functions:

  - ``init(key, sample_x) -> variables``: ``{"params": ...}`` plus ``"batch_stats"`` when the
    module has running statistics. Called directly it runs as its own jit compiled at XLA
    optimisation level 0 (fast compile); inside a caller's jit/vmap it traces through, and values
    can then differ from a direct call in the last float bit.
  - ``apply(variables, x, *, train, rng=None, mask=None, **kwargs) -> ModelOutput``; extra keyword
    arguments (e.g. a multi-head model's ``task``) go to the module. ``train=True``: batch
    statistics over the examples where ``mask`` is true and updated running averages in
    ``state``; dropout needs ``rng`` (a clear ``ValueError`` otherwise). A step whose ``mask`` is
    all false returns the input state unchanged and normalises with the whole (padding) batch so
    nothing becomes NaN. ``train=False``: running averages, no dropout, and ``state`` is the input's
    non-parameter collections unchanged (``{}`` when there are none); models that normalise with
    batch statistics at eval too (``alexnet``'s default) use ``mask`` there as well. Padding
    values never reach real examples' outputs, but must be finite: an inf or NaN in a padded
    example can still turn gradients into NaN (0 * inf) through the masked reductions.

  Args:
    name: registry name recorded in the Model.
    module: the linen module.
    num_classes: output width recorded in the Model.

  Returns:
    The Model.
  """

  def init_fn(key: jax.Array, sample_x: jax.Array) -> Variables:
    params_key, dropout_key = jax.random.split(key)
    variables = module.init({"params": params_key, "dropout": dropout_key}, sample_x, train=False)
    return dict(variables)

  # Called directly, init is one jitted XLA program (cached for repeated inits, e.g. seeds). Init
  # runs once, so its compile time is what counts: XLA:CPU spends ~0.2 s optimising each threefry
  # draw (ResNet-8: 7.4 s of compile CPU time at the default level, 1.9 s at level 0).
  init_jit = jax.jit(init_fn, compiler_options={"xla_backend_optimization_level": 0})

  def init(key: jax.Array, sample_x: jax.Array) -> Variables:
    # Compiler options are only allowed on a top-level jit: under a caller's jit/vmap/eval_shape,
    # trace straight through.
    if any(isinstance(a, jax.core.Tracer) for a in jax.tree_util.tree_leaves((key, sample_x))):
      return init_fn(key, sample_x)
    return init_jit(key, sample_x)

  def apply(
    variables: Variables,
    x: jax.Array,
    *,
    train: bool,
    rng: jax.Array | None = None,
    mask: jax.Array | None = None,
    **kwargs: Any,
  ) -> ModelOutput:
    state_in = {k: v for k, v in variables.items() if k != "params"}
    any_real = None
    if mask is not None:
      mask = jnp.asarray(mask).astype(bool)
      any_real = jnp.any(mask)
      # An all-padding step must stay finite: normalise with the whole batch, keep the old state.
      mask = mask | ~any_real
    if not train:
      logits, features = module.apply(variables, x, train=False, mask=mask, **kwargs)
      return ModelOutput(logits, features, state_in)

    rngs = {} if rng is None else {"dropout": rng}
    try:
      (logits, features), updates = module.apply(
        variables, x, train=True, mask=mask, rngs=rngs, mutable=["batch_stats"], **kwargs
      )
    except flax.errors.InvalidRngError as e:
      raise ValueError(
        f"model {name!r} uses dropout: apply(..., train=True) needs rng=<PRNG key>"
      ) from e
    state = dict(state_in)
    if "batch_stats" in updates:
      new_stats = updates["batch_stats"]
      if any_real is not None and "batch_stats" in state_in:
        new_stats = jax.tree_util.tree_map(
          lambda new, old: jnp.where(any_real, new, old), new_stats, state_in["batch_stats"]
        )
      state["batch_stats"] = new_stats
    return ModelOutput(logits, features, state)

  return Model(name=name, init=init, apply=apply, num_classes=num_classes)
