"""Shared small configurations for the model tests (inputs kept tiny so the suite stays fast)."""

import functools
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_proj.models import get_model

# Smallest inputs each architecture accepts; resnets pool globally, so they run on small images.
INPUT_SHAPES = {
  "mlp": (28, 28, 1),
  "cnn": (28, 28, 1),
  "resnet8": (16, 16, 3),
  "resnet10": (8, 8, 3),
  "resnet18": (8, 8, 3),
  "alexnet": (32, 32, 3),
  "alexnet8": (32, 32, 3),
  "lenet5": (28, 28, 1),
  "bert": (2, 12),  # token ids and token types of 12 tokens
}
FEATURE_DIMS = {
  "mlp": 200,
  "cnn": 512,
  "resnet8": 64,
  "resnet10": 512,
  "resnet18": 512,
  "alexnet": 2048,
  "alexnet8": 4096,
  "lenet5": 84,
  "bert": 32,
}
# Options of the test instance (the registered default of "bert" is the 14.5M-parameter TinyBERT).
TEST_KWARGS = {"bert": {"size": "tiny"}}
TEXT_MODELS = ("bert",)
NUM_CLASSES = 7
BATCH = 3


# Tests check semantics on tiny batches, so compile time dominates: compile at XLA's lowest
# optimisation level (e.g. the AlexNet train step: 3.5 s -> 0.9 s of compile CPU time).
jit = functools.partial(jax.jit, compiler_options={"xla_backend_optimization_level": 0})


def key(seed):
  """A PRNG key for tests."""
  return jax.random.key(seed)


def sample_x(name, batch=BATCH, seed=0):
  """Standard-normal inputs of the architecture's test shape (token ids for text models)."""
  rng = np.random.default_rng(seed)
  if name in TEXT_MODELS:
    ids = rng.integers(1, 1000, (batch, *INPUT_SHAPES[name]))
    ids[:, 1] = ids[:, 1] % 2  # token types
    return jnp.asarray(ids, jnp.int32)
  return jnp.asarray(rng.standard_normal((batch, *INPUT_SHAPES[name])), jnp.float32)


class Built(NamedTuple):
  """A model with its test variables, inputs and jitted apply functions (compiled once)."""

  model: Any
  variables: dict
  x: Any
  eval: Callable  # eval(variables, x, mask=None) -> ModelOutput
  train: Callable  # train(variables, x, rng=None, mask=None) -> ModelOutput


@functools.cache
def built(name, **kwargs):
  """The :class:`Built` bundle for a registered model, built once per option set per session."""
  model = get_model(name, NUM_CLASSES, **{**TEST_KWARGS.get(name, {}), **kwargs})
  x = sample_x(name)
  return Built(
    model,
    model.init(key(0), x[:1]),
    x,
    jit(lambda v, x, mask=None: model.apply(v, x, train=False, mask=mask)),
    jit(lambda v, x, rng=None, mask=None: model.apply(v, x, train=True, rng=rng, mask=mask)),
  )


@functools.cache
def traceable(name):
  """(model, variables as shapes and dtypes, inputs) of :func:`built`'s instance, for tests that
  only trace the model (``jax.make_jaxpr`` takes the shapes): no initialisation is compiled or
  run (an AlexNet-8 init took 4.6 s of CPU at the suite's optimisation level, most of it
  generating its 23M random parameters)."""
  model = get_model(name, NUM_CLASSES, **TEST_KWARGS.get(name, {}))
  x = sample_x(name)
  return model, jax.eval_shape(model.init, key(0), x[:1]), x


def perturbed(variables, scale=0.1):
  """A second, different set of variables of the same structure (cheaper than another init)."""
  return jax.tree_util.tree_map(lambda a: a * (1 + scale) + scale, variables)
