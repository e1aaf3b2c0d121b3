"""The plot command draws curves from run directories and rejects directories without metrics."""

from __future__ import annotations

import json

import pytest

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


def test_plot_names_what_is_wrong_with_each_path_before_drawing(tmp_path, capsys):
  _fake_run(tmp_path / "a", "fedavg", 0.1)
  (tmp_path / "file.txt").write_text("")
  (tmp_path / "empty").mkdir()
  out = tmp_path / "c.png"
  cases = [
    ([str(tmp_path / "absent")], f"{tmp_path / 'absent'} does not exist; check the path"),
    (
      [str(tmp_path / "file.txt")],
      f"{tmp_path / 'file.txt'} is a file, not a run directory; pass the folder that holds it",
    ),
    ([str(tmp_path / "empty")], f"{tmp_path / 'empty'} is a folder without metrics.jsonl"),
    # Given twice, a run or a metric would be drawn twice without a word.
    ([str(tmp_path / "a"), str(tmp_path / "a/")], f"run directory {tmp_path / 'a'} is given more"),
    ([str(tmp_path / "a"), "--metrics=train_loss,train_loss"], "--metrics lists train_loss more"),
  ]
  for argv, message in cases:
    assert plot.main([*argv, "--out", str(out)]) == 1
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1
  with pytest.raises(SystemExit) as e:  # given, yet empty (an unset variable): not every metric
    plot.main([str(tmp_path / "a"), "--metrics=,", "--out", str(out)])
  assert e.value.code == 2 and "--metrics=, lists no metric" in capsys.readouterr().err
  assert not out.exists()


def test_a_truncated_summary_is_named(tmp_path, capsys):
  _fake_run(tmp_path / "a", "fedavg", 0.1)
  (tmp_path / "a" / "summary.json").write_text('{"method": "fedavg", "se')  # cut by a crash
  assert plot.main([str(tmp_path / "a"), "--out", str(tmp_path / "c.png")]) == 1
  err = capsys.readouterr().err
  assert f"{tmp_path / 'a' / 'summary.json'} is not valid JSON (" in err
  assert "Delete it to label the run from its newest checkpoint" in err


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


# One metrics.jsonl line of each shape the library writes (training/loop.py, training/task_rounds.py
# and the methods' diagnostics); plotting must read all of them.
SHAPES = {
  "fedavg": {"train_loss": 1.0, "test_accuracy": 0.3, "round_seconds": 0.1},
  "fedproj": {"train_loss": 1.0, "lmem_global": 0.2, "projected_fraction": 0.5, "mean_cos": None},
  "sfedkd": {"train_loss": 1.0, "teacher_clients": [3, 1], "test_accuracy": 0.4},
  "fot": {"task": 0, "task_round": 1, "train_loss": 1.0, "current_task_accuracy": 0.8},
}


def test_plot_reads_every_metrics_shape_and_names_unfinished_runs(tmp_path, capsys):
  runs = []
  for method, fields in SHAPES.items():
    run = tmp_path / method
    run.mkdir()
    lines = [json.dumps({"round": r, **fields}) + "\n" for r in (1, 2)]
    if method == "fot":  # the continual runner's end-of-task row has no "round"
      lines.append(json.dumps({"task_end": 0, "accuracies": [0.8], "end_task_seconds": 1.0}) + "\n")
    if method == "sfedkd":
      lines.append('{"round": 3, "train_lo')  # torn by a crash: skipped, with a note
    (run / "metrics.jsonl").write_text("".join(lines))
    if method != "fedproj":
      (run / "summary.json").write_text(json.dumps({"method": method, "seed": 0}))
    runs.append(run)
  # fedproj is unfinished: no summary, a checkpoint manifest names it.
  manifest = {"meta": {"round": 2, "rounds": 10, "config": {"method": "fedproj", "seed": 4}}}
  (tmp_path / "fedproj/checkpoints/2").mkdir(parents=True)
  (tmp_path / "fedproj/checkpoints/2" / plot.MANIFEST).write_text(json.dumps(manifest))
  out = tmp_path / "all.png"
  assert plot.main([*map(str, runs), "--out", str(out)]) == 0
  assert "sfedkd/metrics.jsonl ends in a torn line" in capsys.readouterr().err
  fig = plot.figure(runs)
  titles = [ax.get_title() for ax in fig.axes if ax.lines]
  assert "Test accuracy" in titles and "L_mem of the global model" in titles
  assert not any("teacher" in t or t in ("Task", "Round seconds") for t in titles)
  for ax in fig.axes:
    if ax.lines:  # two rounds: ticks at exactly 1 and 2
      assert [float(t) for t in ax.get_xticks()] == [1.0, 2.0]
  labels = plot.run_labels(runs)
  assert labels[tmp_path / "fedproj"] == "fedproj (seed 4, unfinished: round 2 of 10)"
  (tmp_path / "bare").mkdir()
  assert plot.run_labels([tmp_path / "bare"]) == {tmp_path / "bare": "bare (unfinished)"}


def test_unknown_metric_is_named_with_the_known_ones(tmp_path, capsys):
  _fake_run(tmp_path / "a", "fedavg", 0.1)
  out = tmp_path / "c.png"
  assert plot.main([str(tmp_path / "a"), "--metrics=test_accuracy,nope", "--out", str(out)]) == 1
  err = capsys.readouterr().err
  assert "the metric(s) nope; the runs hold: lmem_global, test_accuracy, train_loss" in err
  assert not out.exists()


def test_out_folder_is_refused_and_missing_folders_are_created_and_named(tmp_path, capsys):
  _fake_run(tmp_path / "a", "fedavg", 0.1)
  folder = tmp_path / "figures"
  folder.mkdir()
  assert plot.main([str(tmp_path / "a"), "--out", str(folder)]) == 1
  err = capsys.readouterr().err
  assert (
    f"--out={folder} is a folder; pass the PNG's file path, e.g. --out={folder}/curves.png" in err
  )
  assert list(folder.iterdir()) == []
  deep = tmp_path / "new" / "deeper" / "c.png"
  assert plot.main([str(tmp_path / "a"), "--out", str(deep)]) == 0
  assert f"created the folder {deep.parent} for --out" in capsys.readouterr().out
  assert deep.read_bytes()[:4] == b"\x89PNG"
  (tmp_path / "file").write_text("")
  under_a_file = tmp_path / "file" / "c.png"
  assert plot.main([str(tmp_path / "a"), "--out", str(under_a_file)]) == 1
  assert (
    f"--out={under_a_file}: its folder={tmp_path / 'file'} is a file" in capsys.readouterr().err
  )
