"""Permuted MNIST, task-incremental continual FL: FOT and its baselines (FOT paper, Table 1).

    python experiments/pmnist.py --method=fot --noniid --preset=cpu --data_dir=../shared/data/mnist

``--data_dir`` is a folder holding ``train.npz`` and ``test.npz`` (as ../shared/data/mnist); empty
uses TFDS. Presets: ``paper`` (FOT paper F.3/F.4: 125 clients, 64 per round, 1 local epoch,
SGD 0.01, batch 64, 200 rounds per task (FL: 200 then 100 per task), MLP 784-400-400-400-10 with
dropout 0.2/0.5/0.5, ε = 0.96 non-IID / 0.94 IID (Table 9), EWC λ = 40 with per-client Fishers,
ER one stored example per client per task; docs/reproduction.md lists every field);
``paper_code`` (the same, with FOT's threshold rule of the authors' code, docs/fot.md); ``cpu``
(the reduced budget of benchmarks/accuracy/continual_pmnist.py and docs/fot.md with the paper's MLP:
16 clients per round, 20 rounds per task of 3 local epochs, SGD 0.05, 30k examples per task,
and FOT's ε = 0.90, because at this budget ε = 0.96 with the authors' threshold rule filled 95%
of the input space by task 10 and FOT's ACC dropped below FL's, measured (the energy rule, now the
default, used 71% at ε = 0.96 in one seed: docs/fot.md, "The threshold rule"; ε = 0.90 is not
re-chosen for it); EWC's Fisher scaled to max 1, as lr x λ = 2 here);
``smoke`` (seconds). ``--heads=single`` (default) shares ONE 10-way classifier between the
tasks, as the authors' PMNIST code (FOT projects it like any layer); ``--heads=multi`` gives
one head per task. FOT's appendix settings (docs/fot.md, "Appendix settings"):
``--task_fraction=0.6`` (task heterogeneity, G.1), ``--single_task`` (Table 11, with fl) and
``--centralised`` (Appendix A). Writes ``metrics.jsonl``, ``summary.json`` (``acc``, ``fgt``,
``acc_matrix``), ``final_variables.npz`` and ``checkpoints/`` to ``--output_dir``.

The run is managed as the FL entry points' runs are (README, "Paper presets and run management";
docs/fot.md, "Interrupting and resuming"): a checkpoint every ``--checkpoint_every`` rounds and at
each task's end; the first Ctrl-C finishes the running round, saves, and prints the task and
round on disk and the resume command; ``--output_dir=D --resume`` continues D bit-exactly (the
method's bases, Fishers or replay buffer and the accuracy matrix are in the checkpoint);
``--overwrite`` replaces the run D holds.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import ml_collections

from fedjax_proj.algorithms.continual.gpse import THRESHOLD_RULES
from fedjax_proj.algorithms.registry import check_hparams, describe_hparams, methods
from fedjax_proj.configs import common
from fedjax_proj.core import ranges
from fedjax_proj.training import fields as fields_lib
from fedjax_proj.training.fields import Field

PRESETS = ("paper", "paper_code", "cpu", "smoke")
# FOT's threshold rules (docs/fot.md), as GPSE declares them.
FOT_THRESHOLD_RULES = THRESHOLD_RULES
METHODS = methods(("continual",))  # the continual family of the method registry
# What this family trains: a benchmark of fedjax_proj/training/continual_tasks.py (BUILDERS).
BENCHMARK = "pmnist"


# The continual family's fields (split_cifar100.py builds on them): base_config's where they mean
# the same, with this family's defaults (the paper's), help and ranges (training/fields.py).
_SHARED = fields_lib.FIELDS
FIELDS = fields_lib.table(
  fields_lib.variant(
    _SHARED["method"],
    default="fot",
    help=f"continual FL method: {', '.join(METHODS)}",
    choices=METHODS,
  ),
  # Read by --iid / --noniid (parse()), not by a --iid=<bool> flag.
  Field("iid", False, "IID clients (default: non-IID)"),
  fields_lib.variant(
    _SHARED["data_dir"], help="folder holding the dataset (train.npz/test.npz); empty: TFDS"
  ),
  fields_lib.variant(
    _SHARED["output_dir"],
    help="run directory (metrics.jsonl, summary.json, checkpoints); empty: "
    "runs/<entry>-<method>-<time>",
  ),
  # Run management, as the FL entry points' (README, "Paper presets and run management"): a new
  # run into a directory holding a run is refused unless overwrite is set (it then replaces it);
  # resume continues it from its newest checkpoint, bit-exactly, mid-task or at a task's end.
  # --overwrite is a bare switch here (parse()).
  fields_lib.variant(
    _SHARED["overwrite"], help="replace the run --output_dir holds (default: refuse to start there)"
  ),
  _SHARED["resume"],
  fields_lib.variant(
    _SHARED["checkpoint_every"],
    help="save a checkpoint every k rounds, at each task's end and after the last "
    "(0: only on a signal)",
  ),
  _SHARED["keep_checkpoints"],
  fields_lib.variant(
    _SHARED["progress"], help="show a progress bar (one line per round into a log)"
  ),
  _SHARED["tensorboard"],
  fields_lib.variant(
    _SHARED["num_clients"],
    default=125,
    help="number of clients each task's training set is split over",
  ),
  fields_lib.variant(_SHARED["clients_per_round"], default=64),
  Field(
    "rounds_per_task", 200, "communication rounds per task", ranges.ROUNDS, fix=ranges.ROUNDS_FIX
  ),
  # FL only: rounds of tasks 2..K (F.4: "vanilla FL for 1100 rounds in total, where first task is
  # run for 200 and the others for 100 rounds"); 0 = rounds_per_task for every task.
  Field(
    "fl_later_rounds",
    100,
    "fl only: rounds of tasks 2..K (0: --rounds_per_task for every task)",
    ranges.COUNT,
  ),
  fields_lib.variant(_SHARED["local_epochs"], default=1),
  _SHARED["batch_size"],
  fields_lib.variant(_SHARED["lr"], default=0.01, help="client SGD learning rate (> 0)"),
  fields_lib.variant(_SHARED["momentum"], default=0.0),
  # F.4 is silent on weight decay; the authors' trainers use SGD(weight_decay=1e-5).
  fields_lib.variant(_SHARED["weight_decay"], default=1e-5),
  fields_lib.variant(
    _SHARED["seed"],
    help="random seed in [0, 2**32 - 1) (permutations, partition, sampling, initialisation)",
  ),
  Field("num_tasks", 10, "number of tasks", ranges.AT_LEAST_ONE),
  Field("train_per_task", 0, "training examples per task (0: all)", ranges.COUNT),
  Field("test_per_task", 0, "test examples per task (0: all)", ranges.COUNT),
  _SHARED["strategy"],
  # Clients per chunk of every pass over the clients (the rounds, and the end-of-task pass: FOT's
  # GPSE sketches), as in the FL entry points: auto, none or a number (a memory bound only).
  fields_lib.variant(
    _SHARED["client_chunk"],
    help="clients per chunk of the rounds (streaming aggregation) and of the end-of-task "
    "pass (FOT's GPSE sketches): auto, none or an integer",
  ),
  fields_lib.variant(_SHARED["eval_batch_size"], default=1000),
  fields_lib.variant(
    _SHARED["eval_every"],
    default=0,
    help="also evaluate the current task every k rounds (0: only at the end of each task)",
    range=ranges.COUNT,
  ),
  # The end-of-task pass (GPSE, Fisher, ...) is inference only: larger batches, fewer updates.
  Field(
    "end_task_batch_size",
    256,
    "batch size of the end-of-task pass (GPM/FOT bases, EWC Fisher, ER)",
    ranges.AT_LEAST_ONE,
  ),
  # F.3: "the first 3 fully-connected layers' hidden size is 400 ... dropout of 0.2 after the first
  # layer and 0.5 for the next 2 layers" (the authors' model/mlp.py builds the same).
  Field(
    "hidden",
    "400,400,400",
    "hidden layer widths of the MLP, comma-separated (e.g. 400,400,400)",
    ranges.AT_LEAST_ONE,
  ),
  Field(
    "dropout",
    "0.2,0.5,0.5",
    "dropout rate after each hidden layer, comma-separated, each in [0, 1)",
    ranges.RATE,
  ),
  # "single": one 10-way classifier shared by all tasks (the authors' PMNIST code: domain-
  # incremental, the classifier is projected like any layer); "multi": one head per task.
  Field(
    "heads",
    "single",
    "single: one 10-way classifier shared by the tasks; multi: one head per task",
    choices=("single", "multi"),
  ),
  # FOT's threshold ε; 0 = the paper's (0.94 IID, 0.96 non-IID). The fot_* and ewc_* fields only
  # pick method_defaults, which the resolved method_kwargs hold: no result's fingerprint counts
  # them.
  Field(
    "fot_eps",
    0.0,
    "FOT's subspace energy threshold ε in [0, 1] (0: the paper's, 0.94 IID / 0.96 non-IID)",
    ranges.FRACTION,
    fingerprint=False,
  ),
  # What ε thresholds: "energy", the text's share of the input covered in total (003 Sec. 4.1.2,
  # measured as GPM's squared-energy criterion); "authors", their code's ε' on unsquared ratios
  # (the paper_code preset). docs/fot.md, "The threshold rule".
  Field(
    "fot_threshold_rule",
    "energy",
    "what FOT's ε thresholds: energy (the paper's text: the share of the squared input energy "
    "covered, GPM's criterion) or authors (the authors' code's ε')",
    choices=FOT_THRESHOLD_RULES,
    fingerprint=False,
  ),
  # EWC: scale each task's (and the accumulated) Fisher to max 1. The paper (F.2) does not; the
  # cpu preset does, because its lr 0.05 x λ 40 = 2 makes local SGD unstable along any Fisher
  # entry above 1.
  Field(
    "ewc_normalize",
    False,
    "EWC: scale each task's Fisher to max 1 (true/false)",
    fingerprint=False,
  ),
  # FOT's appendix settings (docs/fot.md, "Appendix settings"); each default is the main setting
  # every earlier run computed (added), so no committed result's fingerprint moves.
  # 003 G.1 / Table 10: each task held by --num_clients of round(num_clients / f) clients.
  Field(
    "task_fraction",
    1.0,
    "task heterogeneity (FOT G.1): the share of the tasks each client holds, in (0, 1]; "
    "--num_clients clients hold each task among round(num_clients / task_fraction) (1: all "
    "clients hold every task)",
    ranges.Interval(0.0, 1.0, low_open=True),
    added=1.0,
  ),
  # 003 Table 11: a fresh model per task, ACC the mean of each task's accuracy on its own model.
  Field(
    "single_task",
    False,
    "single-task reference (FOT Table 11): train each task from a fresh model with fl; ACC = "
    "mean of each task's accuracy on its own model, FGT not applicable (true/false)",
    added=False,
  ),
  # 003 Appendix A / Table 7: one client holding the pooled task, every round (plain SGD).
  Field(
    "centralised",
    False,
    "centralised training (FOT Appendix A): one client holds each task's pooled data and "
    "trains every round, a round = --local_epochs epochs of SGD over it (--num_clients, "
    "--clients_per_round and --iid do not apply; ER stores 100 examples per task) (true/false)",
    added=False,
  ),
)


def get_config(preset: str = "paper") -> ml_collections.ConfigDict:
  c = fields_lib.config(FIELDS)
  c.method_kwargs = ml_collections.ConfigDict()
  if preset == "paper":
    return c
  if preset == "paper_code":
    # The paper's setting as the authors' code runs it, where the code departs from the text.
    c.fot_threshold_rule = "authors"
    return c
  if preset == "cpu":
    c.clients_per_round = 16
    c.rounds_per_task = 20
    c.local_epochs = 3
    c.lr = 0.05
    c.train_per_task = 30000
    c.test_per_task = 2000
    c.fot_eps = 0.90
    c.fl_later_rounds = 0  # every method the same 20 rounds per task at this budget
    c.ewc_normalize = True
    return c
  if preset == "smoke":
    c.num_clients = 10
    c.clients_per_round = 5
    c.rounds_per_task = 2
    c.num_tasks = 3
    c.train_per_task = 1000
    c.test_per_task = 300
    c.fl_later_rounds = 0
    c.hidden = "64,64"
    c.dropout = "0.2,0.5"
    return c
  raise ValueError(f"Unknown preset {preset!r}; choose one of {PRESETS}.")


def method_defaults(c) -> dict:
  """Paper hyperparameters per method (FOT paper F.4; ``--method_kwargs`` overrides them)."""
  if c.method == "fot":
    eps = c.fot_eps or (0.94 if c.iid else 0.96)
    return {
      "eps": eps,
      "eps_inc": 0.0,
      "sketch_multiplier": 1.0,
      "threshold_rule": c.fot_threshold_rule,
    }
  if c.method == "gpm":
    # F.4 gives no GPM threshold; 0.95 is GPM's own PMNIST value (Saha et al., 2021).
    return {"threshold": 0.95}
  if c.method == "ewc":
    return {"lam": 40.0, "fisher": "client", "normalize": c.ewc_normalize}
  if c.method == "er":
    # F.4: 125 stored examples among all (125) clients: one per client per task. Centralised
    # (003 Appendix A): "100 samples are stored in total", read per task as the 125 are.
    return {"buffer_per_task": 100 if c.get("centralised", False) else 1}
  return {}


def resolve(
  preset: str,
  fields=None,
  method_kwargs=None,
  get_config_fn=None,
  method_defaults_fn=None,
  table=None,
) -> ml_collections.ConfigDict:
  """The config ``--preset=<preset>`` with these flags runs: the preset, then ``fields``, then the
  method's paper hyperparameters (:func:`method_defaults`) under ``method_kwargs``, checked against
  ``table`` (default: :data:`FIELDS`), then :func:`prepare`. The flags and the claim runner
  (fedjax_proj/reproduce/resolve.py) both resolve through it."""
  c = common.set_fields((get_config_fn or get_config)(preset), fields)
  c.method_kwargs = {**(method_defaults_fn or method_defaults)(c), **dict(method_kwargs or {})}
  # Every number finite and in range, every choice known (--client_chunk's parse hook), before
  # any data is loaded.
  fields_lib.check_fields(c, FIELDS if table is None else table)
  check_hparams(c.method, c.method_kwargs, flag="--method_kwargs")
  return prepare(c)


def check_run(c: ml_collections.ConfigDict) -> None:
  """Refusals of a resolved config that depend on several fields (a ValueError naming the fix):
  the flags (:func:`parse`) and the claim runner (fedjax_proj/reproduce/resolve.py) both check
  them."""
  if c.get("single_task", False) and c.method != "fl":
    raise ValueError(
      f"--single_task trains each task's own model with plain FL (FOT Table 11); "
      f"--method={c.method} carries state between tasks: pass --method=fl"
    )
  if c.get("centralised", False) and c.get("task_fraction", 1.0) != 1.0:
    raise ValueError(
      f"--centralised pools each task on one client, so --task_fraction={c.task_fraction} does "
      "not apply; pass one of them"
    )
  if c.clients_per_round > c.num_clients and not c.get("centralised", False):
    raise ValueError(
      f"--clients_per_round={c.clients_per_round} exceeds --num_clients={c.num_clients}"
    )
  if c.resume and not c.output_dir:
    raise ValueError("--resume needs --output_dir=<the interrupted run's directory>")
  if "hidden" in c and "dropout" in c:  # the MLP's layers: one rate each, known before the data
    widths = [h for h in c.hidden.split(",") if h.strip()]
    rates = [d for d in c.dropout.split(",") if d.strip()]
    if not widths or len(rates) != len(widths):
      raise ValueError(
        f"--dropout={c.dropout} gives {len(rates)} rate(s) for the {len(widths)} hidden layer(s) "
        f"of --hidden={c.hidden}; give one rate per layer, e.g. --dropout="
        f"{','.join(['0.2'] * max(len(widths), 1))}"
      )
  if c.tensorboard:
    from fedjax_proj.training.tensorboard import require_tensorboardx

    try:
      require_tensorboardx()
    except ImportError as e:
      raise ValueError(str(e)) from None


def prepare(c: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """The rules applied after the flags (the last step of :func:`resolve`): :func:`check_run`'s
  refusals; returns ``c``."""
  check_run(c)
  return c


def parse(
  argv, description: str, get_config_fn, method_defaults_fn=None, table=None
) -> ml_collections.ConfigDict:
  """``--preset`` picks the starting config; every scalar field is a ``--flag``, with the type,
  help and choices its ``table`` entry declares (default: :data:`FIELDS`).

  ``method_defaults_fn(config) -> dict`` gives the method's hyperparameters (default: PMNIST's).
  Also turns on the compilation cache ``--compilation_cache`` names (fedjax_proj/configs/common.py).
  """
  table = FIELDS if table is None else table
  parser = argparse.ArgumentParser(description=description, allow_abbrev=False)
  parser.add_argument(
    "--preset", default="paper", choices=PRESETS, help="starting config (default: paper)"
  )
  parser.add_argument(
    "--iid", dest="iid", action="store_true", default=None, help=table["iid"].help
  )
  parser.add_argument("--noniid", dest="iid", action="store_false", help="non-IID clients")
  parser.add_argument(
    "--overwrite", action="store_true", default=None, help=table["overwrite"].help
  )
  parser.add_argument(
    "--method_kwargs",
    default="",
    help="method hyperparameters as comma-separated key=value pairs, e.g. eps=0.9 (default: the "
    "paper's). Keys per method (with the registry's defaults): "
    + "; ".join(f"{m}: {describe_hparams(m)}" for m in METHODS),
  )
  common.add_compilation_cache_flag(parser)
  defaults = get_config_fn("paper")
  for key, value in defaults.items():
    if key in ("iid", "method_kwargs", "overwrite"):
      continue
    field = common.declared(table, key)
    parser.add_argument(
      f"--{key}",
      type=field.flag_type(),
      # A bare boolean flag means true (--resume is --resume=true), as in configs/common.py.
      **({"nargs": "?", "const": True} if field.type is bool else {}),
      default=None,
      choices=field.choices or None,
      help=f"{field.help} (default: {value!r} in the paper preset)",
    )
  args = parser.parse_args(argv)
  if {"--iid", "--noniid"} <= set(argv):  # argparse would let the last one win silently
    parser.error("--iid and --noniid contradict each other; pass one of them (default: non-IID)")
  if args.method is not None and args.method not in METHODS:
    parser.error(f"unknown --method {args.method!r}; choose one of {', '.join(METHODS)}")
  fields, kwargs = common.flag_values(parser, args)
  try:
    c = resolve(args.preset, fields, kwargs, get_config_fn, method_defaults_fn, table)
  except ValueError as e:  # resolve's checks, prepare's (check_run) last
    parser.error(str(e))
  if not c.output_dir:
    c.output_dir = str(
      Path("runs") / f"{Path(sys.argv[0]).stem}-{c.method}-{time.strftime('%Y%m%d-%H%M%S')}"
    )
  common.keep_step_memory()
  common.use_compilation_cache(parser, args.compilation_cache)
  return c


def main(
  argv,
  description: str = __doc__.splitlines()[0],
  get_config_fn=None,
  method_defaults_fn=None,
  benchmark: str = BENCHMARK,
  table=None,
) -> int:
  """``python experiments/pmnist.py``: the flags, then the run (the benchmark's builder in
  fedjax_proj/training/continual_tasks.py). Another continual family (split_cifar100) passes its
  presets, method defaults, benchmark and field table."""
  from fedjax_proj.data.sources import DataNotFoundError
  from fedjax_proj.training import continual_tasks
  from fedjax_proj.training.continual import run_continual_experiment

  c = parse(argv, description, get_config_fn or get_config, method_defaults_fn, table)
  try:
    bench, model, shared_head = continual_tasks.builder(benchmark)(c)
  except (DataNotFoundError, ValueError) as e:
    print(f"error: {e}", file=sys.stderr)
    return 1

  def run():
    return run_continual_experiment(c, bench, model, shared_head=shared_head)

  # Interrupts, refusals and failures end as in the FL entry points.
  return common.run_reporting(run, argv, c.output_dir)
