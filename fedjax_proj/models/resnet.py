"""CIFAR ResNets: FedDF's ResNet-8, FedProj's ResNet-10 and the CIFAR ResNet-18.

He, Zhang, Ren and Sun, "Deep Residual Learning for Image Recognition" (CVPR 2016).

- ``resnet8``: the ResNet-8 of FedDF (Lin, Kong, Stich and Jaggi, "Ensemble Distillation for
  Robust Model Fusion in Federated Learning", NeurIPS 2020; code
  epfml/federated-learning-public-code, CIFAR ResNet with ``resnet_size=8``): 3x3 conv 16 -> norm
  -> ReLU -> three stages of one basic block (16/32/64 channels, strides 1/2/2; 1x1 conv + norm
  shortcut when the shape changes) -> global average pool -> linear. Convolutions have no bias
  and use FedDF's He-normal (fan-out) initialisation. 78,042 parameters for 10 classes. This is
  the network FedDF's paper calls ResNet-8. FedProj's papers also write "ResNet-8", but the
  network their cost table describes (paper 001, Table 5: d = 4.9M parameters, F = 65 MMACs per
  example) is ``resnet10``.
- ``resnet10``: the network the FedProj authors' code builds under the name "ResNet8"
  (docs/reproduction.md, FedProj): 3x3 conv 64 -> norm -> ReLU -> 3x3 max pool (stride 2,
  padding 1) -> four stages of one basic block (64/128/256/512 channels, strides 1/2/2/2) ->
  global average pool -> linear. Ten weight layers, hence the name: 4,903,242 parameters and
  about 65 MMACs per 32x32 example for 10 classes, matching paper 001, Table 5.
- ``resnet18``: the usual CIFAR variant of ResNet-18 (3x3 conv 64 stem, no max pool, [2, 2, 2, 2]
  basic blocks with 64/128/256/512 channels): 11,173,962 parameters for 10 classes.

``norm="group"`` swaps every BatchNorm for GroupNorm (Wu and He, "Group Normalization", ECCV 2018),
as Hsieh et al., "The Non-IID Data Quagmire of Decentralized Machine Learning" (ICML 2020) suggest
for non-IID FL; the model then has no ``batch_stats``. The pcode ResNets of FedDF's code base (as
copied into CGCL-codes/FedGKD, ``pcode/models/resnet.py``) build
``nn.GroupNorm(planes // group_norm_num_groups, planes)``, so their "number of groups" is really
channels per group: use ``group_size`` to reproduce that, ``num_groups`` for a fixed count.
"""

from __future__ import annotations

from collections.abc import Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp

from fedjax_proj.core.types import Model
from fedjax_proj.models.base import from_flax, norm_layer, output_heads
from fedjax_proj.models.conv import Conv
from fedjax_proj.models.pool import max_pool

# FedDF's ``_weight_initialization``: conv weights ~ N(0, 2 / (k·k·out_channels)).
_CONV_INIT = nn.initializers.variance_scaling(2.0, "fan_out", "normal")


