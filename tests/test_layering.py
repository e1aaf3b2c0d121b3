"""Imports go one way only (docs/design.md, "Layering"): a package imports only from its own layer
or the layers below, anywhere in a module (function-level imports included), so moving a module
can never hide an upward import. In particular core, the execution layer the chunked round lives
in, imports nothing from ``fedjax_proj.algorithms``. The entry points outside the package
(benchmarks/, tools/, studies/) import each other as packages, without a cycle, never a study,
and the package imports none of them.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "fedjax_proj"

# package -> the fedjax_proj packages it may import (besides itself).
ALLOWED = {
  "core": set(),
  "data": {"core"},
  "models": {"core"},
  "algorithms": {"core", "data", "models"},
  "training": {"core", "data", "models", "algorithms"},
  "plot": {"core", "data", "models", "algorithms", "training"},
  # The experiments' presets and flags; quickstart plots its runs.
  "configs": {"core", "data", "models", "algorithms", "training", "plot"},
  "reproduce": {"core", "data", "models", "algorithms", "training", "configs"},
}


def imported_packages(source: str) -> set[str]:
  """The fedjax_proj packages a module's source imports (absolute imports, at any depth)."""
  found = set()
  for node in ast.walk(ast.parse(source)):
    names = []
    if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
      names = [node.module]
    elif isinstance(node, ast.Import):
      names = [alias.name for alias in node.names]
    found |= {n.split(".")[1] for n in names if n.startswith("fedjax_proj.") and "." in n}
  return found


def test_no_module_imports_upwards():
  modules = sorted(PACKAGE.rglob("*.py"))
  assert len(modules) > 40, "the scan found too few modules: is PACKAGE right?"
  bad = []
  for f in modules:
    rel = f.relative_to(PACKAGE)
    if len(rel.parts) == 1 and rel.name == "__init__.py":
      continue
    package = rel.parts[0].removesuffix(".py")
    assert package in ALLOWED, f"{rel}: add its package to ALLOWED (and to docs/design.md)"
    upward = imported_packages(f.read_text()) - ALLOWED[package] - {package}
    if upward:
      bad.append(f"{rel} imports {sorted(upward)}")
  assert not bad, "Upward imports (docs/design.md, 'Layering'):\n" + "\n".join(bad)


@pytest.mark.parametrize(
  ("source", "expected"),
  [
    ("from fedjax_proj.algorithms.base import make_round", {"algorithms"}),
    ("def f():\n  from fedjax_proj.algorithms import base\n", {"algorithms"}),
    ("import fedjax_proj.training.loop", {"training"}),
    ("from . import tree\nimport jax", set()),
  ],
)
def test_the_scan_sees_every_import_form(source, expected):
  assert imported_packages(source) == expected


def imported_modules(source: str, package_root: Path = PACKAGE) -> set[str]:
  """The fedjax_proj modules (dotted names) a module's source names in its imports, at any depth:
  ``from a.b import c`` is the module ``a.b.c`` when that file exists, else ``a.b`` itself."""

  def exists(dotted: str) -> bool:
    rel = Path(*dotted.split(".")[1:])
    return (package_root / rel).with_suffix(".py").is_file() or (package_root / rel).is_dir()

  found = set()
  for node in ast.walk(ast.parse(source)):
    if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
      if node.module.startswith("fedjax_proj"):
        for alias in node.names:
          sub = f"{node.module}.{alias.name}"
          found.add(sub if exists(sub) else node.module)
    elif isinstance(node, ast.Import):
      found |= {a.name for a in node.names if a.name.startswith("fedjax_proj.")}
  return found


def module_name(path: Path) -> str:
  rel = path.relative_to(PACKAGE.parent).with_suffix("")
  parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
  return ".".join(parts)


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
  """One import cycle of ``graph`` (module -> modules it imports), or None (depth-first search)."""
  state: dict[str, int] = {}  # 1: on the current path, 2: done
  path: list[str] = []

  def visit(m: str) -> list[str] | None:
    state[m], _ = 1, path.append(m)
    for n in sorted(graph.get(m, ())):
      if state.get(n) == 1:
        return path[path.index(n) :] + [n]
      if n not in state and (cycle := visit(n)):
        return cycle
    state[m], _ = 2, path.pop()
    return None

  for m in sorted(graph):
    if m not in state and (cycle := visit(m)):
      return cycle
  return None


def test_no_module_level_import_cycle():
  """No two modules import each other, directly or through others (imports at any depth count:
  a function-level import only defers the cycle). Package ``__init__`` files re-export their
  modules and are left out; an import naming a package's re-exported value counts as its
  ``__init__`` and so is out of the graph too."""
  graph = {
    module_name(f): imported_modules(f.read_text())
    for f in PACKAGE.rglob("*.py")
    if f.name != "__init__.py"
  }
  cycle = find_cycle(graph)
  assert cycle is None, "Import cycle: " + " -> ".join(cycle)


def test_the_cycle_check_finds_a_cycle():
  assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == ["a", "b", "c", "a"]
  assert find_cycle({"a": {"b"}, "b": set(), "c": {"a", "b"}}) is None
  src = "def f():\n  from fedjax_proj.algorithms.sequential import base\n"
  assert imported_modules(src) == {"fedjax_proj.algorithms.sequential.base"}


