"""CIFAR-10 (and other image datasets) under label skew: FedProj's main experiment.

    python experiments/cifar10.py --method=fedavg --preset=cpu

Presets: ``paper`` is the FedProj paper's CIFAR-10 setting (100 clients, 10% per round, 20 local
epochs, 100 rounds, ResNet-8, Dirichlet 0.3, Adam 1e-3); ``cpu`` finishes in about 15 minutes on 2
cores; ``smoke`` in under a minute.

The sequential methods (fedseq, cwc, sfedkd) are not offered here: under these parallel-FL
settings they do not learn (docs/sfedkd.md, "Entry points"); run them with
``experiments/sequential.py``, whose presets are their paper's.
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import common  # noqa: E402

from fedjax_proj.algorithms import methods  # noqa: E402
from fedjax_proj.algorithms.sequential import SEQUENTIAL_METHODS  # noqa: E402
from fedjax_proj.core.engine import STRATEGIES  # noqa: E402
from fedjax_proj.models import MODELS  # noqa: E402
from fedjax_proj.training.experiment import base_config  # noqa: E402


def get_config(preset: str = "paper"):
  c = base_config()
  if preset == "paper":
    return c
  if preset == "cpu":
    # 20 rounds x 10 clients x ~500 examples x 2 epochs = 200k example-steps: ~12 min for
    # ResNet-8 at the ~290 samples/s measured by benchmarks/strategies.py on a loaded 2-core CPU.
    c.rounds = 20
    c.local_epochs = 2
    c.eval_every = 5
    return c
  if preset == "smoke":
    c.partition = "dirichlet:0.5"
    return common.apply_smoke(c)
  raise ValueError(f"Unknown preset {preset!r}; choose one of {common.PRESETS}.")


METHODS = tuple(m for m in methods() if m not in SEQUENTIAL_METHODS)


def prepare(c):
  """Refuses the sequential methods with a pointer to their entry point."""
  if c.method in SEQUENTIAL_METHODS:
    raise ValueError(
      f"{c.method} is sequential FL and does not learn under this entry point's parallel-FL "
      'presets (docs/sfedkd.md, "Entry points"); run it with experiments/sequential.py, e.g. '
      f"python experiments/sequential.py --dataset={c.dataset} --method={c.method} --preset=cpu"
    )
  return c


if __name__ == "__main__":
  choices = {"method": (*METHODS, *SEQUENTIAL_METHODS), "strategy": STRATEGIES, "model": MODELS}
  sys.exit(common.main(sys.argv[1:], __doc__.splitlines()[0], get_config, choices, prepare=prepare))