class BasicBlock(nn.Module):
  """Two 3x3 convs with a residual connection (1x1 conv + norm shortcut on shape change).

  Attributes:
    features: output channels.
    strides: stride of the first conv and of the shortcut.
    norm: "batch", "group" or "none".
    num_groups: GroupNorm groups.
    group_size: GroupNorm channels per group (overrides ``num_groups``).
    conv_impl: convolution implementation.
  """

  features: int
  strides: int = 1
  norm: str = "batch"
  num_groups: int | None = 2
  group_size: int | None = None
  conv_impl: str = "xla"

  @nn.compact
  def __call__(self, x: jax.Array, train: bool, mask: jax.Array | None = None) -> jax.Array:
    def conv(y, features, kernel, strides, name):
      return Conv(
        features,
        (kernel, kernel),
        strides=(strides, strides),
        # PyTorch's padding=1 for 3x3 (and 0 for 1x1), explicit so strided convs align with it.
        padding=((kernel // 2, kernel // 2),) * 2,
        use_bias=False,
        impl=self.conv_impl,
        kernel_init=_CONV_INIT,
        name=name,
      )(y)

    def norm(y, name):
      return norm_layer(
        y,
        self.norm,
        train=train,
        mask=mask,
        name=name,
        num_groups=self.num_groups,
        group_size=self.group_size,
      )

    out = nn.relu(norm(conv(x, self.features, 3, self.strides, "conv_0"), "norm_0"))
    out = norm(conv(out, self.features, 3, 1, "conv_1"), "norm_1")
    residual = x
    if self.strides != 1 or x.shape[-1] != self.features:
      residual = norm(conv(x, self.features, 1, self.strides, "shortcut_conv"), "shortcut_norm")
    return nn.relu(out + residual)


class ResNet(nn.Module):
  """CIFAR-style ResNet of basic blocks.

  Attributes:
    num_classes: classifier width (None: no classifier, for multi-head wrappers).
    stem_features: channels of the 3x3 stem conv.
    stage_sizes: blocks per stage.
    stage_features: channels per stage.
    stage_strides: stride of each stage's first block.
    stem_pool: a 3x3, stride-2 max pool (padding 1) after the stem, as in ImageNet ResNets.
    norm: "batch" (default), "group" or "none".
    num_groups: GroupNorm groups (default 2).
    group_size: GroupNorm channels per group (overrides ``num_groups``).
    conv_impl: one of :data:`fedjax_proj.models.conv.CONV_IMPLS` (:mod:`fedjax_proj.models.conv`).
  """

  num_classes: int | None = 10
  stem_features: int = 16
  stage_sizes: Sequence[int] = (1, 1, 1)
  stage_features: Sequence[int] = (16, 32, 64)
  stage_strides: Sequence[int] = (1, 2, 2)
  stem_pool: bool = False
  norm: str = "batch"
  num_groups: int | None = 2
  group_size: int | None = None
  conv_impl: str = "xla"

  @nn.compact
  def __call__(self, x: jax.Array, train: bool, mask: jax.Array | None = None):
    x = Conv(
      self.stem_features,
      (3, 3),
      padding=((1, 1), (1, 1)),
      use_bias=False,
      impl=self.conv_impl,
      kernel_init=_CONV_INIT,
      name="conv_stem",
    )(x)
    x = norm_layer(
      x,
      self.norm,
      train=train,
      mask=mask,
      name="norm_stem",
      num_groups=self.num_groups,
      group_size=self.group_size,
    )
    x = nn.relu(x)
    if self.stem_pool:
      # PyTorch's MaxPool2d(3, stride=2, padding=1): padding never wins the max.
      x = max_pool(x, (3, 3), strides=(2, 2), padding=((1, 1), (1, 1)))
    for s, (size, features, strides) in enumerate(
      zip(self.stage_sizes, self.stage_features, self.stage_strides)
    ):
      for b in range(size):
        x = BasicBlock(
          features,
          strides=strides if b == 0 else 1,
          norm=self.norm,
          num_groups=self.num_groups,
          group_size=self.group_size,
          conv_impl=self.conv_impl,
          name=f"stage{s}_block{b}",
        )(x, train, mask)
    # Global average pool; FedDF's AvgPool2d(8) is the same thing on 32x32 inputs.
    h = jnp.mean(x, axis=(1, 2))
    return output_heads(h, self.num_classes)


# The architectures: FedDF's ResNet-8, FedProj's ResNet-10 (paper 001, Table 5; an ImageNet-style
# stem pool) and the CIFAR ResNet-18. Everything else (norm, heads, conv_impl) is an option.
ARCHITECTURES = {
  "resnet8": dict(
    stem_features=16,
    stage_sizes=(1, 1, 1),
    stage_features=(16, 32, 64),
    stage_strides=(1, 2, 2),
    stem_pool=False,
  ),
  "resnet10": dict(
    stem_features=64,
    stage_sizes=(1, 1, 1, 1),
    stage_features=(64, 128, 256, 512),
    stage_strides=(1, 2, 2, 2),
    stem_pool=True,
  ),
  "resnet18": dict(
    stem_features=64,
    stage_sizes=(2, 2, 2, 2),
    stage_features=(64, 128, 256, 512),
    stage_strides=(1, 2, 2, 2),
    stem_pool=False,
  ),
}


def resnet_module(name: str, num_classes: int | None = 10, **options) -> ResNet:
  """One of :data:`ARCHITECTURES` as a linen module.

  Args:
    name: "resnet8", "resnet10" or "resnet18".
    num_classes: output width (None: no classifier, for multi-head wrappers).
    **options: ``norm``, ``num_groups``, ``group_size``, ``conv_impl``, as :func:`resnet8`; an
      architecture field (e.g. ``stage_features``) replaces the named network's (narrow copies
      for fast tests).
  """
  return ResNet(num_classes=num_classes, **{**ARCHITECTURES[name], **options})


def resnet8_module(num_classes: int | None = 10, **options) -> ResNet:
  """FedDF's ResNet-8 as a linen module (``options`` as :func:`resnet8`)."""
  return resnet_module("resnet8", num_classes, **options)


def resnet10_module(num_classes: int | None = 10, **options) -> ResNet:
  """FedProj's ResNet-10 as a linen module (``options`` as :func:`resnet8`)."""
  return resnet_module("resnet10", num_classes, **options)


def resnet18_module(num_classes: int | None = 10, **options) -> ResNet:
  """CIFAR ResNet-18 as a linen module (``options`` as :func:`resnet8`)."""
  return resnet_module("resnet18", num_classes, **options)


def resnet8(
  num_classes: int = 10,
  *,
  norm: str = "batch",
  num_groups: int | None = 2,
  group_size: int | None = None,
  conv_impl: str = "xla",
  **architecture,
) -> Model:
  """FedDF's ResNet-8 as a :class:`Model`; features are the 64-d pooled representation.

  Args:
    num_classes: output width.
    norm: "batch" (BatchNorm with running statistics), "group" (GroupNorm) or "none".
    num_groups: GroupNorm groups.
    group_size: GroupNorm channels per group (overrides ``num_groups``; FedDF's convention).
    conv_impl: convolution implementation (:data:`fedjax_proj.models.conv.CONV_IMPLS`).
    **architecture: fields of :data:`ARCHITECTURES` replacing ResNet-8's (e.g. a narrower
      ``stage_features`` for fast tests).

  Returns:
    The Model.
  """
  module = resnet8_module(
    num_classes,
    norm=norm,
    num_groups=num_groups,
    group_size=group_size,
    conv_impl=conv_impl,
    **architecture,
  )
  return from_flax("resnet8", module, num_classes)


def resnet10(num_classes: int = 10, **options) -> Model:
  """FedProj's ResNet-10 (paper 001, Table 5) as a :class:`Model`; features are 512-d.

  Args:
    num_classes: output width.
    **options: ``norm``, ``num_groups``, ``group_size``, ``conv_impl``, as :func:`resnet8`.

  Returns:
    The Model.
  """
  return from_flax("resnet10", resnet10_module(num_classes, **options), num_classes)


def resnet18(num_classes: int = 10, **options) -> Model:
  """CIFAR ResNet-18 as a :class:`Model`; features are the 512-d pooled representation.

  Args:
    num_classes: output width.
    **options: ``norm``, ``num_groups``, ``group_size``, ``conv_impl``, as :func:`resnet8`.

  Returns:
    The Model.
  """
  return from_flax("resnet18", resnet18_module(num_classes, **options), num_classes)
