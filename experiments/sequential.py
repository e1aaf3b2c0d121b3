"""Sequential FL under ExDir label skew: SFedKD's experiments (FedAvg, FedSeq, CWC, SFedKD).

    python experiments/sequential.py --dataset=cifar10 --method=sfedkd --preset=cpu
    python experiments/sequential.py --dataset=fashion_mnist --method=cwc --partition=exdir:2:10

Paper: Xu et al., SFedKD (papers/004), Table 1. Presets (``--dataset`` picks the model and
partition, like the paper):

* ``paper``: 100 clients, 10 per round (K = 5 teachers), 1000 rounds, 5 local epochs, batch 64,
  SGD lr 0.01 with weight decay 1e-4; CIFAR-10 AlexNet-like (``alexnet``; the paper's 8-layer
  AlexNet is not identical) ExDir(2, 0.5); Fashion-MNIST the FedAvg CNN (``cnn``; the paper uses
  LeNet-5) ExDir(2, 0.5); CIFAR-100 ``cnn`` ExDir(20, 1.0).
* ``cpu``: the same shape on a 10k-example training subset, 20 clients, 1 local epoch, 15 rounds,
  ``cnn`` (about 10-25 minutes per method on 2 cores).
* ``smoke``: seconds; checks the wiring.

Method hyperparameters go through ``--method_kwargs``: SFedKD ``num_teachers``, ``gamma``,
``beta``, ``temperature``, ``metric`` (kl/l1/l2/js); CWC ``lam``, ``decay``.
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import common  # noqa: E402

from fedjax_proj.core.engine import STRATEGIES  # noqa: E402
from fedjax_proj.models import MODELS  # noqa: E402
from fedjax_proj.training.experiment import base_config  # noqa: E402

METHODS = ("fedavg", "fedseq", "cwc", "sfedkd")
DATASETS = ("cifar10", "fashion_mnist", "cifar100")
# dataset -> (paper model, paper partition)
PAPER_SETTINGS = {
  "cifar10": ("alexnet", "exdir:2:0.5"),
  "fashion_mnist": ("cnn", "exdir:2:0.5"),
  "cifar100": ("cnn", "exdir:20:1.0"),
}


def get_config(preset: str = "paper", dataset: str = "cifar10"):
  if dataset not in PAPER_SETTINGS:
    raise ValueError(f"Unknown --dataset {dataset!r}; choose one of {', '.join(DATASETS)}.")
  c = base_config()
  c.dataset = dataset
  c.method = "sfedkd"
  c.model, c.partition = PAPER_SETTINGS[dataset]
  c.num_clients = 100
  c.clients_per_round = 10
  c.rounds = 1000
  c.local_epochs = 5
  c.batch_size = 64
  c.optimizer = "sgd"
  c.lr = 0.01
  c.momentum = 0.0
  c.weight_decay = 1e-4
  c.eval_every = 10
  if preset == "paper":
    return c
  if preset == "cpu":
    c.model = "cnn"
    c.num_clients = 20
    c.rounds = 15
    c.local_epochs = 1
    c.train_subset = 10000
    c.test_subset = 2000
    c.eval_every = 5
    return c
  if preset == "smoke":
    c.model = "cnn"
    c.num_clients = 10
    c.clients_per_round = 5
    c.rounds = 2
    c.local_epochs = 1
    c.train_subset = 2000
    c.test_subset = 500
    c.eval_every = 1
    c.method_kwargs.num_teachers = 2
    return c
  raise ValueError(f"Unknown preset {preset!r}; choose one of {common.PRESETS}.")


def main(argv) -> int:
  pre = argparse.ArgumentParser(add_help=False)
  pre.add_argument("--dataset", default="cifar10", choices=DATASETS)
  known, _ = pre.parse_known_args(argv)
  choices = {"method": METHODS, "strategy": STRATEGIES, "model": MODELS, "dataset": DATASETS}
  return common.main(
    argv,
    __doc__.splitlines()[0],
    lambda preset: get_config(preset, known.dataset),
    choices,
  )


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
