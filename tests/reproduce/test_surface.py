"""The claim runner's surface (docs/design.md, "Layering"): every module of
``fedjax_proj.reproduce`` exports only the names it defines, callers import each name from the
module that defines it, budgets have one source, and a claim runs from Python without a command
line.

The rule, per module of the package: a name it imports from another ``fedjax_proj`` module is
imported to be used there, never to be passed on. So (a) no import binds a name to itself with
``as`` (``from m import y as y``, the re-export idiom), (b) ``__all__`` lists only names the module
defines, (c) no name with a leading underscore is imported from another module, and (d) every
imported name is used in the module's own code. Callers (the package, tests/, benchmarks/,
experiments/) name a module's attribute, or import a name from a module, only where that module
defines it (or it is a submodule).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from fedjax_proj.reproduce import __main__ as cli
from fedjax_proj.reproduce import claim_queue
from fedjax_proj.reproduce.claims import get_claim
from fedjax_proj.reproduce.claims.common import BUDGET_CHOICES, BUDGET_TABLE, BUDGETS
from fedjax_proj.reproduce.options import RunOptions

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "fedjax_proj" / "reproduce"
CALLERS = ("fedjax_proj", "tests", "benchmarks", "experiments")


def module_name(path: Path, root: Path = REPO) -> str:
  rel = path.relative_to(root).with_suffix("")
  return ".".join(rel.parts[:-1] if rel.name == "__init__" else rel.parts)


def absolute(node: ast.ImportFrom, module: str, is_package: bool) -> str:
  """The absolute module an ImportFrom names (relative imports resolved)."""
  if node.level == 0:
    return node.module or ""
  base = module.split(".")[: None if is_package else -1]
  base = base[: len(base) - node.level + 1]
  return ".".join(base + ([node.module] if node.module else []))


def defined_names(tree: ast.Module) -> set[str]:
  """Names a module binds itself at module level: definitions and assignments (also under a
  module-level ``if``/``try``), not imports."""
  out = set()
  for node in tree.body:
    for n in ast.walk(node) if isinstance(node, (ast.If, ast.Try)) else [node]:
      if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        out.add(n.name)
      elif isinstance(n, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
        targets = n.targets if isinstance(n, ast.Assign) else [n.target]
        out |= {x.id for t in targets for x in ast.walk(t) if isinstance(x, ast.Name)}
  return out


def module_problems(source: str, module: str, is_package: bool = False) -> list[str]:
  """What breaks the rule (a)-(d) of this file's docstring in one module's source."""
  tree = ast.parse(source)
  problems, imported = [], {}
  for node in ast.walk(tree):
    if isinstance(node, ast.ImportFrom):
      src = absolute(node, module, is_package)
      for a in node.names:
        if a.asname == a.name:
          problems.append(f"{module} re-exports {src}.{a.name} ('as {a.name}')")
        if src.startswith("fedjax_proj") and a.name.startswith("_"):
          problems.append(f"{module} imports the private {src}.{a.name}")
        if src.startswith("fedjax_proj"):
          imported[a.asname or a.name] = f"{src}.{a.name}"
    elif isinstance(node, ast.Import):
      problems += [
        f"{module} re-exports {a.name} ('as {a.asname}')"
        for a in node.names
        if a.asname is not None and a.asname == a.name
      ]
  defined = defined_names(tree)
  for node in tree.body:
    if isinstance(node, ast.Assign) and any(
      isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets
    ):
      listed = [e.value for e in ast.walk(node.value) if isinstance(e, ast.Constant)]
      problems += [f"{module}.__all__ lists {n}, not defined there" for n in listed
                   if n not in defined]  # fmt: skip
  used = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
  problems += [
    f"{module} imports {where} and does not use it (a re-export)"
    for name, where in imported.items()
    if name not in used
  ]
  return problems


def package_modules() -> dict[str, Path]:
  return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def caller_problems(source: str, module: str, defines: dict[str, set[str]]) -> list[str]:
  """Names ``source`` takes from a module of ``defines`` (module -> names it defines, submodules
  included) that the module does not define: ``from m import n``, or ``alias.n`` where ``alias``
  is the module."""
  tree = ast.parse(source)
  problems, aliases = [], {}
  for node in ast.walk(tree):
    if isinstance(node, ast.ImportFrom):
      src = absolute(node, module, is_package=False)
      for a in node.names:
        if f"{src}.{a.name}" in defines:
          aliases[a.asname or a.name] = f"{src}.{a.name}"
        elif src in defines and a.name not in defines[src]:
          problems.append(f"{module}:{node.lineno}: from {src} import {a.name}")
    elif isinstance(node, ast.Import):
      aliases |= {a.asname: a.name for a in node.names if a.name in defines and a.asname}
  for node in ast.walk(tree):
    if (
      isinstance(node, ast.Attribute)
      and isinstance(node.value, ast.Name)
      and node.value.id in aliases
      and node.attr not in defines[aliases[node.value.id]]
    ):
      problems.append(f"{module}:{node.lineno}: {aliases[node.value.id]}.{node.attr}")
  return problems


def test_no_module_of_the_package_re_exports():
  modules = package_modules()
  assert len(modules) > 25, "the scan found too few modules: is PACKAGE right?"
  problems = []
  for name, path in modules.items():
    problems += module_problems(path.read_text(), name, path.name == "__init__.py")
  assert not problems, "Re-exports in fedjax_proj.reproduce:\n" + "\n".join(problems)


def test_callers_import_each_name_from_the_module_that_defines_it():
  modules = package_modules()
  defines = {}
  for name, path in modules.items():
    subs = {m.rsplit(".", 1)[1] for m in modules if m.rsplit(".", 1)[0] == name and m != name}
    defines[name] = defined_names(ast.parse(path.read_text())) | subs
  problems = []
  for folder in CALLERS:
    for path in sorted((REPO / folder).rglob("*.py")):
      problems += caller_problems(path.read_text(), module_name(path), defines)
  assert not problems, "Names taken from a module that does not define them:\n" + "\n".join(
    problems
  )


@pytest.mark.parametrize(
  ("source", "found"),
  [
    ("from fedjax_proj.reproduce.records import status as status\n", "re-exports"),
    ("from .records import status\n__all__ = ['status']\n", "__all__ lists status"),
    ("from fedjax_proj.reproduce.runners import _run_image\n_run_image()\n", "private"),
    ("from fedjax_proj.reproduce.records import status\n", "does not use it"),
  ],
)
def test_the_module_rule_finds_each_kind_of_re_export(source, found):
  problems = module_problems(source, "fedjax_proj.reproduce.run")
  assert any(found in p for p in problems), problems


def test_the_caller_rule_finds_a_name_taken_through_another_module():
  defines = {"fedjax_proj.reproduce.run": {"run_one"}, "fedjax_proj.reproduce.records": {"status"}}
  source = (
    "from fedjax_proj.reproduce import run\n"
    "from fedjax_proj.reproduce.run import status\n"
    "run.run_one()\nrun.status()\n"
  )
  assert caller_problems(source, "tests.x", defines) == [
    "tests.x:2: from fedjax_proj.reproduce.run import status",
    "tests.x:4: fedjax_proj.reproduce.run.status",
  ]
  assert caller_problems("from fedjax_proj.reproduce.records import status\n", "t", defines) == []


# Where budgets are listed as a choice: ``--budget=a|b|...`` in a command, a doc or a docstring.
CHOICES = re.compile(r"--budget=((?:[a-z0-9]+\|)+[a-z0-9]+)")


def test_budgets_listed_anywhere_are_the_one_list():
  texts = [
    REPO / "README.md",
    *sorted((REPO / "docs").glob("*.md")),
    *sorted(PACKAGE.rglob("*.py")),
  ]
  found = {}
  for path in texts:
    for m in CHOICES.finditer(path.read_text()):
      found.setdefault(m.group(1), []).append(str(path.relative_to(REPO)))
  assert found, "no --budget=a|b|... list found: is the pattern right?"
  drifted = {k: v for k, v in found.items() if k != BUDGET_CHOICES}
  assert not drifted, (
    f"budget lists that drifted from claims.common.BUDGET_TABLE ({BUDGET_CHOICES}): {drifted}"
  )
  assert {"README.md", "docs/reproduction.md"} <= {p for v in found.values() for p in v}


def test_the_budget_help_lists_every_budget(capsys):
  with pytest.raises(SystemExit):
    cli.parse_args(["--help"])
  help_text = " ".join(capsys.readouterr().out.split())
  for name, what in BUDGET_TABLE:
    assert f"{name} ({what})" in help_text
  assert tuple(name for name, _ in BUDGET_TABLE) == BUDGETS and "gpu" in BUDGETS


def test_every_claims_budget_is_a_listed_budget():
  from fedjax_proj.reproduce.claims import CLAIMS

  assert {b for c in CLAIMS.values() for b in c.budgets} <= set(BUDGETS)


def test_the_registry_is_every_paper_modules_claims():
  from fedjax_proj.reproduce.claims import CLAIMS, fedgkd, fedproj, fot, pilot, sfedkd

  paper = [c for m in (fedproj, pilot, fot, sfedkd, fedgkd) for c in m.CLAIMS]
  assert sorted(c.name for c in paper) == sorted(CLAIMS) and len(paper) == len(CLAIMS)
  assert all(CLAIMS[c.name] is c for c in paper)


def test_a_claim_runs_from_python_without_a_command_line(tmp_path, capsys):
  claim = get_claim("fedproj-iris-pilot")
  options = RunOptions(methods=("fedavg",), seeds=(0,))
  expected = claim_queue.run_claim(claim, "smoke", Path("."), tmp_path, options)
  path = tmp_path / "fedproj-iris-pilot" / "smoke" / "fedavg-seed0.json"
  assert path.is_file() and list(expected) == ["fedavg-seed0"]
  assert "done fedproj-iris-pilot smoke fedavg seed 0" in capsys.readouterr().out
  # The plan of the same options now finds it done and queues nothing.
  plan = claim_queue.plan_claim(claim, "smoke", Path("."), tmp_path, options)
  assert [p.state for p in plan.runs] == ["done"] and plan.queue == []
  assert plan.expected == expected


@pytest.mark.parametrize(
  ("options", "message"),
  [
    (RunOptions(methods=("fedavgg",), seeds=(0,)), "not in claim fedproj-iris-pilot"),
    (RunOptions(methods=("fedavg", "fedavg"), seeds=(0,)), "list a method twice"),
    (RunOptions(methods=("fedavg",), seeds=(-1,)), "non-negative"),
    (RunOptions(methods=("fedavg",), seeds=()), "no method or no seed"),
    (RunOptions(methods=("fedavg",), seeds=(0, 1000), protocol="v2"), "pick seeds of one protocol"),
    (RunOptions(methods=("fedavg",), seeds=(1000,)), "pick seeds of one protocol"),
  ],
)
def test_options_a_claim_cannot_run_are_refused_before_any_run(tmp_path, options, message):
  with pytest.raises(ValueError, match=message):
    claim_queue.run_claim(get_claim("fedproj-iris-pilot"), "smoke", Path("."), tmp_path, options)
  assert not any(tmp_path.iterdir())
