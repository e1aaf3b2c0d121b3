"""The experiment config: its defaults (:func:`base_config`) and its checks, before any compute.

The experiment families (:mod:`fedjax_proj.configs`) own a ``get_config(preset)`` built on
:func:`base_config` and parse flags into it. :func:`validate_config` rejects impossible settings
with an error naming the fix before any data is loaded; the ``--method_kwargs`` a method accepts
are the hyperparameters its registry spec declares (``MethodSpec.hparams``).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import ml_collections

from fedjax_proj.algorithms import registry
from fedjax_proj.algorithms.distillation.fedproj import check_memory
from fedjax_proj.core import engine as engine_lib
from fedjax_proj.data.partition import parse_partition
from fedjax_proj.data.sources import KNOWN_NUM_CLASSES, canonical_name, looks_like_path
from fedjax_proj.data.sources.text import TEXT_DATASETS
from fedjax_proj.training import fields
from fedjax_proj.training.optimizers import lr_step_epochs
from fedjax_proj.training.processes import validate_processes


def base_config() -> ml_collections.ConfigDict:
  """Defaults shared by every image-classification experiment (override per experiment): every
  field of :data:`fedjax_proj.training.fields.FIELDS` at its default, and no method_kwargs."""
  c = fields.config(fields.FIELDS)
  c.method_kwargs = ml_collections.ConfigDict()
  return c


def validate_config(
  c: ml_collections.ConfigDict, table: Mapping[str, fields.Field] = fields.FL_FIELDS
) -> None:
  """Rejects invalid settings with an error naming the fix, before any compute; ``table`` is the
  entry point's field table (:mod:`fedjax_proj.training.fields`: ranges, choices and parse hooks,
  e.g. ``--client_chunk``'s)."""
  if c.method not in registry.methods():
    raise ValueError(
      f"Unknown method {c.method!r}. Valid methods: {', '.join(registry.methods())}."
    )
  engine_lib.validate_strategy(c.strategy)
  parse_partition(c.partition)
  _validate_dataset_name(c.dataset)
  # Ranges, choices and parse hooks (--optimizer, --normalization, --client_chunk...).
  fields.check_fields(c, table)
  s = fields.resolve(c, table)
  if c.clients_per_round > c.num_clients:
    raise ValueError(
      f"--clients_per_round={c.clients_per_round} exceeds --num_clients={c.num_clients}; "
      "lower clients_per_round or raise num_clients."
    )
  if s.lr_schedule == "step" and lr_step_epochs(s) < 1:
    raise ValueError(
      f"--lr_schedule=step needs --lr_step_epochs >= 1 (0 means local_epochs // 2 = "
      f"{c.local_epochs // 2}); set --lr_step_epochs or use --local_epochs >= 2."
    )
  if s.lr_schedule == "step" and c.method == "fednova":
    # FedNova's a_k probes the optimiser with one step table for every client (fednova.py); a
    # per-client epoch schedule would need a table per client size.
    raise ValueError(
      "--method=fednova derives its normalisation from a constant-lr client optimiser; drop "
      "--lr_schedule=step (use --lr_schedule=constant)."
    )
  if c.public_data and looks_like_path(c.public_data) and not Path(c.public_data).exists():
    raise ValueError(
      f"--public_data={c.public_data} does not exist; pass an existing npz file or image folder, "
      "or a dataset name such as cifar100."
    )
  validate_method_kwargs(c.method, dict(c.method_kwargs))
  if registry.needs_validation(c.method, resolved_hparams(c)) and not int(c.train_subset):
    raise ValueError(
      f"{c.method} with vote_validation=server needs held-out validation data, but "
      "--train_subset=0 trains on the whole training set; " + no_validation_fix(c.method) + "."
    )
  if s.resume and not c.output_dir:
    raise ValueError("--resume needs --output_dir=<the interrupted run's directory>.")
  for field in registry.config_kwargs(c.method):
    # One source for a value that is both a flag and a hyperparameter: the flag. Entry points move
    # a --method_kwargs value into the field (fedjax_proj/configs/common.py); a difference left here
    # would make the summary record a value the run did not use.
    if field in c.method_kwargs and c.method_kwargs[field] != c[field]:
      raise ValueError(
        f"--{field}={c[field]} and --method_kwargs {field}={c.method_kwargs[field]} disagree; "
        f"pass it once, as --{field}."
      )
  if c.public_data and c.public_size:
    # A given public subset, before its data is loaded (public_inputs checks again against the set
    # as loaded: a smaller set caps --public_size).
    check_run_memory(c, c.public_size, f"--public_size={c.public_size}")
  validate_processes(s)
  if s.tensorboard:
    from fedjax_proj.training.tensorboard import require_tensorboardx

    try:
      require_tensorboardx()
    except ImportError as e:
      raise ValueError(str(e)) from e


def check_run_memory(c, public_size: int, source: str = "the public set") -> None:
  """FedProj's memory M against ``public_size`` public examples, for a run whose method reads the
  memory field (its registry ``config_kwargs``; others ignore it): :func:`validate_config` checks a
  given ``--public_size`` before any data is loaded, ``inputs.public_inputs`` the set as loaded
  before the model is built (:func:`~fedjax_proj.algorithms.distillation.fedproj.check_memory`)."""
  if "memory_size" in registry.config_kwargs(c.method):
    check_memory(c.memory_size, public_size, source)


