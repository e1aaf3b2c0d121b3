"""Models: linen architectures adapted to the pure-function :class:`~fedjax_proj.core.types.Model`.

Architectures and their papers: ``mlp`` and ``cnn`` (McMahan et al., "Communication-Efficient
Learning of Deep Networks from Decentralized Data", AISTATS 2017), ``resnet8`` (FedDF: Lin et al.,
"Ensemble Distillation for Robust Model Fusion in Federated Learning", NeurIPS 2020), ``resnet10``
(the FedProj network of paper 001, Table 5: 4.9M parameters, 65 MMACs), ``resnet18``
(He et al., "Deep Residual Learning for Image Recognition", CVPR 2016) and ``alexnet`` (GPM: Saha et
al., "Gradient Projection Memory for Continual Learning", ICLR 2021, as used by FOT). ``multi_head``
adds one linear head per task and ``projection_head`` MOON's projection head, two wrappers of any
backbone (``get_model`` applies the latter for ``projection_dim``); ``alexnet8`` and ``lenet5`` are
SFedKD's CIFAR-10 and Fashion-MNIST networks
(papers/004; docs/sfedkd.md); ``bert`` is a BERT-family text encoder (docs/nlp.md); conv
models take ``conv_impl`` (see :mod:`fedjax_proj.models.conv`).

Example::

  model = get_model("resnet8", num_classes=10)
  variables = model.init(jax.random.key(0), x[:1])
  out = model.apply(variables, x, train=True, mask=mask)  # out.logits, out.features, out.state
"""

from fedjax_proj.models.alexnet import alexnet
from fedjax_proj.models.alexnet8 import alexnet8
from fedjax_proj.models.base import count_params, from_flax
from fedjax_proj.models.bert import bert
from fedjax_proj.models.cnn import cnn
from fedjax_proj.models.conv import CONV_IMPLS, Conv, conv2d
from fedjax_proj.models.lenet import lenet5
from fedjax_proj.models.mlp import mlp
from fedjax_proj.models.multihead import multi_head
from fedjax_proj.models.projection import ProjectionHead, projection_head
from fedjax_proj.models.registry import (
  CONV_MODELS,
  MODEL_SPECS,
  MODELS,
  ModelSpec,
  get_model,
  get_module,
  model_spec,
)
from fedjax_proj.models.resnet import resnet8, resnet10, resnet18

__all__ = [
  "CONV_IMPLS",
  "CONV_MODELS",
  "MODELS",
  "MODEL_SPECS",
  "Conv",
  "ModelSpec",
  "ProjectionHead",
  "alexnet",
  "alexnet8",
  "bert",
  "cnn",
  "conv2d",
  "count_params",
  "from_flax",
  "get_model",
  "get_module",
  "lenet5",
  "mlp",
  "model_spec",
  "multi_head",
  "projection_head",
  "resnet8",
  "resnet10",
  "resnet18",
]
