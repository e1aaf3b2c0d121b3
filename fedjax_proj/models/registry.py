"""Name -> model registry (``get_model``) and name -> linen module builders (for wrappers).

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
from typing import Any

import flax.linen as nn

from fedjax_proj.core.types import Model
from fedjax_proj.models.alexnet import AlexNet, alexnet
from fedjax_proj.models.alexnet8 import AlexNet8, alexnet8
from fedjax_proj.models.bert import bert, bert_module
from fedjax_proj.models.cnn import CNN, cnn
from fedjax_proj.models.hf_checkpoint import pretrained_model
from fedjax_proj.models.lenet import LeNet5, lenet5
from fedjax_proj.models.mlp import MLP, mlp
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


MODEL_FACTORIES: dict[str, Callable[..., Model]] = {
  "mlp": mlp,
  "cnn": cnn,
  "resnet8": resnet8,
  "resnet10": resnet10,
  "resnet18": resnet18,
  "alexnet": alexnet,
  "alexnet8": alexnet8,
  "lenet5": lenet5,
  "bert": _bert,
}

# Same names, but building bare linen modules; ``num_classes=None`` gives a backbone without a
# classifier (used by :func:`fedjax_proj.models.multihead.multi_head`).
MODULE_BUILDERS: dict[str, Callable[..., nn.Module]] = {
  "mlp": MLP,
  "cnn": CNN,
  "resnet8": resnet8_module,
  "resnet10": resnet10_module,
  "resnet18": resnet18_module,
  "alexnet": AlexNet,
  "alexnet8": AlexNet8,
  "lenet5": LeNet5,
  "bert": bert_module,
}

MODELS: tuple[str, ...] = tuple(MODEL_FACTORIES)
# The models built from :class:`fedjax_proj.models.conv.Conv` layers: they take ``conv_impl``.
CONV_MODELS: tuple[str, ...] = (
  "cnn",
  "resnet8",
  "resnet10",
  "resnet18",
  "alexnet",
  "alexnet8",
  "lenet5",
)


def get_model(name: str, num_classes: int, **kwargs: Any) -> Model:
  """Builds a registered model.

  Args:
    name: one of :data:`MODELS` ("mlp", "cnn", "resnet8", "resnet10", "resnet18", "alexnet",
      "alexnet8", "lenet5", "bert").
    num_classes: output width.
    **kwargs: the factory's options (e.g. ``norm``, ``projection_dim``, ``conv_impl``).

  Returns:
    The Model.

  Raises:
    ValueError: unknown name.
  """
  if name not in MODEL_FACTORIES:
    raise ValueError(f"unknown model {name!r}; valid names: {', '.join(MODELS)}")
  return MODEL_FACTORIES[name](num_classes, **kwargs)


def get_module(name: str, num_classes: int | None, **kwargs: Any) -> nn.Module:
  """Builds a registered architecture as a bare linen module (see :data:`MODULE_BUILDERS`).

  Raises:
    ValueError: unknown name.
  """
  if name not in MODULE_BUILDERS:
    raise ValueError(f"unknown model {name!r}; valid names: {', '.join(MODELS)}")
  return MODULE_BUILDERS[name](num_classes=num_classes, **kwargs)
