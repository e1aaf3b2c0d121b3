"""FedCIL's conditional generator (the ACGAN generator of its generative replay).

Qi, Zhao and Li, "Better Generative Replay for Continual Federated Learning" (ICLR 2023; code
daiqing98/FedCIL). Its generator (``FLAlgorithms/generator/gan.py``, ``Generator``) is the DGR
WGAN generator: Dense -> [H/8, W/8, 8g] -> three stride-2 transposed convolutions (4g, 2g, g
channels, each BatchNorm + ReLU) -> a 3x3 convolution to the image channels -> tanh, with g = 64
(``--generator-g-channel-size``). Its input is a Gaussian noise vector whose first ``num_labels``
coordinates are overwritten with the label's one-hot (``model.py``, ``generate_noise_with_classes``;
z_size 110 = 100 + 10 for MNIST, 126 = 100 + 26 for EMNIST-L).

Two adaptations (docs/fot.md, "FedCIL+FL"):

* Normalisation is per example (LayerNorm) instead of BatchNorm, so a generated example does not
  depend on the rest of its batch: the server's consolidation draws each example of one batch from
  a different client's generator (:mod:`fedjax_proj.algorithms.continual.fedcil`).
* Flat inputs (Permuted MNIST's 784 pixels, which the task's permutation reorders inside the
  model) have no spatial layout for the transposed convolutions, so for them the generator is an
  MLP (``hidden`` widths, LayerNorm + ReLU) with the same noise input and tanh output.

The tanh output is mapped affinely onto ``[low, high]``, the range of the model's (normalised)
inputs, where the code's tanh spans its [-1, 1] images.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp

from fedjax_proj.core.types import Array

# The noise width beyond the label one-hot: FedCIL's z_size = 100 + number of labels.
NOISE_DIM = 100


class ConditionalGenerator(nn.Module):
  """z [B, z_size] (label one-hot in its first coordinates) -> x [B, *out_shape].

  Attributes:
    out_shape: one example's shape: (H, W, C) builds the transposed-convolution generator
      (at sides rounded up to multiples of 8, centre-cropped), any other shape (e.g. (D,)) the
      MLP one.
    hidden: the MLP generator's hidden widths.
    channels: g, the convolutional generator's base width (FedCIL: 64).
    low: the output's lower bound (tanh's -1 is mapped to it).
    high: the output's upper bound.
    conv: False builds the MLP generator for image shapes too.
  """

  out_shape: tuple[int, ...]
  hidden: Sequence[int] = (256, 512)
  channels: int = 64
  low: float = -1.0
  high: float = 1.0
  conv: bool = True

  @nn.compact
  def __call__(self, z: Array) -> Array:
    # FedCIL's gaussian_intiailize: weights N(0, 0.02²), biases 0 (serverbase.py).
    init = nn.initializers.normal(0.02)
    if self.conv and len(self.out_shape) == 3:
      h_dim, w_dim, c_dim = self.out_shape
      # Sides are rounded up to multiples of 8 and the output centre-cropped (28x28 MNIST from
      # 32x32, the size FedCIL's code resizes MNIST to).
      big_h, big_w = -(-h_dim // 8) * 8, -(-w_dim // 8) * 8
      g = self.channels
      h = nn.Dense(big_h // 8 * big_w // 8 * 8 * g, kernel_init=init)(z)
      h = nn.relu(nn.LayerNorm()(h.reshape(-1, big_h // 8, big_w // 8, 8 * g)))
      for width in (4 * g, 2 * g, g):
        h = nn.ConvTranspose(width, (4, 4), strides=(2, 2), padding="SAME", kernel_init=init)(h)
        h = nn.relu(nn.LayerNorm()(h))
      out = nn.Conv(c_dim, (3, 3), padding="SAME", kernel_init=init)(h)
      top, left = (big_h - h_dim) // 2, (big_w - w_dim) // 2
      out = out[:, top : top + h_dim, left : left + w_dim]
    else:  # flat (or any non-image) inputs
      h = z
      for width in self.hidden:
        h = nn.relu(nn.LayerNorm()(nn.Dense(width, kernel_init=init)(h)))
      out = nn.Dense(math.prod(self.out_shape), kernel_init=init)(h)
    out = jnp.tanh(out).reshape(z.shape[0], *self.out_shape)
    return self.low + (out + 1.0) * (0.5 * (self.high - self.low))


def conditional_noise(key: Array, labels: Array, z_size: int, num_labels: int) -> Array:
  """FedCIL's generator input: z ~ N(0, I) [B, z_size] with z[:, :num_labels] = one_hot(labels)."""
  if z_size < num_labels:
    raise ValueError(f"z_size {z_size} cannot hold the one-hot of {num_labels} labels")
  z = jax.random.normal(key, (labels.shape[0], z_size), jnp.float32)
  return z.at[:, :num_labels].set(jax.nn.one_hot(labels, num_labels, dtype=jnp.float32))
