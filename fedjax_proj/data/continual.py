"""Task-incremental continual-learning benchmarks as datasets: Permuted MNIST and Split-CIFAR100.

The setting of FOT (Bakman et al., "Federated Orthogonal Training: Mitigating Global Catastrophic
Forgetting in Continual Federated Learning", ICLR 2024) and GPM (Saha et al., ICLR 2021): tasks
arrive one after another, only the current task's data is on the clients, and a multi-head model
has one head per task (:mod:`fedjax_proj.models.multihead`).

A :class:`ContinualBenchmark` keeps every image ONCE (``images`` / ``test_images``) with
within-task labels; a task is a set of indices into that store plus a task-dependent input
transform (the pixel permutation of Permuted MNIST; identity for Split-CIFAR100). The transform is
applied on device by :func:`task_model` from the (possibly traced) task id, so one compiled round
serves every task and Permuted MNIST never stores ten permuted copies.

* Permuted MNIST: 10 tasks, each a fixed pixel permutation drawn from ``seed`` (every task
  permuted, as in GPM's ``pmnist``), 10 classes per task.
* Split-CIFAR100: the 100 classes split into 10 tasks of 10 (class order a seeded permutation, as
  the paper's "randomly dividing 100 classes"). Offline, only the 20,000-image CIFAR-100 subset
  ``../shared/data/cifar100/public_20k.npz`` exists: :func:`split_cifar100` then splits it
  into train/test per class with a seed (default 80/20), i.e. ~160 training images per class
  instead of 500 — a smoke/real-data run, not the paper's data size.
* 5-Datasets (CIFAR-10, MNIST, SVHN, notMNIST, Fashion-MNIST) needs notMNIST, which is in
  neither TFDS nor the offline data: :func:`five_datasets` raises a clear error.

Client data per task: :func:`task_partition` splits the task's training indices IID or by
label-sorted shards (FOT's non-IID: 2 shards per client), reproducibly from (seed, task).
Two settings of FOT's appendix change who holds a task (docs/fot.md, "Appendix settings"):
task heterogeneity (003 G.1, Table 10: :func:`heterogeneous_num_clients` and
:func:`task_holders` give each task to a fraction of a larger client population) and centralised
training (003 Appendix A, Table 7: :func:`centralised_partition`, one client holding the pooled
task).
"""

from __future__ import annotations

import pathlib
from collections.abc import Callable
from typing import NamedTuple

import jax.numpy as jnp
import numpy as np

from fedjax_proj.core.types import Array, Model, ModelOutput
from fedjax_proj.data import partition as partition_lib
from fedjax_proj.data.sources import ArrayDataset, load_dataset, load_npz


class TaskSplit(NamedTuple):
  """One task: indices into the benchmark's train and test stores, and its original classes."""

  train_idx: np.ndarray
  test_idx: np.ndarray
  classes: np.ndarray


class ContinualBenchmark(NamedTuple):
  """A sequence of tasks over one shared image store.

  Attributes:
    name: benchmark name (``pmnist``, ``split_cifar100``).
    images: uint8 [N, ...] training store.
    labels: int32 [N] WITHIN-task labels in ``[0, classes_per_task)``.
    test_images: uint8 [M, ...] test store.
    test_labels: int32 [M] within-task labels.
    tasks: one :class:`TaskSplit` per task, in arrival order.
    classes_per_task: head width.
    normalizer_name: dataset name for :func:`fedjax_proj.data.pipeline.normalizer_for`.
    permutations: int32 [T, D] pixel permutations (Permuted MNIST) or None (no transform).
  """

  name: str
  images: np.ndarray
  labels: np.ndarray
  test_images: np.ndarray
  test_labels: np.ndarray
  tasks: tuple[TaskSplit, ...]
  classes_per_task: int
  normalizer_name: str
  permutations: np.ndarray | None = None

  @property
  def num_tasks(self) -> int:
    return len(self.tasks)


def _take_per_task(idx: np.ndarray, n: int, rng: np.random.Generator) -> np.ndarray:
  if not n or n >= len(idx):
    return np.sort(idx)
  return np.sort(rng.choice(idx, n, replace=False))