def parse_value(text: str):
  """A ``--method_kwargs`` value: an int, a float, true/false, or the text itself."""
  for cast in (int, float):
    try:
      return cast(text)
    except ValueError:
      pass
  return {"true": True, "false": False}.get(text.lower(), text)


def parse_method_kwargs(text: str, flag: str = "--method_kwargs") -> dict:
  """``key=value,key=value`` (the ``--method_kwargs`` flag, or ``flag``: ``--model_kwargs``) as a
  dict of parsed values.

  Raises:
    ValueError: a pair without ``=``, an empty key, or a key given twice (which value was meant
      is not knowable).
  """
  kwargs: dict = {}
  for pair in filter(None, (p.strip() for p in text.split(","))):
    key, sep, value = pair.partition("=")
    key = key.strip()
    if not sep or not key:
      raise ValueError(f"{flag} expects key=value pairs, got {pair!r}")
    if key in kwargs:
      raise ValueError(
        f"{flag} gives {key} twice ({kwargs[key]!r} and {value.strip()!r}); pass it once."
      )
    kwargs[key] = parse_value(value.strip())
  return kwargs


def resolved_hparams(c: ml_collections.ConfigDict) -> dict:
  """The method's hyperparameters from the config: a preset's ``method_defaults`` for it, under
  explicit ``method_kwargs``."""
  return {**dict(c.get("method_defaults", {}).get(c.method, {})), **dict(c.method_kwargs)}


def no_validation_fix(method: str) -> str:
  """How to give ``method`` the held-out validation data it needs (its registry spec says)."""
  return registry.spec(method).validation_fix


def _validate_dataset_name(name: str) -> None:
  """A dataset is a known name (checked against its data later) or a path to the data itself."""
  if looks_like_path(name) or canonical_name(name) in KNOWN_NUM_CLASSES:
    return
  if name in TEXT_DATASETS:  # text runs (docs/nlp.md)
    return
  raise ValueError(
    f"Unknown --dataset {name!r}; known names: {', '.join(sorted(KNOWN_NUM_CLASSES))}. For other "
    "data pass its location as --dataset=<folder or .npz path>."
  )


def validate_model_kwargs(model: str, kwargs: dict) -> None:
  """``--model_kwargs`` names options of ``model``'s factory, and a ``conv_impl`` one of
  :data:`fedjax_proj.models.conv.CONV_IMPLS` on a model with convolutions; a ValueError names the
  fix, before any data is read.

  The options are checked by building the model (a module definition, no parameters): several
  factories pass their options on as ``**options``, so their signatures do not list them.
  """
  if not kwargs:
    return
  from fedjax_proj.models import CONV_IMPLS, CONV_MODELS, MODELS

  if model not in MODELS:
    return  # an unknown --model is refused with its own line (fields.check_fields)
  if "conv_impl" in kwargs:
    impl = kwargs["conv_impl"]
    if model not in CONV_MODELS:
      raise ValueError(
        f"--model_kwargs conv_impl={impl}: --model={model} has no convolution; conv_impl applies "
        f"to {', '.join(CONV_MODELS)}."
      )
    if impl not in CONV_IMPLS:
      raise ValueError(
        f"--model_kwargs conv_impl={impl!r} is not a convolution implementation; choose one of "
        f"{', '.join(CONV_IMPLS)}, or leave it out for the backend's "
        '(docs/performance.md, "The CPU convolution kernel gradient").'
      )
  if model == "bert":
    # The text entry point sets these two from its own flags (configs/nlp.py, prepare), and
    # building the encoder may load a checkpoint, so the other BertConfig fields are checked
    # when the run builds it.
    for key, flag in (("size", "--bert_size"), ("checkpoint", "--checkpoint")):
      if key in kwargs:
        raise ValueError(f"--model_kwargs {key}=...: the encoder's {key} is {flag}; pass it there.")
    return
  if (e := _options_error(model, kwargs)) is not None:
    raise ValueError(
      f"--model_kwargs {','.join(f'{k}={v}' for k, v in kwargs.items())}: --model={model} does not "
      f"take these options ({e}); see its factory in fedjax_proj/models/."
    )


def _options_error(model: str, options: dict) -> TypeError | None:
  """The TypeError building ``model`` (a known name) with ``options`` raises, or None: the check
  is the build (a module definition, no parameters), since several factories pass their options
  on as ``**options`` and their signatures do not list them."""
  from fedjax_proj.models import get_model

  try:
    get_model(model, 2, **options)
  except TypeError as e:
    return e
  return None


def model_takes(model: str, options: dict) -> bool:
  """Whether ``model``'s factory builds with ``options``; an unknown model takes nothing."""
  from fedjax_proj.models import MODELS

  return model in MODELS and _options_error(model, options) is None


def validate_method_kwargs(method: str, kwargs: dict) -> None:
  """Unknown keys and wrongly typed values of ``--method_kwargs`` fail, listing the valid ones
  (the method's declared hyperparameters, :func:`fedjax_proj.algorithms.registry.check_hparams`)."""
  if method in registry.METHODS:
    registry.check_hparams(method, kwargs, flag="--method_kwargs")
