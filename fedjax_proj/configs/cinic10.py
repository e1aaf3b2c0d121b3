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

from fedjax_proj.configs import common, fedproj_presets
from fedjax_proj.core.engine import STRATEGIES
from fedjax_proj.models import MODELS
from fedjax_proj.training.config import base_config

# The config's fields (training/fields.py): base_config's and the FedProj presets' switches.
FIELDS = fedproj_presets.FIELDS


def get_config(preset: str = "paper"):
  c = base_config()
  c.dataset = "cinic10"
  c.model = "resnet18"
  c.num_clients = 100
  c.clients_per_round = 10
  c.rounds = 60
  c.local_epochs = 20
  c.partition = "dirichlet:0.3"
  if preset == "paper":
    return fedproj_presets.apply_paper(c, distill_epochs=1)
  if preset == "cpu":
    c.model = "resnet8"
    c.rounds = 20
    c.local_epochs = 2
    c.train_subset = 20000
    c.test_subset = 10000
    c.memory_size = 2000
    return c
  if preset == "smoke":
    c.model = "resnet8"
    return common.apply_smoke(c)
  raise ValueError(f"Unknown preset {preset!r}; choose one of {common.PRESETS}.")


def prepare(c):
  """Preset rules applied after the flags: refuses the sequential methods
  (common.refuse_sequential), then FedProj's α follows the final --partition."""
  common.refuse_sequential(c)
  return fedproj_presets.prepare(c)


def main(argv) -> int:
  """``python experiments/cinic10.py``: the flags, then the run (common.main)."""
  choices = {"method": common.parallel_methods(), "strategy": STRATEGIES, "model": MODELS}
  return common.main(argv, __doc__.splitlines()[0], get_config, choices, prepare=prepare)
