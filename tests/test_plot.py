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


def test_plot_labels_axes_one_legend_integer_rounds_and_a_title(tmp_path):
  for name, seed in (("a", 0), ("b", 0), ("c", 1)):
    (tmp_path / name).mkdir()
    lines = [{"round": r, "test_accuracy": 0.1 * r, "train_loss": 1.0 / r} for r in (1, 2, 3)]
    (tmp_path / name / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    (tmp_path / name / "summary.json").write_text(json.dumps({"method": "fedavg", "seed": seed}))
  runs = [tmp_path / n for n in "abc"]
  labels = plot.run_labels(runs)
  assert labels == {
    runs[0]: "fedavg (seed 0) [a]",  # ambiguous: the directory tells them apart
    runs[1]: "fedavg (seed 0) [b]",
    runs[2]: "fedavg (seed 1)",
  }
  fig = plot.figure(runs)
  axes = [ax for ax in fig.axes if ax.get_visible() and ax.lines]
  assert [ax.get_ylabel() for ax in axes] == ["test accuracy", "training loss"]
  for ax in axes:
    ticks = [t for t in ax.get_xticks() if 1 <= t <= 3]
    assert ticks and all(float(t).is_integer() for t in ticks)
    assert ax.get_legend() is None
  assert len(fig.legends) == 1
  assert [t.get_text() for t in fig.legends[0].get_texts()] == list(labels.values())
  assert fig._suptitle.get_text() == "fedavg: 3 runs"
