"""What a claim's run computes: its resolved config, and the fingerprint of that config.

A run's config is resolved by its entry point's config module (``experiments/<name>.py`` runs
:mod:`fedjax_proj.configs`'s ``<name>``: its presets, ``resolve`` and ``prepare``) plus the claim's
budget overrides (:mod:`fedjax_proj.reproduce.claims`). Its fingerprint (SHA-256 of the resolved
config, with the ``{data}`` placeholder kept and run-management fields cleared) decides whether a
result on disk is of the planned config (docs/reproduction.md, "Results").
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from fedjax_proj.configs import all_fields
from fedjax_proj.reproduce.claims.common import Claim, budget_overrides
from fedjax_proj.reproduce.provenance import REPO_ROOT
from fedjax_proj.reproduce.runners import load_entry
from fedjax_proj.training.fields import UNSET

# Every config field of the experiment families, each declared once with what it means for a
# result's fingerprint (fedjax_proj/training/fields.py, Field; the families' FIELDS).
FIELDS = all_fields()
# Fields that change how a run is managed, not what it computes (Field.run_management).
RUN_FIELDS = tuple(name for name, f in FIELDS.items() if f.run_management)


def default_data_root() -> Path:
  """The shared data folder (fedjax_proj.data.sources.find_shared_data), else a folder named
  ``shared-data-not-found`` (configs still resolve; their paths then fail validation)."""
  from fedjax_proj.data.sources import find_shared_data

  return find_shared_data() or REPO_ROOT.parent / "shared-data-not-found"


def resolve_config(
  claim: Claim, budget: str, method: str, seed: int, data_root: Path | None = None
) -> dict[str, Any]:
  """The full config of one run, with ``{data}`` placeholders kept.

  Image and continual claims resolve through their entry point's own ``resolve`` (the budget's
  preset, the overrides, the entry point's ``prepare``), exactly as its flags do; the pilot merges
  the overrides into its ``default_config``. The entry point checks paths, so ``{data}`` is
  ``data_root`` (default :func:`default_data_root`) while it resolves, then put back.
  """
  if method not in claim.runnable:
    raise ValueError(
      f"Method {method!r} is not part of claim {claim.name!r}; choose from "
      f"{', '.join(claim.runnable)}."
    )
  overrides = budget_overrides(claim, budget, method)
  ablation = claim.ablations.get(method)
  method = ablation.base if ablation else method
  budget_model_options = dict(overrides.pop("model_options", {}))
  entry = load_entry(claim)
  if claim.kind == "pilot":
    config = {**entry.default_config(), **overrides, "method": method, "seed": seed}
    config.pop("output_dir", None)
    return config
  root = str(data_root or default_data_root())
  kwargs = overrides.pop("method_kwargs", {})
  fields = {**substitute_data(overrides, Path(root)), "method": method, "seed": seed}
  try:
    config = entry.resolve(claim.preset_of(budget), fields, kwargs, **claim.entry_kwargs)
  except ValueError as e:
    raise ValueError(
      f"{claim.name} {budget} {method}: {e} Fix the claim in fedjax_proj/reproduce/claims/."
    ) from e
  if "lmem_global" not in fields and "lmem_global" in config:
    # The reports plot it (report/, lmem_vs_accuracy.png and the diagnostics table).
    config.lmem_global = True
  out = config.to_dict()
  for field in RUN_FIELDS:  # set by the runner; not part of what a run computes
    out.pop(field, None)
  # The model options the run builds with beyond its preset's (the registry's for the method, e.g.
  # MOON's projection head, then the budget's): on record, so the fingerprint says which model the
  # run builds (training/experiment.py builds it from the same merge).
  from fedjax_proj.algorithms.registry import model_kwargs

  options = {**model_kwargs(method), **dict(out.get("model_kwargs", {})), **budget_model_options}
  if options:
    out["model_kwargs"] = options
  return {k: v.replace(root, "{data}") if isinstance(v, str) else v for k, v in out.items()}


def effective_hparams(config: dict[str, Any]) -> dict[str, Any]:
  """The method's hyperparameters a run uses: the registry defaults, then the preset's
  ``method_defaults`` for the method, then ``method_kwargs`` (training/config.resolved_hparams)."""
  from fedjax_proj.algorithms.registry import config_kwargs, declared_hparams

  # Hyperparameters read from config fields (e.g. FedProj's memory M) show as those fields.
  fields = config_kwargs(config["method"])
  declared = declared_hparams(config["method"]) or {}
  declared = {k: v for k, v in declared.items() if k not in fields}
  defaults = dict(config.get("method_defaults", {}).get(config["method"], {}))
  return {**declared, **defaults, **dict(config.get("method_kwargs", {}))}


# Config fields added after results were first recorded, with the value that reproduces the runs
# made before them (Field.added). A field at this value is left out of the fingerprint, so adding
# an option does not turn every committed result stale; set to anything else it counts like any
# other field.
ADDED_FIELDS = {
  name: f.added for name, f in FIELDS.items() if f.added is not UNSET and not f.added_family
}
# Config fields added to one method family's entry points after its results were first recorded,
# where other families had them all along (and their results' fingerprints hold them): family ->
# {field: the value every earlier run of the family computed with} (Field.added_family), left out
# of the fingerprint of that family's configs at that value, as ADDED_FIELDS.
ADDED_FAMILY_FIELDS = {
  family: {
    name: f.added for name, f in FIELDS.items() if f.added is not UNSET and f.added_family == family
  }
  for family in sorted({f.added_family for f in FIELDS.values() if f.added_family})
}
# Method hyperparameters added after results were first recorded, with the value every earlier run
# of that method computed with: left out of the fingerprint at that value, as ADDED_FIELDS.
ADDED_HPARAMS = {
  # FOT's threshold rule (docs/fot.md): every FOT run before the setting used the authors' rule.
  ("fot", "threshold_rule"): "authors",
  # SFedKD's ablation switches (004 Tables 2-3; docs/methods.md, "SFedKD"): every earlier run
  # computed Eq. 5's weights and Algorithm 1's selection.
  ("sfedkd", "uniform_g"): False,
  ("sfedkd", "uniform_h"): False,
  ("sfedkd", "selection"): "greedy",
}
# Model options a method's runs built without recording them, with the value they built: left out
# of the fingerprint at that value, as ADDED_FIELDS. MOON's runs before the parity fix
# (docs/parity.md, "What the rows found", MOON) computed the logits from the encoder's features
# and recorded no model_kwargs.
ADDED_MODEL_KWARGS = {
  ("moon", "projection_dim"): 256,
  ("moon", "classifier_on_projection"): False,
}
# Fields that only choose method hyperparameters' defaults, which the resolved ``method_kwargs``
# (or ``method_defaults``) already hold, or only choose what a run writes (TensorBoard event
# files): they compute nothing themselves (Field.fingerprint). Unlike RUN_FIELDS, results record
# them.
DEFAULT_ONLY_FIELDS = tuple(
  name for name, f in FIELDS.items() if not f.fingerprint and not f.run_management
)


def _added_fields(method: str | None) -> dict[str, Any]:
  """:data:`ADDED_FIELDS`, with :data:`ADDED_FAMILY_FIELDS` of ``method``'s family."""
  from fedjax_proj.algorithms.registry import methods

  family = {
    k: v
    for fam, fields in ADDED_FAMILY_FIELDS.items()
    if method in methods((fam,))
    for k, v in fields.items()
  }
  return {**ADDED_FIELDS, **family}


