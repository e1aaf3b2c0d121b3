"""LeNet-5 (LeCun, Bottou, Bengio and Haffner, Proc. IEEE 1998), SFedKD's Fashion-MNIST network.

SFedKD (Xu et al., papers/004, Sect. 4.1) trains "a LeNet-5 [26]" on Fashion-MNIST without listing
its layers. The 1998 network takes 32x32 inputs; on 28x28 images we use the common reading that
feeds them unpadded, as Li & Lyu's sequential-FL code does (liyipeng00/convergence,
``lenet5_mnist.py``; SFedKD takes its ExDir partition and FedSeq baseline from that work, [35]):

  conv 5x5 6 -> ReLU -> maxpool 2      (28 -> 24 -> 12)
  conv 5x5 16 -> ReLU -> maxpool 2     (12 -> 8 -> 4)
  flatten (256) -> dense 120 -> ReLU -> dense 84 -> ReLU -> head

VALID padding, biases everywhere, ReLU and max pooling (the 1998 paper's scaled tanh, trainable
subsampling and sparse C3 connections are not used by modern reimplementations). 44,426
parameters for 10 classes on 28x28x1 inputs (docs/sfedkd.md, "Networks"). It is the FedAvg CNN's
stack (:class:`fedjax_proj.models.cnn.CNN`) with LeNet's widths and padding.
"""

from __future__ import annotations

import functools

from fedjax_proj.core.types import Model
from fedjax_proj.models.base import from_flax
from fedjax_proj.models.cnn import CNN

# LeNet-5 as a linen module builder (``LeNet5(num_classes=...)``), for the module registry.
LeNet5 = functools.partial(CNN, conv_features=(6, 16), padding="VALID", hidden=(120, 84))


def lenet5(num_classes: int = 10, **options) -> Model:
  """LeNet-5 as a :class:`Model`; features are the 84-unit layer.

  Args:
    num_classes: output width.
    **options: the FedAvg CNN's options (``conv_impl``; see :func:`fedjax_proj.models.cnn.cnn`).

  Returns:
    The Model.
  """
  return from_flax("lenet5", LeNet5(num_classes=num_classes, **options), num_classes)
