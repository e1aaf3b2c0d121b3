"""Shared types: the model contract, batches and the round layout.

Algorithms never hold a Flax Module; they receive a :class:`Model`, a pair of pure functions.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax

PyTree = Any
Array = jax.Array
Variables = dict  # {"params": ..., optionally "batch_stats": ...}


class ModelOutput(NamedTuple):
  """What a model's forward pass returns.

  Attributes:
    logits: [B, num_classes] (for multi-head models: the selected head's logits).
    features: [B, D] penultimate features (after global pooling / last hidden layer), computed in
      the same forward pass; MOON, FedRCL and FOT read them without a second pass.
    state: the updated non-parameter collections (e.g. ``{"batch_stats": ...}``). In inference mode
      (``train=False``) this is the input state unchanged. ``{}`` for models without such state.
  """

  logits: Array
  features: Array
  state: dict


class Model(NamedTuple):
  """A model as two pure functions.

  Attributes:
    name: registry name, e.g. ``"resnet8"``.
    init: ``init(key, sample_x) -> variables`` with ``variables["params"]`` and, for BatchNorm
      models, ``variables["batch_stats"]``.
    apply: ``apply(variables, x, *, train, rng=None, mask=None) -> ModelOutput``. ``train=True``
      uses batch statistics (and returns updated running statistics, computed over examples where
      ``mask`` is true only) and enables dropout with ``rng``; ``train=False`` never changes state.
    num_classes: output width.
  """

  name: str
  init: Callable[..., Variables]
  apply: Callable[..., ModelOutput]
  num_classes: int


class Batch(NamedTuple):
  """One local step's batch for one client.

  Attributes:
    x: float32 inputs [B, ...], already normalised (and augmented when training).
    y: int32 labels [B].
    mask: float32 [B]; 1 for real examples, 0 for padding. Losses are masked means.
  """

  x: Array
  y: Array
  mask: Array


class RoundData(NamedTuple):
  """Everything one round needs, as device arrays; passed as an argument, never closed over.

  The training set lives on device once (``images`` uint8 or float, ``labels`` int32); each round
  only ships indices into it, laid out [clients, steps, batch].

  Attributes:
    images: [N, ...] the whole training set (uint8 images or float features).
    labels: [N] int32.
    client_ids: [C] int32, which of the ``num_clients`` clients were sampled (for per-client state).
    idx: [C, S, B] int32 indices into ``images``; padding entries point at index 0.
    mask: [C, S, B] bool; False for padding. A step whose mask is all False is a no-op.
    num_examples: [C] float32, each sampled client's local dataset size n_k (aggregation weights).
    extra: method-specific round inputs (e.g. FedProj's memory-buffer indices), a dict of arrays.
  """

  images: Array
  labels: Array
  client_ids: Array
  idx: Array
  mask: Array
  num_examples: Array
  extra: dict
