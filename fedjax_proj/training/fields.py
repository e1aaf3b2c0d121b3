"""Every config field of the experiments, declared once: its type, default, help, range or choices,
and what it means for the fingerprints and for ``--resume``.

A :class:`Field` states all of that in one typed entry, and everything else reads it:
:func:`fedjax_proj.training.config.base_config` (the defaults), the entry points' flags and
``--help`` (:mod:`fedjax_proj.configs.common`, :mod:`fedjax_proj.configs.pmnist`),
:func:`check_fields` (ranges, choices and parse hooks, before any data is loaded), :func:`resolve`
(the frozen :class:`Config` a run reads, every field filled in once), the checkpoint's config
fingerprint (:data:`fedjax_proj.training.checkpoint.NON_SEMANTIC_FIELDS`: the fields a resumed run
may change) and a claim result's fingerprint (:mod:`fedjax_proj.reproduce.run`: which fields it
leaves out, and the value of a field added after results were recorded). docs/design.md,
"Config fields", says how to add one.

:data:`FIELDS` holds the fields of :func:`~fedjax_proj.training.config.base_config`, which every
image and text entry point builds on. An experiment family with fields of its own declares them in
its config module (``fedjax_proj/configs/<family>.py``, its ``FIELDS``: the table of every field
its config has); where a family gives a shared field another default, help or range (the
continual family's ``eval_every`` counts 0 as "only at each task's end"), its entry is the shared
one with those changed (:func:`variant`), so what a field means for the fingerprints and for resume
is stated once. Method hyperparameters are not config fields: their defaults and ranges stay with
their method (:mod:`fedjax_proj.algorithms.registry`). The nested blocks (``method_kwargs``,
``method_defaults``, ``model_kwargs``, ``text``) are not flags and have no entry.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Iterator, Mapping
from types import MappingProxyType
from typing import Any, NamedTuple

import ml_collections

from fedjax_proj.core import ranges


class _Unset:
  def __repr__(self) -> str:
    return "UNSET"


# ``Field.added`` of a field as old as the results.
UNSET: Any = _Unset()
# The types a field may have (a flag parses its text into it).
TYPES = (bool, int, float, str)


class Field(NamedTuple):
  """One config field, and the ``--<name>`` flag of every entry point whose config has it.

  Attributes:
    name: the field's and its flag's name.
    default: the value the family's config starts from (a preset may change it); its type is the
      field's type, one of :data:`TYPES`.
    help: what the field does, for ``--help`` (the paper preset's value is appended).
    range: the numbers it may take (for a text field: each of its comma-separated numbers); None:
      any finite number.
    choices: the values a text field may take (empty: any).
    fix: what to suggest next to a range error.
    fingerprint: whether it can change a result. False for a field that only picks method
      hyperparameters' defaults (which the resolved ``method_kwargs`` hold) or what a run writes;
      a claim result's fingerprint leaves it out (reproduce/resolve.py).
    resumable: whether a resumed run may change it (``--resume --rounds=N`` extends a run); the
      checkpoint's config fingerprint leaves it out (training/checkpoint.py).
    run_management: how a run is managed (where it writes, when it saves, what it prints), not
      what it computes: the claim runner sets it per run and leaves it out of a result's config.
    added: the value every run recorded before the field existed computed with (:data:`UNSET`:
      the field is as old as the results); at that value a claim result's fingerprint leaves the
      field out, so adding an option turns no committed result stale.
    added_family: the method family (registry name) the field was added to later, where the other
      families had it all along; empty: ``added`` holds for every family.
    parse: the one function that both checks the config's value and turns it into what a run
      reads (:func:`resolve`), raising a ValueError that names the fix (:func:`check_fields`
      calls it, so the value is refused before any data is loaded); None: the value as it is.
  """

  name: str
  default: Any
  help: str
  range: ranges.Interval | None = None
  choices: tuple[str, ...] = ()
  fix: str = ""
  fingerprint: bool = True
  resumable: bool = False
  run_management: bool = False
  added: Any = UNSET
  added_family: str = ""
  parse: Callable[[Any], Any] | None = None

  @property
  def type(self) -> type:
    """The field's type: its default's."""
    return type(self.default)

  def flag_type(self):
    """What parses the flag's text into the field's type (argparse ``type``)."""
    return parse_bool if self.type is bool else self.type


def parse_bool(text: str) -> bool:
  """A boolean flag value: 1/true/yes/on or 0/false/no/off (argparse type)."""
  low = text.lower()
  if low in ("1", "true", "yes", "on"):
    return True
  if low in ("0", "false", "no", "off"):
    return False
  raise argparse.ArgumentTypeError(f"expected true/false, got {text!r}")


def table(*entries: Field | Mapping[str, Field]) -> dict[str, Field]:
  """The fields ``entries`` give (fields, or tables to take whole), by name, in order.

  Raises:
    ValueError: a name given twice (which entry was meant is not knowable), a default of another
      type than :data:`TYPES`, or a run-management field that counts for a fingerprint.
  """
  out: dict[str, Field] = {}
  for entry in entries:
    for f in entry.values() if isinstance(entry, Mapping) else (entry,):
      if f.name in out:
        raise ValueError(f"Config field {f.name!r} is declared twice; declare it once.")
      if f.type not in TYPES:
        raise ValueError(
          f"Config field {f.name!r} has a default of type {f.type.__name__}; use one of "
          f"{', '.join(t.__name__ for t in TYPES)}."
        )
      if f.run_management and (f.fingerprint or not f.resumable):
        raise ValueError(
          f"Config field {f.name!r} manages the run: declare it fingerprint=False, resumable=True."
        )
      out[f.name] = f
  return out


def variant(shared: Field, **changes) -> Field:
  """A family's entry for a shared field: another default, help, range or fix, never another
  meaning for the fingerprints or resume (a ValueError names the attribute)."""
  fixed = set(changes) - {"default", "help", "range", "fix", "choices"}
  if fixed:
    raise ValueError(
      f"A variant of {shared.name!r} may change its default, help, range, fix or choices, not "
      f"{', '.join(sorted(fixed))}; declare another field instead."
    )
  return shared._replace(**changes)


def without(fields: Mapping[str, Field], *names: str) -> dict[str, Field]:
  """``fields`` without ``names`` (a family that drops fields of the one it builds on)."""
  missing = set(names) - set(fields)
  if missing:
    raise ValueError(f"No config field {', '.join(sorted(missing))} to drop.")
  return {k: f for k, f in fields.items() if k not in names}


def config(
  fields: Mapping[str, Field], c: ml_collections.ConfigDict | None = None
) -> ml_collections.ConfigDict:
  """``c`` (default: a new config) with every field of ``fields`` set to its default."""
  c = ml_collections.ConfigDict() if c is None else c
  for f in fields.values():
    c[f.name] = f.default
  return c


def add_flags(parser: argparse.ArgumentParser, fields: Mapping[str, Field]) -> None:
  """One ``--<name>`` flag per field of ``fields``, with the field's type, default, choices and
  help (its default appended); a boolean field's flag also works bare (``--overwrite``).

  For the small entry points whose flags are their whole config (the quickstart, the Iris pilot);
  :func:`fedjax_proj.configs.common.build_parser` builds the preset-based entry points' flags.
  Ranges are checked after parsing (:func:`parse_checked`), so that every range error reads the
  same.
  """
  for f in fields.values():
    extra = {"nargs": "?", "const": True} if f.type is bool else {}
    parser.add_argument(
      f"--{f.name}",
      type=f.flag_type(),
      default=f.default,
      choices=f.choices or None,
      help=f"{f.help} (default: {f.default!r})",
      **extra,
    )


def parse_checked(
  parser: argparse.ArgumentParser, argv, fields: Mapping[str, Field]
) -> argparse.Namespace:
  """``parser``'s flags from ``argv``, with every value of ``fields`` in its range or choices
  (:func:`check_fields`); a value outside is the parser's usage error (exit 2), before any work."""
  args = parser.parse_args(argv)
  try:
    check_fields(vars(args), fields)
  except ValueError as e:
    parser.error(str(e))
  return args


class Config(Mapping):
  """A config resolved once (:func:`resolve`): frozen, every field of its table present (the
  config's value, or the field's default where the config lacks it) and parsed by the field's
  :attr:`Field.parse`; read as attributes (``s.client_chunk``) or by key.

  It is what a run computes with, never what it records: summary.json and the fingerprints keep
  hashing the config as given (a config recorded before a field existed fingerprints the same).
  """

  __slots__ = ("_values",)

  def __init__(self, values: Mapping[str, Any]):
    object.__setattr__(self, "_values", MappingProxyType(dict(values)))

  def __getattr__(self, name: str) -> Any:
    if name.startswith("__") or name == "_values":  # copy/pickle probe a bare instance first
      raise AttributeError(name)
    try:
      return self._values[name]
    except KeyError:
      raise AttributeError(f"The config has no field {name!r}.") from None

  def __reduce__(self):
    return Config, (dict(self._values),)

  def __setattr__(self, name: str, value: Any) -> None:
    raise AttributeError(
      f"A resolved config is frozen: set {name} on the config before resolving it."
    )

  def __getitem__(self, name: str) -> Any:
    return self._values[name]

  def __iter__(self) -> Iterator[str]:
    return iter(self._values)

  def __len__(self) -> int:
    return len(self._values)

  def __repr__(self) -> str:
    return f"Config({dict(self._values)!r})"


def resolve(c: Mapping[str, Any], table: Mapping[str, Field] | None = None) -> Config:
  """``c`` (a ConfigDict or a recorded config's dict) as the frozen :class:`Config` a run reads.

  Every field of :data:`FL_FIELDS` and of ``table`` (a family's own) is filled in once here: a
  family's config that lacks a shared field (the continual configs have no ``normalization``),
  or a config recorded before a field existed, reads its default, the value such runs computed
  with (:attr:`Field.added`). A field with a :attr:`Field.parse` hook holds the parsed value.
  The other entries of ``c`` (``method_kwargs``...) are kept as they are.

  Raises:
    ValueError: a value its field's parse hook refuses (the message names the fix).
  """
  if isinstance(c, Config):
    return c
  fields = {**FL_FIELDS, **(table or {})}
  given = dict(c.items())
  values = {name: given.get(name, f.default) for name, f in fields.items()}
  for name, f in fields.items():
    if f.parse is not None:
      values[name] = f.parse(values[name])
  return Config({**given, **values})


def check_fields(c, fields: Mapping[str, Field]) -> None:
  """Every numeric field of ``c`` is finite and in its declared range, and every text field with
  declared choices holds one of them; the error names the flag, the range (or the choices) and
  the value, and the fix where the table gives one.

  A text field of comma-separated numbers (e.g. ``dropout="0.2,0.5"``) is checked number by number
  when its range is declared. Fields of ``c`` the table lacks must be finite when numeric.
  """
  for name, value in c.items():
    f = fields.get(name)
    if f is not None and f.parse is not None:
      f.parse(value)
    interval = ranges.ANY if f is None or f.range is None else f.range
    if ranges.is_number(value):
      ranges.check_number(f"--{name}", value, interval, f.fix if f else "")
    elif isinstance(value, str) and f is not None and f.choices and value not in f.choices:
      raise ValueError(f"Unknown --{name} {value!r}; choose one of {f.choices}.")
    elif isinstance(value, str) and f is not None and f.range is not None:
      for part in filter(None, (p.strip() for p in value.split(","))):
        try:
          number = float(part)
        except ValueError:
          raise ValueError(
            f"--{name}={value!r}: {part!r} is not a number; pass comma-separated numbers."
          ) from None
        ranges.check_number(f"--{name}", number, interval)


def parse_client_chunk(value) -> int | str | None:
  """``--client_chunk``: ``"auto"`` (the run decides, training/placement.py), None (``none``: all
  of a round's clients at once) or the clients per chunk, a positive integer."""
  text = str(value).lower()
  if text in ("auto", "none"):
    return None if text == "none" else "auto"
  if not (text.isdigit() and int(text) >= 1):
    raise ValueError(f"--client_chunk must be auto, none or a positive integer, got {text!r}.")
  return int(text)


# The fix named next to a subset size's range error.
EXAMPLES_FIX = "Pass a number of examples, or 0 for the whole set."

# The fields of every image and text experiment (training/config.py base_config), in its order.
FIELDS: dict[str, Field] = table(
  Field("method", "fedavg", "federated method to run"),
  Field(
    "dataset",
    "cifar10",
    "dataset name (checked against the data's shape and classes) or a path to the data",
  ),
  Field(
    "data_dir", "", "folder (or .npz) holding the dataset; empty: $FEDJAX_PROJ_DATA_DIR, then TFDS"
  ),
  Field("model", "resnet8", "model architecture"),
  Field(
    "num_clients", 100, "number of clients the training set is split over", ranges.AT_LEAST_ONE
  ),
  Field("clients_per_round", 10, "clients sampled each round", ranges.AT_LEAST_ONE),
  # The run's length: every round is a pure function of (seed, round), so a checkpoint continues
  # bit-exactly into a longer run (``--resume --rounds=N`` extends it).
  Field(
    "rounds",
    100,
    "communication rounds (with --resume: extends a shorter run to this many)",
    ranges.ROUNDS,
    fix=ranges.ROUNDS_FIX,
    resumable=True,
  ),
  Field("local_epochs", 20, "local epochs per client per round", ranges.AT_LEAST_ONE),
  Field("batch_size", 64, "local batch size", ranges.AT_LEAST_ONE),
  Field(
    "partition",
    "dirichlet:0.3",
    "how the training set is split over clients: iid; dirichlet:<beta>[:<min_size>] (label "
    "skew, smaller beta = more skewed, e.g. dirichlet:0.3); shards:<shards_per_client> (e.g. "
    "shards:2); exdir:<classes_per_client>:<alpha>[:<min_size>] (e.g. exdir:2:0.5)",
  ),
  Field(
    "seed",
    0,
    "random seed in [0, 2**32 - 1) (client sampling, batches, initialisation derive from it)",
    ranges.SEED,
  ),
  Field(
    "strategy", "auto", "how a round is executed (auto picks the fastest for the model and backend)"
  ),
  Field("optimizer", "adam", "client optimiser: sgd or adam", choices=("sgd", "adam")),
  Field(
    "lr",
    1e-3,
    "client learning rate (> 0)",
    ranges.POSITIVE,
    fix="Pass e.g. --lr=0.001 (Adam) or --lr=0.01 (SGD).",
  ),
  Field("momentum", 0.9, "client SGD momentum in [0, 1) (0: none)", ranges.RATE),
  Field("weight_decay", 0.0, "client weight decay (0: none)", ranges.NON_NEGATIVE),
  # Restarted every round; "step" is torch's StepLR per local epoch (client.epoch_step_lr).
  Field(
    "lr_schedule",
    "constant",
    "local learning-rate schedule, restarted each round: constant, or step (lr x "
    "lr_step_gamma^floor(epoch / lr_step_epochs), the FedProj code's StepLR)",
    choices=("constant", "step"),
    added="constant",
  ),
  # 0 = local_epochs // 2, the FedProj code's step_size.
  Field(
    "lr_step_epochs",
    0,
    "with --lr_schedule=step: local epochs between decays (0: local_epochs // 2)",
    ranges.COUNT,
    added=0,
  ),
  Field(
    "lr_step_gamma",
    0.1,
    "with --lr_schedule=step: factor in (0, 1] applied to the lr at each decay",
    ranges.Interval(0.0, 1.0, low_open=True),
    added=0.1,
  ),
  Field(
    "server_optimizer",
    "none",
    "server optimiser on the aggregated update: none (averaging), sgd or adam",
    choices=("none", "sgd", "adam"),
  ),
  Field("server_lr", 1.0, "server learning rate (> 0)", ranges.POSITIVE),
  Field("server_momentum", 0.0, "server SGD momentum in [0, 1)", ranges.RATE),
  Field("augment", False, "random crop and flip of training images"),
  # "dataset" is the normaliser every run used before --normalization=code existed.
  Field(
    "normalization",
    "dataset",
    "input normalisation: dataset (the data's channel statistics) or code (the FedProj authors' "
    "values: CIFAR-10 std (0.2023, 0.1994, 0.2010), the public set its own statistics)",
    choices=("dataset", "code"),
    added="dataset",
  ),
  Field(
    "eval_every",
    5,
    "evaluate the global model every k rounds (and after the last)",
    ranges.AT_LEAST_ONE,
  ),
  Field("eval_batch_size", 500, "batch size of evaluation", ranges.AT_LEAST_ONE),
  Field(
    "train_subset",
    0,
    "use only this many training examples (0: all)",
    ranges.COUNT,
    fix=EXAMPLES_FIX,
  ),
  Field(
    "test_subset", 0, "use only this many test examples (0: all)", ranges.COUNT, fix=EXAMPLES_FIX
  ),
  Field(
    "output_dir",
    "",
    "run directory (metrics, summary, checkpoints); empty: runs/<method>-<time>",
    fingerprint=False,
    resumable=True,
    run_management=True,
  ),
  Field(
    "progress",
    True,
    "show a progress bar",
    fingerprint=False,
    resumable=True,
    run_management=True,
  ),
  # vmap_scan only; a no-op on one device.
  Field("shard_clients", True, "split each round's clients over the local devices"),
  # "auto" chunks methods that support it when the cohort would not fit (training/placement.py
  # decides, with core/chunked.py's rule); a memory bound only. The continual entry points took
  # it later (it bounds FOT's end-of-task GPSE pass); before, they planned with "auto".
  Field(
    "client_chunk",
    "auto",
    "clients per chunk with streaming aggregation: auto, none or an integer",
    added="auto",
    added_family="continual",
    parse=parse_client_chunk,
  ),
  # The process layout changes no state: process_id differs between the processes of one job
  # (which must agree on the checkpoint's fingerprint), a relaunched job may get another
  # coordinator, and the number of processes changes results only by float summation order.
  Field(
    "coordinator_address",
    "",
    "host:port of process 0 in a multi-process job",
    resumable=True,
  ),
  Field(
    "num_processes",
    1,
    "processes of the job (0: detect Cloud TPU / Slurm / Open MPI)",
    ranges.COUNT,
    resumable=True,
  ),
  Field(
    "process_id",
    0,
    "this process's rank in a multi-process job",
    ranges.COUNT,
    resumable=True,
  ),
  Field(
    "cpu_collectives",
    "",
    "collectives for CPU-only multi-process jobs: '' (JAX default), gloo or mpi",
    resumable=True,
  ),
  Field(
    "public_data",
    "",
    "public (unlabelled) set for distillation methods: a name (cifar100) or a path",
  ),
  # TFDS names only (001 Sec. 6.1 distils on CIFAR-100 train + test, 60k images); a local npz or
  # folder is used as it is.
  Field(
    "public_split",
    "train",
    "split of a TFDS public set: train, or train+test (CIFAR-100's 60k, 001 6.1)",
    added="train",
  ),
  Field(
    "public_size",
    0,
    "use only this many public examples (0: all)",
    ranges.COUNT,
    fix=EXAMPLES_FIX,
  ),
  Field(
    "memory_size",
    10000,
    "FedProj's memory of public examples (at most --public_size)",
    ranges.AT_LEAST_ONE,
  ),
  # A forward pass of the new global model on the memory every round (001, C.4) that trains
  # nothing: a logged diagnostic the state does not depend on (so a resumed run may change it),
  # off unless asked; the claim runner turns it on for the reports that plot it
  # (reproduce/resolve.py), as every claim run logged it before it became a switch.
  Field(
    "lmem_global",
    False,
    "log FedProj's lmem_global drift metric (one more forward pass per round)",
    resumable=True,
    added=True,
  ),
  Field(
    "resume",
    False,
    "continue the run in --output_dir from its newest checkpoint (bit-exact)",
    fingerprint=False,
    resumable=True,
    run_management=True,
  ),
  Field(
    "overwrite",
    False,
    "let a new run replace the run --output_dir holds (otherwise refused)",
    fingerprint=False,
    resumable=True,
    run_management=True,
  ),
  Field(
    "checkpoint_every",
    10,
    "save a checkpoint every k rounds and after the last (0: only on a signal)",
    ranges.COUNT,
    fix="0 saves only on SIGINT/SIGTERM.",
    fingerprint=False,
    resumable=True,
    run_management=True,
  ),
  Field(
    "keep_checkpoints",
    3,
    "how many checkpoints to keep",
    ranges.AT_LEAST_ONE,
    fingerprint=False,
    resumable=True,
    run_management=True,
  ),
  # Only what a run writes; claim results record it (their configs always held it).
  Field(
    "tensorboard",
    False,
    "also write TensorBoard events (needs the tensorboard extra)",
    fingerprint=False,
    resumable=True,
  ),
)

# Switches the FedProj presets (configs/fedproj_presets.py) add to base_config's fields: they pick
# FedProj's α, which prepare() writes into method_defaults (where a result's config holds it), so
# neither counts for a result's fingerprint. Only paper_code sets the second, so it is no flag.
FEDPROJ_FIELDS: dict[str, Field] = table(
  Field(
    "fedproj_alpha_by_beta",
    False,
    "fedproj: read its divergence weight alpha from paper 001 Table 3 for the final --partition",
    fingerprint=False,
  ),
  Field(
    "fedproj_code_alpha_by_beta",
    False,
    "fedproj: read its divergence weight alpha from the authors' scripts for the final --partition",
    fingerprint=False,
  ),
)
# The fields of the parallel- and sequential-FL entry points' configs (configs/common.py's flags
# and validate_config read them unless an entry point passes its own table).
FL_FIELDS: dict[str, Field] = table(FIELDS, FEDPROJ_FIELDS)


def resumable_fields(fields: Mapping[str, Field] = FL_FIELDS) -> tuple[str, ...]:
  """The names a resumed run may change (left out of the checkpoint's config fingerprint)."""
  return tuple(name for name, f in fields.items() if f.resumable)
