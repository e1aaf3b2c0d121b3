"""The quickstart's and the Iris pilot's flags come from field tables: typed, ranged, checked before
anything is written (training/fields.py, add_flags and check_fields)."""

from __future__ import annotations

import argparse

import pytest

from fedjax_proj.configs import pilot_iris, quickstart
from fedjax_proj.training import fields as fields_lib


def _error(capsys, main, argv) -> str:
  with pytest.raises(SystemExit) as e:
    main(argv)
  assert e.value.code == 2
  return capsys.readouterr().err


@pytest.mark.parametrize(
  "flag,named",
  [
    ("--rounds=0", "--rounds must be in [1, 4294967296]"),
    ("--rounds=4294967297", "--rounds must be in [1, 4294967296]"),
    ("--seed=-1", "--seed must be in"),
  ],
)
def test_quickstart_refuses_out_of_range_before_writing(tmp_path, capsys, flag, named):
  out = tmp_path / "qs"
  err = _error(capsys, quickstart.main, [flag, f"--output_dir={out}"])
  assert named in err
  assert not out.exists()  # refused before the public set was written


@pytest.mark.parametrize(
  "flag,named",
  [
    ("--seeds=1,x", "'x' is not a number"),
    ("--seeds=0,-3", "--seeds must be in"),
    ("--lr=0", "--lr must be > 0"),
    ("--hidden=0", "--hidden must be >= 1"),
    ("--public=foo", "invalid choice"),
    # Each would be run and counted twice in the mean and FedProj's wins: refused, as reproduce.
    ("--seeds=0,0", "--seeds lists 0 more than once"),
    ("--seeds=3,1,3,1", "--seeds lists 1, 3 more than once"),
    ("--methods=fedavg,fedproj,fedavg", "--methods lists fedavg more than once"),
    # Empty (an unset shell variable): nothing would run, yet pilot_iris.json would be written.
    ("--methods=", "--methods= lists no method; list some of fedavg, feddf, fedproj"),
    ("--seeds=,", "--seeds=, lists no seed"),
  ],
)
def test_pilot_refuses_bad_flags(tmp_path, capsys, flag, named):
  out = tmp_path / "pilot"
  assert named in _error(capsys, pilot_iris.main, [flag, f"--output_dir={out}"])
  assert not out.exists()


def test_pilot_output_fields_are_the_unfingerprinted_ones():
  # default_config (the reproduce tool's run config) holds exactly the fields that change a result.
  assert set(pilot_iris.default_config()) == {
    n for n, f in pilot_iris.FIELDS.items() if f.fingerprint
  }
  assert set(pilot_iris.OUTPUT_FIELDS) == {"output_dir", "methods", "seeds", "no_plot"}


def test_add_flags_types_defaults_and_bare_booleans():
  p = argparse.ArgumentParser()
  fields_lib.add_flags(p, quickstart.FLAGS)
  assert vars(p.parse_args([])) == {"output_dir": "", "rounds": 20, "seed": 0, "overwrite": False}
  args = p.parse_args(["--overwrite", "--rounds=3"])
  assert args.overwrite is True and args.rounds == 3
  assert p.parse_args(["--overwrite=false"]).overwrite is False
  with pytest.raises(SystemExit):
    p.parse_args(["--rounds=2.5"])  # an int field's flag parses ints only
