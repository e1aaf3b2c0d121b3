"""The plot command draws curves from run directories and rejects directories without metrics."""

from __future__ import annotations

import json

from fedjax_proj import plot


def _fake_run(path, method, acc):
  path.mkdir()
  lines = [
    {"round": r, "train_loss": 2.0 / r, "test_accuracy": acc * r, "lmem_global": 0.1 * r}
    for r in range(1, 4)
  ]
  (path / "metrics.jsonl").write_text("\n".join(json.dumps(x) for x in lines) + "\n")
  (path / "summary.json").write_text(json.dumps({"method": method, "seed": 0}))


def test_plot_writes_png(tmp_path):
  _fake_run(tmp_path / "a", "fedavg", 0.1)
  _fake_run(tmp_path / "b", "fedproj", 0.2)
  out = tmp_path / "c.png"
  assert plot.main([str(tmp_path / "a"), str(tmp_path / "b"), "--out", str(out)]) == 0
  assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 5000


def test_plot_rejects_missing_metrics(tmp_path, capsys):
  (tmp_path / "empty").mkdir()
  assert plot.main([str(tmp_path / "empty")]) == 1
  assert "metrics.jsonl" in capsys.readouterr().err
