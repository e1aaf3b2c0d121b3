"""Method registry: one name per algorithm, each built from a :class:`BuildContext` and its
hyperparameters. Experiments select methods by name (``--method``)."""

from __future__ import annotations

import functools
import importlib
import importlib.util
import inspect
from collections.abc import Callable
from typing import Any, NamedTuple

import optax

from fedjax_proj.algorithms.base import FederatedAlgorithm
from fedjax_proj.core.engine import BatchFn
from fedjax_proj.core.types import Array, Model


class BuildContext(NamedTuple):
  """What every method factory may need besides its own hyperparameters.

  Attributes:
    model: the model.
    client_optimizer: the local optimiser.
    batch_fn: the engine's batch builder for private data.
    normalize: maps raw (uint8) images to model inputs, for public data.
    num_clients: total number of clients (for per-client state).
    server_optimizer: optional optax server optimiser (FedAvgM/FedAdam), else None.
    public_size: number of public examples in ``RoundData.extra["public_images"]`` (0 if none).
    num_classes: number of classes of the private task.
    validation_size: number of held-out training examples in ``RoundData.extra``
      (``validation_images`` / ``validation_labels``; 0 if none): the part of the training set
      that ``train_subset`` leaves out (FedGKD-VOTE's server-side validation losses).
  """

  model: Model
  client_optimizer: optax.GradientTransformation
  batch_fn: BatchFn
  normalize: Callable[[Array], Array]
  num_clients: int
  server_optimizer: optax.GradientTransformation | None = None
  public_size: int = 0
  num_classes: int = 10
  validation_size: int = 0


# name -> module defining ``build(ctx: BuildContext, **hparams) -> FederatedAlgorithm``,
# ``NEEDS_PUBLIC: bool`` and optionally ``MODEL_KWARGS: dict`` (model options the method needs).
# Modules are imported lazily, so adding a method never slows start-up; a name is listed only
# once its module exists.
METHOD_MODULES: dict[str, str] = {
  "fedavg": "fedjax_proj.algorithms.fedavg",
  "fedprox": "fedjax_proj.algorithms.fedprox",
  "fednova": "fedjax_proj.algorithms.fednova",
  "feddyn": "fedjax_proj.algorithms.feddyn",
  "scaffold": "fedjax_proj.algorithms.scaffold",
  "moon": "fedjax_proj.algorithms.moon",
  "fedrcl": "fedjax_proj.algorithms.fedrcl",
  "feddf": "fedjax_proj.algorithms.feddf",
  "fedet": "fedjax_proj.algorithms.fedet",
  "fedgkd": "fedjax_proj.algorithms.fedgkd",
  "fedgkd_vote": "fedjax_proj.algorithms.fedgkd",
  "fedntd": "fedjax_proj.algorithms.fedntd",
  "fedproj": "fedjax_proj.algorithms.fedproj",
  "fedseq": "fedjax_proj.algorithms.sequential",
  "cwc": "fedjax_proj.algorithms.cwc",
  "sfedkd": "fedjax_proj.algorithms.sfedkd",
}
_EXTRA: dict[str, tuple[Callable[..., FederatedAlgorithm], bool]] = {}


def register(name: str, builder: Callable[..., FederatedAlgorithm], needs_public: bool = False):
  """Adds a user-defined method ``builder(ctx, **hparams)`` to the registry."""
  _EXTRA[name] = (builder, needs_public)


def _available(name: str) -> bool:
  if name in _EXTRA:
    return True
  module = METHOD_MODULES.get(name)
  return module is not None and importlib.util.find_spec(module) is not None


def methods() -> tuple[str, ...]:
  """Names of the methods available in this installation."""
  return tuple(sorted(n for n in {*METHOD_MODULES, *_EXTRA} if _available(n)))


def _resolve(name: str) -> tuple[Callable[..., FederatedAlgorithm], bool]:
  if name in _EXTRA:
    return _EXTRA[name]
  module = importlib.import_module(METHOD_MODULES[name])
  builder = module.build
  needs_public = getattr(module, "NEEDS_PUBLIC", False)
  if isinstance(needs_public, dict):
    needs_public = needs_public.get(name, False)
  if "method" in inspect.signature(builder).parameters:
    # One module may serve several names (fedgkd / fedgkd_vote).
    builder = functools.partial(builder, method=name)
  return builder, needs_public


def model_kwargs(name: str) -> dict:
  """Model options a method requires (e.g. MOON's ``projection_dim``), from ``MODEL_KWARGS``."""
  if name in _EXTRA or not _available(name):
    return {}
  kwargs = getattr(importlib.import_module(METHOD_MODULES[name]), "MODEL_KWARGS", {})
  return dict(kwargs.get(name, {})) if name in kwargs else dict(kwargs)


def config_kwargs(name: str) -> tuple[str, ...]:
  """Experiment-config fields a method consumes as hyperparameters (``CONFIG_KWARGS``)."""
  if name in _EXTRA or not _available(name):
    return ()
  return tuple(getattr(importlib.import_module(METHOD_MODULES[name]), "CONFIG_KWARGS", ()))


def optimizer_caveat(name: str, optimizer: str) -> str | None:
  """Why ``optimizer`` is a poor client optimiser for method ``name``, or None.

  Modules list the client optimisers they are defined for in ``CLIENT_OPTIMIZERS`` and say why in
  ``CLIENT_OPTIMIZER_NOTE``.
  """
  if name in _EXTRA or not _available(name):
    return None
  module = importlib.import_module(METHOD_MODULES[name])
  allowed = getattr(module, "CLIENT_OPTIMIZERS", None)
  if allowed is None or optimizer in allowed:
    return None
  return (
    f"{name} is defined for client optimiser(s) {', '.join(allowed)}, not {optimizer}: "
    + getattr(module, "CLIENT_OPTIMIZER_NOTE", "expect it to train poorly.")
  )


def needs_public(name: str) -> bool:
  """Whether method ``name`` reads a public set from ``RoundData.extra``."""
  return _resolve(name)[1]


def needs_validation(name: str, hparams: dict) -> bool:
  """Whether method ``name`` with ``hparams`` reads a held-out validation split from
  ``RoundData.extra`` (a module's ``needs_validation(name, hparams)``; False if it has none)."""
  if name in _EXTRA or not _available(name):
    return False
  check = getattr(importlib.import_module(METHOD_MODULES[name]), "needs_validation", None)
  return bool(check is not None and check(name, hparams))


def build_algorithm(name: str, ctx: BuildContext, **hparams: Any) -> FederatedAlgorithm:
  """Builds method ``name``; unknown names raise a ValueError listing the valid ones."""
  if not _available(name):
    raise ValueError(f"Unknown method {name!r}. Valid methods: {', '.join(methods())}.")
  builder, public = _resolve(name)
  if public and ctx.public_size <= 0:
    raise ValueError(
      f"Method {name!r} needs a public dataset: pass --public_data (e.g. cifar100 or a path to "
      "an npz/image folder)."
    )
  return builder(ctx, **hparams)
