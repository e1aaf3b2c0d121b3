"""Multi-layer perceptron on flattened inputs.

The default (two hidden layers of 200 units, ReLU) is the "2NN" of McMahan et al.,
"Communication-Efficient Learning of Deep Networks from Decentralized Data" (AISTATS 2017).
FOT's Permuted-MNIST model (Bakman et al., "Federated Orthogonal Training", ICLR 2024; code
duygunuryldz/Federated_Orthogonal_Training, ``model/mlp.py``) is
``mlp(10, hidden=(400, 400, 400), dropout=(0.2, 0.5, 0.5))``: note that code builds three hidden
layers of 400 even though it is configured with ``hidden_layer_num=2``.
"""

from __future__ import annotations

from collections.abc import Sequence

import flax.linen as nn
import jax

from fedjax_proj.core.types import Model
from fedjax_proj.models.base import from_flax, output_heads


class MLP(nn.Module):
  """Flatten -> [Dense -> ReLU -> Dropout] * len(hidden) -> classifier.

  Attributes:
    num_classes: classifier width (None: no classifier, for multi-head wrappers).
    hidden: hidden layer widths.
    dropout: one rate for every hidden layer, or one rate per hidden layer (0 disables).
  """

  num_classes: int | None = 10
  hidden: Sequence[int] = (200, 200)
  dropout: float | Sequence[float] = 0.0

  @nn.compact
  def __call__(self, x: jax.Array, train: bool, mask: jax.Array | None = None):
    del mask  # No batch-dependent layers.
    rates = (
      tuple(self.dropout)
      if isinstance(self.dropout, Sequence)
      else (float(self.dropout),) * len(self.hidden)
    )
    if len(rates) != len(self.hidden):
      raise ValueError(f"dropout has {len(rates)} rates for {len(self.hidden)} hidden layers")
    h = x.reshape(x.shape[0], -1)
    for i, (width, rate) in enumerate(zip(self.hidden, rates)):
      h = nn.relu(nn.Dense(width, name=f"dense_{i}")(h))
      h = nn.Dropout(rate, deterministic=not train, name=f"dropout_{i}")(h)
    # Features are exactly what the classifier sees (post-dropout when training).
    return output_heads(h, self.num_classes)


def mlp(
  num_classes: int = 10,
  *,
  hidden: Sequence[int] = (200, 200),
  dropout: float | Sequence[float] = 0.0,
) -> Model:
  """The MLP as a :class:`Model`; features are the last hidden layer [B, hidden[-1]].

  Args:
    num_classes: output width.
    hidden: hidden layer widths.
    dropout: rate(s) after each hidden ReLU.

  Returns:
    The Model.
  """
  module = MLP(
    num_classes=num_classes,
    hidden=tuple(hidden),
    dropout=tuple(dropout) if isinstance(dropout, Sequence) else dropout,
  )
  return from_flax("mlp", module, num_classes)
