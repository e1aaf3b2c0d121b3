"""The pilot study of FedProj (paper 000, Section 3; partition from paper 001, C.5).

    python experiments/pilot_iris.py [--output_dir runs/pilot_iris] [--rounds 20]

Iris reduced to 2-D by PCA, three non-IID clients (client 0: 50 Setosa; client 1: 40 Versicolor +
10 Virginica; client 2: 10 Versicolor + 40 Virginica), a 3-layer MLP, SGD (lr 1e-3, momentum 0.9),
20 rounds of 5 local epochs; FedAvg, FedDF and FedProj from the same initial model. Writes
``pilot_iris.png`` (per method: each client's decision regions after its last local training, and
the global model's, with global accuracy in the titles) and ``pilot_iris.json``.

Regime (the papers leave it unstated; default = closest to their text, see PRETRAIN_STEPS and
docs/reproduction.md): ``--public`` ``iris_labelled`` (default: the 150 points with labels,
FedProj's memory loss is the cross-entropy on them, 000 Algorithm 1 line 9), ``iris`` (the 150
points unlabelled: KL to the clients' ensemble) or ``gaussian`` (1,000 unlabelled points from a
Gaussian with the mean and 1.5x the covariance of the 2-D PCA data); ``--pretrain_steps`` (default
200 full-batch Adam steps: a strong pretrained start; 0 = random); ``--batch_size`` (default 10).
``python -m fedjax_proj.reproduce fedproj-iris-pilot --sweep`` crosses them. Global accuracy is
measured on all 150 Iris points, as the paper's figure does.

The trainer (data, methods, round loop, figure) is :mod:`fedjax_proj.training.pilot`; this module
holds the flags, the one preset and the family protocol (``get_config``, ``prepare``, ``resolve``,
``main``).
"""

from __future__ import annotations

import argparse

import ml_collections

from fedjax_proj.core import ranges
from fedjax_proj.training import fields as fields_lib
from fedjax_proj.training.fields import Field
from fedjax_proj.training.pilot import PRETRAIN_STEPS, PUBLIC_DEFAULT, PUBLIC_KINDS

PRESETS = ("paper",)
METHODS = ("fedavg", "feddf", "fedproj")

# The pilot's flags, which are its whole config (training/fields.py): base_config's fields where
# they mean the same, with the pilot's defaults; fingerprint=False marks what only picks what is
# run or written (left out of default_config, so out of the reproduce tool's result fingerprints).
_SHARED = fields_lib.FIELDS
FIELDS = fields_lib.table(
  fields_lib.variant(
    _SHARED["output_dir"], default="runs/pilot_iris", help="folder of pilot_iris.json and .png"
  ),
  Field(
    "methods", "fedavg,feddf,fedproj", "comma-separated: fedavg, feddf, fedproj", fingerprint=False
  ),
  fields_lib.variant(_SHARED["rounds"], default=20, help="communication rounds"),
  fields_lib.variant(_SHARED["local_epochs"], default=5),
  fields_lib.variant(_SHARED["batch_size"], default=10),
  fields_lib.variant(_SHARED["lr"], help="client SGD learning rate (momentum 0.9), > 0"),
  Field("hidden", 32, "units of each of the MLP's two hidden layers", ranges.AT_LEAST_ONE),
  Field(
    "memory_batch", 100, "FedProj's memory batch (public points per step)", ranges.AT_LEAST_ONE
  ),
  Field("distill_epochs", 1, "server distillation epochs (FedDF, FedProj)", ranges.AT_LEAST_ONE),
  Field("distill_lr", 1e-3, "server distillation Adam learning rate (> 0)", ranges.POSITIVE),
  Field(
    "pretrain_steps",
    PRETRAIN_STEPS,
    "full-batch Adam steps on all of Iris before round 1 (0 = start from random weights)",
    ranges.COUNT,
  ),
  Field(
    "seeds",
    "0",
    "comma-separated seeds; the figure shows the first, the JSON all",
    ranges.SEED,
    fingerprint=False,
  ),
  Field("no_plot", False, "skip the figure", fingerprint=False),
  Field(
    "public",
    PUBLIC_DEFAULT,
    "public set: gaussian cover, iris (unlabelled) or iris_labelled (FedProj's g_mem is CE)",
    choices=PUBLIC_KINDS,
  ),
)
# Fields of the parser that are about output, not about the run.
OUTPUT_FIELDS = tuple(name for name, f in FIELDS.items() if not f.fingerprint)


