"""The experiment config: its defaults (:func:`base_config`) and its checks, before any compute.

The experiment families (:mod:`fedjax_proj.configs`) own a ``get_config(preset)`` built on
:func:`base_config` and parse flags into it. :func:`validate_config` rejects impossible settings
with an error naming the fix before any data is loaded; the ``--method_kwargs`` a method accepts
are the hyperparameters its registry spec declares (``MethodSpec.hparams``).
"""

from __future__ import annotations

from pathlib import Path

import ml_collections

from fedjax_proj.algorithms import registry
from fedjax_proj.core import engine as engine_lib
from fedjax_proj.core import ranges
from fedjax_proj.data.partition import parse_partition
from fedjax_proj.data.sources import KNOWN_NUM_CLASSES, canonical_name, looks_like_path
from fedjax_proj.data.sources.text import TEXT_DATASETS
from fedjax_proj.training.optimizers import (
  LR_SCHEDULES,
  OPTIMIZERS,
  SERVER_OPTIMIZERS,
  lr_step_epochs,
)
from fedjax_proj.training.processes import validate_processes


def base_config() -> ml_collections.ConfigDict:
  """Defaults shared by every image-classification experiment (override per experiment)."""
  c = ml_collections.ConfigDict()
  c.method = "fedavg"
  c.dataset = "cifar10"
  c.data_dir = ""
  c.model = "resnet8"
  c.num_clients = 100
  c.clients_per_round = 10
  c.rounds = 100
  c.local_epochs = 20
  c.batch_size = 64
  c.partition = "dirichlet:0.3"
  c.seed = 0
  c.strategy = "auto"
  c.optimizer = "adam"
  c.lr = 1e-3
  c.momentum = 0.9
  c.weight_decay = 0.0
  # Local learning-rate schedule, restarted every round: "constant", or "step" (torch StepLR per
  # local epoch: lr · lr_step_gamma^floor(epoch / lr_step_epochs); client.epoch_step_lr).
  c.lr_schedule = "constant"
  c.lr_step_epochs = 0  # 0 = local_epochs // 2 (the FedProj code's step_size)
  c.lr_step_gamma = 0.1
  c.server_optimizer = "none"
  c.server_lr = 1.0
  c.server_momentum = 0.0
  c.augment = False
  # Input normalisation: "dataset" (the data's own channel statistics) or "code" (the FedProj
  # authors' values: CIFAR-10 std (0.2023, 0.1994, 0.2010), the public set its own statistics).
  c.normalization = "dataset"
  c.eval_every = 5
  c.eval_batch_size = 500
  c.train_subset = 0  # 0 = all
  c.test_subset = 0
  c.output_dir = ""
  c.progress = True
  # Split each round's clients over all local devices (vmap_scan only; a no-op on one device).
  c.shard_clients = True
  # Clients per chunk for large cohorts (streaming aggregation, peak memory bounded by the chunk):
  # "auto" chunks methods that support it when the cohort would not fit (training/placement.py
  # decides, with core/chunked.py's rule),
  # "none" disables chunking, an integer forces that chunk size.
  c.client_chunk = "auto"
  # Several processes (jax.distributed): every process passes the same coordinator "host:port"
  # (process 0's) and num_processes, and its own process_id. num_processes=0 lets JAX detect a
  # Cloud TPU / Slurm / Open MPI job. cpu_collectives="gloo" for CPU-only jobs ("" = JAX default).
  c.coordinator_address = ""
  c.num_processes = 1
  c.process_id = 0
  c.cpu_collectives = ""
  c.public_data = ""  # name (e.g. cifar100) or path (npz / image folder); "" = none
  # The public set's split: "train", or "train+test" (TFDS names only: 001 Sec. 6.1 distils on
  # CIFAR-100 train + test, 60k images). A local npz or folder is used as it is.
  c.public_split = "train"
  c.public_size = 0  # use only this many public examples (0 = all)
  c.memory_size = 10000
  # FedProj's lmem_global drift metric (001, C.4): a forward pass of the new global model on the
  # memory every round that trains nothing, so off unless asked; the claim runner turns it on for
  # the reports that plot it (fedjax_proj/reproduce/run.py).
  c.lmem_global = False
  c.method_kwargs = ml_collections.ConfigDict()
  # Run management: not part of the config fingerprint a resumed run must match.
  c.resume = False  # continue from output_dir's newest valid checkpoint
  c.overwrite = False  # a new run may replace the run output_dir holds
  c.checkpoint_every = 10  # rounds between checkpoints (0: only on SIGINT/SIGTERM)
  c.keep_checkpoints = 3
  c.tensorboard = False  # also write TensorBoard events (needs the tensorboard extra)
  return c


