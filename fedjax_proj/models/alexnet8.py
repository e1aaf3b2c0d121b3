"""The 8-layer AlexNet (5 convolutions + 3 fully connected layers) for 32x32 images.

SFedKD (Xu et al., papers/004, Sect. 4.1) trains "an 8-layer AlexNet [24]" on CIFAR-10 and
CINIC-10 without listing its layers. [24] is Krizhevsky, Sutskever and Hinton (NeurIPS 2012): five
convolutions (the 1st, 2nd and 5th followed by max pooling) and three fully connected layers
(4096, 4096, classes) with dropout 0.5 before the first two. On 32x32 inputs we use the usual
CIFAR adaptation of that stack (3x3 kernels, the first with stride 2, widths 64/192/384/256/256),
as federated-learning benchmarks implement "AlexNet" for CIFAR-10:

  conv 3x3/2 64 -> ReLU -> maxpool 2        (32 -> 16 -> 8)
  conv 3x3 192 -> ReLU -> maxpool 2         (8 -> 4)
  conv 3x3 384 -> ReLU
  conv 3x3 256 -> ReLU
  conv 3x3 256 -> ReLU -> maxpool 2         (4 -> 2)
  flatten (1024) -> dropout 0.5 -> fc 4096 -> ReLU -> dropout 0.5 -> fc 4096 -> ReLU -> head

SAME padding, biases everywhere, no normalisation layers (the 2012 network's local response
normalisation is left out, as in those implementations). 23,272,266 parameters with a 10-class
head (docs/sfedkd.md, "Networks"). It is a different network from :mod:`fedjax_proj.models.alexnet`
(GPM/FOT's 3-conv "AlexNet-like" net); the two share the convolution and head building blocks.
"""

from __future__ import annotations

import flax.linen as nn
import jax

from fedjax_proj.core.types import Model
from fedjax_proj.models.base import from_flax, output_heads
from fedjax_proj.models.conv import Conv
from fedjax_proj.models.pool import max_pool

# (features, stride, max pool after) per conv layer.
_CONVS = ((64, 2, True), (192, 1, True), (384, 1, False), (256, 1, False), (256, 1, True))


class AlexNet8(nn.Module):
  """The 8-layer AlexNet for 32x32 inputs.

  Attributes:
    num_classes: classifier width (None: no classifier, for multi-head wrappers).
    dropout: rate before each of the two hidden fully connected layers (Krizhevsky et al.: 0.5).
    fc_features: width of the two hidden fully connected layers.
    conv_impl: one of :data:`fedjax_proj.models.conv.CONV_IMPLS` (:mod:`fedjax_proj.models.conv`).
  """

  num_classes: int | None = 10
  dropout: float = 0.5
  fc_features: int = 4096
  conv_impl: str = "xla"

  @nn.compact
  def __call__(self, x: jax.Array, train: bool, mask: jax.Array | None = None):
    del mask  # No batch-dependent layers.
    for i, (features, stride, pool) in enumerate(_CONVS):
      x = Conv(
        features,
        (3, 3),
        strides=(stride, stride),
        padding="SAME",
        impl=self.conv_impl,
        name=f"conv_{i}",
      )(x)
      x = nn.relu(x)
      if pool:
        x = max_pool(x, (2, 2), strides=(2, 2))
    h = x.reshape(x.shape[0], -1)
    for j in range(2):
      h = nn.Dropout(self.dropout, deterministic=not train, name=f"dropout_{j}")(h)
      h = nn.relu(nn.Dense(self.fc_features, name=f"fc_{j}")(h))
    return output_heads(h, self.num_classes)


def alexnet8(
  num_classes: int = 10,
  *,
  dropout: float = 0.5,
  fc_features: int = 4096,
  conv_impl: str = "xla",
) -> Model:
  """The 8-layer AlexNet as a :class:`Model`; features are the second 4096-unit layer.

  Args:
    num_classes: output width.
    dropout: rate before each hidden fully connected layer.
    fc_features: width of the hidden fully connected layers.
    conv_impl: convolution implementation (:data:`fedjax_proj.models.conv.CONV_IMPLS`).

  Returns:
    The Model.
  """
  module = AlexNet8(
    num_classes=num_classes,
    dropout=dropout,
    fc_features=fc_features,
    conv_impl=conv_impl,
  )
  return from_flax("alexnet8", module, num_classes)
