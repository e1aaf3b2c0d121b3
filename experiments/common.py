"""Flag parsing shared by the experiment entry points: every config field becomes a --flag.

``--preset`` picks the starting config (``paper``, ``cpu`` or ``smoke``; an entry point may offer
more, e.g. ``paper_code``, by passing its own ``presets``); other flags override single fields.
A preset's ``method_defaults`` (method name -> hyperparameters) apply to that method unless
``--method_kwargs`` sets them. Bad values exit non-zero with a message listing the valid choices.
Boolean flags may be given bare (``--resume`` means ``--resume=true``).

Run management flags (fields of every config from ``base_config``): ``--output_dir=D --resume``
continues D's newest valid checkpoint bit-exactly, ``--checkpoint_every=k`` (0: only on a signal),
``--keep_checkpoints=n``, ``--tensorboard``. SIGINT/SIGTERM finish the running round, save and exit
with 128 + the signal number and a message naming the resume command; a non-finite loss or
parameters exit 1 keeping the last good checkpoint.

Several processes / hosts: run the same command on every process with ``--num_processes=N
--process_id=<rank> --coordinator_address=<process 0's host:port> --output_dir=<shared dir>``
(``--cpu_collectives=gloo`` for CPU-only jobs; ``--num_processes=0`` auto-detects Cloud TPU, Slurm
and Open MPI jobs). Only process 0 prints and writes outputs. See docs/performance.md.
"""

from __future__ import annotations

import argparse
import shlex
import signal
import sys
from collections.abc import Callable

import ml_collections

PRESETS = ("paper", "cpu", "smoke")


def apply_smoke(c: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """The ``smoke`` budget shared by the image experiments: under a minute on 2 CPU cores."""
  c.num_clients = 10
  c.clients_per_round = 2
  c.rounds = 2
  c.local_epochs = 1
  c.train_subset = 2000
  c.test_subset = 500
  c.eval_every = 1
  c.memory_size = 500
  return c


def _bool(text: str) -> bool:
  low = text.lower()
  if low in ("1", "true", "yes", "on"):
    return True
  if low in ("0", "false", "no", "off"):
    return False
  raise argparse.ArgumentTypeError(f"expected true/false, got {text!r}")


def _optional_int(text: str):
  return None if text.lower() in ("none", "") else int(text)


def dirichlet_beta(partition: str) -> float | None:
  """β of a ``dirichlet:β`` partition spec, else None."""
  kind, _, arg = partition.partition(":")
  return float(arg) if kind == "dirichlet" and arg else None


def build_parser(
  description: str,
  get_config: Callable[[str], ml_collections.ConfigDict],
  choices: dict,
  presets: tuple[str, ...] = PRESETS,
) -> argparse.ArgumentParser:
  parser = argparse.ArgumentParser(description=description)
  parser.add_argument("--preset", default="paper", choices=presets, help="starting config")
  defaults = get_config("paper")
  for key, value in defaults.items():
    if isinstance(value, ml_collections.ConfigDict):
      continue
    kind = _bool if isinstance(value, bool) else type(value)
    if value is None:
      kind = _optional_int
    extra = {"nargs": "?", "const": True} if isinstance(value, bool) else {}
    parser.add_argument(
      f"--{key}",
      type=kind,
      default=None,
      choices=choices.get(key),
      help=f"(paper: {value!r})",
      **extra,
    )
  parser.add_argument(
    "--method_kwargs",
    default="",
    help="method hyperparameters as key=value pairs separated by commas, e.g. mu=0.01",
  )
  return parser


def _parse_value(text: str):
  for cast in (int, float):
    try:
      return cast(text)
    except ValueError:
      pass
  return {"true": True, "false": False}.get(text.lower(), text)


def parse_config(
  argv,
  description: str,
  get_config: Callable[[str], ml_collections.ConfigDict],
  choices: dict,
  presets: tuple[str, ...] = PRESETS,
) -> ml_collections.ConfigDict:
  parser = build_parser(description, get_config, choices, presets)
  args = parser.parse_args(argv)
  config = get_config(args.preset)
  for key, value in vars(args).items():
    if key in ("preset", "method_kwargs") or value is None:
      continue
    config[key] = value
  if args.method_kwargs:
    for pair in args.method_kwargs.split(","):
      if "=" not in pair:
        parser.error(f"--method_kwargs expects key=value pairs, got {pair!r}")
      k, v = pair.split("=", 1)
      config.method_kwargs[k.strip()] = _parse_value(v.strip())
  try:
    from fedjax_proj.training.experiment import validate_config

    validate_config(config)
  except ValueError as e:
    parser.error(str(e))
  return config


def resume_command(argv, output_dir: str) -> str:
  """The command line that resumes this run: the same flags plus --output_dir and --resume."""
  kept = [a for a in argv if not a.startswith(("--resume", "--output_dir"))]
  return shlex.join(
    [sys.executable, sys.argv[0], *kept, f"--output_dir={output_dir}", "--resume=true"]
  )


def main(
  argv,
  description,
  get_config,
  choices,
  prepare: Callable | None = None,
  presets: tuple[str, ...] = PRESETS,
) -> int:
  """Parses flags, runs the experiment and maps failures to exit codes with a message.

  ``prepare(config) -> config`` applies preset rules that depend on the chosen flags (e.g. the
  public set a preset expects); its ValueErrors exit 2 like other flag errors.
  """
  from fedjax_proj.training.checkpoint import CheckpointError
  from fedjax_proj.training.experiment import default_output_dir, run_experiment
  from fedjax_proj.training.loop import NonFiniteError, TrainingInterrupted

  config = parse_config(argv, description, get_config, choices, presets)
  if prepare is not None:
    try:
      config = prepare(config)
    except ValueError as e:
      print(f"error: {e}", file=sys.stderr)
      return 2
  # Fix the output directory here so the resume message can name it.
  config.output_dir = config.output_dir or default_output_dir(config.method)
  try:
    run_experiment(config)
  except TrainingInterrupted as e:
    print(f"interrupted: {e}", file=sys.stderr)
    if e.saved:
      print(f"resume with: {resume_command(argv, config.output_dir)}", file=sys.stderr)
    return 128 + e.signum
  except KeyboardInterrupt:
    print(
      "aborted by a second interrupt; the last completed checkpoint in "
      f"{config.output_dir}/checkpoints is intact (resume with --resume).",
      file=sys.stderr,
    )
    return 128 + signal.SIGINT
  except (FileNotFoundError, ValueError, CheckpointError, NonFiniteError) as e:
    print(f"error: {e}", file=sys.stderr)
    return 1
  return 0
