"""The continual families' benchmarks and models, and their run: what ``experiments/pmnist.py``
and ``experiments/split_cifar100.py`` train.

Task-incremental continual FL (FOT, Bakman et al., ICLR 2024; GPM, Saha et al., ICLR 2021): a
family's config (fedjax_proj/configs/pmnist.py, split_cifar100.py) names its benchmark, whose
builder here turns the config into (the benchmark, the model, whether the tasks share one head);
:func:`run` trains it with :func:`fedjax_proj.training.continual.run_continual_experiment`.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable

from fedjax_proj.data.continual import permuted_mnist, split_cifar100
from fedjax_proj.data.sources import load_dataset
from fedjax_proj.models import mlp, multi_head
from fedjax_proj.training.continual import run_continual_experiment
from fedjax_proj.training.inputs import check_dataset
from fedjax_proj.training.placement import conv_impl_choice

# The Split-CIFAR100 backbone's normalisations.
NORMS = ("none", "batch")


def build_pmnist(c):
  """What config ``c`` trains: (the Permuted-MNIST benchmark, the model, whether the tasks share
  one head). Raises DataNotFoundError or ValueError naming the data and the fix."""
  train = load_dataset("mnist", "train", c.data_dir or None)
  test = load_dataset("mnist", "test", c.data_dir or None)
  check_dataset(train, "mnist", f"--data_dir={c.data_dir}" if c.data_dir else "TFDS")
  bench = permuted_mnist(
    train,
    test,
    num_tasks=c.num_tasks,
    seed=c.seed,
    train_per_task=c.train_per_task,
    test_per_task=c.test_per_task,
  )
  hidden = tuple(int(h) for h in c.hidden.split(","))
  dropout = tuple(float(d) for d in c.dropout.split(","))
  if c.heads not in ("single", "multi"):
    raise ValueError(f"--heads must be 'single' or 'multi', got {c.heads!r}")
  if c.heads == "single":
    return bench, mlp(10, hidden=hidden, dropout=dropout), True
  return bench, multi_head("mlp", bench.num_tasks, 10, hidden=hidden, dropout=dropout), False


def build_split_cifar100(c):
  """What config ``c`` trains: (the Split-CIFAR100 benchmark, the AlexNet-like multi-head model,
  False: one head per task). Raises DataNotFoundError or ValueError naming the fix.

  The model's convolutions are the backend's, as the one-task runner's (``conv_impl_choice``: on
  CPU oneDNN's convolutions where its handler loads, else the matmul kernel gradient, with a
  one-line warning naming why; docs/performance.md, "The CPU convolution kernel gradient")."""
  if c.norm not in NORMS:
    raise ValueError(f"--norm must be one of {NORMS}")
  conv_impl, why = conv_impl_choice()
  if why:
    warnings.warn(why, stacklevel=2)
  bench = split_cifar100(
    c.data_dir or None, num_tasks=10, seed=c.seed, test_fraction=c.test_fraction
  )
  model = multi_head(
    "alexnet",
    bench.num_tasks,
    bench.classes_per_task,
    head_bias=False,
    norm=c.norm,
    fc_features=c.fc_features,
    conv_impl=conv_impl,
  )
  return bench, model, False


# Benchmark name -> builder: ``build(config) -> (benchmark, model, shared_head)``.
BUILDERS: dict[str, Callable] = {"pmnist": build_pmnist, "split_cifar100": build_split_cifar100}


def builder(benchmark: str) -> Callable:
  """The builder of a continual benchmark; a ValueError names the known ones."""
  try:
    return BUILDERS[benchmark]
  except KeyError:
    raise ValueError(
      f"Unknown continual benchmark {benchmark!r}; choose one of {', '.join(BUILDERS)}."
    ) from None


def run(c, benchmark: str) -> dict:
  """Trains config ``c`` on ``benchmark`` (a key of :data:`BUILDERS`) into ``c.output_dir``;
  returns the summary. The claim runner's continual runs call it."""
  bench, model, shared_head = builder(benchmark)(c)
  return run_continual_experiment(c, bench, model, shared_head=shared_head)
