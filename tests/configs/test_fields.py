"""Every config field is declared once, in a field table (fedjax_proj/training/fields.py and the
families' ``FIELDS``; docs/design.md, "Config fields"), and the flags, ``--help``, validation and
the fingerprints read it.

* Each family's table covers exactly its configs' fields (every preset's), in their types, and
  its entry point's ``--help`` lists exactly the table's flags with the table's help.
* A name declared twice, a variant that changes what a field means, or two families disagreeing
  on it are refused.
* A value outside a field's range, or not among its choices, is refused naming the flag and the
  range (or choices) the table declares.
* The fingerprints' field lists are the table's.
"""

from __future__ import annotations

import contextlib
import copy
import io
import pickle
import re

import ml_collections
import pytest

from fedjax_proj import configs
from fedjax_proj.configs import common, nlp, pmnist, sequential, split_cifar100
from fedjax_proj.core import ranges
from fedjax_proj.reproduce import resolve
from fedjax_proj.training import checkpoint, fields
from fedjax_proj.training.fields import Field

# The flags an entry point has besides its fields'.
NOT_FIELDS = {"help", "preset", "method_kwargs", "model_kwargs", "compilation_cache", "noniid"}


def family_configs(name: str) -> list[ml_collections.ConfigDict]:
  """Every config the family's presets start from (each task / dataset where they depend on it)."""
  module = configs.for_entry(f"experiments/{name}.py")
  if name == "quickstart":
    return [module.get_config()]
  if name == "nlp":
    return [module.get_config(p, t) for p in nlp.PRESETS for t in nlp.TASKS]
  if name == "sequential":
    return [module.get_config(p, d) for p in common.PRESETS for d in sequential.DATASETS]
  presets = pmnist.PRESETS if name == "split_cifar100" else getattr(module, "PRESETS", None)
  return [module.get_config(p) for p in presets or common.PRESETS]


def scalar_items(c: ml_collections.ConfigDict) -> dict:
  return {k: v for k, v in c.items() if not isinstance(v, ml_collections.ConfigDict)}


@pytest.mark.parametrize("name", configs.CONFIG_FAMILIES)
def test_every_config_field_has_a_table_entry_of_its_type(name):
  table = configs.for_entry(f"experiments/{name}.py").FIELDS
  for c in family_configs(name):
    for key, value in scalar_items(c).items():
      assert key in table, f"{name}: config field {key!r} has no Field entry"
      assert type(value) is table[key].type, f"{name}: {key}={value!r} is not a {table[key].type}"


def test_every_table_entry_is_a_config_field():
  """An entry no preset's config holds describes nothing (e.g. a field no family uses any more)."""
  seen = {k for name in configs.CONFIG_FAMILIES for c in family_configs(name) for k in c}
  unused = set(configs.all_fields()) - seen
  assert not unused, f"Field entries of no config field: {sorted(unused)}"


def help_flags(name: str) -> dict[str, str]:
  """flag -> its help text, read from ``python experiments/<name>.py --help``."""
  out = io.StringIO()
  with contextlib.redirect_stdout(out), pytest.raises(SystemExit):
    configs.for_entry(f"experiments/{name}.py").main(["--help"])
  text = out.getvalue().split("options:", 1)[1]
  flags, current = {}, None
  for line in text.splitlines():
    m = re.match(r"^  --([a-z_0-9]+)\b(.*)$", line)
    if m:
      current = m.group(1)
      flags[current] = m.group(2)
    elif current:
      flags[current] += " " + line.strip()
  return flags


@pytest.mark.parametrize("name", [f for f in configs.CONFIG_FAMILIES if f != "quickstart"])
def test_every_flag_is_a_table_entry_with_its_help(name):
  module = configs.for_entry(f"experiments/{name}.py")
  table = module.FIELDS
  flags = help_flags(name)
  assert len(flags) > 20, f"the --help scan found too few flags: {sorted(flags)}"
  paper = scalar_items(module.get_config("paper"))
  assert set(flags) - NOT_FIELDS == set(paper)
  for flag in set(flags) - NOT_FIELDS:
    # argparse wraps lines, at spaces and hyphens: compare without whitespace.
    assert "".join(table[flag].help.split()) in "".join(flags[flag].split()), (name, flag)


