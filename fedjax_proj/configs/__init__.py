"""The experiments' presets and how flags resolve into a config, one module per experiment family.

As big_vision keeps ``configs/`` beside its trainer, each module here owns a family's
``get_config(preset)``, the preset rules applied after the flags (``prepare``) and ``resolve``, the
one function the flags, the claim runner (:mod:`fedjax_proj.reproduce`) and the notebook turn a
preset plus overrides into a config through; and ``main(argv)``, what ``experiments/<family>.py``
runs. :mod:`.common` holds the flag parsing they share and the exit codes of a run
(docs/design.md, "The package and the checkout").
"""

from __future__ import annotations

import importlib
from pathlib import PurePosixPath
from types import ModuleType

# The experiment families: experiments/<name>.py runs fedjax_proj.configs.<name>.main.
FAMILIES = (
  "cifar10",
  "cifar100",
  "cinic10",
  "sequential",
  "nlp",
  "pmnist",
  "split_cifar100",
  "pilot_iris",
  "quickstart",
)


def for_entry(entry: str) -> ModuleType:
  """The config module of an entry point named as the docs name it (``experiments/cifar10.py``,
  a claim's ``entry``); a ValueError names the families for any other."""
  name = PurePosixPath(entry).stem
  if PurePosixPath(entry).parent.name != "experiments" or name not in FAMILIES:
    raise ValueError(
      f"{entry!r} is not an experiment entry point; choose one of "
      + ", ".join(f"experiments/{f}.py" for f in FAMILIES)
    )
  return importlib.import_module(f"{__name__}.{name}")
