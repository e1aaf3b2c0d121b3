"""The AlexNet-like network used for Split-CIFAR100 by GPM and FOT.

From Saha, Garg and Roy, "Gradient Projection Memory for Continual Learning" (ICLR 2021; code
sahagobinda/GPM, ``main_cifar100.py``), used by Bakman et al., "Federated Orthogonal Training:
Mitigating Global Catastrophic Forgetting in Continual Federated Learning" (ICLR 2024; code
duygunuryldz/Federated_Orthogonal_Training, ``model/alexnet.py``). On 32x32x3 inputs:

  conv 4x4 64 -> BN -> ReLU -> dropout 0.2 -> maxpool 2      (32 -> 29 -> 14)
  conv 3x3 128 -> BN -> ReLU -> dropout 0.2 -> maxpool 2     (14 -> 12 -> 6)
  conv 2x2 256 -> BN -> ReLU -> dropout 0.5 -> maxpool 2     (6 -> 5 -> 2)
  flatten (1024) -> fc 2048 -> BN -> ReLU -> dropout 0.5 -> fc 2048 -> BN -> ReLU -> dropout 0.5
  -> head

As in both codes: convolutions, fully connected layers and the head have no bias, padding is
VALID, and dropout comes before max pooling (``maxpool(drop(relu(bn(conv(x)))))``). 6,528,896
parameters with a 10-class head.

BatchNorm: GPM builds every BatchNorm with ``track_running_stats=False``, so it normalises with the
current batch's statistics in evaluation too and keeps no running averages. That is the default
here (``bn_batch_stats_at_eval=True``): the model has no ``batch_stats`` and an example's eval
output depends on its batch (evaluate with reasonably large batches; padding is excluded through
``mask``). ``bn_batch_stats_at_eval=False`` gives the usual BatchNorm with running averages. FOT's
published code drops the BatchNorm layers altogether: ``norm="none"`` reproduces it.
"""

from __future__ import annotations

from collections.abc import Sequence

import flax.linen as nn
import jax

from fedjax_proj.core.types import Model
from fedjax_proj.models.base import from_flax, norm_layer, output_heads
from fedjax_proj.models.conv import Conv
from fedjax_proj.models.pool import max_pool

# (features, kernel) per conv layer, as GPM.
_CONVS = ((64, 4), (128, 3), (256, 2))


class AlexNet(nn.Module):
  """GPM/FOT AlexNet-like network.

  Attributes:
    num_classes: classifier width (None: no classifier, for multi-head wrappers).
    norm: "batch" (default, as GPM) or "none" (as FOT's code).
    bn_batch_stats_at_eval: BatchNorm always uses batch statistics and keeps no running averages
      (GPM's ``track_running_stats=False``; default True).
    dropout: rates after the three convs and the two fc layers.
    fc_features: width of the two fully connected layers.
    head_bias: classifier bias (GPM and FOT: none).
    conv_impl: one of :data:`fedjax_proj.models.conv.CONV_IMPLS` (:mod:`fedjax_proj.models.conv`).
  """

  num_classes: int | None = 10
  norm: str = "batch"
  bn_batch_stats_at_eval: bool = True
  dropout: Sequence[float] = (0.2, 0.2, 0.5, 0.5, 0.5)
  fc_features: int = 2048
  head_bias: bool = False
  conv_impl: str = "xla"

  @nn.compact
  def __call__(self, x: jax.Array, train: bool, mask: jax.Array | None = None):
    if self.norm not in ("batch", "none"):
      raise ValueError(f"alexnet norm must be 'batch' or 'none', got {self.norm!r}")
    if len(self.dropout) != 5:
      raise ValueError(f"alexnet needs 5 dropout rates, got {self.dropout}")

    def norm(y, name):
      return norm_layer(
        y,
        self.norm,
        train=train,
        mask=mask,
        name=name,
        batch_stats_at_eval=self.bn_batch_stats_at_eval,
      )

    for i, (features, kernel) in enumerate(_CONVS):
      x = Conv(
        features,
        (kernel, kernel),
        padding="VALID",
        use_bias=False,
        impl=self.conv_impl,
        name=f"conv_{i}",
      )(x)
      x = nn.relu(norm(x, f"norm_{i}"))
      x = nn.Dropout(self.dropout[i], deterministic=not train, name=f"dropout_{i}")(x)
      x = max_pool(x, (2, 2), strides=(2, 2))
    h = x.reshape(x.shape[0], -1)
    for j in range(2):
      h = nn.Dense(self.fc_features, use_bias=False, name=f"fc_{j}")(h)
      h = nn.relu(norm(h, f"norm_{3 + j}"))
      h = nn.Dropout(self.dropout[3 + j], deterministic=not train, name=f"dropout_{3 + j}")(h)
    return output_heads(h, self.num_classes, head_bias=self.head_bias)


def alexnet(
  num_classes: int = 10,
  *,
  norm: str = "batch",
  bn_batch_stats_at_eval: bool = True,
  dropout: Sequence[float] = (0.2, 0.2, 0.5, 0.5, 0.5),
  fc_features: int = 2048,
  head_bias: bool = False,
  conv_impl: str = "xla",
) -> Model:
  """The GPM/FOT AlexNet-like network as a :class:`Model`; features are the 2048-d fc output.

  Args:
    num_classes: output width.
    norm: "batch" (GPM) or "none" (FOT's code).
    bn_batch_stats_at_eval: True (GPM): batch statistics in train and eval, no ``batch_stats``;
      False: the usual running averages.
    dropout: five rates (after conv 1-3 and fc 1-2).
    fc_features: width of the fully connected layers.
    head_bias: classifier bias.
    conv_impl: convolution implementation (:data:`fedjax_proj.models.conv.CONV_IMPLS`).

  Returns:
    The Model.
  """
  module = AlexNet(
    num_classes=num_classes,
    norm=norm,
    bn_batch_stats_at_eval=bn_batch_stats_at_eval,
    dropout=tuple(dropout),
    fc_features=fc_features,
    head_bias=head_bias,
    conv_impl=conv_impl,
  )
  return from_flax("alexnet", module, num_classes)
