"""Every source test runs with a private cache and without an inherited data folder."""

from __future__ import annotations

import pytest

from fedjax_proj.data import sources


@pytest.fixture(autouse=True)
def isolated_env(tmp_path, monkeypatch):
  """Private cache dir and no inherited data dir, so tests neither pollute nor read $HOME."""
  monkeypatch.setenv(sources.CACHE_DIR_ENV, str(tmp_path / "cache"))
  monkeypatch.delenv(sources.DATA_DIR_ENV, raising=False)