def test_quickstarts_own_flags_set_table_fields():
  flags = help_flags("quickstart")
  assert set(flags) - {"help"} == {"output_dir", "rounds", "seed", "overwrite"}
  assert set(flags) - {"help"} <= set(fields.FL_FIELDS)


def test_a_name_declared_twice_is_refused():
  lr = fields.FIELDS["lr"]
  with pytest.raises(ValueError, match="'lr' is declared twice"):
    fields.table(lr, fields.variant(lr, default=0.1))
  with pytest.raises(ValueError, match="'momentum' is declared twice"):
    fields.table(fields.FIELDS, Field("momentum", 0.5, "again"))


def test_a_default_of_another_type_and_inconsistent_run_management_are_refused():
  with pytest.raises(ValueError, match="'x' has a default of type list"):
    fields.table(Field("x", [1], "a list"))
  with pytest.raises(ValueError, match="'y' manages the run"):
    fields.table(Field("y", "", "a folder", run_management=True))


def test_a_variant_keeps_what_the_field_means():
  rounds = fields.FIELDS["rounds"]
  assert fields.variant(rounds, default=7, help="h").resumable
  with pytest.raises(ValueError, match="not fingerprint, resumable"):
    fields.variant(rounds, resumable=False, fingerprint=False)


def test_families_that_disagree_on_a_field_are_refused(monkeypatch):
  assert configs.all_fields()["eval_every"].range == ranges.AT_LEAST_ONE  # FL families first
  changed = {**pmnist.FIELDS, "seed": pmnist.FIELDS["seed"]._replace(fingerprint=False)}
  monkeypatch.setattr(pmnist, "FIELDS", changed)
  with pytest.raises(ValueError, match="'seed' of pmnist differs .* in fingerprint"):
    configs.all_fields()


def test_only_fl_fields_are_resumable():
  """The checkpoint's fingerprint knows only training/fields.py's tables (it sits below the
  families), so a family's own field that a resumed run may change would go unnoticed there."""
  assert set(checkpoint.NON_SEMANTIC_FIELDS) == {
    k for k, f in fields.FL_FIELDS.items() if f.resumable
  }
  for name, f in configs.all_fields().items():
    if f.resumable:
      assert name in fields.FL_FIELDS, name


def test_the_claim_fingerprints_field_lists_are_the_tables():
  every = configs.all_fields()
  assert set(resolve.RUN_FIELDS) == {k for k, f in every.items() if f.run_management}
  assert {"output_dir", "resume", "checkpoint_every"} <= set(resolve.RUN_FIELDS)
  assert set(resolve.DEFAULT_ONLY_FIELDS) == {
    k for k, f in every.items() if not f.fingerprint and not f.run_management
  }
  assert resolve.ADDED_FIELDS["lmem_global"] is True
  assert resolve.ADDED_FAMILY_FIELDS == {"continual": {"client_chunk": "auto"}}
  # What a result's fingerprint hashes leaves the default-only fields out, and an added field at
  # its earlier value.
  c = {"lr": 0.1, "tensorboard": True, "fot_eps": 0.9, "rounds": 3, "lr_schedule": "constant"}
  assert resolve.canonical(c) == {"lr": 0.1, "rounds": 3}


def outside(f: Field):
  """A value of ``f``'s type outside its range."""
  interval = f.range
  bad = interval.low if interval.low_open else interval.low - 1
  return str(bad) if f.type is str else f.type(bad)


def ranged(table):
  return [f for f in table.values() if f.range is not None]


def chosen(table):
  return [f for f in table.values() if f.choices and f.type is str]


RESOLVE = {
  "cifar10": lambda fields_: configs.for_entry("experiments/cifar10.py").resolve("smoke", fields_),
  "pmnist": lambda fields_: pmnist.resolve("smoke", fields_),
  "split_cifar100": lambda fields_: split_cifar100.resolve("smoke", fields_),
  "nlp": lambda fields_: nlp.resolve("smoke", fields_),
}
CASES = [
  (name, f)
  for name in RESOLVE
  for f in ranged(configs.for_entry(f"experiments/{name}.py").FIELDS)
  + chosen(configs.for_entry(f"experiments/{name}.py").FIELDS)
]


