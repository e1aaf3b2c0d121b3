"""Config-driven experiments: build data, model, algorithm and strategy from one ConfigDict, run.

Experiments (``experiments/*.py``) own a ``get_config(preset)`` and parse flags into it; this
module only reads the config object it is given. :func:`validate_config` rejects impossible
settings before any data is loaded; data-dependent checks (the partition, the public set against
``memory_size``) run before the model is built or anything is compiled.

Each run's ``output_dir`` holds ``metrics.jsonl``, ``summary.json``, ``final_variables.npz``,
``checkpoints/`` (see :mod:`fedjax_proj.training.checkpoint`; ``resume=True`` continues from the
newest valid one) and, with ``tensorboard=True``, ``tensorboard/`` event files.

Several processes (hosts, or CPU processes on one machine): every process runs the same command
with its own ``process_id`` and the same ``coordinator_address``, ``num_processes`` and
``output_dir``; the round's client axis is sharded over the devices of all processes and only
process 0 writes outputs (docs/performance.md, "Several hosts").
"""

from __future__ import annotations

import inspect
import sys
import time
from pathlib import Path

import jax
import ml_collections
import numpy as np
import optax

from fedjax_proj.algorithms import registry
from fedjax_proj.algorithms.base import make_round
from fedjax_proj.core import distributed, sharding
from fedjax_proj.core import engine as engine_lib
from fedjax_proj.core.chunked import auto_client_chunk, make_chunked_round, tree_bytes
from fedjax_proj.core.rounds import streaming_of
from fedjax_proj.data import pipeline
from fedjax_proj.data.federated import FederatedData
from fedjax_proj.data.partition import parse_partition, partition
from fedjax_proj.data.sources import (
  KNOWN_NUM_CLASSES,
  canonical_name,
  expected_format,
  load_dataset,
  looks_like_path,
)
from fedjax_proj.models import get_model
from fedjax_proj.models.base import count_params
from fedjax_proj.training import rundir
from fedjax_proj.training.checkpoint import Checkpointer, config_fingerprint
from fedjax_proj.training.evaluate import make_evaluator
from fedjax_proj.training.loop import train

OPTIMIZERS = ("sgd", "adam")
LR_SCHEDULES = ("constant", "step")
CPU_COLLECTIVES = ("", "gloo", "mpi")
SERVER_OPTIMIZERS = ("none", "sgd", "adam")


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
  c.eval_every = 5
  c.eval_batch_size = 500
  c.train_subset = 0  # 0 = all
  c.test_subset = 0
  c.output_dir = ""
  c.progress = True
  # Split each round's clients over all local devices (vmap_scan only; a no-op on one device).
  c.shard_clients = True
  # Clients per chunk for large cohorts (streaming aggregation, peak memory bounded by the chunk):
  # "auto" chunks methods that support it when the cohort would not fit (core/chunked.py),
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
  c.public_size = 0  # use only this many public examples (0 = all)
  c.memory_size = 10000
  c.method_kwargs = ml_collections.ConfigDict()
  # Run management: not part of the config fingerprint a resumed run must match.
  c.resume = False  # continue from output_dir's newest valid checkpoint
  c.overwrite = False  # a new run may replace the run output_dir holds
  c.checkpoint_every = 10  # rounds between checkpoints (0: only on SIGINT/SIGTERM)
  c.keep_checkpoints = 3
  c.tensorboard = False  # also write TensorBoard events (needs the tensorboard extra)
  return c