def build_parser() -> argparse.ArgumentParser:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
  fields_lib.add_flags(p, FIELDS)
  return p


def get_config(preset: str = "paper") -> ml_collections.ConfigDict:
  """The pilot's flags at their defaults (its one preset, ``paper``: docs/reproduction.md)."""
  if preset not in PRESETS:
    raise ValueError(f"Unknown preset {preset!r}; the Iris pilot has one preset, 'paper'.")
  return ml_collections.ConfigDict(vars(build_parser().parse_args([])))


def default_config() -> dict:
  """The pilot's default run settings (the reproduce tool's ``paper`` budget): the fingerprinted
  fields of :func:`get_config`."""
  return {k: v for k, v in get_config().items() if k not in OUTPUT_FIELDS}


def method_list(c) -> list[str]:
  """``--methods`` as a list."""
  return [m.strip() for m in c.methods.split(",") if m.strip()]


def seed_list(c) -> list[int]:
  """``--seeds`` as a list (a ValueError for a non-integer)."""
  try:
    return [int(s) for s in c.seeds.split(",") if s.strip()]
  except ValueError:
    raise ValueError(f"--seeds must be comma-separated integers, got {c.seeds!r}") from None


def prepare(c):
  """The rules applied after the flags: ``--methods`` and ``--seeds`` list something, each
  entry once, every method the pilot's (a ValueError naming the fix); returns ``c``."""
  methods = method_list(c)
  if not methods:  # an unset shell variable: nothing would run, yet a JSON would be written
    raise ValueError(f"--methods={c.methods} lists no method; list some of {', '.join(METHODS)}")
  bad = [m for m in methods if m not in METHODS]
  if bad:
    raise ValueError(f"unknown method(s) {bad}; choose from {', '.join(METHODS)}")
  seeds = seed_list(c)
  if not seeds:
    raise ValueError(f"--seeds={c.seeds} lists no seed; list them, e.g. --seeds=0,1,2")
  # A method or seed listed twice would be run twice and counted twice in the mean, the spread
  # and FedProj's wins over FedAvg, as if it were another draw (the claim runner refuses it too).
  for flag, values in (("--methods", methods), ("--seeds", seeds)):
    twice = sorted({v for v in values if values.count(v) > 1})
    if twice:
      raise ValueError(f"{flag} lists {', '.join(map(str, twice))} more than once; list each once")
  return c


def resolve(preset: str = "paper", fields=None, method_kwargs=None) -> ml_collections.ConfigDict:
  """The config ``--preset=<preset>`` with these flags runs: :func:`get_config`, then ``fields``,
  checked against :data:`FIELDS`, then :func:`prepare`. The pilot's methods take no
  ``method_kwargs`` (a ValueError if given)."""
  from fedjax_proj.configs import common

  if method_kwargs:
    raise ValueError(
      f"the Iris pilot takes no method_kwargs (got {dict(method_kwargs)}); its settings are flags: "
      + ", ".join(f"--{k}" for k in FIELDS)
    )
  c = common.set_fields(get_config(preset), fields)
  fields_lib.check_fields(c, FIELDS)
  return prepare(c)


def main(argv=None) -> int:
  """``python experiments/pilot_iris.py``: the flags, then the runs
  (:func:`fedjax_proj.training.pilot.run_pilot`)."""
  from fedjax_proj.configs import common
  from fedjax_proj.training.pilot import run_pilot

  common.keep_step_memory()
  p = build_parser()
  args = fields_lib.parse_checked(p, argv, FIELDS)
  c = ml_collections.ConfigDict(vars(args))
  try:
    prepare(c)
  except ValueError as e:
    p.error(str(e))
  return run_pilot(vars(args), method_list(c), seed_list(c))
