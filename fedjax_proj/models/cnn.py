"""The FedAvg CNN of McMahan et al., "Communication-Efficient Learning of Deep Networks from
Decentralized Data" (AISTATS 2017).

conv 5x5 32 -> ReLU -> maxpool 2 -> conv 5x5 64 -> ReLU -> maxpool 2 -> dense 512 -> ReLU ->
dense num_classes; convolutions with "SAME" padding and bias. On 28x28x1 MNIST with 10 classes it
has 1,663,370 parameters, the paper's count. The same two-conv/dense stack with other widths and
VALID padding is LeNet-5 (:mod:`fedjax_proj.models.lenet`).
"""

from __future__ import annotations

from collections.abc import Sequence

import flax.linen as nn
import jax

from fedjax_proj.core.types import Model
from fedjax_proj.models.base import from_flax, output_heads
from fedjax_proj.models.conv import Conv
from fedjax_proj.models.pool import max_pool


class CNN(nn.Module):
  """The FedAvg CNN.

  Attributes:
    num_classes: classifier width (None: no classifier, for multi-head wrappers).
    conv_features: widths of the 5x5 convolutions, each followed by ReLU and 2x2 max pooling.
    padding: the convolutions' padding.
    hidden: widths of the ReLU dense layers before the classifier.
    conv_impl: one of :data:`fedjax_proj.models.conv.CONV_IMPLS` (:mod:`fedjax_proj.models.conv`).
  """

  num_classes: int | None = 10
  conv_features: Sequence[int] = (32, 64)
  padding: str = "SAME"
  hidden: Sequence[int] = (512,)
  conv_impl: str = "xla"

  @nn.compact
  def __call__(self, x: jax.Array, train: bool, mask: jax.Array | None = None):
    del train, mask  # No dropout or batch-dependent layers.
    if x.ndim == 3:  # [B, H, W] grayscale.
      x = x[..., None]
    for i, width in enumerate(self.conv_features):
      x = Conv(width, (5, 5), padding=self.padding, impl=self.conv_impl, name=f"conv_{i}")(x)
      x = max_pool(nn.relu(x), (2, 2), strides=(2, 2))
    h = x.reshape(x.shape[0], -1)
    for j, width in enumerate(self.hidden):
      h = nn.relu(nn.Dense(width, name=f"dense_{j}")(h))
    return output_heads(h, self.num_classes)


def cnn(
  num_classes: int = 10,
  *,
  conv_impl: str = "xla",
) -> Model:
  """The FedAvg CNN as a :class:`Model`; features are the 512-unit hidden layer.

  Args:
    num_classes: output width.
    conv_impl: convolution implementation (:data:`fedjax_proj.models.conv.CONV_IMPLS`).

  Returns:
    The Model.
  """
  module = CNN(
    num_classes=num_classes,
    conv_impl=conv_impl,
  )
  return from_flax("cnn", module, num_classes)
