"""Multi-head models for task-incremental continual learning: one linear head per task.

The task-incremental setting of GPM (Saha et al., ICLR 2021) and FOT (Bakman et al., "Federated
Orthogonal Training", ICLR 2024; code duygunuryldz/Federated_Orthogonal_Training keeps a
``ModuleList`` of per-task ``Linear`` heads on a shared backbone).

Extension of the :class:`~fedjax_proj.core.types.Model` contract: a multi-head model's apply is

  ``apply(variables, x, *, train, rng=None, mask=None, task=0) -> ModelOutput``

where ``task`` is a Python int or an integer array scalar (it may be traced, so one compiled
program serves every task), or an integer vector [B] giving each example its own task (one pass
over a batch that mixes tasks, e.g. FedCIL's generated replay), and ``logits`` are the selected
head's (each example's head's) [B, classes_per_task];
``features`` are the shared backbone's. ``Model.num_classes`` is ``classes_per_task``.

Parameters: ``params["backbone"]`` (shared) and ``params["heads"]`` with ``kernel``
[num_tasks, D, classes_per_task] (head t is ``kernel[t]``) and optional ``bias``
[num_tasks, classes_per_task], so algorithms that must skip heads (FOT's projection) find them by
name. The head's weights are gathered with ``jnp.take`` before one matmul: the same logits as
computing every head and selecting one, without the other heads' work, and the gradient of every
unselected head is exactly zero.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from fedjax_proj.core.types import Model
from fedjax_proj.models.base import from_flax
from fedjax_proj.models.projection import OPTIONS as PROJECTION_OPTIONS
from fedjax_proj.models.projection import ProjectionHead
from fedjax_proj.models.registry import get_module


class TaskHeads(nn.Module):
  """``num_tasks`` linear heads stored as one [T, D, C] kernel; applies head ``task``.

  Attributes:
    num_tasks: number of heads T.
    classes_per_task: width C of each head.
    use_bias: whether heads have a bias.
  """

  num_tasks: int
  classes_per_task: int
  use_bias: bool = True

  @nn.compact
  def __call__(self, h: jax.Array, task: int | jax.Array) -> jax.Array:
    if isinstance(task, int) and not 0 <= task < self.num_tasks:
      raise ValueError(f"task {task} out of range [0, {self.num_tasks})")
    kernel = self.param(
      "kernel",
      # Each head initialised as an independent Dense(D -> C) would be.
      nn.initializers.lecun_normal(in_axis=-2, out_axis=-1, batch_axis=(0,)),
      (self.num_tasks, h.shape[-1], self.classes_per_task),
    )
    task = jnp.asarray(task, jnp.int32)
    # mode="fill" turns an out-of-range traced task into NaN logits instead of a silent clip.
    if task.ndim == 1:  # one task per example: each row times its own head
      logits = jnp.einsum("bd,bdc->bc", h, jnp.take(kernel, task, axis=0, mode="fill"))
    else:
      logits = h @ jnp.take(kernel, task, axis=0, mode="fill")
    if self.use_bias:
      bias = self.param(
        "bias", nn.initializers.zeros_init(), (self.num_tasks, self.classes_per_task)
      )
      logits = logits + jnp.take(bias, task, axis=0, mode="fill")
    return logits


class MultiHead(nn.Module):
  """A backbone (built without a classifier) plus :class:`TaskHeads`.

  Attributes:
    backbone: linen module with ``__call__(x, train, mask) -> (logits_or_None, features)``.
    num_tasks: number of tasks.
    classes_per_task: classes per task.
    head_bias: whether heads have a bias.
  """

  backbone: nn.Module
  num_tasks: int
  classes_per_task: int
  head_bias: bool = True

  @nn.compact
  def __call__(
    self,
    x: jax.Array,
    train: bool,
    mask: jax.Array | None = None,
    task: int | jax.Array = 0,
  ):
    _, features = self.backbone(x, train, mask)
    logits = TaskHeads(self.num_tasks, self.classes_per_task, self.head_bias, name="heads")(
      features, task
    )
    return logits, features


def multi_head(
  backbone: str | nn.Module | Callable[..., nn.Module],
  num_tasks: int,
  classes_per_task: int,
  *,
  head_bias: bool = True,
  name: str | None = None,
  **backbone_kwargs: Any,
) -> Model:
  """A multi-head :class:`Model`: shared backbone, one linear head per task.

  Args:
    backbone: a registry name ("mlp", "cnn", "resnet8", "resnet18", "alexnet"); a callable
      ``fn(num_classes=None, **backbone_kwargs) -> nn.Module`` (e.g. a module class); or a linen
      module instance (cloned with ``num_classes=None`` when it has that field, so it carries no
      unused single-task classifier).
    num_tasks: number of heads.
    classes_per_task: width of each head (the Model's ``num_classes``).
    head_bias: whether heads have a bias (GPM/FOT's AlexNet heads have none: pass False).
    name: Model name; default ``"multi_head_<backbone>"``.
    **backbone_kwargs: backbone options when ``backbone`` is a name or a callable.

  Returns:
    The Model; apply takes the extra keyword ``task`` (see the module docstring).

  Raises:
    ValueError: bad sizes, or a backbone with a projection head (heads need the pooled features).
  """
  if num_tasks < 1 or classes_per_task < 1:
    raise ValueError(
      f"need num_tasks >= 1 and classes_per_task >= 1, got {num_tasks}, {classes_per_task}"
    )
  if any(k in backbone_kwargs for k in PROJECTION_OPTIONS) or isinstance(backbone, ProjectionHead):
    raise ValueError("multi_head does not support a backbone projection head (projection_dim)")
  if isinstance(backbone, str):
    backbone_name = backbone
    module = get_module(backbone, None, **backbone_kwargs)
  elif isinstance(backbone, nn.Module):
    if backbone_kwargs:
      raise ValueError("backbone_kwargs only apply when backbone is a name or a callable")
    backbone_name = type(backbone).__name__.lower()
    module = backbone.clone(num_classes=None) if hasattr(backbone, "num_classes") else backbone
  else:
    backbone_name = getattr(backbone, "__name__", "backbone").lower()
    module = backbone(num_classes=None, **backbone_kwargs)
  model_name = name or f"multi_head_{backbone_name}"
  wrapped = MultiHead(module, num_tasks, classes_per_task, head_bias)
  return from_flax(model_name, wrapped, classes_per_task)
