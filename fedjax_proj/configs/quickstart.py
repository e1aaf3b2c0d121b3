"""Quickstart: FedAvg vs FedProj on scikit-learn's digits, in about a minute on a CPU.

    python experiments/quickstart.py [--output_dir=runs/quickstart] [--rounds=20] [--seed=0]

Needs no download, no GPU and no data folder: the 1,797 8x8 handwritten digits ship with
scikit-learn (``--dataset=digits``, split 80/20 into train and test). The job is the library's
main one at toy scale: 10 clients under Dirichlet(0.3) label skew train a 200-200 MLP (the 2NN
of McMahan et al., 2017). FedAvg averages their models; FedProj (papers 000/001; docs/fedproj.md)
also keeps a memory of the global model's predictions on a public set, projects each client
gradient so that the memory loss does not rise, and distils the clients' ensemble into the global
model on that set. The private training set is 1,000 of the 1,437 training images; the other 437,
without their labels, are the public set (written to ``<output_dir>/public_digits.npz``), so public
and private never overlap.

Prints each run's progress and a summary (final test accuracy; for FedProj the fraction of local
steps it projected), and saves the curves of both runs to ``<output_dir>/curves.png``. One seed of
a toy problem shows what the library does, not which method is better: the measured comparisons on
CIFAR-10 are in docs/fedproj.md and docs/reproduction.md. The CIFAR-10 entry point with its
``cpu`` preset is the next step (README, first section).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import ml_collections

from fedjax_proj.training import fields as fields_lib
from fedjax_proj.training.config import base_config
from fedjax_proj.training.fields import FIELDS as FIELDS  # the config's: base_config's

METHODS = ("fedavg", "fedproj")
PRIVATE_TRAIN = 1000  # of digits' 1,437 training images; the rest is the unlabelled public set
PUBLIC_FILE = "public_digits.npz"
# The quickstart's flags: base_config's fields with the demo's defaults and help (training/fields.py
# declares what each means; ranges are checked before anything is written).
FLAGS = fields_lib.table(
  fields_lib.variant(
    FIELDS["output_dir"],
    help="folder for both runs, the public set and curves.png (empty: runs/quickstart-<time>)",
  ),
  fields_lib.variant(FIELDS["rounds"], default=20, help="communication rounds of each method"),
  fields_lib.variant(FIELDS["seed"], help="random seed of both runs, in [0, 2**32 - 1)"),
  fields_lib.variant(FIELDS["overwrite"], help="replace the runs --output_dir holds (else refuse)"),
)


def get_config(preset: str = "demo") -> ml_collections.ConfigDict:
  """The demo setting shared by both methods (FedProj additionally reads the public set)."""
  if preset != "demo":
    raise ValueError(f"Unknown preset {preset!r}; quickstart has one preset, 'demo'.")
  c = base_config()
  c.dataset = "digits"
  c.model = "mlp"
  c.num_clients = 10
  c.clients_per_round = 5
  c.rounds = 20
  c.local_epochs = 2
  c.batch_size = 16
  c.partition = "dirichlet:0.3"
  c.train_subset = PRIVATE_TRAIN
  c.eval_every = 1
  c.checkpoint_every = 0  # a minute-long run: checkpoints only on Ctrl-C
  c.public_size = 0
  c.memory_size = 437 - 37  # |M|: most of the 437 public images
  c.lmem_global = True  # the demo plots FedProj's drift metric beside its accuracy
  c.method_defaults = ml_collections.ConfigDict(
    {"fedproj": {"memory_batch_size": 64, "distill_batch_size": 64, "distill_lr": 1e-4}}
  )
  return c


def prepare(c: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """The demo's rules applied after the flags: every field in its range and choices, FedProj's
  public set named (training/config.validate_config; a ValueError naming the fix); returns
  ``c``. :func:`main` applies it to both methods' configs before either run starts."""
  from fedjax_proj.training.config import validate_config

  validate_config(c)
  return c


