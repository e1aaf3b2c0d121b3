"""CINIC-10 under label skew from an image folder: the FedProj paper's CINIC-10 setting (Table 1).

    python experiments/cinic10.py --method=fedproj --data_dir=/data/CINIC-10 \
        --public_data=../shared/data/cifar100/public_20k.npz --memory_size=20000

Preset ``paper``: 100 clients, 10% per round, 20 local epochs, 60 rounds, ResNet-18, Dirichlet 0.3
(``--partition=dirichlet:0.5`` for the other column), Adam 1e-3, batch 64, public CIFAR-100 with
1 distillation epoch; FedProj as the papers write it (plain-KL memory loss, |M| = 50k, α from
Table 3: 0 at β 0.3, 0.3 at β 0.5; docs/reproduction.md). Expected final accuracy (papers 000/001
Table 1, Dir 0.3 / 0.5): FedAvg 40.59 / 40.70, FedDF 40.64 / 40.77, FedProj 41.46 / 41.63.

Data this preset expects: CINIC-10 as it ships (Darlow et al. 2018), i.e. ``--data_dir`` holding
``train/<class>/*.png`` and ``test/<class>/*.png`` (the ``valid/`` split is not used); the decoded
arrays are cached under ``~/.cache/fedjax_proj``. It is not in ``../shared/data`` nor in TFDS,
so without ``--data_dir`` (or ``$FEDJAX_PROJ_DATA_DIR``) the run stops with offline instructions.
Public set: CIFAR-100 (``--public_data=cifar100`` via TFDS or the offline 20k subset
``../shared/data/cifar100/public_20k.npz``); methods that need it refuse to start without it.

``cpu`` shrinks the budget (ResNet-8, 20 rounds, 2 local epochs, 20k training images); ``smoke``
is a 2-round check of the wiring.

The sequential methods (fedseq, cwc, sfedkd) are refused here, as in cifar10.py: under these
parallel-FL settings they do not learn (docs/sfedkd.md, "Entry points"); run them with
``experiments/sequential.py``.
"""

from __future__ import annotations

from fedjax_proj.configs import image

# The image family's protocol (fedjax_proj/configs/image.py) with the dataset fixed.
DATASET = "cinic10"
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
  """``python experiments/cinic10.py``: the flags, then the run (image.main)."""
  return image.main(argv, DATASET, __doc__.splitlines()[0])