def permuted_mnist(
  train: ArrayDataset,
  test: ArrayDataset,
  *,
  num_tasks: int = 10,
  seed: int = 0,
  train_per_task: int = 0,
  test_per_task: int = 0,
) -> ContinualBenchmark:
  """Permuted MNIST: task t sees every image with the fixed pixel permutation ``perm[t]``.

  Args:
    train: MNIST train split (uint8 [N, 28, 28, 1]).
    test: MNIST test split.
    num_tasks: number of permutations (10 in the paper).
    seed: seeds the permutations and the per-task subsets.
    train_per_task: if > 0, each task uses its own random subset of this many training images
      (a reduced budget); 0 uses all of them for every task (the paper).
    test_per_task: the same for the test split.

  Returns:
    The benchmark; ``permutations`` [T, H·W·C] act on flattened images.
  """
  if num_tasks < 1:
    raise ValueError(f"num_tasks must be >= 1, got {num_tasks}")
  if train.images.ndim != 4:
    raise ValueError(f"permuted_mnist expects images [N, H, W, C], got {train.images.shape}")
  dim = int(np.prod(train.images.shape[1:]))
  rng = np.random.default_rng([seed, 0x504D])
  perms = np.stack([rng.permutation(dim) for _ in range(num_tasks)]).astype(np.int32)
  tasks = []
  all_train, all_test = np.arange(len(train.labels)), np.arange(len(test.labels))
  for _ in range(num_tasks):
    tasks.append(
      TaskSplit(
        _take_per_task(all_train, train_per_task, rng),
        _take_per_task(all_test, test_per_task, rng),
        np.arange(10),
      )
    )
  return ContinualBenchmark(
    "pmnist",
    train.images,
    train.labels.astype(np.int32),
    test.images,
    test.labels.astype(np.int32),
    tuple(tasks),
    10,
    "mnist",
    perms,
  )


def _split_by_class(labels: np.ndarray, test_fraction: float, seed: int):
  rng = np.random.default_rng([seed, 0x5350])
  train_idx, test_idx = [], []
  for c in np.unique(labels):
    idx = rng.permutation(np.flatnonzero(labels == c))
    n_test = round(len(idx) * test_fraction)
    test_idx.append(idx[:n_test])
    train_idx.append(idx[n_test:])
  return np.sort(np.concatenate(train_idx)), np.sort(np.concatenate(test_idx))


def split_classes(
  train: ArrayDataset,
  test: ArrayDataset,
  *,
  num_tasks: int,
  seed: int = 0,
  shuffle_classes: bool = True,
  name: str = "split",
  normalizer_name: str = "",
) -> ContinualBenchmark:
  """Class-split benchmark: the classes divided into ``num_tasks`` equal groups, one per task.

  Labels become within-task positions: class ``order[t * k + j]`` is label j of task t.
  """
  num_classes = train.num_classes
  if num_classes % num_tasks:
    raise ValueError(f"{num_classes} classes do not split evenly into {num_tasks} tasks")
  k = num_classes // num_tasks
  order = (
    np.random.default_rng([seed, 0x4353]).permutation(num_classes)
    if shuffle_classes
    else np.arange(num_classes)
  )
  task_of = np.empty(num_classes, np.int32)
  local = np.empty(num_classes, np.int32)
  task_of[order] = np.arange(num_classes) // k
  local[order] = np.arange(num_classes) % k
  tasks = []
  for t in range(num_tasks):
    classes = order[t * k : (t + 1) * k]
    tr = np.flatnonzero(task_of[train.labels] == t)
    te = np.flatnonzero(task_of[test.labels] == t)
    if len(tr) == 0 or len(te) == 0:
      raise ValueError(f"task {t} (classes {classes.tolist()}) has no train or test examples")
    tasks.append(TaskSplit(tr, te, classes))
  return ContinualBenchmark(
    name,
    train.images,
    local[train.labels],
    test.images,
    local[test.labels],
    tuple(tasks),
    k,
    normalizer_name or name,
  )


