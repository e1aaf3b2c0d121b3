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

from fedjax_proj.algorithms import registry
from fedjax_proj.configs import common, fedproj_presets
from fedjax_proj.core.engine import STRATEGIES
from fedjax_proj.models import MODELS
from fedjax_proj.training.config import base_config

# The config's fields (training/fields.py): base_config's and the FedProj presets' switches.
FIELDS = fedproj_presets.FIELDS

# Methods with server-side ensemble distillation: the paper distils 3 epochs on CIFAR-100.
DISTILL_METHODS = ("fedproj", "feddf", "fedet")
PAPER_DISTILL_EPOCHS = 3


def get_config(preset: str = "paper"):
  c = base_config()
  c.dataset = "cifar100"
  c.model = "resnet18"
  c.num_clients = 50
  c.clients_per_round = 5
  c.rounds = 100
  c.local_epochs = 20
  c.partition = "dirichlet:0.3"
  if preset == "paper":
    return fedproj_presets.apply_paper(c, distill_epochs=PAPER_DISTILL_EPOCHS)
  if preset == "cpu":
    c.model = "resnet8"
    c.rounds = 30
    c.local_epochs = 2
    c.train_subset = 10000
    c.memory_size = 2000
    return c
  if preset == "smoke":
    c.model = "resnet8"
    return common.apply_smoke(c)
  raise ValueError(f"Unknown preset {preset!r}; choose one of {common.PRESETS}.")


def check_public_data(config) -> None:
  """Rejects a missing or overlapping public set with what the preset expects."""
  if not registry.needs_public(config.method):
    return
  if not config.public_data:
    raise ValueError(
      f"Method {config.method!r} needs a public set. The paper uses ImageNet-100 at 32x32 for "
      "CIFAR-100; pass --public_data=<npz (image uint8 [N,32,32,3], label) or image folder>. "
      "No copy exists in ../shared/data."
    )
  if "cifar100" in config.public_data.lower().replace("-", "").replace("_", ""):
    raise ValueError(
      f"--public_data={config.public_data} is CIFAR-100, the private dataset of this preset: the "
      "public set must be disjoint from it (the paper uses ImageNet-100 at 32x32)."
    )


def prepare(config):
  """Preset rules that depend on the chosen method (applied after the flags).

  Refuses the sequential methods (common.refuse_sequential), then sets the distillation epochs,
  checks the public set and FedProj's α (fedproj_presets.prepare).
  """
  common.refuse_sequential(config)
  if config.method in DISTILL_METHODS and "distill_epochs" not in config.method_kwargs:
    config.method_kwargs.distill_epochs = PAPER_DISTILL_EPOCHS
  check_public_data(config)
  return fedproj_presets.prepare(config)


def main(argv) -> int:
  """``python experiments/cifar100.py``: the flags, then the run (common.main)."""
  choices = {"method": common.parallel_methods(), "strategy": STRATEGIES, "model": MODELS}
  return common.main(argv, __doc__.splitlines()[0], get_config, choices, prepare=prepare)
