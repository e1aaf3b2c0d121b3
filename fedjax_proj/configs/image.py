"""The image family: parallel FL under label skew on CIFAR-10, CIFAR-100 and CINIC-10, keyed by
dataset (FedProj's Table 1 settings, papers 000/001; FedGKD's CIFAR-10 setting, paper 002).

One protocol for the three entry points (``get_config``, ``prepare``, ``resolve``, ``main``, each
taking the ``dataset`` of :data:`DATASETS`); ``experiments/<dataset>.py`` runs
``fedjax_proj/configs/<dataset>.py``, a thin module that fixes the dataset and documents the
presets. Every preset field and its source: docs/reproduction.md.
"""

from __future__ import annotations

import ml_collections

from fedjax_proj.algorithms import registry
from fedjax_proj.configs import common, fedproj_presets
from fedjax_proj.core.engine import STRATEGIES
from fedjax_proj.models import MODELS
from fedjax_proj.training.config import base_config

# The config's fields (training/fields.py): base_config's and the FedProj presets' switches.
FIELDS = fedproj_presets.FIELDS

# Dataset -> the presets its entry point offers.
DATASETS: dict[str, tuple[str, ...]] = {
  "cifar10": ("paper", "paper_code", "fedgkd_paper", "cpu", "smoke"),
  "cifar100": common.PRESETS,
  "cinic10": common.PRESETS,
}
# MOON (Li, He and Song, CVPR 2021), Sec. 4.1: μ = 5 on CIFAR-10.
MOON_CIFAR10_MU = 5.0
# CIFAR-100: the methods with server-side ensemble distillation distil 3 epochs (paper 001, Sec. 6).
DISTILL_METHODS = ("fedproj", "feddf", "fedet")
PAPER_DISTILL_EPOCHS = 3


def _check(dataset: str) -> None:
  if dataset not in DATASETS:
    raise ValueError(
      f"Unknown image-family dataset {dataset!r}; choose one of {', '.join(DATASETS)}."
    )


def get_config(preset: str = "paper", dataset: str = "cifar10") -> ml_collections.ConfigDict:
  """The ``preset`` of ``dataset``'s entry point (its module docstring describes them)."""
  _check(dataset)
  if preset not in DATASETS[dataset]:
    raise ValueError(f"Unknown preset {preset!r}; choose one of {DATASETS[dataset]}.")
  return {"cifar10": _cifar10, "cifar100": _cifar100, "cinic10": _cinic10}[dataset](preset)


def _cifar10(preset: str) -> ml_collections.ConfigDict:
  c = base_config()
  if preset in ("paper", "paper_code"):
    c.model = "resnet10"
    apply = fedproj_presets.apply_paper if preset == "paper" else fedproj_presets.apply_paper_code
    apply(c, distill_epochs=1)
    c.method_defaults.moon = ml_collections.ConfigDict({"mu": MOON_CIFAR10_MU})
    return c
  if preset == "fedgkd_paper":
    return fedgkd_paper(c)
  if preset == "cpu":
    # 20 rounds x 10 clients x ~500 examples x 2 epochs = 200k example-steps: ~12 min for ResNet-8
    # at the ~290 samples/s measured by benchmarks/perf/strategies.py on a loaded 2-core CPU.
    c.rounds = 20
    c.local_epochs = 2
    c.eval_every = 5
    return c
  c.partition = "dirichlet:0.5"
  return common.apply_smoke(c)