def resolve(preset: str = "demo", fields=None, method_kwargs=None) -> ml_collections.ConfigDict:
  """The config of one of the demo's runs: the preset, then ``fields`` and ``method_kwargs``
  (configs/common.resolve), then :func:`prepare`."""
  from fedjax_proj.configs import common

  return common.resolve(get_config, preset, fields, method_kwargs, prepare)


def write_public_set(path: Path, seed: int) -> int:
  """Writes the training images ``train_subset`` leaves out, without labels, as an npz."""
  import numpy as np

  from fedjax_proj.data.sources import load_sklearn
  from fedjax_proj.training.inputs import held_out

  images, _ = held_out(load_sklearn("digits", "train"), PRIVATE_TRAIN, seed)
  path.parent.mkdir(parents=True, exist_ok=True)
  np.savez(path, image=images)  # no "label": the public set is unlabelled (docs/fedproj.md)
  return len(images)


def main(argv) -> int:
  """``python experiments/quickstart.py``: FedAvg and FedProj on the demo, then their curves."""
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
  fields_lib.add_flags(p, FLAGS)
  args = fields_lib.parse_checked(p, argv, FLAGS)
  out = Path(args.output_dir or f"runs/quickstart-{time.strftime('%Y%m%d-%H%M%S')}")
  from fedjax_proj.plot import plot_runs
  from fedjax_proj.training.checkpoint import CheckpointError
  from fedjax_proj.training.experiment import run_experiment
  from fedjax_proj.training.loop import NonFiniteError
  from fedjax_proj.training.metrics import read_metrics
  from fedjax_proj.training.rundir import describe_os_error
  from fedjax_proj.training.signals import TrainingInterrupted

  configs = {}
  for method in METHODS:
    c = get_config()
    c.method, c.rounds, c.seed = method, args.rounds, args.seed
    c.output_dir, c.overwrite = str(out / method), args.overwrite
    if method == "fedproj":
      c.public_data = str(out / PUBLIC_FILE)
    configs[method] = c
  try:
    size = write_public_set(out / PUBLIC_FILE, args.seed)
    for c in configs.values():  # both configs checked before either run starts
      prepare(c)
  except ValueError as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  except OSError as e:  # e.g. an --output_dir that cannot be created: one line
    print(f"error: {describe_os_error(e)}", file=sys.stderr)
    return 1
  print(
    f"quickstart: digits ({PRIVATE_TRAIN} private training images over 10 clients, Dirichlet 0.3; "
    f"{size} unlabelled public images for FedProj), {args.rounds} rounds per method, in {out}"
  )
  summaries = {}
  for method, c in configs.items():
    print(f"--- {method}")
    try:
      summaries[method] = run_experiment(c)
    except TrainingInterrupted as e:
      print(f"interrupted: {e}", file=sys.stderr)
      return 128 + e.signum
    except (ValueError, CheckpointError, NonFiniteError) as e:
      print(f"error: {e}", file=sys.stderr)
      return 1
    except OSError as e:  # disk full, name too long, permission...: one line
      print(f"error: {describe_os_error(e)}", file=sys.stderr)
      return 1
  curves = plot_runs([out / m for m in METHODS], out / "curves.png")
  print("\nsummary (one seed of a toy problem; docs/fedproj.md has the measured comparisons)")
  print(f"  {'method':8s} {'final test accuracy':>20s} {'steps projected':>16s} {'wall s':>7s}")
  for method, s in summaries.items():
    last = read_metrics(out / method)[-1]
    projected = last.get("projected_fraction")
    projected = "-" if projected is None else f"{projected:.2f}"
    print(
      f"  {method:8s} {s['final_test_accuracy']:20.4f} {projected:>16s} {s['wall_seconds']:7.1f}"
    )
  print(f"curves (test accuracy, training loss, FedProj's diagnostics): {curves}")
  return 0
