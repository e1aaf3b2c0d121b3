"""Method registry: one typed spec per method, found by name. Experiments select methods by name
(``--method``).

Each method module declares one :class:`MethodSpec` (a module serving several names declares one
per name): its family, its ``build(ctx: BuildContext, **hparams)``, the hyperparameters that build
accepts with their defaults (:func:`factory_hparams` reads them from the factory's signature),
whether it reads a public set, the model options and config fields it needs and the client
optimisers it is defined for. :func:`build_algorithm` checks the given hyperparameters against the
declared ones (names and types) before building. A method whose ``build`` only forwards
:class:`BuildContext` fields to its factory declares its spec with :func:`factory_spec`. The
registry is the table :data:`METHODS` of name -> ``"module:ATTRIBUTE"`` of that spec; modules are
imported only when a method is looked up, so adding a method never slows start-up
(docs/design.md, "The method registry").
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import inspect
from collections.abc import Callable, Iterable, Mapping
from typing import Any, NamedTuple

import optax

from fedjax_proj.algorithms.families import FAMILY_PROTOCOLS, meets_family
from fedjax_proj.core import ranges
from fedjax_proj.core.executor import Executor
from fedjax_proj.core.types import Array, Model

# The method families (docs/design.md, "The algorithm contract"), each a Protocol of
# fedjax_proj.algorithms.families: parallel FL (a ``FederatedAlgorithm``), sequential FL (a
# ``SequentialAlgorithm``) and continual FL (a ``ContinualMethod``).
FAMILIES = tuple(FAMILY_PROTOCOLS)
# The families ``fedjax_proj.training.experiment`` runs (one task, a global model per round).
FEDERATED = ("fl", "sequential")


class BuildContext(NamedTuple):
  """What every method factory may need besides its own hyperparameters.

  Attributes:
    model: the model.
    client_optimizer: the local optimiser.
    normalize: maps raw (uint8) images to model inputs, for public data.
    num_clients: total number of clients (for per-client state).
    executor: the run's :class:`~fedjax_proj.core.executor.Executor` (strategy, batch builder,
      mesh, chunk), for the methods that run clients or build batches themselves (the continual
      methods' replay, Fisher, GPM and GPSE passes); rounds get it from ``make_round``.
    server_optimizer: optional optax server optimiser (FedAvgM/FedAdam), else None.
    public_size: number of public examples in ``RoundData.extra["public_images"]`` (0 if none).
    num_classes: number of classes of the private task.
    validation_size: number of held-out training examples in ``RoundData.extra``
      (``validation_images`` / ``validation_labels``; 0 if none): the part of the training set
      that ``train_subset`` leaves out (FedGKD-VOTE's server-side validation losses).
    variables: the initial variables (continual methods locate their projected layers in them).
    sample_x: a normalised input batch, shape only (continual methods that trace the model).
    num_tasks: number of tasks of a continual benchmark (0 otherwise).
    public_normalize: the public set's own normaliser where its statistics differ from the
      private set's (``--normalization=code``); None: ``normalize`` (read by FedProj).
  """

  model: Model
  client_optimizer: optax.GradientTransformation
  normalize: Callable[[Array], Array]
  num_clients: int
  executor: Executor | None = None
  server_optimizer: optax.GradientTransformation | None = None
  public_size: int = 0
  num_classes: int = 10
  validation_size: int = 0
  variables: dict | None = None
  sample_x: Array | None = None
  num_tasks: int = 0
  public_normalize: Callable[[Array], Array] | None = None


@dataclasses.dataclass(frozen=True)
class MethodSpec:
  """One method's registry entry.

  Attributes:
    name: the ``--method`` name.
    family: one of :data:`FAMILIES`; says which round driver runs what ``build`` returns.
    build: ``build(ctx: BuildContext, **hparams)`` -> the algorithm (``FederatedAlgorithm``,
      ``SequentialAlgorithm`` or ``ContinualMethod``, by family).
    needs_public: the method reads a public set from ``RoundData.extra``.
    requires: :class:`BuildContext` fields that default to None and that ``build`` reads (e.g.
      ``executor``, ``variables``, ``sample_x``); :func:`build_algorithm` refuses a context
      without them.
    model_kwargs: model options the method requires (e.g. MOON's ``projection_dim``).
    config_kwargs: experiment-config fields the method consumes as hyperparameters.
    client_optimizers: the client optimisers the method is defined for (None: any).
    client_optimizer_note: why the others are a poor choice.
    needs_validation: ``needs_validation(hparams) -> bool``: with these hyperparameters the
      method reads a held-out validation split from ``RoundData.extra`` (None: never).
    validation_fix: what to pass when that split is empty (printed in the error).
    hparams: the hyperparameters ``build`` accepts, name -> default (``REQUIRED`` for one without
      a default), usually :func:`factory_hparams` of the factory ``build`` forwards them to. None
      leaves them undeclared: any are passed through unchecked (e.g. a quick user method).
    ranges: ranges of this method's numeric hyperparameters where they differ from
      :data:`HPARAM_RANGES` (e.g. FOT's ``eps`` is a fraction, SFedKD's a small constant).
    choices: the accepted values of this method's text hyperparameters (e.g. FOT's
      ``threshold_rule``), checked with the ranges before any data is loaded.
  """

  name: str
  family: str
  build: Callable[..., Any]
  needs_public: bool = False
  requires: tuple[str, ...] = ()
  model_kwargs: Mapping[str, Any] = dataclasses.field(default_factory=dict)
  config_kwargs: tuple[str, ...] = ()
  client_optimizers: tuple[str, ...] | None = None
  client_optimizer_note: str = "expect it to train poorly."
  needs_validation: Callable[[Mapping[str, Any]], bool] | None = None
  validation_fix: str = "pass --train_subset below the training set's size"
  hparams: Mapping[str, Any] | None = None
  ranges: Mapping[str, ranges.Interval] = dataclasses.field(default_factory=dict)
  choices: Mapping[str, tuple[str, ...]] = dataclasses.field(default_factory=dict)

  def __post_init__(self):
    if self.family not in FAMILIES:
      raise ValueError(
        f"MethodSpec {self.name!r}: unknown family {self.family!r}; choose one of {FAMILIES}."
      )
    unknown = [f for f in self.requires if f not in BuildContext._fields]
    if unknown:
      raise ValueError(
        f"MethodSpec {self.name!r}: requires names {unknown}, which are not BuildContext fields "
        f"({', '.join(BuildContext._fields)})."
      )


# The range of a numeric hyperparameter by name, declared once for every method that has it (a
# spec's ``ranges`` overrides it for that method). A numeric hyperparameter listed nowhere must be
# finite and >= 0: every one of the registered methods is a weight, rate, count or size.
HPARAM_RANGES: dict[str, ranges.Interval] = {
  **dict.fromkeys(
    ("temperature", "distill_temperature", "distill_lr", "max_coef", "sketch_multiplier"),
    ranges.POSITIVE,
  ),
  "conv_sketch_multiplier": ranges.POSITIVE,
  **dict.fromkeys(
    (
      "memory_batch_size",
      "distill_batch_size",
      "validation_batch_size",
      "buffer_size",
      "num_teachers",
      "gpm_samples",
      "replay_batch",
      "max_exact_svd",
      "server_blas_threads",
    ),
    ranges.AT_LEAST_ONE,
  ),
  **dict.fromkeys(("distill_epochs", "topk_neg", "buffer_per_task"), ranges.COUNT),
  **dict.fromkeys(("projection_prob", "decay"), ranges.FRACTION),
}
DEFAULT_HPARAM_RANGE = ranges.NON_NEGATIVE
# Hyperparameters a method no longer takes because a run setting does their job, with the fix an
# error names: (method, key) -> what to pass instead.
MOVED_HPARAMS = {
  # The run's chunk bounds every pass over the clients, FOT's end-of-task GPSE pass included
  # (Executor.client_chunks).
  ("fot", "client_chunk"): "--client_chunk=N (the run's chunk, which bounds FOT's GPSE pass too)",
}


def hparam_range(name: str, key: str) -> ranges.Interval:
  """The declared range of method ``name``'s hyperparameter ``key`` (see :data:`HPARAM_RANGES`)."""
  own = spec(name).ranges if _available(name) else {}
  return own.get(key) or HPARAM_RANGES.get(key, DEFAULT_HPARAM_RANGE)


# The default of a hyperparameter that has none: the method requires it.
REQUIRED = inspect.Parameter.empty


def factory_hparams(factory: Callable, *, context: Iterable[str] = ()) -> dict[str, Any]:
  """The hyperparameters of a method factory, name -> default, from its signature.

  They are the factory's parameters that have a default, minus ``context``: the ones its registry
  ``build`` fills itself (from the :class:`BuildContext`, or fixed per registered name, like
  FedET's ``teacher``). The factory's signature stays the single source of the defaults.

  Raises:
    ValueError: a ``context`` name is not a parameter of the factory (a typo would otherwise
      expose that parameter as a hyperparameter).
  """
  params = inspect.signature(factory).parameters
  context = tuple(context)
  unknown = [c for c in context if c not in params]
  if unknown:
    raise ValueError(f"{factory.__name__} has no parameter(s) {unknown}; fix `context`.")
  if any(p.kind == p.VAR_KEYWORD for p in params.values()):
    raise ValueError(f"{factory.__name__} takes **kwargs; declare its hyperparameters explicitly.")
  return {
    n: p.default
    for n, p in params.items()
    if p.default is not p.empty
    and n not in context
    and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
  }


def check_no_server_optimizer(server_optimizer: Any, name: str) -> None:
  """Refuses a server optimiser for sequential-FL method ``name``: the chain has no server step."""
  if server_optimizer is not None:
    raise ValueError(
      f"{name} is sequential FL: the last client's model is the global model, there is no server "
      "aggregation for a server optimiser. Use --server_optimizer=none."
    )


def factory_spec(
  name: str,
  family: str,
  factory: Callable,
  *,
  ctx_args: tuple[str, ...] = ("model", "client_optimizer"),
  ctx_kwargs: tuple[str, ...] = (),
  fixed: Mapping[str, Any] | None = None,
  **fields: Any,
) -> MethodSpec:
  """The :class:`MethodSpec` of a method whose ``build`` only forwards context to its factory.

  Its ``build(ctx, **hparams)`` calls ``factory(*ctx_args, **ctx_kwargs, **fixed, **hparams)``,
  with ``ctx_args`` the :class:`BuildContext` fields passed positionally (by default the model and
  the client optimiser), ``ctx_kwargs`` the fields passed as the keyword of the same name (e.g.
  ``server_optimizer``, ``num_clients``) and ``fixed`` the keywords the registered name fixes
  (FedET's ``teacher``). A sequential method refuses a server optimiser first (its chain has no
  server step). Unless ``fields`` give ``hparams``, they are :func:`factory_hparams` of the factory
  without the keywords ``build`` fills. The other ``fields`` go to :class:`MethodSpec` as they are
  (``requires`` stays explicit: which of the fields read may not be None is the method's to say).
  A method whose build does more (FedProj's public normaliser, FedGKD-VOTE's validation check,
  SFedKD's config) writes its own ``build``.
  """
  fixed = dict(fixed or {})
  unknown = [f for f in (*ctx_args, *ctx_kwargs) if f not in BuildContext._fields]
  if unknown:
    raise ValueError(
      f"factory_spec {name!r}: {unknown} are not BuildContext fields "
      f"({', '.join(BuildContext._fields)})."
    )

  def build(ctx: BuildContext, **hparams: Any):
    if family == "sequential":
      check_no_server_optimizer(ctx.server_optimizer, name)
    args = [getattr(ctx, f) for f in ctx_args]
    kwargs = {f: getattr(ctx, f) for f in ctx_kwargs}
    return factory(*args, **kwargs, **fixed, **hparams)

  build.__doc__ = f"Registry entry of {name!r}: builds {factory.__name__} from a BuildContext."
  fields.setdefault("hparams", factory_hparams(factory, context=(*ctx_kwargs, *fixed)))
  return MethodSpec(name, family, build, **fields)


# name -> "module:ATTRIBUTE" of the method's MethodSpec, one line per method, in the order
# :func:`methods` lists them: the one-task methods alphabetically, the continual ones in the order
# of FOT's tables (paper 003), which its entry points print.
METHODS: dict[str, str] = {
  "cwc": "fedjax_proj.algorithms.sequential.cwc:SPEC",
  "fedavg": "fedjax_proj.algorithms.fedavg:SPEC",
  "fedcurv": "fedjax_proj.algorithms.fedcurv:SPEC",
  "feddf": "fedjax_proj.algorithms.distillation.feddf:SPEC",
  "feddistill_plus": "fedjax_proj.algorithms.distillation.feddistill:SPEC",
  "feddyn": "fedjax_proj.algorithms.feddyn:SPEC",
  "fedet": "fedjax_proj.algorithms.distillation.fedet:SPEC",
  "fedgen": "fedjax_proj.algorithms.distillation.fedgen:SPEC",
  "fedgkd": "fedjax_proj.algorithms.distillation.fedgkd:SPEC",
  "fedgkd_plus": "fedjax_proj.algorithms.distillation.fedgkd:PLUS_SPEC",
  "fedgkd_vote": "fedjax_proj.algorithms.distillation.fedgkd:VOTE_SPEC",
  "fednova": "fedjax_proj.algorithms.fednova:SPEC",
  "fedntd": "fedjax_proj.algorithms.distillation.fedntd:SPEC",
  "fedproj": "fedjax_proj.algorithms.distillation.fedproj:SPEC",
  "fedprox": "fedjax_proj.algorithms.fedprox:SPEC",
  "fedrcl": "fedjax_proj.algorithms.fedrcl:SPEC",
  "fedseq": "fedjax_proj.algorithms.sequential.fedseq:SPEC",
  "fedseq_aver": "fedjax_proj.algorithms.sequential.mtkd:AVER_SPEC",
  "fedseq_camkd": "fedjax_proj.algorithms.sequential.mtkd:CAMKD_SPEC",
  "fedseq_ebkd": "fedjax_proj.algorithms.sequential.mtkd:EBKD_SPEC",
  "moon": "fedjax_proj.algorithms.moon:SPEC",
  "scaffold": "fedjax_proj.algorithms.scaffold:SPEC",
  "sfedkd": "fedjax_proj.algorithms.sequential.sfedkd:SPEC",
  "fl": "fedjax_proj.algorithms.continual.fl:SPEC",
  "ewc": "fedjax_proj.algorithms.continual.ewc:SPEC",
  "er": "fedjax_proj.algorithms.continual.er:SPEC",
  "rgo": "fedjax_proj.algorithms.continual.rgo:SPEC",
  "gpm": "fedjax_proj.algorithms.continual.gpm:SPEC",
  "glfc": "fedjax_proj.algorithms.continual.glfc:SPEC",
  "fedcil": "fedjax_proj.algorithms.continual.fedcil:SPEC",
  "fot": "fedjax_proj.algorithms.continual.fot:SPEC",
}
_EXTRA: dict[str, MethodSpec] = {}


def register(spec: MethodSpec) -> None:
  """Adds a user-defined method to the registry (its name must be new)."""
  if not isinstance(spec, MethodSpec):
    raise TypeError(f"register() takes a MethodSpec, got {type(spec).__name__}.")
  if spec.name in METHODS:
    raise ValueError(f"Method {spec.name!r} is already registered; choose another name.")
  _EXTRA[spec.name] = spec


def unregister(name: str) -> None:
  """Removes a method added with :func:`register`."""
  _EXTRA.pop(name)


def _available(name: str) -> bool:
  if name in _EXTRA:
    return True
  ref = METHODS.get(name)
  return ref is not None and importlib.util.find_spec(ref.split(":")[0]) is not None


def spec(name: str) -> MethodSpec:
  """The :class:`MethodSpec` of ``name``; an unknown name raises a ValueError listing valid ones."""
  if not _available(name):
    raise ValueError(f"Unknown method {name!r}. Valid methods: {', '.join(methods(FAMILIES))}.")
  if name in _EXTRA:
    return _EXTRA[name]
  module, attribute = METHODS[name].split(":")
  found = getattr(importlib.import_module(module), attribute)
  if not isinstance(found, MethodSpec) or found.name != name:
    raise TypeError(f"{METHODS[name]} must be the MethodSpec of {name!r}, got {found!r}.")
  return found


def methods(families: tuple[str, ...] = FEDERATED) -> tuple[str, ...]:
  """Names of the available methods of ``families`` (default: the one-task FL families), in
  :data:`METHODS` order, then the user-registered ones alphabetically."""
  names = [*METHODS, *sorted(_EXTRA)]
  return tuple(n for n in names if _available(n) and spec(n).family in families)


def model_kwargs(name: str) -> dict:
  """Model options a method requires (e.g. MOON's ``projection_dim``)."""
  return dict(spec(name).model_kwargs) if _available(name) else {}


def config_kwargs(name: str) -> tuple[str, ...]:
  """Experiment-config fields a method consumes as hyperparameters."""
  return spec(name).config_kwargs if _available(name) else ()


def optimizer_caveat(name: str, optimizer: str) -> str | None:
  """Why ``optimizer`` is a poor client optimiser for method ``name``, or None."""
  if not _available(name):
    return None
  s = spec(name)
  if s.client_optimizers is None or optimizer in s.client_optimizers:
    return None
  return (
    f"{name} is defined for client optimiser(s) {', '.join(s.client_optimizers)}, not "
    f"{optimizer}: " + s.client_optimizer_note
  )


def declared_hparams(name: str) -> dict[str, Any] | None:
  """The hyperparameters method ``name`` accepts, name -> default; None if undeclared."""
  declared = spec(name).hparams
  return None if declared is None else dict(declared)


def describe_hparams(name: str) -> str:
  """``key=default, ...`` of :func:`declared_hparams`, for help texts and errors."""
  declared = declared_hparams(name)
  if declared is None:
    return "(undeclared)"
  if not declared:
    return "(none)"
  return ", ".join(f"{k}={'<required>' if v is REQUIRED else v!r}" for k, v in declared.items())


def _type_ok(value: Any, default: Any) -> bool:
  if default is None or default is REQUIRED or isinstance(default, tuple | list | dict):
    return True
  if isinstance(default, bool):
    return isinstance(value, bool)
  if isinstance(default, float):
    return isinstance(value, int | float) and not isinstance(value, bool)
  if isinstance(default, int):
    return isinstance(value, int) and not isinstance(value, bool)
  return isinstance(value, type(default))


def check_hparams(
  name: str, given: Mapping[str, Any], flag: str = "method hyperparameters"
) -> None:
  """Raises a ValueError, listing what ``name`` accepts, for an unknown hyperparameter, a value
  whose type does not match its default's (an int for a float is fine), a number that is not
  finite or outside its range (:func:`hparam_range`), a text value outside its spec's
  ``choices``, or a missing required one.
  ``flag`` names where the values came from in the message (e.g. ``--method_kwargs``)."""
  declared = declared_hparams(name)
  if declared is None:
    return
  accepted = f"{name} accepts: {describe_hparams(name)}"
  unknown = sorted(set(given) - set(declared))
  moved = [f"{k}: pass {MOVED_HPARAMS[name, k]}" for k in unknown if (name, k) in MOVED_HPARAMS]
  if moved:
    raise ValueError(f"{flag}: {name} no longer takes {'; '.join(moved)}.")
  if unknown:
    raise ValueError(
      f"{flag}: unknown key(s) {', '.join(unknown)} for --method={name}; {accepted}."
    )
  for key, value in given.items():
    default = declared[key]
    if not _type_ok(value, default):
      raise ValueError(
        f"{flag}: {key}={value!r} is a {type(value).__name__} but {name}'s {key} "
        f"takes a {type(default).__name__} (default {default!r}); {accepted}."
      )
  for key, value in given.items():
    if ranges.is_number(value):
      ranges.check_number(
        f"{flag} {key}",
        value,
        hparam_range(name, key),
        f"{name}'s default is {declared[key]!r}.",
      )
  allowed = spec(name).choices if _available(name) else {}
  for key, value in given.items():
    if key in allowed and value not in allowed[key]:
      raise ValueError(
        f"{flag}: {key}={value!r} is not one of {name}'s {key} values "
        f"({', '.join(map(repr, allowed[key]))}); default {declared[key]!r}."
      )
  missing = sorted(k for k, v in declared.items() if v is REQUIRED and k not in given)
  if missing:
    raise ValueError(f"{flag}: {name} requires {', '.join(missing)}; {accepted}.")


def needs_public(name: str) -> bool:
  """Whether method ``name`` reads a public set from ``RoundData.extra``."""
  return spec(name).needs_public


def needs_validation(name: str, hparams: dict) -> bool:
  """Whether method ``name`` with ``hparams`` reads a held-out validation split from
  ``RoundData.extra`` (its spec's ``needs_validation``; False if it has none)."""
  if not _available(name):
    return False
  check = spec(name).needs_validation
  return bool(check is not None and check(hparams))


def build_algorithm(name: str, ctx: BuildContext, **hparams: Any):
  """Builds method ``name``, a value of its family's Protocol (:mod:`.families`).

  Raises:
    ValueError: an unknown name (the error lists the valid ones), a hyperparameter the method does
      not declare or of the wrong type (:func:`check_hparams`), a context without a field the
      spec ``requires``, a config field the spec reads (``config_kwargs``) that is neither given
      nor defaulted by its factory, or a method that needs a public set and a context without
      one.
    TypeError: the build returned something that does not meet the spec's family.
  """
  s = spec(name)
  # The config fields a method reads (FedProj's memory size) were checked as fields, against
  # their one declared default and range (training/fields.py).
  check_hparams(name, {k: v for k, v in hparams.items() if k not in s.config_kwargs})
  unset = [f for f in s.config_kwargs if f not in hparams and f not in (s.hparams or {})]
  if unset:
    raise ValueError(
      f"Method {name!r} reads the config field(s) {', '.join(unset)}; pass them (a run passes "
      "its config's, training/experiment.py)."
    )
  missing = [f for f in s.requires if getattr(ctx, f) is None]
  if missing:
    raise ValueError(
      f"Method {name!r} needs BuildContext field(s) {', '.join(missing)}; pass them when building "
      "the context (training/continual.py shows how)."
    )
  if s.needs_public and ctx.public_size <= 0:
    raise ValueError(
      f"Method {name!r} needs a public dataset: pass --public_data (e.g. cifar100 or a path to "
      "an npz/image folder)."
    )
  built = s.build(ctx, **hparams)
  if not meets_family(built, s.family):
    raise TypeError(
      f"Method {name!r} is registered as family {s.family!r} but its build returned a "
      f"{type(built).__name__}, which does not meet {FAMILY_PROTOCOLS[s.family].__name__} "
      "(fedjax_proj.algorithms.families); fix the MethodSpec's family or its build."
    )
  return built