def validate_config(c: ml_collections.ConfigDict) -> None:
  """Rejects invalid settings with an error naming the fix, before any compute."""
  if c.method not in registry.methods():
    raise ValueError(
      f"Unknown method {c.method!r}. Valid methods: {', '.join(registry.methods())}."
    )
  engine_lib.validate_strategy(c.strategy)
  parse_partition(c.partition)
  _validate_dataset_name(c.dataset)
  for field in ("num_clients", "clients_per_round", "rounds", "local_epochs", "batch_size"):
    if int(c[field]) < 1:
      raise ValueError(f"--{field} must be >= 1, got {c[field]}.")
  if c.clients_per_round > c.num_clients:
    raise ValueError(
      f"--clients_per_round={c.clients_per_round} exceeds --num_clients={c.num_clients}; "
      "lower clients_per_round or raise num_clients."
    )
  if c.optimizer not in OPTIMIZERS:
    raise ValueError(f"Unknown --optimizer {c.optimizer!r}; choose one of {OPTIMIZERS}.")
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
  chunk = str(c.get("client_chunk", "auto")).lower()
  if chunk not in ("auto", "none") and not (chunk.isdigit() and int(chunk) >= 1):
    raise ValueError(f"--client_chunk must be auto, none or a positive integer, got {chunk!r}.")
  if c.eval_every < 1:
    raise ValueError("--eval_every must be >= 1.")
  if not c.lr > 0:
    raise ValueError(f"--lr must be > 0, got {c.lr}; e.g. --lr=0.001 (Adam) or --lr=0.01 (SGD).")
  for field in ("train_subset", "test_subset", "public_size"):
    if int(c.get(field, 0)) < 0:
      raise ValueError(
        f"--{field} must be >= 0 (0 uses the whole set), got {c[field]}; pass a number of "
        "examples or 0."
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
      "--train_subset=0 trains on the whole training set; " + _no_validation_fix(c.method) + "."
    )
  if c.get("checkpoint_every", 0) < 0:
    raise ValueError("--checkpoint_every must be >= 0 (0 saves only on SIGINT/SIGTERM).")
  if c.get("keep_checkpoints", 1) < 1:
    raise ValueError("--keep_checkpoints must be >= 1.")
  if c.get("resume", False) and not c.output_dir:
    raise ValueError("--resume needs --output_dir=<the interrupted run's directory>.")
  memory_size = c.method_kwargs.get("memory_size", c.memory_size)
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
  _validate_processes(c)
  if c.get("tensorboard", False):
    from fedjax_proj.training.tensorboard import require_tensorboardx

    try:
      require_tensorboardx()
    except ImportError as e:
      raise ValueError(str(e)) from e


def resolved_hparams(c: ml_collections.ConfigDict) -> dict:
  """The method's hyperparameters from the config: a preset's ``method_defaults`` for it, under
  explicit ``method_kwargs``."""
  return {**dict(c.get("method_defaults", {}).get(c.method, {})), **dict(c.method_kwargs)}


def _no_validation_fix(method: str) -> str:
  return registry.spec(method).validation_fix


def _validate_dataset_name(name: str) -> None:
  """A dataset is a known name (checked against its data later) or a path to the data itself."""
  if looks_like_path(name) or canonical_name(name) in KNOWN_NUM_CLASSES:
    return
  raise ValueError(
    f"Unknown --dataset {name!r}; known names: {', '.join(sorted(KNOWN_NUM_CLASSES))}. For other "
    "data pass its location as --dataset=<folder or .npz path>."
  )


def method_hparams(method: str) -> dict[str, object] | None:
  """The hyperparameters ``--method_kwargs`` may set for ``method``, with their defaults.

  Read from the factory the method's registry ``build`` forwards its ``**hparams`` to (its
  signature is the single source of truth), plus the config fields the method consumes
  (``MethodSpec.config_kwargs``). None when that cannot be determined (e.g. a user-registered
  method).
  """
  import ast  # noqa: PLC0415
  import importlib  # noqa: PLC0415
  import textwrap  # noqa: PLC0415

  if method not in registry.METHODS:
    return None
  build = registry.spec(method).build
  build = getattr(build, "func", build)  # a functools.partial (one build serving two names)
  module = importlib.import_module(build.__module__)
  try:
    tree = ast.parse(textwrap.dedent(inspect.getsource(build)))
  except (OSError, TypeError, SyntaxError):
    return None
  rest = next((p.name for p in inspect.signature(build).parameters.values() if p.kind == 4), None)
  for node in ast.walk(tree):
    if not isinstance(node, ast.Call):
      continue
    forwards = any(
      k.arg is None and isinstance(k.value, ast.Name) and k.value.id == rest for k in node.keywords
    )
    if not forwards or not isinstance(node.func, ast.Name):
      continue
    factory = getattr(module, node.func.id, None)
    if factory is None:
      return None
    explicit = {k.arg for k in node.keywords if k.arg is not None} | {"method"}
    params = list(inspect.signature(factory).parameters.values())[len(node.args) :]
    out = {
      p.name: p.default
      for p in params
      if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and p.name not in explicit
    }
    if any(p.kind == p.VAR_KEYWORD for p in params):
      return None  # the factory forwards further: accept anything
    return out
  # ``**hparams`` is never forwarded to a factory (e.g. fedseq, which refuses any): none accepted.
  return {} if rest is not None else None


