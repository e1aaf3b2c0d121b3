"""MOON's projection head as a wrapper of any backbone (Li, He and Song, "Model-Contrastive
Federated Learning", CVPR 2021, Sec. 3.2: a base encoder, a projection head and an output layer).

:class:`ProjectionHead` wraps a backbone built without a classifier (``num_classes=None``) and
adds, on its pooled features h [B, D], MOON's 2-layer MLP head ``proj_hidden`` (D -> D, ReLU) and
``proj_out`` (D -> projection_dim), whose output becomes the model's ``features``, and the
classifier ``head``: on h by default, on the projection with ``classifier_on_projection`` (MOON's
official code, QinbinLi/MOON ``ModelFedCon``: ``l3(l2(relu(l1(h))))``).

The backbone shares the wrapper's scope (``flax.linen.share_scope``): its parameters are not
nested under a ``backbone`` key but sit beside ``proj_hidden``, ``proj_out`` and ``head``, the
tree (and, from the same key, the values) a backbone with the head built in had, so checkpoints
and the parity and fingerprint records keep their names. :func:`fedjax_proj.models.get_model`
builds it for ``projection_dim`` (the model options MOON's registry entry asks for); beside
:func:`fedjax_proj.models.multihead.multi_head`, the other wrapper of a registered backbone.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import flax.linen as nn
import jax

from fedjax_proj.core.types import Model
from fedjax_proj.models.base import from_flax, output_heads

# The model options this wrapper takes (get_model routes them here).
OPTIONS = ("projection_dim", "classifier_on_projection")


class ProjectionHead(nn.Module):
  """A backbone (built without a classifier) plus MOON's projection head and the classifier.

  Attributes:
    backbone: linen module with ``__call__(x, train, mask) -> (None, features)``.
    num_classes: classifier width.
    projection_dim: the projection's width (the model's ``features``).
    classifier_on_projection: logits from the projection instead of the backbone's features.
    head_bias: whether the classifier has a bias.
  """

  backbone: nn.Module
  num_classes: int
  projection_dim: int
  classifier_on_projection: bool = False
  head_bias: bool = True

  def setup(self):
    # The backbone's parameters at this module's level, not under "backbone" (module docstring).
    nn.share_scope(self, self.backbone)

  @nn.compact
  def __call__(self, x: jax.Array, train: bool, mask: jax.Array | None = None):
    _, h = self.backbone(x, train, mask)
    return output_heads(
      h,
      self.num_classes,
      self.projection_dim,
      classifier_on_projection=self.classifier_on_projection,
      head_bias=self.head_bias,
    )


def projection_head(
  backbone: nn.Module | Callable[..., nn.Module],
  num_classes: int,
  projection_dim: int,
  *,
  classifier_on_projection: bool = False,
  name: str | None = None,
  **backbone_kwargs: Any,
) -> Model:
  """A :class:`Model` of ``backbone`` with MOON's projection head.

  Args:
    backbone: a linen module (cloned with ``num_classes=None``) or a callable
      ``fn(num_classes=None, **backbone_kwargs) -> nn.Module`` (e.g. a registry module builder).
    num_classes: classifier width (the Model's ``num_classes``).
    projection_dim: the projection's width (the Model's ``features``).
    classifier_on_projection: logits from the projection (MOON's code) instead of the backbone's
      features.
    name: Model name; default the backbone's class name, lower case.
    **backbone_kwargs: backbone options when ``backbone`` is a callable.

  Returns:
    The Model; its classifier keeps the backbone's ``head_bias`` (AlexNet's has none).

  Raises:
    ValueError: a non-positive ``projection_dim``, or options given with a module instance.
  """
  if int(projection_dim) < 1:
    raise ValueError(f"projection_dim must be >= 1, got {projection_dim}")
  if isinstance(backbone, nn.Module):
    if backbone_kwargs:
      raise ValueError("backbone_kwargs only apply when backbone is a callable")
    module = backbone.clone(num_classes=None)
  else:
    module = backbone(num_classes=None, **backbone_kwargs)
  wrapped = ProjectionHead(
    module,
    num_classes,
    int(projection_dim),
    classifier_on_projection,
    head_bias=getattr(module, "head_bias", True),
  )
  return from_flax(name or type(module).__name__.lower(), wrapped, num_classes)