def canonical(config: dict[str, Any]) -> dict[str, Any]:
  """What a config computes: the preset's ``method_defaults`` for the run's method folded into
  ``method_kwargs`` (the other methods' defaults dropped), :data:`DEFAULT_ONLY_FIELDS` dropped,
  and :data:`ADDED_FIELDS`, :data:`ADDED_FAMILY_FIELDS`, :data:`ADDED_HPARAMS` and
  :data:`ADDED_MODEL_KWARGS` at their earlier value left out."""
  c = {k: v for k, v in config.items() if k not in DEFAULT_ONLY_FIELDS}
  defaults = c.pop("method_defaults", None)
  if defaults is not None:
    c["method_kwargs"] = {
      **dict(defaults.get(c.get("method"), {})),
      **dict(c.get("method_kwargs", {})),
    }
  if "method_kwargs" in c:
    c["method_kwargs"] = {
      k: v
      for k, v in dict(c["method_kwargs"]).items()
      if ADDED_HPARAMS.get((c.get("method"), k), object()) != v
    }
  method = c.get("method")
  if "model_kwargs" in c and any(m == method for m, _ in ADDED_MODEL_KWARGS):
    kept = {
      k: v
      for k, v in dict(c["model_kwargs"]).items()
      if ADDED_MODEL_KWARGS.get((method, k), object()) != v
    }
    if kept:
      c["model_kwargs"] = kept
    else:  # those runs recorded no model_kwargs at all
      del c["model_kwargs"]
  added = _added_fields(method)
  return {k: v for k, v in c.items() if k not in added or v != added[k]}


def fingerprint(config: dict[str, Any], deviations: tuple[str, ...] | list[str] = ()) -> str:
  """SHA-256 (16 hex digits) of :func:`canonical` of the resolved config, and of the run's
  deviations of arithmetic or data (:func:`arithmetic_deviations`, :func:`data_deviations`) when
  it has any: a result's ``fingerprint`` says what it computed, while ``status`` and the report
  compare the config's alone (a deviating run is the budget's run, labelled and paired only with
  runs of the same deviations, report/)."""
  content: dict[str, Any] = canonical(config)
  if deviations:
    content = {"config": content, "deviations": sorted(deviations)}
  text = json.dumps(content, sort_keys=True, default=str)
  return hashlib.sha256(text.encode()).hexdigest()[:16]


def substitute_data(config: dict[str, Any], data_root: Path) -> dict[str, Any]:
  """Replaces ``{data}`` in string values by the shared data folder."""
  return {
    k: v.replace("{data}", str(data_root)) if isinstance(v, str) else v for k, v in config.items()
  }