def _type_ok(value, default) -> bool:
  if default is None or isinstance(default, tuple | list | dict):
    return True
  if isinstance(default, bool):
    return isinstance(value, bool)
  if isinstance(default, float):
    return isinstance(value, int | float) and not isinstance(value, bool)
  if isinstance(default, int):
    return isinstance(value, int) and not isinstance(value, bool)
  return isinstance(value, type(default))


def describe_method_hparams(method: str) -> str:
  """``key=default, ...`` of :func:`method_hparams`, for help texts and errors."""
  hparams = method_hparams(method)
  if hparams is None:
    return "(not introspectable)"
  if not hparams:
    return "(none)"
  return ", ".join(
    f"{k}={'<required>' if v is inspect.Parameter.empty else v!r}" for k, v in hparams.items()
  )


def validate_method_kwargs(method: str, kwargs: dict) -> None:
  """Unknown keys and wrongly typed values of ``--method_kwargs`` fail, listing the valid ones."""
  if not kwargs or method not in registry.METHODS:
    return
  hparams = method_hparams(method)
  if hparams is None:
    return
  accepted = f"{method} accepts: {describe_method_hparams(method)}"
  unknown = sorted(set(kwargs) - set(hparams))
  if unknown:
    raise ValueError(
      f"--method_kwargs: unknown key(s) {', '.join(unknown)} for --method={method}; {accepted}."
    )
  for key, value in kwargs.items():
    default = hparams[key]
    if default is not inspect.Parameter.empty and not _type_ok(value, default):
      raise ValueError(
        f"--method_kwargs: {key}={value!r} is a {type(value).__name__} but {method}'s {key} "
        f"takes a {type(default).__name__} (default {default!r}); {accepted}."
      )


def check_dataset(ds, name: str, where: str) -> None:
  """Checks data loaded for a known ``--dataset`` name has that dataset's image shape and classes.

  Raises:
    ValueError: naming what the data is, what the name expects, and the two ways to fix it.
  """
  expected = expected_format(name)
  if expected is None:
    return
  shape, classes = expected
  got = (tuple(ds.images.shape[1:]), int(ds.num_classes))
  if got != (shape, classes):
    fmt = lambda s, k: f"examples of shape {'x'.join(map(str, s))} and {k} classes"
    raise ValueError(
      f"--dataset={name} expects {fmt(shape, classes)}, but the data from {where} has "
      f"{fmt(*got)}. Point --data_dir at {name}'s data, or pass the --dataset this data is."
    )


def _validate_processes(c: ml_collections.ConfigDict) -> None:
  """The process-layout flags (device-count checks run after jax.distributed is initialised)."""
  n = int(c.get("num_processes", 1))
  pid = int(c.get("process_id", 0))
  address = c.get("coordinator_address", "")
  if c.get("cpu_collectives", "") not in CPU_COLLECTIVES:
    raise ValueError(
      f"--cpu_collectives must be one of {CPU_COLLECTIVES} ('' = JAX's default), got "
      f"{c.cpu_collectives!r}."
    )
  if n < 0:
    raise ValueError(f"--num_processes must be >= 1 (or 0 to auto-detect a cluster), got {n}.")
  if n == 1:
    if pid != 0:
      raise ValueError(f"--process_id={pid} needs --num_processes > {pid}; a single process is 0.")
    return
  if n == 0 and (address or pid):
    raise ValueError(
      "--num_processes=0 lets JAX detect the cluster (Cloud TPU, Slurm, Open MPI): leave "
      "--coordinator_address and --process_id unset, or pass all three explicitly."
    )
  if n > 1:
    if not 0 <= pid < n:
      raise ValueError(
        f"--process_id={pid} is out of range for --num_processes={n}; give each process a "
        f"distinct id in 0..{n - 1}."
      )
    if ":" not in address:
      raise ValueError(
        f"--num_processes={n} needs --coordinator_address=<host:port> of process 0 (the same on "
        f"every process), e.g. 10.0.0.1:1234; got {address!r}."
      )
  if not c.output_dir:
    raise ValueError(
      "A multi-process run needs an explicit --output_dir on a filesystem every process sees "
      "(the default name is timestamped per process)."
    )
  if not c.get("shard_clients", True):
    raise ValueError(
      "--num_processes > 1 shards the clients over all processes' devices; drop "
      "--shard_clients=false."
    )
  if c.strategy not in ("auto", "vmap_scan"):
    raise ValueError(
      f"A multi-process run needs --strategy=vmap_scan (the sharded round), got {c.strategy!r}."
    )


