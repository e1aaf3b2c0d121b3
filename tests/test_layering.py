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
  "reproduce": {"core", "data", "models", "algorithms", "training"},
  "plot": {"core", "data", "models", "algorithms", "training"},
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