def split_cifar100(
  data_dir: str | pathlib.Path | None = None,
  *,
  num_tasks: int = 10,
  seed: int = 0,
  test_fraction: float = 0.2,
) -> ContinualBenchmark:
  """Split-CIFAR100 (10 tasks x 10 classes).

  Args:
    data_dir: an ``.npz`` file holding ONE pool of CIFAR-100 images (e.g. the offline
      ``public_20k.npz``), split here into train/test per class with ``seed`` and
      ``test_fraction``; or a folder with ``train``/``test`` splits (npz or image folders, see
      :func:`fedjax_proj.data.sources.load_dataset`); or None for TFDS.
    num_tasks: number of tasks.
    seed: class order and train/test split seed.
    test_fraction: test share of each class when splitting a single pool.

  Returns:
    The benchmark.
  """
  path = pathlib.Path(data_dir).expanduser() if data_dir else None
  if path is not None and path.suffix == ".npz":
    pool = load_npz(path, name="cifar100", num_classes=100)
    tr, te = _split_by_class(pool.labels, test_fraction, seed)
    train = ArrayDataset(pool.images[tr], pool.labels[tr], 100, "cifar100")
    test = ArrayDataset(pool.images[te], pool.labels[te], 100, "cifar100")
  else:
    train = load_dataset("cifar100", "train", path)
    test = load_dataset("cifar100", "test", path)
  return split_classes(
    train, test, num_tasks=num_tasks, seed=seed, name="split_cifar100", normalizer_name="cifar100"
  )


def five_datasets(*_args, **_kwargs) -> ContinualBenchmark:
  """5-Datasets is not available: notMNIST is in neither TFDS nor the offline data."""
  raise NotImplementedError(
    "5-Datasets (CIFAR-10, MNIST, SVHN, notMNIST, Fashion-MNIST) is not supported: notMNIST is "
    "not in TFDS and no offline copy exists. Use pmnist or split_cifar100."
  )


def task_partition(
  bench: ContinualBenchmark,
  task: int,
  num_clients: int,
  *,
  iid: bool,
  seed: int,
  shards_per_client: int = 2,
) -> list[np.ndarray]:
  """Splits task ``task``'s training data over the clients; returns indices into the store.

  Args:
    bench: the benchmark.
    task: task id.
    num_clients: number of clients.
    iid: IID split if True, else label-sorted shards (``shards_per_client`` each; FOT's non-IID).
    seed: run seed; the task id is folded in so every task gets a different split.
    shards_per_client: shards per client for the non-IID split.
  """
  split = bench.tasks[task]
  labels = bench.labels[split.train_idx]
  task_seed = int(np.random.default_rng([seed, task, 0x5450]).integers(2**31))
  if iid:
    parts = partition_lib.iid(labels, num_clients, task_seed)
  else:
    parts = partition_lib.shards(labels, num_clients, shards_per_client, seed=task_seed)
  return [split.train_idx[p] for p in parts]


def input_transform(bench: ContinualBenchmark) -> Callable[[Array, Array], Array] | None:
  """``transform(x, task)`` applying the task's permutation to flattened inputs, or None.

  ``task`` is a scalar (the batch's task) or a vector [B] (each example's own task)."""
  if bench.permutations is None:
    return None
  perms = np.asarray(bench.permutations)

  def transform(x: Array, task: Array) -> Array:
    flat = x.reshape(x.shape[0], -1)
    perm = jnp.take(jnp.asarray(perms), jnp.asarray(task, jnp.int32), axis=0)
    if perm.ndim == 2:  # [B, D]: each example through its own task's permutation
      return jnp.take_along_axis(flat, perm, axis=1).reshape(x.shape)
    return jnp.take(flat, perm, axis=1).reshape(x.shape)

  return transform