# The range of every numeric config field, declared once (fedjax_proj.core.ranges): validate_config
# checks each numeric field of a config against it, and every numeric field, listed or not, must be
# finite. Entry points with other fields pass their own additions (experiments/pmnist.py).
FIELD_RANGES: dict[str, ranges.Interval] = {
  **dict.fromkeys(
    ("num_clients", "clients_per_round", "rounds", "local_epochs", "batch_size"),
    ranges.AT_LEAST_ONE,
  ),
  **dict.fromkeys(("eval_every", "eval_batch_size", "keep_checkpoints"), ranges.AT_LEAST_ONE),
  "seed": ranges.SEED,
  "lr": ranges.POSITIVE,
  "server_lr": ranges.POSITIVE,
  "momentum": ranges.RATE,
  "server_momentum": ranges.RATE,
  "weight_decay": ranges.NON_NEGATIVE,
  "lr_step_epochs": ranges.COUNT,  # 0 = local_epochs // 2
  "lr_step_gamma": ranges.Interval(0.0, 1.0, low_open=True),
  **dict.fromkeys(("train_subset", "test_subset", "public_size"), ranges.COUNT),  # 0 = all
  "memory_size": ranges.AT_LEAST_ONE,
  "checkpoint_every": ranges.COUNT,  # 0 = only on a signal
  "num_processes": ranges.COUNT,  # 0 = detect
  "process_id": ranges.COUNT,
}
# What to suggest next to a field's range error.
FIELD_FIXES = {
  "lr": "Pass e.g. --lr=0.001 (Adam) or --lr=0.01 (SGD).",
  "train_subset": "Pass a number of examples, or 0 for the whole set.",
  "test_subset": "Pass a number of examples, or 0 for the whole set.",
  "public_size": "Pass a number of examples, or 0 for the whole set.",
  "checkpoint_every": "0 saves only on SIGINT/SIGTERM.",
}


def check_fields(c, field_ranges: dict[str, ranges.Interval] | None = None) -> None:
  """Every numeric field of ``c`` is finite and in its declared range (``FIELD_RANGES`` plus
  ``field_ranges``); the error names the flag, the range and the value.

  A string field of comma-separated numbers (e.g. ``dropout="0.2,0.5"``) is checked number by
  number when its range is declared.
  """
  declared = {**FIELD_RANGES, **(field_ranges or {})}
  for field, value in c.items():
    interval = declared.get(field, ranges.ANY)
    if ranges.is_number(value):
      ranges.check_number(f"--{field}", value, interval, FIELD_FIXES.get(field, ""))
    elif isinstance(value, str) and field in declared:
      for part in filter(None, (p.strip() for p in value.split(","))):
        try:
          number = float(part)
        except ValueError:
          raise ValueError(
            f"--{field}={value!r}: {part!r} is not a number; pass comma-separated numbers."
          ) from None
        ranges.check_number(f"--{field}", number, interval)


def check_client_chunk_flag(c) -> None:
  """``--client_chunk`` is auto, none or a positive integer (every entry point's runs read it,
  :func:`fedjax_proj.training.placement.plan_execution`)."""
  chunk = str(c.get("client_chunk", "auto")).lower()
  if chunk not in ("auto", "none") and not (chunk.isdigit() and int(chunk) >= 1):
    raise ValueError(f"--client_chunk must be auto, none or a positive integer, got {chunk!r}.")


