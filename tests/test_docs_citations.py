"""Code cites only documents inside the repository, and never an issue number, which means
nothing to a reader of the repository.

Every Python file under fedjax_proj/, experiments/, benchmarks/, tools/ and studies/ must not
cite the old out-of-repository references (METHODS.md, DESIGN.md, ../shared/docs,
../shared/papers) or a document by an absolute path, and every ``docs/<name>.md`` it cites must
exist, with the quoted section heading when it names one (``docs/methods.md, "FOT"``; a heading's
start is enough, as in ``docs/fot.md, "Paper settings"`` for "Paper settings (PMNIST and
Split-CIFAR100)").

Paths to the offline DATA folder (``../shared/data``) are not citations: they are where the runners
look for data, and stay allowed.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CODE_DIRS = ("fedjax_proj", "experiments", "benchmarks", "tools", "studies")

FORBIDDEN = re.compile(
  r"METHODS\.md|DESIGN\.md|shared/docs|shared/papers"
  # an absolute path to a document, or into a machine's home/work folders
  r"|(?<![\w.~:/])/(?:work|home|Users|root)/\S*"
  r"|(?<![\w.~:/>])/[\w.-]+(?:/[\w.-]+)*\.(?:md|txt|pdf)\b"
)
CITATION = re.compile(r"docs/([\w-]+\.md)(?:,?\s*\(?\"([^\"]+)\")?")


def _code_files() -> list[Path]:
  files = []
  for d in CODE_DIRS:
    files += sorted((ROOT / d).rglob("*.py"))
  assert len(files) > 50, "the scan found too few files: is ROOT right?"
  return files


def _headings(doc: Path) -> set[str]:
  return {line.lstrip("#").strip() for line in doc.read_text().splitlines() if line.startswith("#")}


def test_no_file_cites_outside_the_repository():
  bad = {}
  for f in _code_files():
    rel = f.relative_to(ROOT).as_posix()
    hits = [m.group(0) for m in FORBIDDEN.finditer(f.read_text())]
    if hits:
      bad[rel] = hits
  assert not bad, (
    f"These files cite documents outside the repository: {bad}. Cite docs/design.md or "
    "docs/methods.md (with the section name) instead."
  )


def test_cited_docs_and_sections_exist():
  missing = []
  citations = 0
  for f in _code_files():
    text = re.sub(r"\s+", " ", f.read_text())  # a section name may wrap across lines
    for m in CITATION.finditer(text):
      citations += 1
      doc = ROOT / "docs" / m.group(1)
      if not doc.exists():
        missing.append(f"{f.relative_to(ROOT)}: docs/{m.group(1)} does not exist")
      elif m.group(2) and not any(h.startswith(m.group(2)) for h in _headings(doc)):
        missing.append(f"{f.relative_to(ROOT)}: no section {m.group(2)!r} in docs/{m.group(1)}")
  assert citations > 20, "expected the modules to cite docs/*.md"
  assert not missing, "\n".join(missing)


@pytest.mark.parametrize(
  "text",
  [
    "see METHODS.md",
    "(DESIGN.md, Scale-out)",
    "``/work/shared/docs/notes``",
    "../shared/papers/001.txt",
    "see /opt/notes/design.md",
  ],
)
def test_forbidden_pattern_catches(text):
  assert FORBIDDEN.search(text)


@pytest.mark.parametrize(
  "text",
  ["--data_dir=../shared/data/mnist", "docs/design.md", "a/b.md", "papers/004", "<dir>/report.md"],
)
def test_forbidden_pattern_allows(text):
  assert not FORBIDDEN.search(text)


# "issue 13", "Issue 14's", "issues 8 and 9", "(#12)": an issue tracker's numbers, which mean
# nothing to a reader of the repository. Another project's issue (``jax-ml/jax issue 12868``) is
# a real reference and stays allowed.
ISSUE_NUMBER = re.compile(r"(?<!jax )\b[Ii]ssues? #?\d+|\(#\d+\)")
# A test module cited by path (docs and code point readers at the test that shows a claim).
TEST_PATH = re.compile(r"\btests/[\w/]+\.py\b")


def _text_files() -> list[Path]:
  files = (
    _code_files() + sorted((ROOT / "tests").rglob("*.py")) + sorted((ROOT / "docs").glob("*.md"))
  )
  return [*files, ROOT / "README.md"]


def test_nothing_cites_an_issue_number():
  bad = {}
  for f in _text_files():
    hits = [m.group(0) for m in ISSUE_NUMBER.finditer(f.read_text())]
    if hits and f != Path(__file__):
      bad[f.relative_to(ROOT).as_posix()] = hits
  assert not bad, f"Cite a docs section or a paper instead of an issue number: {bad}"


def test_cited_test_files_exist():
  missing = set()
  for f in _text_files():
    for m in TEST_PATH.finditer(f.read_text()):
      if not (ROOT / m.group(0)).is_file():
        missing.add(f"{f.relative_to(ROOT)}: {m.group(0)}")
  assert not missing, "Cited test files that do not exist:\n" + "\n".join(sorted(missing))


def test_cited_tests_exist():
  # The docs name a test as ``file::name`` (docs/design.md, "Input rules": the test of each rule).
  missing = set()
  for f in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
    for m in re.finditer(r"\b(tests/[\w/]+\.py)::(\w+)", f.read_text()):
      path = ROOT / m.group(1)
      if not path.is_file() or f"def {m.group(2)}(" not in path.read_text():
        missing.add(f"{f.relative_to(ROOT)}: {m.group(0)}")
  assert not missing, "Cited tests that do not exist:\n" + "\n".join(sorted(missing))
  rules = (ROOT / "docs" / "design.md").read_text().split("### Input rules")[1].split("\n## ")[0]
  assert rules.count("\n| ") >= 10 and "::" in rules


@pytest.mark.parametrize("text", ["(issue 13)", "Issue 14's must-show", "issues 8", "see (#12)"])
def test_issue_pattern_catches(text):
  assert ISSUE_NUMBER.search(text)


@pytest.mark.parametrize("text", ["jax-ml/jax issue 12868", "a known issue", "tissue 3"])
def test_issue_pattern_allows(text):
  assert not ISSUE_NUMBER.search(text)


def _layout_rows() -> set[str]:
  """The first cell of every table row in docs/design.md's "Layout" section, as written; the
  rows of the algorithms and core tables drop the leading ``fedjax_proj/``, so it is put back."""
  text = (ROOT / "docs" / "design.md").read_text()
  section = text.split("\n## Layout\n", 1)[1].split("\n## ", 1)[0]
  cells = {m.group(1) for m in re.finditer(r"(?m)^\| `([^`]+)`", section)}
  return cells | {f"fedjax_proj/{c}" for c in cells if c.split("/")[0] in ("algorithms", "core")}


def _tracked_top_level_folders() -> set[str]:
  out = subprocess.run(
    ["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True
  ).stdout
  return {f"{line.split('/')[0]}/" for line in out.splitlines() if "/" in line}


def test_every_package_folder_and_top_level_folder_has_a_layout_row():
  """A contributor finds every folder of the house in docs/design.md, "Layout": each package
  folder (a folder of fedjax_proj/, benchmarks/ or tools/ with an ``__init__.py``; studies/ has
  one row for its one-folder-per-study layout) and each tracked top-level folder."""
  packages = {
    f"{p.parent.relative_to(ROOT)}/"
    for top in ("fedjax_proj", "benchmarks", "tools")
    for p in (ROOT / top).rglob("__init__.py")
  }
  missing = sorted((packages | _tracked_top_level_folders()) - _layout_rows())
  assert not missing, f"docs/design.md, 'Layout', has no row for {missing}"


def test_the_layout_check_sees_its_rows():
  rows = _layout_rows()
  assert {"fedjax_proj/core/", "fedjax_proj/algorithms/continual/", ".ci/", "tests/"} <= rows
  assert {"benchmarks/parity/", "benchmarks/perf/peer/", "tools/", "studies/"} <= rows
  assert "fedjax_proj/nowhere/" not in rows
