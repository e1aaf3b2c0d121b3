"""CIFAR-100 under label skew: the FedProj paper's CIFAR-100 setting (papers 000/001, Table 1).

    python experiments/cifar100.py --method=fedproj --public_data=/data/imagenet100_32.npz

Preset ``paper``: 50 clients, 10% (5) per round, 20 local epochs, 100 rounds, ResNet-18, Dirichlet
0.3 (``--partition=dirichlet:0.5`` for the other column), Adam 1e-3, batch 64; server distillation
runs 3 epochs (paper 001, Sec. 6) for the distillation methods (FedProj, FedDF, FedET) unless
``--method_kwargs=distill_epochs=...`` says otherwise. Expected final accuracy (Table 1, mean over
seeds, Dir 0.3 / 0.5): FedAvg 33.72 / 37.18, FedDF 33.65 / 36.60, FedProj 35.27 / 38.06. FedProj
runs as the papers write it (plain-KL memory loss, |M| = 50k, α from Table 3: 0 at β 0.3, 0.5 at
β 0.5; docs/reproduction.md).

Data this preset expects (nothing here is in ``../shared/data``, which holds only CIFAR-10, a 20k
CIFAR-100 *public* subset and MNIST):

* private CIFAR-100 train/test: TFDS ``cifar100`` (downloads when online) or ``--data_dir`` holding
  ``train.npz``/``test.npz`` (``image`` uint8 [N,32,32,3], ``label`` fine labels 0-99) or a
  ``train/<class>/`` + ``test/<class>/`` image folder;
* public set: ImageNet-100 (100 ImageNet classes) downsampled to 32x32 RGB, as an npz or image
  folder passed with ``--public_data``. It is required by the methods that read public data and it
  must be disjoint from CIFAR-100, so CIFAR-100 itself (e.g. ``public_20k.npz``) is refused.

``cpu`` shrinks the budget (ResNet-8, 30 rounds, 2 local epochs, 10k training images); ``smoke``
is a 2-round check of the wiring.

The sequential methods (fedseq, cwc, sfedkd) are refused here, as in cifar10.py: under these
parallel-FL settings they do not learn (docs/sfedkd.md, "Entry points"); run them with
``experiments/sequential.py``.
"""

from __future__ import annotations

from fedjax_proj.configs import image

# The image family's protocol (fedjax_proj/configs/image.py) with the dataset fixed.
DATASET = "cifar100"
FIELDS = image.FIELDS


def get_config(preset: str = "paper"):
  """The preset ``preset`` (image.get_config)."""
  return image.get_config(preset, DATASET)


def prepare(c):
  """Preset rules applied after the flags (image.prepare)."""
  return image.prepare(c, DATASET)


def resolve(preset: str, fields=None, method_kwargs=None):
  """The config ``--preset=<preset>`` with these flags runs (image.resolve)."""
  return image.resolve(preset, fields, method_kwargs, DATASET)


def main(argv) -> int:
  """``python experiments/cifar100.py``: the flags, then the run (image.main)."""
  return image.main(argv, DATASET, __doc__.splitlines()[0])
