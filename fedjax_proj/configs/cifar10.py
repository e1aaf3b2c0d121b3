"""CIFAR-10 (and other image datasets) under label skew: FedProj's main experiment.

    python experiments/cifar10.py --method=fedavg --preset=cpu

Presets (each field and its source: docs/reproduction.md):

- ``paper``: FedProj's CIFAR-10 setting as papers 000/001 write it (Sec. 6.1, Algorithm 1, Tables
  3-5): 100 clients, 10% per round, 20 local epochs, 100 rounds, ``resnet10`` (the 4.9M-parameter
  network of 001 Table 5), Dirichlet 0.3 (``--partition=dirichlet:0.5`` for the other column;
  FedProj's α follows Table 3: 0 at β 0.3, 0.3 at β 0.5), Adam 1e-3, batch 64; FedProj's memory
  loss is the plain KL, |M| = 50k; server distillation 1 epoch, batch 256, T = 3. MOON uses μ = 5
  (MOON's CIFAR-10 value). Needs ``--public_data`` (CIFAR-100; the offline 20k subset also needs
  ``--memory_size=20000``).
- ``paper_code``: the same setting as the authors' code runs it (Adam with weight decay 5e-5 and
  the lr divided by 10 after half the local epochs of each round,
  memory loss at T = 3 without T², coefficient clamp 10, |M| = 12,500, distillation batch 128,
  projection only in rounds 10-89, memory batches reshuffled per pass and client, the code's
  normalisation; its two defects, the memory's integer cast and the aliased divergence anchor,
  stay off: ``--method_kwargs=int_cast_memory=true,divergence_anchor=live`` turns them on).
- ``fedgkd_paper``: FedGKD's CIFAR-10 setting (paper 002): 20 clients, 20% per round, 100 rounds,
  20 local epochs, batch 64, SGD 0.05 with momentum 0.9 and weight decay 1e-5, ResNet-8 with
  GroupNorm (16 channels per group), Dirichlet 0.1, buffer M = 5, γ = 0.2.
- ``cpu`` finishes in about 15 minutes on 2 cores; ``smoke`` in under a minute.

The sequential methods (fedseq, cwc, sfedkd) are not offered here: under these parallel-FL
settings they do not learn (docs/sfedkd.md, "Entry points"); run them with
``experiments/sequential.py``, whose presets are their paper's.
"""

from __future__ import annotations

from fedjax_proj.configs import common, image

# The image family's protocol (fedjax_proj/configs/image.py) with the dataset fixed.
DATASET = "cifar10"
FIELDS = image.FIELDS
PRESETS = image.DATASETS[DATASET]
# The methods this entry point offers: the registry's parallel-FL ones.
METHODS = common.parallel_methods()


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
  """``python experiments/cifar10.py``: the flags, then the run (image.main)."""
  return image.main(argv, DATASET, __doc__.splitlines()[0])