def init_processes(c: ml_collections.ConfigDict) -> bool:
  """Joins the multi-process job the config describes (no-op for one process).

  Must run before any JAX computation. Returns True when several processes run.
  """
  n = int(c.get("num_processes", 1))
  if n == 1:
    return False
  distributed.initialize(
    c.coordinator_address or None,
    n or None,
    int(c.process_id) if n else None,
    cpu_collectives=c.get("cpu_collectives", "") or None,
  )
  return jax.process_count() > 1


def lr_step_epochs(c: ml_collections.ConfigDict) -> int:
  """Epochs between local lr decays: ``lr_step_epochs``, or local_epochs // 2 when it is 0."""
  return int(c.get("lr_step_epochs", 0)) or int(c.local_epochs) // 2


def make_optimizer(
  name: str,
  lr: float,
  momentum: float,
  weight_decay: float,
  schedule: str = "constant",
  local_epochs: int = 1,
  step_epochs: int = 1,
  gamma: float = 0.1,
):
  """The client optimiser; ``schedule="step"`` wraps it in :func:`client.epoch_step_lr`."""
  if name == "sgd":
    opt = optax.sgd(lr, momentum=momentum or None)
  else:
    opt = optax.adam(lr)
  if weight_decay:
    opt = optax.chain(optax.add_decayed_weights(weight_decay), opt)
  if schedule == "step":
    from fedjax_proj.algorithms.client import epoch_step_lr  # noqa: PLC0415

    opt = epoch_step_lr(opt, local_epochs, step_epochs, gamma)
  return opt


def client_optimizer(c: ml_collections.ConfigDict):
  """:func:`make_optimizer` from the config's optimiser and local-schedule fields."""
  return make_optimizer(
    c.optimizer,
    c.lr,
    c.momentum,
    c.weight_decay,
    schedule=c.get("lr_schedule", "constant"),
    local_epochs=c.local_epochs,
    step_epochs=lr_step_epochs(c),
    gamma=c.get("lr_step_gamma", 0.1),
  )


def make_server_optimizer(c: ml_collections.ConfigDict):
  if c.server_optimizer == "none":
    return None
  if c.server_optimizer == "sgd":
    return optax.sgd(c.server_lr, momentum=c.server_momentum or None)
  return optax.adam(c.server_lr)


def _subset_indices(size: int, n: int, seed: int) -> np.ndarray:
  """The sorted indices a ``train_subset``/``test_subset`` of ``n`` keeps (all when n is 0)."""
  if not n or n >= size:
    return np.arange(size)
  return np.sort(np.random.default_rng(seed).choice(size, n, replace=False))


def _subset(ds, n: int, seed: int):
  if not n or n >= len(ds.labels):
    return ds.images, ds.labels
  keep = _subset_indices(len(ds.labels), n, seed)
  return ds.images[keep], ds.labels[keep]