@pytest.mark.parametrize(("name", "field"), CASES, ids=[f"{n}-{f.name}" for n, f in CASES])
def test_a_value_outside_the_table_is_refused_naming_the_range(name, field):
  if field.range is not None:
    value, expected = outside(field), f"--{field.name} must be {field.range}"
  else:
    value, expected = "nope", f"Unknown --{field.name} 'nope'; choose one of {field.choices}"
  with pytest.raises(ValueError) as e:
    RESOLVE[name]({field.name: value})
  assert expected in str(e.value)
  assert field.fix in str(e.value)


def test_the_table_is_what_validation_reads(monkeypatch):
  """A range changed in the table changes what is refused: validation has no copy of its own."""
  assert pmnist.resolve("smoke", {"num_tasks": 2}).num_tasks == 2
  tighter = fields.variant(pmnist.FIELDS["num_tasks"], range=ranges.Interval(3, integer=True))
  monkeypatch.setitem(pmnist.FIELDS, "num_tasks", tighter)
  with pytest.raises(ValueError, match=r"--num_tasks must be >= 3 \(a whole number\), got 2"):
    pmnist.resolve("smoke", {"num_tasks": 2})


@pytest.mark.parametrize(
  ("given", "parsed"), [("auto", "auto"), ("AUTO", "auto"), ("none", None), ("4", 4), (4, 4)]
)
def test_client_chunk_is_checked_and_parsed_by_its_fields_hook(given, parsed):
  """--client_chunk's parse hook is both its check (check_fields) and its parser (resolve)."""
  assert fields.FL_FIELDS["client_chunk"].parse is fields.parse_client_chunk
  fields.check_fields({"client_chunk": given}, fields.FL_FIELDS)
  assert fields.resolve({"client_chunk": given}).client_chunk == parsed
  # Parsing what the hook gave back gives it again (a resolved value resolves to itself).
  assert fields.parse_client_chunk(parsed) == parsed


@pytest.mark.parametrize("bad", ["0", "-2", "four", "2.5", ""])
def test_a_bad_client_chunk_is_refused_by_the_same_hook(bad):
  message = "--client_chunk must be auto, none or a positive integer"
  with pytest.raises(ValueError, match=message):
    fields.check_fields({"client_chunk": bad}, fields.FL_FIELDS)
  with pytest.raises(ValueError, match=message):
    fields.resolve({"client_chunk": bad})


def test_resolve_fills_missing_fields_once_and_leaves_the_record_alone():
  """A continual config lacks the image fields (normalization...): resolve gives their defaults,
  the value such runs computed with, without touching what the run records or fingerprints."""
  c = pmnist.resolve("smoke", {})
  assert "normalization" not in c and "shard_clients" not in c
  before = checkpoint.config_fingerprint(c.to_dict())
  s = fields.resolve(c, pmnist.FIELDS)
  assert (s.normalization, s.shard_clients) == ("dataset", True)
  assert s.num_tasks == c.num_tasks and s.client_chunk == "auto"  # the family's own fields too
  assert dict(s.method_kwargs) == dict(c.method_kwargs)  # entries that are not fields, as given
  assert "normalization" not in c and checkpoint.config_fingerprint(c.to_dict()) == before
  assert fields.resolve(s) is s


def test_a_resolved_config_is_frozen():
  s = fields.resolve({"lr": 0.1})
  with pytest.raises(AttributeError, match="frozen"):
    s.lr = 0.2
  with pytest.raises(TypeError):
    s["lr"] = 0.2  # type: ignore[index]
  with pytest.raises(AttributeError, match="no field 'nope'"):
    _ = s.nope
  assert s.lr == 0.1 and s.memory_size == fields.FL_FIELDS["memory_size"].default
  assert copy.deepcopy(s) == s and pickle.loads(pickle.dumps(s)) == s
