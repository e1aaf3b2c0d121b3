"""The paper claims ``python -m fedjax_proj.reproduce`` settles (docs/reproduction.md, "Results").

A :class:`Claim` names one experiment of a seed paper: the entry point that runs it, the methods it
compares, the paper's numbers, the orderings the paper claims, and per budget the config overrides.

Budgets: ``paper`` starts from the claim's own preset of its entry point (``Claim.preset``, e.g.
``fedgkd_paper`` for FedGKD) and changes only what the claim's table differs in (partition, public
data); ``cpu`` and ``smoke`` start from a preset too but pin every field and method hyperparameter
they depend on here, so a claim's ``cpu`` budget does not silently change when a preset or a module
default changes. Every budget resolves through the entry point's own ``resolve`` (the preset, the
overrides, then the entry point's ``prepare``), so a claim runs what its entry point runs. String
values may hold ``{data}``, the shared data folder, substituted only when a run starts (the
result's fingerprint keeps the placeholder, so results move between machines).

Each budget pre-registers its seed count (``Budget.seeds``: the verdict uses seeds 0..n-1, chosen
by the power calculation of :mod:`fedjax_proj.reproduce.protocol` from ``Budget.power_sd``).

The FedProj claims also have a ``drift`` budget: FedAvg, FedDF and FedProj only, trained into the
regime where clients forget what the global model knew (chosen from the measured pilot of
benchmarks/pilots/drift_pilot.py; docs/reproduction.md, "Drift budget"), and a ``gpu`` budget:
the drift budget three times as long, declared for a protocol v2 replication on a GPU only
(docs/reproduction.md, "The gpu budget").

The SFedKD claim on Fashion-MNIST has an ``mnist`` budget: MNIST with LeNet-5, the offline analogue
of 004's Fashion-MNIST, at a shape where FedSeq forgets the earlier clients' classes along the chain
(chosen by the pre-stated rule of benchmarks/pilots/sfedkd_pilot.py; docs/reproduction.md, "SFedKD
budget on MNIST").

One module per paper: :mod:`.fedproj` (000/001), :mod:`.fedgkd` (002), :mod:`.fot` (003),
:mod:`.sfedkd` (004) and :mod:`.pilot`, each with one ``CLAIMS`` tuple; :mod:`.common` holds the
records (:class:`.common.Claim`, :class:`.common.Budget`, ``BUDGETS``, ...), :mod:`.presets` the
budgets several papers share. This package defines only the registry, :data:`CLAIMS` (every paper
module's ``CLAIMS``, concatenated), and :func:`get_claim`; every other name is imported from the
module that defines it.

Papers: 000/001 FedProj, 002 FedGKD, 003 FOT, 004 SFedKD (the files the project was given).
"""

from __future__ import annotations

from fedjax_proj.reproduce.claims import fedgkd, fedproj, fot, pilot, sfedkd
from fedjax_proj.reproduce.claims.common import Claim

# The order --list, the claims table and docs/reproduction.md's results show the claims in: the
# headline claim of each paper first, then the table variants and text claims as they were added.
LISTED = (
  "fedproj-cifar10-dir0.3",
  "fedproj-cifar10-dir0.5",
  "fedproj-iris-pilot",
  "fot-pmnist-noniid",
  "fot-pmnist-iid",
  "sfedkd-cifar10-exdir",
  "sfedkd-fmnist-exdir",
  "fedgkd-cifar10",
  "fedgkd-cifar10-table3",
  "sfedkd-fmnist-exdir-baselines",
  "fot-pmnist-noniid-table1",
  "fot-pmnist-noniid-fedcil",
  "fot-pmnist-iid-table1",
  "fedproj-mnli-dir0.3",
  "fedproj-mnli-dir0.5",
  "fedproj-sst2-dir0.3",
  "fedproj-sst2-dir0.5",
  "fedproj-marc-dir0.3",
  "fedproj-marc-dir0.5",
  "fedgkd-agnews",
)


def _registry(paper_claims: tuple[Claim, ...], listed: tuple[str, ...]) -> dict[str, Claim]:
  """{name: claim} in ``listed`` order; a ValueError names a claim defined twice, or one that
  ``listed`` leaves out or names without a module defining it."""
  by_name: dict[str, Claim] = {}
  for c in paper_claims:
    if c.name in by_name:
      raise ValueError(f"claim {c.name!r} is defined twice; give each claim its own name")
    by_name[c.name] = c
  if set(by_name) != set(listed) or len(listed) != len(set(listed)):
    unlisted = sorted(set(by_name) - set(listed))
    undefined = sorted(set(listed) - set(by_name))
    raise ValueError(
      f"claims.LISTED must name every claim of the paper modules once: unlisted {unlisted}, "
      f"undefined {undefined}; add or remove the names in fedjax_proj/reproduce/claims/__init__.py"
    )
  return {name: by_name[name] for name in listed}


CLAIMS: dict[str, Claim] = _registry(
  fedproj.CLAIMS + pilot.CLAIMS + fot.CLAIMS + sfedkd.CLAIMS + fedgkd.CLAIMS, LISTED
)


def get_claim(name: str) -> Claim:
  """The claim called ``name``; a ValueError lists the valid names."""
  if name not in CLAIMS:
    raise ValueError(f"Unknown claim {name!r}. Valid claims: {', '.join(CLAIMS)}.")
  return CLAIMS[name]
