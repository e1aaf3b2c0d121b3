"""experiments/sequential.py's paper preset equals docs/reproduction.md's SFedKD table, row by row.

Keys: a config field (``lr``), ``sfedkd.<field>`` / ``cwc.<arg>`` (the method's hyperparameter as a
run of the preset resolves it: the preset's ``method_kwargs`` over the method's default),
``<method>.<hparam>`` for the other methods sequential.py offers (the registry's default), and
``<dataset>:<field>`` for the per-dataset rows (``params`` counts the network's parameters).
"""

from __future__ import annotations

import importlib
import inspect
from pathlib import Path

import jax
import jax.numpy as jnp

from fedjax_proj.algorithms import registry
from fedjax_proj.algorithms.sequential import cwc as cwc_lib
from fedjax_proj.algorithms.sequential.sfedkd import SFedKDConfig
from fedjax_proj.data.sources import KNOWN_NUM_CLASSES
from fedjax_proj.models import count_params, get_model
from tests.paper_table import check_table, read_tables

ROOT = Path(__file__).resolve().parents[2]


def load_experiment(name: str):
  """The config module of experiments/<name>.py (fedjax_proj/configs/<name>.py)."""
  return importlib.import_module(f"fedjax_proj.configs.{name}")


sequential = load_experiment("sequential")


def _params(config) -> int:
  shape = (28, 28, 1) if config.dataset in sequential.GRAYSCALE else (32, 32, 3)
  model = get_model(config.model, KNOWN_NUM_CLASSES[config.dataset])
  variables = jax.eval_shape(model.init, jax.random.key(0), jnp.zeros((1, *shape)))
  return count_params(variables)


def resolve(key: str):
  dataset, _, field = key.rpartition(":")
  config = sequential.prepare(sequential.get_config("paper", dataset or "cifar10"), log=print)
  if field == "params":
    return _params(config)
  if field.startswith("sfedkd."):
    name = field.removeprefix("sfedkd.")
    return config.method_kwargs.get(name, getattr(SFedKDConfig(), name))
  if field.startswith("cwc."):
    name = field.removeprefix("cwc.")
    default = inspect.signature(cwc_lib.cwc).parameters[name].default
    return config.method_kwargs.get(name, default)
  method, dot, name = field.partition(".")
  if dot and method in sequential.METHODS:  # another method's registry default (the preset's is
    return registry.declared_hparams(method)[name]  # sfedkd, whose method_kwargs these are not)
  return config[field]


def test_paper_preset_matches_the_reproduction_table():
  rows = read_tables()["sequential-paper"]
  checked = check_table(rows, resolve)
  # Every dataset the entry point offers for the paper has its network and partition checked.
  for dataset in ("cifar10", "cinic10", "fashion_mnist", "cifar100"):
    assert {f"`{dataset}:model`", f"`{dataset}:partition`"} <= {r.key for r in rows}
  assert checked >= 25
