"""Flag parsing shared by the experiment entry points: every config field becomes a --flag.

``--preset`` picks the starting config (``paper``, ``cpu`` or ``smoke``); other flags override
single fields. Bad values exit non-zero with a message listing the valid choices.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

import ml_collections

PRESETS = ("paper", "cpu", "smoke")


def _bool(text: str) -> bool:
  low = text.lower()
  if low in ("1", "true", "yes", "on"):
    return True
  if low in ("0", "false", "no", "off"):
    return False
  raise argparse.ArgumentTypeError(f"expected true/false, got {text!r}")


def _optional_int(text: str):
  return None if text.lower() in ("none", "") else int(text)


def build_parser(
  description: str, get_config: Callable[[str], ml_collections.ConfigDict], choices: dict
) -> argparse.ArgumentParser:
  parser = argparse.ArgumentParser(description=description)
  parser.add_argument("--preset", default="paper", choices=PRESETS, help="starting config")
  defaults = get_config("paper")
  for key, value in defaults.items():
    if isinstance(value, ml_collections.ConfigDict):
      continue
    kind = _bool if isinstance(value, bool) else type(value)
    if value is None:
      kind = _optional_int
    parser.add_argument(
      f"--{key}", type=kind, default=None, choices=choices.get(key), help=f"(paper: {value!r})"
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
  argv, description: str, get_config: Callable[[str], ml_collections.ConfigDict], choices: dict
) -> ml_collections.ConfigDict:
  parser = build_parser(description, get_config, choices)
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


def main(argv, description, get_config, choices) -> int:
  from fedjax_proj.training.experiment import run_experiment

  config = parse_config(argv, description, get_config, choices)
  try:
    run_experiment(config)
  except (FileNotFoundError, ValueError) as e:
    print(f"error: {e}", file=sys.stderr)
    return 1
  return 0
