"""The model registry: one :class:`ModelSpec` per architecture (its Model factory, its linen
module for the wrappers, whether it has convolutions and takes MOON's projection head).

The registered architectures and their sources are documented in their modules: ``mlp`` and
``cnn`` (McMahan et al., AISTATS 2017), ``resnet8`` (FedDF, Lin et al., NeurIPS 2020), ``resnet10``
(FedProj's network, paper 001 Table 5), ``resnet18``
(He et al., CVPR 2016), ``alexnet`` (GPM, Saha et al., ICLR 2021; FOT, Bakman et al., ICLR 2024)
and SFedKD's networks ``alexnet8`` (Krizhevsky et al., NeurIPS 2012) and ``lenet5`` (LeCun et
al., 1998), and the text encoder ``bert`` (TinyBERT/DistilBERT shapes or a Hugging Face
checkpoint; docs/nlp.md).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import flax.linen as nn

from fedjax_proj.core.types import Model
from fedjax_proj.models.alexnet import AlexNet, alexnet
from fedjax_proj.models.alexnet8 import AlexNet8, alexnet8
from fedjax_proj.models.bert import bert, bert_module
from fedjax_proj.models.cnn import CNN, cnn
from fedjax_proj.models.hf_checkpoint import pretrained_model
from fedjax_proj.models.lenet import LeNet5, lenet5
from fedjax_proj.models.mlp import MLP, mlp
from fedjax_proj.models.projection import OPTIONS as PROJECTION_OPTIONS
from fedjax_proj.models.projection import projection_head
from fedjax_proj.models.resnet import (
  resnet8,
  resnet8_module,
  resnet10,
  resnet10_module,
  resnet18,
  resnet18_module,
)


def _bert(num_classes: int, *, checkpoint: str | None = None, **kwargs: Any) -> Model:
  """``bert``, or a Hugging Face checkpoint's weights in it when ``checkpoint`` names one (its
  ``config.json`` then decides the shape: ``size`` is ignored)."""
  if not checkpoint:
    return bert(num_classes, **kwargs)
  kwargs.pop("size", None)
  return pretrained_model(checkpoint, num_classes, **kwargs)


class ModelSpec(NamedTuple):
  """A registered architecture.

  Attributes:
    name: the registry key (``--model``).
    factory: ``factory(num_classes, **options) -> Model``, what :func:`get_model` builds.
    module: ``module(num_classes=..., **options) -> nn.Module``, the bare linen module;
      ``num_classes=None`` gives a backbone without a classifier, which the wrappers
      (:func:`fedjax_proj.models.multihead.multi_head`,
      :func:`fedjax_proj.models.projection.projection_head`) complete.
    convolutions: built from :class:`fedjax_proj.models.conv.Conv` layers, so it takes
      ``conv_impl``.
    projection: takes MOON's projection head (``projection_dim``; models/projection.py).
  """

  name: str
  factory: Callable[..., Model]
  module: Callable[..., nn.Module]
  convolutions: bool = False
  projection: bool = True


MODEL_SPECS: dict[str, ModelSpec] = {
  s.name: s
  for s in (
    ModelSpec("mlp", mlp, MLP),
    ModelSpec("cnn", cnn, CNN, convolutions=True),
    ModelSpec("resnet8", resnet8, resnet8_module, convolutions=True),
    ModelSpec("resnet10", resnet10, resnet10_module, convolutions=True),
    ModelSpec("resnet18", resnet18, resnet18_module, convolutions=True),
    ModelSpec("alexnet", alexnet, AlexNet, convolutions=True),
    ModelSpec("alexnet8", alexnet8, AlexNet8, convolutions=True),
    ModelSpec("lenet5", lenet5, LeNet5, convolutions=True),
    # The encoder's pooled [CLS] vector feeds its classifier directly (docs/nlp.md).
    ModelSpec("bert", _bert, bert_module, projection=False),
  )
}

# Views of :data:`MODEL_SPECS`: every name, and the models that take ``conv_impl``.
MODELS: tuple[str, ...] = tuple(MODEL_SPECS)
CONV_MODELS: tuple[str, ...] = tuple(n for n, s in MODEL_SPECS.items() if s.convolutions)


def model_spec(name: str) -> ModelSpec:
  """The registry entry of ``name``; a ValueError lists the valid names."""
  if name not in MODEL_SPECS:
    raise ValueError(f"unknown model {name!r}; valid names: {', '.join(MODELS)}")
  return MODEL_SPECS[name]


def get_model(name: str, num_classes: int, **kwargs: Any) -> Model:
  """Builds a registered model.

  Args:
    name: one of :data:`MODELS` ("mlp", "cnn", "resnet8", "resnet10", "resnet18", "alexnet",
      "alexnet8", "lenet5", "bert").
    num_classes: output width.
    **kwargs: the factory's options (e.g. ``norm``, ``conv_impl``), and MOON's
      ``projection_dim`` and ``classifier_on_projection``, which wrap the backbone in
      :class:`fedjax_proj.models.projection.ProjectionHead`.

  Returns:
    The Model.

  Raises:
    ValueError: unknown name.
    TypeError: an option the model does not take.
  """
  spec = model_spec(name)
  head = {k: kwargs.pop(k) for k in PROJECTION_OPTIONS if k in kwargs}
  if head.get("projection_dim") is None:
    # Without a projection the classifier reads the backbone's features whatever
    # classifier_on_projection says.
    return spec.factory(num_classes, **kwargs)
  if not spec.projection:
    raise TypeError(f"{name} takes no projection head ({', '.join(head)})")
  return projection_head(spec.module, num_classes, **head, name=name, **kwargs)


def get_module(name: str, num_classes: int | None, **kwargs: Any) -> nn.Module:
  """Builds a registered architecture as a bare linen module (:attr:`ModelSpec.module`).

  Raises:
    ValueError: unknown name.
  """
  return model_spec(name).module(num_classes=num_classes, **kwargs)
