"""Flag parsing shared by the experiment entry points: every config field becomes a --flag.

``--preset`` picks the starting config (``paper``, ``cpu`` or ``smoke``; an entry point may offer
more, e.g. ``paper_code``, by passing its own ``presets``); other flags override single fields.
A preset's ``method_defaults`` (method name -> hyperparameters) apply to that method unless
``--method_kwargs`` sets them. Bad values exit non-zero with a message listing the valid choices.
Boolean flags may be given bare (``--resume`` means ``--resume=true``).

Run management flags (fields of every config from ``base_config``): ``--output_dir=D --resume``
continues D's newest valid checkpoint bit-exactly (``--rounds=N`` with it extends the run),
``--overwrite`` lets a new run replace the run D holds (otherwise refused), ``--checkpoint_every=k``
(0: only on a signal), ``--keep_checkpoints=n``, ``--tensorboard``. One run at a time holds D
(fedjax_proj/training/rundir.py). The first SIGINT/SIGTERM prints at once which round the run
stops after, finishes it, saves and exits with 128 + the signal number and the resume command; a
second one aborts and says what is on disk. Before round 1 (imports, data, compilation) a signal
ends the script at once with one line and 128 + the signal (:func:`exit_on_interrupt`). A
non-finite loss or parameters exit 3 keeping the last good checkpoint. Flag errors exit 2 and
runtime refusals exit 1, each naming the fix; flags must be spelled out in full (no prefix
matching).

``--compilation_cache=DIR|off``: JAX's persistent compilation cache, so a second run of the same
programs (the next seed, a resumed run) loads them instead of compiling (default:
``$FEDJAX_PROJ_COMPILATION_CACHE``, else ``$XDG_CACHE_HOME/fedjax_proj/jax``, else
``~/.cache/fedjax_proj/jax``; fedjax_proj/training/compilation_cache.py).

Before anything computes, an entry point keeps XLA:CPU's per-step working memory in the heap
between steps (:func:`keep_step_memory`; fedjax_proj/training/host_memory.py).

Several processes / hosts: run the same command on every process with ``--num_processes=N
--process_id=<rank> --coordinator_address=<process 0's host:port> --output_dir=<shared dir>``
(``--cpu_collectives=gloo`` for CPU-only jobs; ``--num_processes=0`` auto-detects Cloud TPU, Slurm
and Open MPI jobs). Only process 0 prints and writes outputs. See docs/performance.md.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shlex
import signal
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

if TYPE_CHECKING:  # imported where used: exit_on_interrupt runs before any heavy import
  import ml_collections

  from fedjax_proj.training.fields import Field

PRESETS = ("paper", "cpu", "smoke")


def parallel_methods() -> tuple[str, ...]:
  """The registered methods the parallel-FL entry points (cifar10, cifar100, cinic10) run."""
  from fedjax_proj.algorithms import methods

  return methods(("fl",))


def refuse_sequential(c: ml_collections.ConfigDict) -> None:
  """Refuses a sequential method (the registry's "sequential" family) under a parallel-FL entry
  point.

  Under those presets they do not learn (docs/sfedkd.md, "Entry points"); the error names
  experiments/sequential.py, whose presets are their paper's. ``main`` exits 2 with it.
  """
  from fedjax_proj.algorithms import methods

  # The sequential family's methods need settings of their own (paper 004's: SGD, ExDir
  # partitions), which experiments/sequential.py has.
  if c.method in methods(("sequential",)):
    raise ValueError(
      f"{c.method} is sequential FL and does not learn under this entry point's parallel-FL "
      'presets (docs/sfedkd.md, "Entry points"); run it with experiments/sequential.py, e.g. '
      f"python experiments/sequential.py --dataset={c.dataset} --method={c.method} --preset=cpu"
    )


# The public subset of the small CPU presets (the image smoke preset below; NLP's cpu and smoke,
# configs/nlp.py): distillation methods pass over the whole public set each round, so 512
# examples, not 20k, keep the image smoke run under a minute (benchmarks/perf/smoke_times.py);
# FedProj's memory M is half of it. The claims' budgets pin their own copies
# (reproduce/claims/presets.py), so they do not move with this.
SMALL_PUBLIC = {"public_size": 512, "memory_size": 256}


def apply_smoke(c: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """The ``smoke`` budget shared by the image experiments: under a minute on 2 CPU cores."""
  c.num_clients = 10
  c.clients_per_round = 2
  c.rounds = 2
  c.local_epochs = 1
  c.train_subset = 2000
  c.test_subset = 500
  c.eval_every = 1
  c.update(SMALL_PUBLIC)
  return c


# Method hyperparameters the smoke preset lowers for the methods that take them (unless given in
# --method_kwargs): FedProj's memory batch of 256 made each local step ~5x a FedAvg step.
SMOKE_METHOD_KWARGS = {"memory_batch_size": 64}


def method_kwargs_help(methods) -> str:
  """--method_kwargs' help: the syntax and every method's keys with their defaults."""
  from fedjax_proj.algorithms.registry import describe_hparams

  lines = [
    "method hyperparameters as comma-separated key=value pairs, e.g. --method_kwargs=mu=0.01 or "
    "--method_kwargs=temperature=2,beta=0.5 (numbers, true/false or text). Keys per method "
    "(with defaults): "
  ]
  return lines[0] + "; ".join(f"{m}: {describe_hparams(m)}" for m in methods)


MODEL_KWARGS_HELP = (
  "model options as comma-separated key=value pairs, over the preset's: the keyword arguments of "
  "the model's factory (fedjax_proj/models/), e.g. --model_kwargs=conv_impl=gemm_grad (the "
  "convolution implementation of a conv model: xla, gemm_grad, onednn_grad, onednn, patches_grad "
  "or patches; default: the backend's, onednn on CPU where its handler builds, else gemm_grad; "
  "docs/performance.md) or --model_kwargs=norm=group,group_size=16 (resnet8)"
)


def _method_type(valid: tuple[str, ...]) -> Callable[[str], str]:
  """argparse type of --method: ``valid``, or a sequential method (refused later with a pointer)."""
  from fedjax_proj.algorithms import methods

  sequential = methods(("sequential",))

  def method(text: str) -> str:
    if text in valid or text in sequential:
      return text
    raise argparse.ArgumentTypeError(
      f"invalid choice: {text!r} (choose from {', '.join(map(repr, valid))})"
    )

  return method


def dirichlet_beta(partition: str) -> float | None:
  """β of a ``dirichlet:β`` partition spec, else None."""
  kind, _, arg = partition.partition(":")
  return float(arg) if kind == "dirichlet" and arg else None


def build_parser(
  description: str,
  get_config: Callable[[str], ml_collections.ConfigDict],
  choices: dict,
  presets: tuple[str, ...] = PRESETS,
  table: Mapping[str, Field] | None = None,
) -> argparse.ArgumentParser:
  """The entry point's flags: ``--preset``, one ``--<field>`` per scalar field of its paper preset
  with the type and help its ``table`` entry declares (default: the FL entry points',
  :data:`fedjax_proj.training.fields.FL_FIELDS`), ``--method_kwargs`` and
  ``--compilation_cache``. ``choices`` restricts fields to the values this entry point offers.

  Raises:
    ValueError: a field of the config without a table entry (declare it there).
  """
  import ml_collections

  from fedjax_proj.training.fields import FL_FIELDS

  table = FL_FIELDS if table is None else table
  parser = argparse.ArgumentParser(description=description, allow_abbrev=False)
  parser.add_argument(
    "--preset",
    default="paper",
    choices=presets,
    help=f"starting config, one of {', '.join(presets)}: paper (the paper's setting), cpu "
    "(minutes on a CPU), smoke (under a minute); other flags override single fields (default: "
    "paper)",
  )
  defaults = get_config("paper")
  for key, value in defaults.items():
    if isinstance(value, ml_collections.ConfigDict):
      continue
    field = declared(table, key)
    kind = field.flag_type()
    extra = {"nargs": "?", "const": True} if field.type is bool else {}
    if key == "method" and choices.get(key):
      # --help and the errors offer this entry point's methods only; a sequential method's name
      # still parses, so that prepare() can point to experiments/sequential.py instead.
      kind, extra = _method_type(choices[key]), {"metavar": "{" + ",".join(choices[key]) + "}"}
    parser.add_argument(
      f"--{key}",
      type=kind,
      default=None,
      choices=None if key == "method" else choices.get(key),
      help=f"{field.help} (default: {value!r} in the paper preset)",
      **extra,
    )
  methods = choices.get("method") or ()
  parser.add_argument("--method_kwargs", default="", help=method_kwargs_help(methods))
  parser.add_argument("--model_kwargs", default="", help=MODEL_KWARGS_HELP)
  add_compilation_cache_flag(parser)
  return parser


def declared(table: Mapping[str, Field], key: str) -> Field:
  """``table``'s entry for the config field ``key``; a ValueError names where to declare it."""
  try:
    return table[key]
  except KeyError:
    raise ValueError(
      f"Config field {key!r} has no entry in the field table; pass the family's FIELDS as the "
      "table, or declare the field once as a Field (fedjax_proj/training/fields.py, or the "
      "family's FIELDS in fedjax_proj/configs/)."
    ) from None


def add_compilation_cache_flag(parser: argparse.ArgumentParser) -> None:
  """``--compilation_cache=DIR|off``, read by :func:`use_compilation_cache`."""
  from fedjax_proj.training import compilation_cache

  parser.add_argument(
    "--compilation_cache",
    default=None,
    help="folder of JAX's persistent compilation cache, or off (default: "
    f"${compilation_cache.ENV}, else $XDG_CACHE_HOME/fedjax_proj/jax, else "
    "~/.cache/fedjax_proj/jax); a run of programs compiled before loads them instead",
  )


def keep_step_memory() -> None:
  """XLA:CPU's per-step buffers kept in the heap between steps instead of mapped afresh
  (:func:`fedjax_proj.training.host_memory.keep_freed_memory`: 23-35% of a CNN or ResNet-8 CPU
  step's time was its page faults). An entry point calls it first, before anything computes; where
  ``malloc`` is not glibc's, one ``note:`` line on stderr says so, and the run goes on as before.
  Called in-process after JAX started (a test, a user's program calling ``main``), the executions
  stay on JAX's worker threads, silently: the thresholds still keep buffers up to 64 MB."""
  from fedjax_proj.training import host_memory

  if line := host_memory.keep_freed_memory().get("malloc"):
    print(f"note: {line}", file=sys.stderr)


def use_compilation_cache(parser: argparse.ArgumentParser, setting: str | None) -> None:
  """Turns the compilation cache on at ``setting`` (None: the default) or off, before anything
  compiles; a folder that cannot be used is a flag error naming it and the fix."""
  from fedjax_proj.training import compilation_cache

  try:
    compilation_cache.enable(setting)
  except ValueError as e:
    parser.error(str(e))


def set_fields(config: ml_collections.ConfigDict, fields=None) -> ml_collections.ConfigDict:
  """``config`` with ``fields`` set; a field the entry point's config lacks is a ValueError."""
  for key, value in dict(fields or {}).items():
    if key not in config:
      raise ValueError(f"Config field {key!r} does not exist in this entry point's config.")
    config[key] = value
  return config


def resolve(
  get_config: Callable[[str], ml_collections.ConfigDict],
  preset: str,
  fields=None,
  method_kwargs=None,
  prepare: Callable | None = None,
  table: Mapping[str, Field] | None = None,
  model_kwargs=None,
) -> ml_collections.ConfigDict:
  """The config an entry point runs: ``get_config(preset)``, then ``fields``, then the smoke
  preset's method defaults, then ``method_kwargs``, then ``model_kwargs`` (``--model_kwargs``)
  over the preset's, checked (with the ranges and choices of ``table``, the entry point's field
  table; default: training/fields.py's FL_FIELDS, and the model's options:
  :func:`fedjax_proj.training.config.validate_model_kwargs`), then ``prepare`` (the preset rules
  that depend on the final fields).

  The flags of :func:`main`, the claim runner (fedjax_proj/reproduce/resolve.py) and
  experiments/quickstart.ipynb all resolve through this function, so a claim or the notebook runs
  what its entry point runs. Raises ValueError naming the
  field and the fix (an unknown field included).
  """
  config = get_config(preset)
  preset_model = config.get("model")
  config = set_fields(config, fields)
  preset_options = dict(config.get("model_kwargs", {}))
  overridden = config.get("model") != preset_model and "model_kwargs" not in (fields or {})
  if overridden and preset_options:
    # A preset's model_kwargs are options of its own network (fedgkd_paper's norm=group for
    # resnet8); another --model keeps those it takes too and leaves the others out.
    from fedjax_proj.training.config import model_takes

    kept = {k: v for k, v in preset_options.items() if model_takes(config.model, {k: v})}
    config.model_kwargs = type(config.model_kwargs)(kept)
    if dropped := [f"{k}={v}" for k, v in preset_options.items() if k not in kept]:
      print(
        f"note: --model={config.model} replaces the preset's {preset_model} and does not take "
        f"the preset's model options {','.join(dropped)}: left out",
        file=sys.stderr,
      )
  if preset == "smoke":
    from fedjax_proj.algorithms.registry import declared_hparams

    accepted = declared_hparams(config.method) or {}
    for key, value in SMOKE_METHOD_KWARGS.items():
      if key in accepted and key not in config.method_kwargs:
        config.method_kwargs[key] = value
  from fedjax_proj.algorithms.registry import config_kwargs
  from fedjax_proj.training.config import validate_config
  from fedjax_proj.training.fields import FL_FIELDS

  given = dict(method_kwargs or {})
  for field in config_kwargs(config.method):
    # A hyperparameter that is also a config field (FedProj's memory M) has one source, the
    # field: a value given only in method_kwargs moves into it, two different values are refused.
    if field in given:
      if field in (fields or {}) and fields[field] != given[field]:
        raise ValueError(
          f"--{field}={fields[field]} and --method_kwargs {field}={given[field]} disagree; pass "
          f"it once, as --{field}."
        )
      value = given.pop(field)
      try:
        config[field] = value
      except TypeError:
        raise ValueError(
          f"--method_kwargs {field}={value!r} must be a {type(config[field]).__name__}, as "
          f"--{field}."
        ) from None
  for key, value in given.items():
    config.method_kwargs[key] = value

  validate_config(config, FL_FIELDS if table is None else table)
  if model_kwargs:
    import ml_collections

    from fedjax_proj.training.config import validate_model_kwargs

    validate_model_kwargs(config.model, dict(model_kwargs))
    # Recorded in the run's config (and so its checkpoint fingerprint) as the user gave them; the
    # placement's own conv_impl choice is not (training/placement.conv_impl_line).
    config.model_kwargs = ml_collections.ConfigDict(
      {**dict(config.get("model_kwargs", {})), **dict(model_kwargs)}
    )
  return prepare(config) if prepare is not None else config


def flag_values(parser: argparse.ArgumentParser, args) -> tuple[dict, dict]:
  """The config fields the flags set (``--preset`` and unset flags left out) and the
  ``--method_kwargs`` pairs, parsed (a malformed pair is a parser error)."""
  from fedjax_proj.training.config import parse_method_kwargs

  skip = ("preset", "method_kwargs", "model_kwargs", "compilation_cache")
  fields = {k: v for k, v in vars(args).items() if k not in skip and v is not None}
  try:
    return fields, parse_method_kwargs(args.method_kwargs)
  except ValueError as e:
    parser.error(str(e))


def parse_config(
  argv,
  description: str,
  get_config: Callable[[str], ml_collections.ConfigDict],
  choices: dict,
  presets: tuple[str, ...] = PRESETS,
  table: Mapping[str, Field] | None = None,
) -> ml_collections.ConfigDict:
  """The flags' config: :func:`resolve` without ``prepare`` (:func:`main` applies it, so its
  refusals exit 2 with a one-line error rather than a usage message)."""
  return _parse(argv, description, get_config, choices, presets, table)[2]


def _parse(argv, description, get_config, choices, presets, table=None):
  """(parser, parsed flags, config) of :func:`parse_config`."""
  from fedjax_proj.training.config import parse_method_kwargs

  parser = build_parser(description, get_config, choices, presets, table)
  args = parser.parse_args(argv)
  fields, kwargs = flag_values(parser, args)
  try:
    model_kwargs = parse_method_kwargs(args.model_kwargs, flag="--model_kwargs")
    config = resolve(
      get_config, args.preset, fields, kwargs, table=table, model_kwargs=model_kwargs
    )
  except ValueError as e:
    parser.error(str(e))
  return parser, args, config


def resume_command(argv, output_dir: str) -> str:
  """The command line that resumes this run: the same flags plus --output_dir and --resume."""
  kept = [a for a in argv if not a.startswith(("--resume", "--output_dir", "--overwrite"))]
  return shlex.join(
    [sys.executable, sys.argv[0], *kept, f"--output_dir={output_dir}", "--resume=true"]
  )


def checkpoint_where(output_dir: str, round_idx: int) -> str:
  """Where the run stood at a checkpoint, as its record says (e.g. a continual run's task)."""
  import json

  from fedjax_proj.training.checkpoint import MANIFEST

  try:
    path = Path(output_dir) / "checkpoints" / str(round_idx) / MANIFEST
    return str(json.loads(path.read_text())["meta"].get("where") or "")
  except (OSError, ValueError, KeyError):
    return ""


def on_disk(output_dir: str, argv) -> str:
  """What an aborted run left in ``output_dir``, and how to go on from it."""
  from fedjax_proj.training.rundir import RUN_FILES, checkpoint_rounds

  # A run stopped during start-up leaves at most its lock files, which a new run takes over.
  if not any((Path(output_dir) / name).exists() for name in RUN_FILES):
    return f"nothing was written to {output_dir}; start the run again."
  rounds = checkpoint_rounds(output_dir)
  if rounds:
    return (
      f"the checkpoint of round {rounds[-1]}{checkpoint_where(output_dir, rounds[-1])} in "
      f"{output_dir}/checkpoints is intact; resume with: {resume_command(argv, output_dir)}"
    )
  return (
    f"no checkpoint was saved in {output_dir}, so the run cannot be resumed; start it again "
    "(add --overwrite to replace its partial files)."
  )


def main(
  argv,
  description,
  get_config,
  choices,
  prepare: Callable | None = None,
  presets: tuple[str, ...] = PRESETS,
  table: Mapping[str, Field] | None = None,
) -> int:
  """Parses flags, runs the experiment and maps failures to exit codes with a message.

  ``prepare(config) -> config`` applies preset rules that depend on the chosen flags (e.g. the
  public set a preset expects); its ValueErrors exit 2 like other flag errors. Flags, then
  ``prepare``, is :func:`resolve`, the function the claim runner calls. ``table``: the entry
  point's field table (:func:`build_parser`).
  """
  from fedjax_proj.training.experiment import default_output_dir, run_experiment

  keep_step_memory()
  parser, args, config = _parse(argv, description, get_config, choices, presets, table)
  use_compilation_cache(parser, args.compilation_cache)
  if prepare is not None:  # the last step of resolve(), kept here for its exit code
    try:
      config = prepare(config)
    except ValueError as e:
      print(f"error: {e}", file=sys.stderr)
      return 2
  # Fix the output directory here so the resume message can name it.
  config.output_dir = config.output_dir or default_output_dir(config.method)
  return run_reporting(lambda: run_experiment(config), argv, config.output_dir)


# A run stopped on a non-finite loss or parameters: an outcome of its config (the claim runner
# records it as diverged instead of retrying it), told apart from the refusals' 1.
EXIT_NONFINITE = 3


def run_reporting(run: Callable[[], object], argv, output_dir: str) -> int:
  """Runs ``run()`` and maps how it ended to an exit code and a message: 0; 128 + the signal
  with what is on disk and the resume command after an interrupt; EXIT_NONFINITE (3) when it
  diverged; 1 with the error's one line (a refused directory or flag, a foreign checkpoint, a
  full disk...)."""
  from fedjax_proj.training.checkpoint import CheckpointError
  from fedjax_proj.training.loop import NonFiniteError
  from fedjax_proj.training.signals import AbortedBySignal, TrainingInterrupted

  _STOP.update(output_dir=output_dir, argv=list(argv))  # for exit_on_interrupt's line
  try:
    run()
  except TrainingInterrupted as e:
    print(f"interrupted: {e}", file=sys.stderr)
    if e.saved:
      print(f"resume with: {resume_command(argv, output_dir)}", file=sys.stderr)
    return 128 + e.signum
  except KeyboardInterrupt as e:
    # A second signal during the rounds (AbortedBySignal), or the only one before round 1.
    when = "by a second interrupt" if isinstance(e, AbortedBySignal) else "before round 1"
    print(f"aborted {when}; {on_disk(output_dir, argv)}", file=sys.stderr)
    return 128 + signal.SIGINT
  except NonFiniteError as e:
    print(f"error: {e}", file=sys.stderr)
    return EXIT_NONFINITE
  except (ValueError, CheckpointError) as e:
    print(f"error: {e}", file=sys.stderr)
    return 1
  except OSError as e:  # disk full, name too long, permission...: one line, not a traceback
    print(f"error: {os_error_line(e, output_dir, argv)}", file=sys.stderr)
    return 1
  return 0


def os_error_line(e: OSError, output_dir: str, argv) -> str:
  """An OSError of a run as one line: cause, path and fix, then what is on disk."""
  from fedjax_proj.data.sources import DataNotFoundError
  from fedjax_proj.training.rundir import describe_os_error

  if isinstance(e, DataNotFoundError) or (e.errno is None and not e.filename):
    return str(e)  # the library's own message (missing data and how to provide it)
  try:
    left = on_disk(output_dir, argv)
  except OSError:  # e.g. the output path itself is unusable
    left = ""
  return describe_os_error(e) + (f". {left[0].upper()}{left[1:]}" if left else "")


# The run a signal outside the rounds reports on (set by run_reporting, read by exit_on_interrupt).
_STOP: dict = {"output_dir": "", "argv": []}


def exit_on_interrupt() -> None:
  """For an entry point run as a script, called before its heavy imports: SIGINT or SIGTERM
  outside the round loop (imports, data loading, compilation, the wrap-up) ends the process at
  once, with one line saying what is on disk and exit code 128 + the signal.

  The round loop replaces this handler while it runs (fedjax_proj/training/signals.py: finish the
  round, save, stop) and restores it after. Outside the rounds a KeyboardInterrupt could land in
  an import, in XLA's compilation, in a garbage-collection callback or in the interpreter's
  teardown, which printed tracebacks, jax's atexit errors or crashed (segmentation fault). Nothing
  needs saving there: a checkpoint is renamed into place only once complete
  (fedjax_proj/training/checkpoint.py) and the run directory's lock is dropped by the kernel, so
  the process skips the teardown (``os._exit``). Not for in-process callers (the claim runner
  imports the entry points but never calls this).
  """
  for sig in (signal.SIGINT, signal.SIGTERM):
    signal.signal(sig, _exit_now)


def _exit_now(signum, frame) -> NoReturn:
  del frame
  out, argv = _STOP["output_dir"], _STOP["argv"]
  started = bool(out) and (Path(out) / "metrics.jsonl").exists()
  when = "outside the rounds" if started else "before round 1"
  line = f"aborted by {signal.Signals(signum).name} {when}"
  try:
    line += f"; {on_disk(out, argv)}" if out else "; nothing was written."  # still parsing
  except Exception:  # noqa: BLE001 - e.g. a module half imported when the signal came
    line += f"; see {out}."
  for stream in (sys.stdout, sys.stderr):  # what was printed before goes out first
    with contextlib.suppress(Exception):  # closed or mid-write: the line still goes out
      stream.flush()
  os.write(2, (line + "\n").encode())
  os._exit(128 + signum)


def exit_with(code: int) -> NoReturn:
  """An entry point script's exit: ``sys.exit(code)``, except after a signal (code > 128), where
  the run has stopped and closed its files and the interpreter's teardown is skipped
  (:func:`exit_on_interrupt` says why)."""
  if code > 128:
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
  sys.exit(code)
