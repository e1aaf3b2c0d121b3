"""Optimiser factories: the client optimiser (with its local lr schedule) and the server one."""

from __future__ import annotations

import ml_collections
import optax

from fedjax_proj.training.fields import FIELDS

# The names each factory takes: the choices its config field declares (training/fields.py).
OPTIMIZERS = FIELDS["optimizer"].choices
LR_SCHEDULES = FIELDS["lr_schedule"].choices
SERVER_OPTIMIZERS = FIELDS["server_optimizer"].choices


def lr_step_epochs(c: ml_collections.ConfigDict) -> int:
  """Epochs between local lr decays: ``lr_step_epochs``, or local_epochs // 2 when it is 0."""
  return int(c.lr_step_epochs) or int(c.local_epochs) // 2


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
    schedule=c.lr_schedule,
    local_epochs=c.local_epochs,
    step_epochs=lr_step_epochs(c),
    gamma=c.lr_step_gamma,
  )


def make_server_optimizer(c: ml_collections.ConfigDict):
  """The server optimiser the config asks for; None for plain averaging (``none``)."""
  if c.server_optimizer == "none":
    return None
  if c.server_optimizer == "sgd":
    return optax.sgd(c.server_lr, momentum=c.server_momentum or None)
  return optax.adam(c.server_lr)