def fedgkd_paper(c: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """FedGKD's CIFAR-10 setting (paper 002, Sec. 5, "Implementation Details")."""
  c.method = "fedgkd"
  c.num_clients = 20
  c.clients_per_round = 4  # C = 0.2
  c.rounds = 100
  c.local_epochs = 20
  c.batch_size = 64
  c.train_subset = 45_000  # "we use 90% of the data as the training dataset"
  c.partition = "dirichlet:0.1"  # Table 1 columns α = 0.1 / 0.5 / 1: --partition for the others
  c.optimizer = "sgd"
  c.lr = 0.05
  c.momentum = 0.9
  c.weight_decay = 1e-5
  c.model = "resnet8"
  # GroupNorm with 16 channels per group ("we set the channels of each group as 16").
  c.model_kwargs = ml_collections.ConfigDict({"norm": "group", "group_size": 16})
  c.method_defaults = ml_collections.ConfigDict(
    {
      "fedgkd": {"buffer_size": 5, "gamma": 0.2, "temperature": 1.0},
      # L_m: each buffered model's validation loss on the 5,000 examples train_subset leaves out.
      "fedgkd_vote": {
        "buffer_size": 5,
        "lam": 0.1,
        "temperature": 1.0,
        "vote_validation": "server",
      },
      "moon": {"mu": MOON_CIFAR10_MU},
      # FedGKD+ is FedGKD on MOON's head (002 Evaluation Methods): FedGKD's γ, M and T.
      "fedgkd_plus": {"buffer_size": 5, "gamma": 0.2, "temperature": 1.0},
      # 002 Parameter Setting: "for the distillation coefficient, we set it as 0.1"; its
      # temperature value is missing there, and the authors' --temperature defaults to 1.
      "feddistill_plus": {"beta": 0.1, "temperature": 1.0},
      # 002 Parameter Setting: a 2-layer MLP generator of hidden width 512 for ResNet-8; the local
      # coefficient is "tuned from {0.1, 1, 10}" without the chosen value: the library's 1.
      "fedgen": {"hidden_dim": 512},
    }
  )
  return c


def _cifar100(preset: str) -> ml_collections.ConfigDict:
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
    return _cpu(c, rounds=30, train_subset=10000)
  c.model = "resnet8"
  return common.apply_smoke(c)


def _cinic10(preset: str) -> ml_collections.ConfigDict:
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
    c.test_subset = 10000
    return _cpu(c, rounds=20, train_subset=20000)
  c.model = "resnet8"
  return common.apply_smoke(c)


def _cpu(c: ml_collections.ConfigDict, *, rounds: int, train_subset: int):
  """The cpu preset of CIFAR-100 and CINIC-10 (one origin, 3ca68d9): ResNet-8, 2 local epochs,
  ``rounds`` rounds on ``train_subset`` training examples, and a 2,000-example memory."""
  c.model = "resnet8"
  c.rounds = rounds
  c.local_epochs = 2
  c.train_subset = train_subset
  c.memory_size = 2000
  return c


def check_public_data(config: ml_collections.ConfigDict) -> None:
  """CIFAR-100's public set: a missing or overlapping one is refused with what the preset
  expects (ImageNet-100 at 32x32, disjoint from CIFAR-100)."""
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


def prepare(c: ml_collections.ConfigDict, dataset: str = "cifar10") -> ml_collections.ConfigDict:
  """Preset rules applied after the flags.

  Refuses the sequential methods with a pointer to their entry point (common.refuse_sequential);
  on CIFAR-100 sets the distillation epochs (unless ``--method_kwargs`` does) and checks the
  public set; then FedProj's α follows the final ``--partition`` (fedproj_presets.prepare).
  """
  _check(dataset)
  common.refuse_sequential(c)
  if dataset == "cifar100":
    if c.method in DISTILL_METHODS and "distill_epochs" not in c.method_kwargs:
      c.method_kwargs.distill_epochs = PAPER_DISTILL_EPOCHS
    check_public_data(c)
  return fedproj_presets.prepare(c)


def resolve(preset: str, fields=None, method_kwargs=None, dataset: str = "cifar10"):
  """The config ``--preset=<preset>`` of ``experiments/<dataset>.py`` with these flags runs
  (common.resolve, then :func:`prepare`); the claim runner (fedjax_proj/reproduce/resolve.py)
  and experiments/quickstart.ipynb resolve through it too."""
  _check(dataset)
  return common.resolve(
    lambda p: get_config(p, dataset),
    preset,
    fields,
    method_kwargs,
    lambda c: prepare(c, dataset),
  )


def main(argv, dataset: str = "cifar10", description: str | None = None) -> int:
  """``python experiments/<dataset>.py``: the flags, then the run (common.main)."""
  _check(dataset)
  choices = {"method": common.parallel_methods(), "strategy": STRATEGIES, "model": MODELS}
  return common.main(
    argv,
    description or __doc__.splitlines()[0],
    lambda p: get_config(p, dataset),
    choices,
    prepare=lambda c: prepare(c, dataset),
    presets=DATASETS[dataset],
  )
