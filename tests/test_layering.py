"""Imports go one way only (docs/design.md, "Layering"): a package imports only from its own layer
or the layers below, anywhere in a module (function-level imports included), so moving a module
can never hide an upward import. In particular core, the execution layer the chunked round lives
in, imports nothing from ``fedjax_proj.algorithms``.
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