def held_out(ds, n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
  """The examples :func:`_subset` ``(ds, n, seed)`` leaves out, in their original order.

  FedGKD-VOTE's server validation split: paper 002 trains on 90% of the data, so
  ``train_subset=45000`` of CIFAR-10 leaves these 5,000 for validation (docs/reproduction.md).
  """
  out = np.setdiff1d(np.arange(len(ds.labels)), _subset_indices(len(ds.labels), n, seed))
  return ds.images[out], np.asarray(ds.labels[out], np.int32)


def same_label_space(public_name: str, private_name: str) -> bool:
  """Whether a public set's labels are the private task's labels: the same dataset by name.

  Equal class counts are not enough (ImageNet-100 and CIFAR-100 both have 100 classes).
  """
  canon = lambda n: n.strip().lower().replace("-", "").replace("_", "")
  return bool(public_name) and canon(public_name) == canon(private_name)


def _public_inputs(
  c, train_x: np.ndarray, num_classes: int, private_name: str = ""
) -> tuple[dict, int]:
  """Loads the public set for methods that need one; validates it before any compute."""
  if not c.public_data:
    if registry.needs_public(c.method):
      raise ValueError(
        f"Method {c.method!r} needs public data: pass --public_data=cifar100 or a path, e.g. "
        "--public_data=../shared/data/cifar100/public_20k.npz"
      )
    return {}, 0
  public = load_dataset(c.public_data, "train")
  images, labels = _subset(public, c.public_size, c.seed + 2)
  if images.shape[1:] != train_x.shape[1:] or images.dtype != train_x.dtype:
    raise ValueError(
      f"Public data {c.public_data!r} has examples {images.shape[1:]} {images.dtype} but the "
      f"private data has {train_x.shape[1:]} {train_x.dtype}; use a public set of the same format."
    )
  memory_size = c.method_kwargs.get("memory_size", c.memory_size)
  if "memory_size" in registry.config_kwargs(c.method) and memory_size > len(labels):
    raise ValueError(
      f"--memory_size={memory_size} exceeds the public set ({len(labels)} examples); lower "
      "--memory_size or use more public data (--public_size=0 uses all of it)."
    )
  inputs = {"public_images": jax.device_put(images)}
  # FedProj's round-0 CE (001, Algorithm 1, line 16) reads public labels as private ones.
  if public.num_classes == num_classes and same_label_space(public.name, private_name):
    inputs["public_labels"] = jax.device_put(np.asarray(labels, np.int32))
  return inputs, len(labels)


def _client_mesh(c, strategy: str, log):
  """The mesh the client axis is sharded over, or None for the plain single-device round."""
  if jax.process_count() > 1:
    devices = jax.device_count()
    if strategy != "vmap_scan":
      raise ValueError(
        f"A multi-process run needs --strategy=vmap_scan (the sharded round); auto chose "
        f"{strategy!r} for this model and backend."
      )
    if c.clients_per_round % devices:
      raise ValueError(
        f"--clients_per_round={c.clients_per_round} is not a multiple of the {devices} devices of "
        f"the {jax.process_count()} processes; use a multiple of {devices} clients per round."
      )
    log(
      f"sharding the client axis over {devices} devices of {jax.process_count()} processes "
      f"(process {jax.process_index()} holds {jax.local_device_count()})"
    )
    return distributed.global_client_mesh()
  devices = jax.local_device_count()
  if not c.get("shard_clients", True) or devices == 1 or strategy != "vmap_scan":
    return None
  if c.clients_per_round % devices:
    log(
      f"note: not sharding clients: clients_per_round={c.clients_per_round} is not a multiple "
      f"of the {devices} local devices"
    )
    return None
  log(f"sharding the client axis over {devices} devices")
  return sharding.client_mesh()


def _build_round(algorithm, strategy: str, c, variables, log, mesh=None):
  """The round function: chunked (streaming aggregation) when asked for and possible.

  With a ``mesh`` each chunk's clients are sharded over its devices, so ``auto`` budgets one
  device's share of the cohort.
  """
  chunk = str(c.get("client_chunk", "auto")).lower()
  if chunk == "none":
    return make_round(algorithm, strategy)
  shards = 1 if mesh is None else int(mesh.devices.size)
  per_device = f" ({-(-int(chunk) // shards)} per device)" if shards > 1 and chunk.isdigit() else ""
  if chunk == "auto":
    if streaming_of(algorithm) is None:
      return make_round(algorithm, strategy)
    local = c.clients_per_round // shards
    size = auto_client_chunk(local, tree_bytes(variables))
    if size >= local:  # the whole cohort fits: the ordinary round
      return make_round(algorithm, strategy)
    per_device = f" ({size} per device)" if shards > 1 else ""
    log(
      f"clients run in chunks of {size * shards}{per_device} with streaming aggregation "
      "(client_chunk=auto)"
    )
    return make_chunked_round(algorithm, strategy, size * shards, mesh=mesh)
  log(f"clients run in chunks of {int(chunk)}{per_device} with streaming aggregation")
  return make_chunked_round(algorithm, strategy, int(chunk), mesh=mesh)


def _placed(round_fn, mesh):
  """Wraps ``round_fn`` to place its inputs on ``mesh`` (clients split, the rest replicated).

  The training set and the other shared inputs are the same objects every round, so they are
  placed once. Several processes: inputs become global arrays (each process fills its own devices
  from the identical host data it computed) and the outputs stay global.
  """
  if mesh is None:
    return round_fn
  if jax.process_count() > 1:
    place_rd, place_tree = distributed.shard_round_data, distributed.replicate
  else:
    place_rd, place_tree = sharding.shard_round_data, sharding.replicate
  shared: dict = {}

  def sharded(state, rd, key):
    source = (rd.images, rd.labels, rd.extra)
    cached = shared.get("source", ())
    # The cache keeps the sources alive, so an identity match cannot be a recycled object.
    if len(cached) != 3 or any(a is not b for a, b in zip(cached, source, strict=True)):
      shared["placed"], shared["source"] = place_rd(rd, mesh), source
    placed = shared["placed"]
    # Only the per-client fields change between rounds.
    rd = place_rd(rd._replace(images=placed.images, labels=placed.labels, extra=placed.extra), mesh)
    return round_fn(place_tree(state, mesh), rd, place_tree(key, mesh))

  return sharded


def default_output_dir(method: str) -> str:
  return str(Path("runs") / f"{method}-{time.strftime('%Y%m%d-%H%M%S')}")


def run_experiment(c: ml_collections.ConfigDict, log=print) -> dict:
  """Runs one federated experiment described by ``c``; returns the summary dict.

  With ``num_processes != 1`` this joins the multi-process job first (before any JAX computation)
  and only process 0 logs and writes outputs; every process returns the same summary.
  """
  validate_config(c)
  if init_processes(c) and jax.process_index() != 0:
    log = lambda *args, **kwargs: None  # process 0 reports for the whole job
  output_dir = c.output_dir or default_output_dir(c.method)
  lock = None
  created = not Path(output_dir).exists()
  if jax.process_index() == 0:
    # Before any data is loaded: the directory is writable, ours alone, and holds nothing a new
    # run would silently replace (training/rundir.py). A --resume target must already exist (a
    # typo must not create it).
    if c.get("resume", False) and not Path(output_dir).is_dir():
      rundir.check_run_dir(output_dir, resume=True, overwrite=c.get("overwrite", False))
    rundir.check_writable(output_dir)
    lock = rundir.RunLock(output_dir, log=lambda msg: print(msg, file=sys.stderr)).acquire()
  try:
    if lock is not None:
      state = rundir.check_run_dir(
        output_dir, resume=c.get("resume", False), overwrite=c.get("overwrite", False)
      )
      if state != "empty" and c.get("overwrite", False):
        print(f"--overwrite: replacing the {state} run in {output_dir}", file=sys.stderr)
        rundir.clear_run(output_dir)
    return _run(c, output_dir, log)
  except BaseException:
    if lock is not None and created and rundir.run_state(output_dir) == "empty":
      # A run refused before writing anything leaves no directory behind.
      lock.release()
      lock = None
      rundir.remove_empty(output_dir)
    raise
  finally:
    if lock is not None:
      lock.release()


# Runs with fewer local steps than this start without a timing probe (seconds to run anyway).
ETA_PROBE_MIN_STEPS = 2000


def time_local_step(model, optimizer, normalize, images, labels, batch_size: int, repeats=3):
  """Seconds per local training step (forward, backward, update) of one batch, measured now.

  Compiles one plain cross-entropy step and times ``repeats`` calls (the median); the
  per-method local loss terms and the server side are not included.
  """
  from fedjax_proj.algorithms.client import (  # noqa: PLC0415
    ROUND_STEPS_ARG,
    forward,
    split_variables,
  )

  n = min(batch_size, len(labels))
  x = normalize(jax.numpy.asarray(images[:n]))
  y = jax.numpy.asarray(np.asarray(labels[:n], np.int32))
  variables = model.init(jax.random.key(0), x[:2])
  params, model_state = split_variables(variables)
  opt_state = optimizer.init(params)

  @jax.jit
  def step(params, opt_state, key):
    def loss(p):
      logits = forward(model, p, model_state, x, train=True, key=key).logits
      return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()

    grads = jax.grad(loss)(params)
    # A per-epoch schedule (client.epoch_step_lr) needs the round's step count; any will do here.
    updates, opt_state = optimizer.update(grads, opt_state, params, **{ROUND_STEPS_ARG: 1})
    return optax.apply_updates(params, updates), opt_state

  key = jax.random.key(1)
  jax.block_until_ready(step(params, opt_state, key))  # compile
  times = []
  for _ in range(repeats):
    t0 = time.perf_counter()
    jax.block_until_ready(step(params, opt_state, key))
    times.append(time.perf_counter() - t0)
  return float(np.median(times))


def _format_duration(seconds: float) -> str:
  if seconds < 120:
    return f"{seconds:.0f} s"
  if seconds < 7200:
    return f"{seconds / 60:.0f} min"
  return f"{seconds / 3600:.1f} h"


def estimate_run(
  c, fed: FederatedData, step_seconds: float | None, start_round: int = 0, padded: bool = True
) -> str:
  """The pre-round-1 estimate line(s) for ``c`` given a measured time per local step.

  ``padded``: every client runs the longest client's step count (vmap_scan's fixed shapes);
  otherwise each runs its own, and the mean client's count is used.
  """
  per_client = fed.num_steps if padded else float(np.mean([fed.steps_for(n) for n in fed.sizes]))
  steps = int(round((c.rounds - start_round) * c.clients_per_round * per_client))
  if step_seconds is None:
    return ""
  total = steps * step_seconds
  text = (
    f"estimated time: about {_format_duration(total)} for {c.rounds - start_round} rounds "
    f"({steps:,} local steps of batch {c.batch_size} at {step_seconds * 1e3:.1f} ms each, "
    f"timed now on {jax.default_backend()}; {c.method}'s extra local and server work comes on top)"
  )
  if total > 3600 and jax.default_backend() == "cpu":
    text += (
      f"\nwarning: this run needs more than an hour on CPU (about {_format_duration(total)}); "
      "--preset=cpu runs a reduced budget of this experiment in minutes, --preset=smoke in "
      "under one."
    )
  return text


def _run(c: ml_collections.ConfigDict, output_dir: str, log) -> dict:
  """The body of :func:`run_experiment` once the output directory is held."""
  data_dir = c.data_dir or None
  train_ds = load_dataset(c.dataset, "train", data_dir)
  test_ds = load_dataset(c.dataset, "test", data_dir)
  where = f"--data_dir={c.data_dir}" if c.data_dir else "the default source"
  check_dataset(train_ds, c.dataset, where)
  check_dataset(test_ds, c.dataset, where)
  train_x, train_y = _subset(train_ds, c.train_subset, c.seed)
  test_x, test_y = _subset(test_ds, c.test_subset, c.seed + 1)
  parts = partition(train_y, c.partition, c.num_clients, c.seed)
  fed = FederatedData(parts, c.batch_size, c.local_epochs)
  round_inputs, public_size = _public_inputs(c, train_x, train_ds.num_classes, train_ds.name)
  # A preset's per-method defaults (e.g. FedProj's paper values), under explicit method_kwargs.
  hparams = resolved_hparams(c)
  validation_size = 0
  if registry.needs_validation(c.method, hparams):
    val_x, val_y = held_out(train_ds, c.train_subset, c.seed)
    if not len(val_y):
      raise ValueError(
        f"{c.method} with vote_validation=server needs held-out validation data, but "
        f"--train_subset={c.train_subset} keeps all {len(train_ds.labels)} training examples; "
        + _no_validation_fix(c.method)
        + "."
      )
    round_inputs["validation_images"] = jax.device_put(val_x)
    round_inputs["validation_labels"] = jax.device_put(val_y)
    validation_size = len(val_y)
    log(f"validation split: the {validation_size} training examples --train_subset leaves out")

  model_kwargs = {**registry.model_kwargs(c.method), **dict(c.get("model_kwargs", {}))}
  model = get_model(c.model, train_ds.num_classes, **model_kwargs)
  sample = pipeline.normalizer(0.0, 1.0)(np.asarray(train_x[:2], np.float32))
  variables = model.init(jax.random.key(c.seed), sample)
  normalize = pipeline.normalizer_for(c.dataset, train_x)
  batch_fn = pipeline.make_batch_fn(normalize, augment=c.augment)

  ctx = registry.BuildContext(
    model=model,
    client_optimizer=client_optimizer(c),
    batch_fn=batch_fn,
    normalize=normalize,
    num_clients=c.num_clients,
    server_optimizer=make_server_optimizer(c),
    public_size=public_size,
    num_classes=train_ds.num_classes,
    validation_size=validation_size,
  )
  for field in registry.config_kwargs(c.method):
    hparams.setdefault(field, c[field])
  algorithm = registry.build_algorithm(c.method, ctx, **hparams)
  caveat = registry.optimizer_caveat(c.method, c.optimizer)
  if caveat:
    log(f"warning: {caveat}")
  has_conv = engine_lib.has_convolution(
    lambda v, x: model.apply(v, x, train=False).logits, variables, sample
  )
  strategy = engine_lib.choose_strategy(
    c.strategy,
    has_conv=has_conv,
    num_clients=c.clients_per_round,
    # Sharding over local devices needs the one-program round (docs/performance.md).
    sharded=c.get("shard_clients", True) and jax.local_device_count() > 1,
  )
  log(
    f"backend={jax.default_backend()} devices={jax.device_count()} "
    + (f"processes={jax.process_count()} " if jax.process_count() > 1 else "")
    + f"strategy={strategy} "
    f"method={c.method} model={c.model} params={count_params(variables)} "
    f"clients={c.num_clients} per_round={c.clients_per_round} rounds={c.rounds} "
    f"local_epochs={c.local_epochs} partition={c.partition} output_dir={output_dir}"
  )
  if c.clients_per_round * c.rounds * fed.num_steps >= ETA_PROBE_MIN_STEPS and not c.get(
    "resume", False
  ):
    step_seconds = time_local_step(
      model, ctx.client_optimizer, normalize, train_x, train_y, c.batch_size
    )
    log(estimate_run(c, fed, step_seconds, padded=strategy == "vmap_scan"))
  mesh = _client_mesh(c, strategy, log)
  round_fn = _placed(_build_round(algorithm, strategy, c, variables, log, mesh), mesh)
  sys.stdout.flush()
  checkpointer = Checkpointer(
    Path(output_dir) / "checkpoints", config_fingerprint(c.to_dict()), c.get("keep_checkpoints", 3)
  )
  _, summary = train(
    algorithm,
    round_fn,
    fed,
    (train_x, train_y),
    (test_x, test_y),
    make_evaluator(model, normalize, c.eval_batch_size),
    variables,
    rounds=c.rounds,
    clients_per_round=c.clients_per_round,
    seed=c.seed,
    eval_every=c.eval_every,
    output_dir=output_dir,
    round_inputs=round_inputs,
    summary_extra={"strategy": strategy, "config": c.to_dict(), "output_dir": output_dir},
    progress=c.progress,
    checkpointer=checkpointer,
    checkpoint_every=c.get("checkpoint_every", 0),
    resume=c.get("resume", False),
    overwrite=c.get("overwrite", False),
    tensorboard_dir=Path(output_dir) / "tensorboard" if c.get("tensorboard", False) else None,
  )
  log(
    f"final_test_accuracy={summary['final_test_accuracy']:.4f} "
    f"wall_seconds={summary['wall_seconds']:.1f} output_dir={output_dir}"
  )
  return summary