def task_model(
  model: Model,
  transform: Callable[[Array, Array], Array] | None,
  *,
  shared_head: bool = False,
) -> Model:
  """Wraps a model so that ``apply(..., task=t)`` first applies ``transform(x, t)``.

  Args:
    model: a multi-head model (``apply(..., task=t)``), or with ``shared_head=True`` an ordinary
      single-head model that never sees the task id (the authors' Permuted-MNIST setup: one
      10-way classifier shared by every task, which FOT then projects like any Dense layer).
    transform: the benchmark's input transform (:func:`input_transform`), or None.
    shared_head: drop the ``task`` keyword before calling ``model.apply``.
  """
  if transform is None and not shared_head:
    return model

  def apply(variables, x, *, train, rng=None, mask=None, task=0) -> ModelOutput:
    if transform is not None:
      x = transform(x, task)
    kwargs = {} if shared_head else {"task": task}
    return model.apply(variables, x, train=train, rng=rng, mask=mask, **kwargs)

  return Model(model.name, model.init, apply, model.num_classes)


def heterogeneous_num_clients(num_clients: int, task_fraction: float) -> int:
  """The client population of FOT's task-heterogeneity setting (003 G.1, Table 10).

  "We increase the total number of clients so that 60% of that is equal to the number of clients
  we set for the main experiments": ``round(num_clients / task_fraction)`` clients in all, of
  which ``num_clients`` hold each task (:func:`task_holders`). ``task_fraction`` 1 is the main
  setting: every client holds every task.

  Args:
    num_clients: clients holding each task's data (the main setting's number of clients).
    task_fraction: the share of the tasks a client holds on average, in (0, 1].

  Raises:
    ValueError: ``task_fraction`` outside (0, 1] or ``num_clients`` < 1.
  """
  if not 0.0 < task_fraction <= 1.0:
    raise ValueError(
      f"task_fraction must be in (0, 1] (the share of the tasks each client holds; 1: every "
      f"client holds every task), got {task_fraction}"
    )
  if num_clients < 1:
    raise ValueError(f"num_clients must be >= 1, got {num_clients}")
  return max(num_clients, round(num_clients / task_fraction))


def task_holders(
  num_tasks: int, num_clients: int, total_clients: int, seed: int
) -> tuple[np.ndarray, ...]:
  """Which clients hold each task's data (003 G.1): ``num_clients`` of ``total_clients`` each.

  003 fixes only the averages ("each client sees 60% of the tasks on average ... the number of
  clients that have data for each task is the same as before"); how the tasks are dealt is our
  reading (docs/fot.md, "Appendix settings"): task by task, the ``num_clients`` clients holding
  the fewest tasks so far, ties broken uniformly at random from ``seed``. Every client then holds
  ⌊K·N/M⌋ or ⌈K·N/M⌉ of the K tasks (N = ``num_clients``, M = ``total_clients``), so each holds
  N/M of them up to one task, and each task's holders are a random set.

  Args:
    num_tasks: K.
    num_clients: N, the clients holding each task.
    total_clients: M >= N, the population (:func:`heterogeneous_num_clients`).
    seed: run seed.

  Returns:
    K sorted int32 arrays of N distinct client ids in [0, M); ``arange(N)`` for every task when
    M = N (the main setting, unchanged).
  """
  if not 1 <= num_clients <= total_clients:
    raise ValueError(
      f"task_holders needs 1 <= num_clients <= total_clients, got {num_clients} of {total_clients}"
    )
  if total_clients == num_clients:
    return tuple(np.arange(num_clients, dtype=np.int32) for _ in range(num_tasks))
  rng = np.random.default_rng([seed, 0x484F])
  held = np.zeros(total_clients, np.int64)
  holders = []
  for _ in range(num_tasks):
    # Fewest tasks first (the integer part), random among equals (the fraction in [0, 1)).
    order = np.argsort(held + rng.random(total_clients), kind="stable")
    chosen = np.sort(order[:num_clients]).astype(np.int32)
    held[chosen] += 1
    holders.append(chosen)
  return tuple(holders)


def centralised_partition(bench: ContinualBenchmark, task: int) -> list[np.ndarray]:
  """Centralised training (003 Appendix A, Table 7): ONE client holding all of task ``task``'s
  training data, the pooled data a centralised learner (ER over plain SGD) trains on."""
  return [np.array(bench.tasks[task].train_idx, copy=True)]