def validate_config(c: ml_collections.ConfigDict) -> None:
  """Rejects invalid settings with an error naming the fix, before any compute."""
  if c.method not in registry.methods():
    raise ValueError(
      f"Unknown method {c.method!r}. Valid methods: {', '.join(registry.methods())}."
    )
  engine_lib.validate_strategy(c.strategy)
  parse_partition(c.partition)
  _validate_dataset_name(c.dataset)
  check_fields(c)
  if c.clients_per_round > c.num_clients:
    raise ValueError(
      f"--clients_per_round={c.clients_per_round} exceeds --num_clients={c.num_clients}; "
      "lower clients_per_round or raise num_clients."
    )
  if c.optimizer not in OPTIMIZERS:
    raise ValueError(f"Unknown --optimizer {c.optimizer!r}; choose one of {OPTIMIZERS}.")
  if c.get("normalization", "dataset") not in ("dataset", "code"):
    raise ValueError(
      f"Unknown --normalization {c.normalization!r}; choose one of ('dataset', 'code')."
    )
  if c.get("lr_schedule", "constant") not in LR_SCHEDULES:
    raise ValueError(f"Unknown --lr_schedule {c.lr_schedule!r}; choose one of {LR_SCHEDULES}.")
  if c.get("lr_schedule", "constant") == "step" and lr_step_epochs(c) < 1:
    raise ValueError(
      f"--lr_schedule=step needs --lr_step_epochs >= 1 (0 means local_epochs // 2 = "
      f"{c.local_epochs // 2}); set --lr_step_epochs or use --local_epochs >= 2."
    )
  if c.get("lr_schedule", "constant") == "step" and c.method == "fednova":
    # FedNova's a_k probes the optimiser with one step table for every client (fednova.py); a
    # per-client epoch schedule would need a table per client size.
    raise ValueError(
      "--method=fednova derives its normalisation from a constant-lr client optimiser; drop "
      "--lr_schedule=step (use --lr_schedule=constant)."
    )
  if c.server_optimizer not in SERVER_OPTIMIZERS:
    raise ValueError(
      f"Unknown --server_optimizer {c.server_optimizer!r}; choose one of {SERVER_OPTIMIZERS}."
    )
  check_client_chunk_flag(c)
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
  if c.get("resume", False) and not c.output_dir:
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
  memory_size = c.memory_size
  if (
    c.public_data
    and c.public_size
    and "memory_size" in registry.config_kwargs(c.method)
    and memory_size > c.public_size
  ):
    raise ValueError(
      f"--memory_size={memory_size} exceeds --public_size={c.public_size}; lower --memory_size "
      "or raise --public_size (0 uses the whole public set)."
    )
  validate_processes(c)
  if c.get("tensorboard", False):
    from fedjax_proj.training.tensorboard import require_tensorboardx

    try:
      require_tensorboardx()
    except ImportError as e:
      raise ValueError(str(e)) from e


def parse_value(text: str):
  """A ``--method_kwargs`` value: an int, a float, true/false, or the text itself."""
  for cast in (int, float):
    try:
      return cast(text)
    except ValueError:
      pass
  return {"true": True, "false": False}.get(text.lower(), text)


def parse_method_kwargs(text: str) -> dict:
  """``key=value,key=value`` (the ``--method_kwargs`` flag) as a dict of parsed values.

  Raises:
    ValueError: a pair without ``=``, an empty key, or a key given twice (which value was meant
      is not knowable).
  """
  kwargs: dict = {}
  for pair in filter(None, (p.strip() for p in text.split(","))):
    key, sep, value = pair.partition("=")
    key = key.strip()
    if not sep or not key:
      raise ValueError(f"--method_kwargs expects key=value pairs, got {pair!r}")
    if key in kwargs:
      raise ValueError(
        f"--method_kwargs gives {key} twice ({kwargs[key]!r} and {value.strip()!r}); pass it once."
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


def validate_method_kwargs(method: str, kwargs: dict) -> None:
  """Unknown keys and wrongly typed values of ``--method_kwargs`` fail, listing the valid ones
  (the method's declared hyperparameters, :func:`fedjax_proj.algorithms.registry.check_hparams`)."""
  if method in registry.METHODS:
    registry.check_hparams(method, kwargs, flag="--method_kwargs")