# The entry points outside the package (docs/design.md, "Layout"): scripts run as modules
# (``python -m benchmarks.perf.cpu_step``) that import each other only as packages.
REPO = PACKAGE.parent
ENTRY_PACKAGES = ("benchmarks", "tools", "studies")


def entry_modules() -> dict[str, Path]:
  """Dotted name -> file of every module of the entry-point packages (``__init__`` files too)."""
  out = {}
  for top in ENTRY_PACKAGES:
    for f in sorted((REPO / top).rglob("*.py")):
      out[module_name_in(f, REPO)] = f
  return out


def module_name_in(path: Path, root: Path) -> str:
  rel = path.relative_to(root).with_suffix("")
  parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
  return ".".join(parts)


def imported_entry_modules(source: str, known: set[str]) -> set[str]:
  """The entry-point modules a source imports, at any depth: ``from a.b import c`` is ``a.b.c``
  when that module exists, else ``a.b``; only absolute imports of ENTRY_PACKAGES count."""
  found = set()
  for node in ast.walk(ast.parse(source)):
    if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
      if node.module.split(".")[0] in ENTRY_PACKAGES:
        for alias in node.names:
          sub = f"{node.module}.{alias.name}"
          found.add(sub if sub in known else node.module)
    elif isinstance(node, ast.Import):
      found |= {a.name for a in node.names if a.name.split(".")[0] in ENTRY_PACKAGES}
  return found


def test_no_import_cycle_among_benchmarks_tools_and_studies():
  """No two modules of benchmarks/, tools/ and studies/ import each other, directly or through
  others (function-level imports count); package ``__init__`` files import nothing and are out."""
  modules = entry_modules()
  assert len(modules) > 40, "the scan found too few modules: is REPO right?"
  # A module naming itself is no cycle (the Flower runner hands its own module to the simulation).
  graph = {
    name: imported_entry_modules(f.read_text(), set(modules)) - {name}
    for name, f in modules.items()
    if f.name != "__init__.py"
  }
  # The scan sees a package import: parity's FedProj benchmark uses the suite's harness.
  assert "benchmarks.parity.common" in graph["benchmarks.parity.fedproj"]
  cycle = find_cycle(graph)
  assert cycle is None, "Import cycle: " + " -> ".join(cycle)


def test_package_inits_of_the_entry_points_import_nothing():
  """A peer runner imports ``benchmarks.perf.peer`` in another framework's environment, where
  neither this repository's dependencies nor its other benchmarks are installed."""
  bad = [
    name
    for name, f in entry_modules().items()
    if f.name == "__init__.py"
    and any(isinstance(n, (ast.Import, ast.ImportFrom)) for n in ast.walk(ast.parse(f.read_text())))
  ]
  assert not bad, f"these package __init__ files import: {bad}"


def test_nothing_imports_a_study():
  """A study answers one question (studies/<name>/README.md); what others need moves to a shelf."""
  known = set(entry_modules())
  bad = []
  for top in ("fedjax_proj", "experiments", *ENTRY_PACKAGES):
    for f in sorted((REPO / top).rglob("*.py")):
      here = module_name_in(f, REPO)
      for m in imported_entry_modules(f.read_text(), known):
        parts = m.split(".")
        # A study's own modules may import each other.
        if parts[0] == "studies" and parts[:2] != here.split(".")[:2]:
          bad.append(f"{here} imports {m}")
  assert not bad, "\n".join(bad)


def test_the_package_imports_no_benchmark_tool_or_study():
  """``import fedjax_proj`` needs no checkout (docs/design.md, "The package and the checkout"):
  the wheel holds only fedjax_proj, so an import of these folders would fail once installed."""
  bad = []
  for f in sorted(PACKAGE.rglob("*.py")):
    for node in ast.walk(ast.parse(f.read_text())):
      names = []
      if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
        names = [node.module]
      elif isinstance(node, ast.Import):
        names = [a.name for a in node.names]
      bad += [f"{f.relative_to(REPO)}: {n}" for n in names if n.split(".")[0] in ENTRY_PACKAGES]
  assert not bad, "\n".join(bad)


def test_entry_points_never_edit_the_import_path():
  """Scripts run as modules from the repository root and import each other as packages, so none
  puts a folder on ``sys.path`` (a second name for one file, and an import that only works from
  one working directory)."""
  bad = [
    str(f.relative_to(REPO))
    for top in ENTRY_PACKAGES
    for f in sorted((REPO / top).rglob("*"))
    if f.suffix in (".py", ".sh") and "sys.path" in f.read_text()
  ]
  assert not bad, f"these edit sys.path: {bad}; import as packages (benchmarks/README.md)"


def test_the_entry_scan_sees_every_import_form():
  known = {"benchmarks.flag_checks", "benchmarks.parity.common", "studies.x.study"}
  src = (
    "from benchmarks import flag_checks\n"
    "def f():\n  from benchmarks.parity.common import REFERENCES\n"
    "import studies.x.study\nimport fedjax_proj.core\n"
  )
  assert imported_entry_modules(src, known) == {
    "benchmarks.flag_checks",
    "benchmarks.parity.common",
    "studies.x.study",
  }
