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
benchmarks/drift_pilot.py; docs/reproduction.md, "Drift budget").

The SFedKD claim on Fashion-MNIST has an ``mnist`` budget: MNIST with LeNet-5, the offline analogue
of 004's Fashion-MNIST, at a shape where FedSeq forgets the earlier clients' classes along the chain
(chosen by the pre-stated rule of benchmarks/sfedkd_pilot.py; docs/reproduction.md, "SFedKD budget
on MNIST").

One module per paper: :mod:`.fedproj` (000/001), :mod:`.fedgkd` (002), :mod:`.fot` (003),
:mod:`.sfedkd` (004) and :mod:`.pilot`; :mod:`.common` holds the records, :mod:`.presets` the
budgets several papers share. This package re-exports every name.

Papers: 000/001 FedProj, 002 FedGKD, 003 FOT, 004 SFedKD (the files the project was given).
"""

from __future__ import annotations

from fedjax_proj.reproduce.claims.common import (
  BUDGET_ORDER,
  BUDGETS,
  LOWER_IS_BETTER,
  PAPERS,
  Ablation,
  Budget,
  Claim,
  Ordering,
  Replication,
  beats,
  budget_overrides,
)
from fedjax_proj.reproduce.claims.fedgkd import (
  FEDGKD,
  FEDGKD_AGNEWS,
  FEDGKD_CPU,
  FEDGKD_METHODS,
  FEDGKD_TABLE3,
)
from fedjax_proj.reproduce.claims.fedproj import (
  CPU_METHOD_KW,
  DRIFT_METHODS,
  FEDPROJ_ABLATIONS,
  FEDPROJ_DIR03,
  FEDPROJ_DIR05,
  FEDPROJ_METHODS,
  FEDPROJ_SD,
  FEDPROJ_SD_SOURCE,
  FEDPROJ_SEEDS,
  FEDPROJ_TABLE1,
  NLP_FEDPROJ,
  NLP_FEDPROJ_METHODS,
  NLP_PUBLIC,
  NLP_SMOKE_KW,
  TABLE2,
  _fedproj_cifar,
  _fedproj_nlp,
)
from fedjax_proj.reproduce.claims.fot import (
  FOT_ABLATIONS,
  FOT_EPS,
  FOT_IID,
  FOT_METHOD_KW,
  FOT_METHODS,
  FOT_NONIID,
  FOT_NONIID_TABLE1,
  FOT_SD,
  FOT_SD_SOURCE,
  PMNIST_CPU,
  _fot,
)
from fedjax_proj.reproduce.claims.pilot import (
  PILOT,
  PILOT_BASE,
  PILOT_METHODS,
  PILOT_SD,
  PILOT_SD_SOURCE,
)
from fedjax_proj.reproduce.claims.presets import (
  BASELINE_KW,
  CIFAR_CPU,
  CIFAR_DRIFT,
  CIFAR_GPU,
  CIFAR_SMOKE,
  DISTILL,
  FEDPROJ_KW,
  IMAGE_METHOD_KW,
  NLP_SMOKE,
  PAPER_PUBLIC,
  PUBLIC,
)
from fedjax_proj.reproduce.claims.sfedkd import (
  FMNIST_TABLE1,
  SEQ_CPU,
  SEQ_METHOD_KW,
  SEQ_MNIST,
  SEQ_SD,
  SEQ_SD_SOURCE,
  SFEDKD,
  SFEDKD_FMNIST,
  SFEDKD_FMNIST_BASELINES,
  SFEDKD_METHODS,
  _seq_smoke,
  _sfedkd,
)

__all__ = [
  "Ablation",
  "BASELINE_KW",
  "BUDGETS",
  "BUDGET_ORDER",
  "Budget",
  "CIFAR_CPU",
  "CIFAR_DRIFT",
  "CIFAR_GPU",
  "CIFAR_SMOKE",
  "CLAIMS",
  "CPU_METHOD_KW",
  "PAPERS",
  "Claim",
  "DISTILL",
  "DRIFT_METHODS",
  "FEDGKD",
  "FEDGKD_AGNEWS",
  "FEDGKD_CPU",
  "FEDGKD_METHODS",
  "FEDGKD_TABLE3",
  "FEDPROJ_ABLATIONS",
  "FEDPROJ_DIR03",
  "FEDPROJ_DIR05",
  "FEDPROJ_KW",
  "FEDPROJ_METHODS",
  "FEDPROJ_SD",
  "FEDPROJ_SD_SOURCE",
  "FEDPROJ_SEEDS",
  "FEDPROJ_TABLE1",
  "FMNIST_TABLE1",
  "FOT_ABLATIONS",
  "FOT_EPS",
  "FOT_IID",
  "FOT_METHODS",
  "FOT_METHOD_KW",
  "FOT_NONIID",
  "FOT_NONIID_TABLE1",
  "FOT_SD",
  "FOT_SD_SOURCE",
  "IMAGE_METHOD_KW",
  "LOWER_IS_BETTER",
  "NLP_FEDPROJ",
  "NLP_FEDPROJ_METHODS",
  "NLP_PUBLIC",
  "NLP_SMOKE",
  "NLP_SMOKE_KW",
  "Ordering",
  "PAPER_PUBLIC",
  "PILOT",
  "PILOT_BASE",
  "PILOT_METHODS",
  "PILOT_SD",
  "PILOT_SD_SOURCE",
  "PMNIST_CPU",
  "PUBLIC",
  "Replication",
  "SEQ_CPU",
  "SEQ_METHOD_KW",
  "SEQ_MNIST",
  "SEQ_SD",
  "SEQ_SD_SOURCE",
  "SFEDKD",
  "SFEDKD_FMNIST",
  "SFEDKD_FMNIST_BASELINES",
  "SFEDKD_METHODS",
  "TABLE2",
  "beats",
  "_fedproj_cifar",
  "_fedproj_nlp",
  "_fot",
  "_seq_smoke",
  "_sfedkd",
  "budget_overrides",
  "get_claim",
]

CLAIMS: dict[str, Claim] = {
  c.name: c
  for c in (FEDPROJ_DIR03, FEDPROJ_DIR05, PILOT, FOT_NONIID, FOT_IID, SFEDKD, SFEDKD_FMNIST, FEDGKD)
  + (FEDGKD_TABLE3, SFEDKD_FMNIST_BASELINES, FOT_NONIID_TABLE1)
  + NLP_FEDPROJ
  + (FEDGKD_AGNEWS,)
}


def get_claim(name: str) -> Claim:
  """The claim called ``name``; a ValueError lists the valid names."""
  if name not in CLAIMS:
    raise ValueError(f"Unknown claim {name!r}. Valid claims: {', '.join(CLAIMS)}.")
  return CLAIMS[name]
