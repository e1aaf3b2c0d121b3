"""Small fixtures shared by tests: a tiny model and synthetic federated data."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

from fedjax_proj.core.types import Model, ModelOutput, RoundData
from fedjax_proj.data.federated import FederatedData
from fedjax_proj.data.pipeline import make_batch_fn, normalizer
from fedjax_proj.data.sources import ArrayDataset


def tiny_model(num_classes: int = 3, hidden: int = 8, in_dim: int = 4) -> Model:
  """A 2-layer tanh MLP written directly as pure functions (no Flax)."""

  def init(key, x):
    k1, k2 = jax.random.split(key)
    return {
      "params": {
        "w1": jax.random.normal(k1, (in_dim, hidden)) * 0.5,
        "b1": jnp.zeros(hidden),
        "w2": jax.random.normal(k2, (hidden, num_classes)) * 0.5,
        "b2": jnp.zeros(num_classes),
      }
    }

  def apply(variables, x, *, train, rng=None, mask=None):
    del train, rng, mask
    p = variables["params"]
    h = jnp.tanh(x.reshape(x.shape[0], -1) @ p["w1"] + p["b1"])
    return ModelOutput(h @ p["w2"] + p["b2"], h, {})

  return Model("tiny", init, apply, num_classes)


def synthetic_data(n: int = 120, in_dim: int = 4, num_classes: int = 3, seed: int = 0):
  """Linearly separable-ish float features and labels."""
  rng = np.random.default_rng(seed)
  centers = rng.normal(size=(num_classes, in_dim)) * 2
  labels = rng.integers(0, num_classes, n).astype(np.int32)
  x = (centers[labels] + rng.normal(size=(n, in_dim))).astype(np.float32)
  return x, labels


def unequal_clients(n: int, sizes=(7, 19, 30, 12)) -> list[np.ndarray]:
  assert sum(sizes) <= n
  cuts = np.cumsum((0, *sizes))
  return [np.arange(cuts[i], cuts[i + 1]) for i in range(len(sizes))]


def float_batch_fn():
  return make_batch_fn(normalizer(0.0, 1.0))


def round_data(fd: FederatedData, x, y, round_idx=0, seed=0, cpr=None) -> RoundData:
  sampled = fd.sample_clients(round_idx, cpr or fd.num_clients, seed)
  return fd.round_data(jnp.asarray(x), jnp.asarray(y), sampled, round_idx, seed, {})


def sequential_setup():
  """(x, y, model, federated data, variables) for the sequential-FL tests: 4 unequal clients,
  batch 5, 2 local epochs."""
  x, y = synthetic_data()
  model = tiny_model()
  fd = FederatedData(unequal_clients(len(x)), batch_size=5, local_epochs=2)
  variables = model.init(jax.random.key(0), jnp.asarray(x[:2]))
  return x, y, model, fd, variables


def sgd(lr=0.1, momentum=0.9):
  return optax.sgd(lr, momentum=momentum)


def tiny_bn_model(num_classes: int = 4) -> Model:
  """Dense -> BatchNorm -> ReLU -> Dense, through the project's Flax adapter (has batch_stats)."""
  import flax.linen as nn

  from fedjax_proj.models.base import from_flax

  class TinyBN(nn.Module):
    @nn.compact
    def __call__(self, x, train: bool, mask=None):
      h = nn.Dense(8)(x.reshape(x.shape[0], -1))
      h = nn.BatchNorm(use_running_average=not train, momentum=0.9)(
        h, mask=None if mask is None else mask[:, None]
      )
      h = nn.relu(h)
      return nn.Dense(num_classes)(h), h

  return from_flax("tiny_bn", TinyBN(), num_classes)


def fake_mnist(n: int, seed: int) -> ArrayDataset:
  """A 6x6 single-channel MNIST stand-in whose pixel level tracks the label (learnable)."""
  rng = np.random.default_rng(seed)
  labels = rng.integers(0, 10, n).astype(np.int32)
  images = (rng.integers(0, 40, (n, 6, 6, 1)) + 20 * labels[:, None, None, None]).astype(np.uint8)
  return ArrayDataset(images, labels, 10, "mnist")


class TinyBackbone(nn.Module):
  """A 2-layer dense backbone for multi-head (continual) models: returns (None, features)."""

  @nn.compact
  def __call__(self, x, train, mask=None):
    h = nn.relu(nn.Dense(16)(x.reshape(x.shape[0], -1)))
    return None, nn.relu(nn.Dense(16)(h))


def tiny_continual(
  method: str,
  backbone: nn.Module | None = None,
  client_chunk: int | None = None,
  num_clients: int = 4,
  **hparams,
):
  """A continual method on 2 permuted tasks of fake 6x6 MNIST, ``num_clients`` clients' state
  (4), a multi-head model, on a ``vmap_scan`` executor with the run's ``client_chunk``: (bench,
  method, compiled round, task evaluator, initial variables)."""
  from fedjax_proj.algorithms.base import make_round
  from fedjax_proj.core.executor import Executor
  from fedjax_proj.data.continual import input_transform, permuted_mnist, task_model
  from fedjax_proj.models import multi_head
  from fedjax_proj.training.continual import build_continual_method, make_task_evaluator

  bench = permuted_mnist(fake_mnist(240, 0), fake_mnist(60, 1), num_tasks=2, seed=0)
  model = task_model(multi_head(backbone or TinyBackbone(), 2, 10), input_transform(bench))
  normalize = normalizer(0.0, 255.0)
  sample = normalize(jnp.asarray(bench.images[:2]))
  variables = model.init(jax.random.key(0), sample)
  executor = Executor("vmap_scan", make_batch_fn(normalize), client_chunk=client_chunk)
  cm = build_continual_method(
    method,
    model,
    optax.sgd(0.05),
    executor,
    variables=variables,
    sample_x=sample,
    num_clients=num_clients,
    num_tasks=2,
    **hparams,
  )
  evaluate = make_task_evaluator(model, normalize, 64)
  return bench, cm, make_round(cm.algorithm, executor), evaluate, variables


def dkd_loss(teacher_logits, student_logits, labels, temperature=4.0, mask=None):
  """DKD's two terms with its T² factor (Zhao et al., 2022): (T²·TCKD, T²·NCKD), batch means over
  unmasked examples; the single-teacher reference SFedKD's per-example weighting is tested against
  (docs/methods.md, "SFedKD")."""
  from fedjax_proj.algorithms import losses

  tckd, nckd = losses.dkd_per_example(teacher_logits, student_logits, labels, temperature)
  scale = temperature**2
  return scale * losses.masked_mean(tckd, mask), scale * losses.masked_mean(nckd, mask)
