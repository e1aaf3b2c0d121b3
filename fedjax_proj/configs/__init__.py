"""The experiments' presets and how flags resolve into a config, one module per experiment family.

As big_vision keeps ``configs/`` beside its trainer, each module here holds a family's presets and
the one protocol every family has: ``get_config(preset)``; ``prepare(config)``, the preset rules
applied after the flags; ``resolve(preset, fields, method_kwargs)``, the one function the flags,
the claim runner (:mod:`fedjax_proj.reproduce`) and the notebook turn a preset plus overrides into
a config through; and ``main(argv)``, what ``experiments/<family>.py`` runs. Nothing here trains:
the runs are :mod:`fedjax_proj.training`'s (the Iris pilot's trainer ``training/pilot.py``, the
continual benchmarks' builders ``training/continual_tasks.py``). :mod:`.image` is the one image
family (CIFAR-10, CIFAR-100, CINIC-10) keyed by dataset, whose entry points' modules fix the
dataset; :mod:`.common` holds the flag parsing the families share and the exit codes of a run
(docs/design.md, "The package and the checkout"). Each family's ``FIELDS`` is the table of its
config's fields (fedjax_proj/training/fields.py; docs/design.md, "Config fields").
"""

from __future__ import annotations

import importlib
from pathlib import PurePosixPath
from types import ModuleType
from typing import TYPE_CHECKING

if TYPE_CHECKING:
  from fedjax_proj.training.fields import Field

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

# The families whose config is a ConfigDict with a field table (FIELDS); the Iris pilot's script
# has flags of its own, outside the experiments' configs.
CONFIG_FAMILIES = tuple(f for f in FAMILIES if f != "pilot_iris")
# What a variant of a shared field may not change (training/fields.py, variant): what the field
# means for the fingerprints and for resume.
MEANING = ("type", "fingerprint", "resumable", "run_management", "added", "added_family")


def all_fields() -> dict[str, Field]:
  """Every config field of the experiment families, by name (a family's variant of a shared field
  stands for it: they differ only in default, help, range or choices).

  Raises:
    ValueError: two families' entries of one name that differ in what it means for the
      fingerprints or for resume (:data:`MEANING`); declare one of them under another name.
  """
  out: dict[str, Field] = {}
  for family in CONFIG_FAMILIES:
    for name, f in importlib.import_module(f"{__name__}.{family}").FIELDS.items():
      seen = out.setdefault(name, f)
      differ = [a for a in MEANING if getattr(seen, a) != getattr(f, a)]
      if differ:
        raise ValueError(
          f"Config field {name!r} of {family} differs from another family's in "
          f"{', '.join(differ)}; a shared field means the same everywhere (declare another name)."
        )
  return out


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
