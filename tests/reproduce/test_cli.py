"""``python -m fedjax_proj.reproduce``: a claim end to end, skip-if-done, stale results, report."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import numpy as np
import pytest

from fedjax_proj.reproduce import __main__ as cli
from fedjax_proj.reproduce import (
  availability,
  claim_queue,
  provenance,
  records,
  resolve,
  run,
  runners,
  stats,
)
from fedjax_proj.reproduce.claims.pilot import PILOT
from fedjax_proj.reproduce.report import figures as report_figures
from fedjax_proj.reproduce.report import results as report_results
from fedjax_proj.reproduce.report import tables as report_tables
from fedjax_proj.reproduce.report import timing as report_timing
from fedjax_proj.reproduce.report import verdicts as report_verdicts
from fedjax_proj.reproduce.report import writer as report_writer

PILOT_SMOKE = ["fedproj-iris-pilot", "--budget=smoke", "--methods=fedavg"]


def test_pilot_smoke_end_to_end_then_skipped(tmp_path, capsys):
  args = [*PILOT_SMOKE, "--seeds=0", f"--results={tmp_path}", "--report"]
  assert cli.main(args) == 0
  path = tmp_path / "fedproj-iris-pilot" / "smoke" / "fedavg-seed0.json"
  result = json.loads(path.read_text())
  assert result["method"] == "fedavg" and result["seed"] == 0
  assert 0.0 <= result["metrics"]["global_accuracy"] <= 100.0
  assert [c["round"] for c in result["curve"]] == [1, 2]  # smoke = 2 rounds
  assert result["config"]["rounds"] == 2 and result["config"]["public"] == "iris_labelled"
  assert result["fingerprint"] == resolve.fingerprint(result["config"])
  assert (path.parent / "report.md").is_file()
  before = path.read_bytes()
  capsys.readouterr()
  assert cli.main(args) == 0
  assert "skip fedproj-iris-pilot smoke fedavg seed 0: done with the same config" in (
    capsys.readouterr().out
  )
  assert path.read_bytes() == before


def _fake_runner(calls):
  def runner(claim, config, work, log):
    calls.append(config["seed"])
    return {"global_accuracy": 50.0 + config["seed"], "client_accuracy": 40.0}, [{"round": 1}]

  return runner


def test_report_names_its_file_and_a_command_that_reruns_exactly(tmp_path, capsys, monkeypatch):
  import shlex

  calls = []
  monkeypatch.setitem(runners.RUNNERS, "pilot", _fake_runner(calls))
  results = tmp_path / "results"
  argv = [*PILOT_SMOKE, "--seeds=1,2", f"--data={tmp_path}", f"--results={results}", "--report"]
  assert cli.main(argv) == 0 and calls == [1, 2]
  written = results / PILOT.name / "smoke" / "report.md"
  assert f"wrote {written} (and its figures beside it)" in capsys.readouterr().out
  line = next(x for x in written.read_text().splitlines() if x.startswith("Command: `"))
  command = shlex.split(line[len("Command: `") : -len("`.")])
  assert command[:3] == ["python", "-m", "fedjax_proj.reproduce"]
  assert "--methods=fedavg" in command and "--seeds=1,2" in command
  assert f"--data={tmp_path}" in command
  # Pasted, it reruns the same queue (every run now done) and rewrites the same report.
  before = written.read_text()
  assert cli.main(command[3:]) == 0 and calls == [1, 2]
  assert written.read_text() == before


def test_stale_result_rerun_only_on_request(tmp_path, capsys, monkeypatch):
  calls = []
  monkeypatch.setitem(runners.RUNNERS, "pilot", _fake_runner(calls))
  args = [*PILOT_SMOKE, "--seeds=0,1", f"--results={tmp_path}"]
  assert cli.main(args) == 0 and calls == [0, 1]
  path = tmp_path / "fedproj-iris-pilot" / "smoke" / "fedavg-seed1.json"
  result = json.loads(path.read_text())
  result["config"]["rounds"] = 999  # as if run under another config
  result["fingerprint"] = resolve.fingerprint(result["config"])
  path.write_text(json.dumps(result))
  stale_bytes = path.read_bytes()
  capsys.readouterr()
  assert cli.main(args) == 0
  out = capsys.readouterr().out
  assert "skip fedproj-iris-pilot smoke fedavg seed 0" in out
  assert "stale fedproj-iris-pilot smoke fedavg seed 1" in out and "--rerun_stale" in out
  assert calls == [0, 1] and path.read_bytes() == stale_bytes
  assert cli.main([*args, "--rerun_stale"]) == 0
  assert calls == [0, 1, 1]
  assert json.loads(path.read_text())["config"]["rounds"] == 2


def test_a_failing_run_does_not_stop_the_others(tmp_path, capsys, monkeypatch):
  calls = []

  def runner(claim, config, work, log):
    calls.append(config["seed"])
    if config["seed"] == 1 and calls.count(1) == 1:
      raise FloatingPointError("task 1 round 2: non-finite train loss nan")
    return {"global_accuracy": 50.0, "client_accuracy": 40.0}, [
      {"round": 1, "global_accuracy": 0.5}
    ]

  monkeypatch.setitem(runners.RUNNERS, "pilot", runner)
  args = [*PILOT_SMOKE, "--seeds=0,1,2", f"--results={tmp_path}", "--report"]
  assert cli.main(args) == 1
  out, err = capsys.readouterr()
  directory = tmp_path / "fedproj-iris-pilot" / "smoke"
  assert calls == [0, 1, 2]  # seed 2 still ran after seed 1 failed
  assert sorted(p.name for p in directory.glob("*-seed*.json")) == [
    "fedavg-seed0.json",
    "fedavg-seed2.json",
  ]
  assert "FAILED fedproj-iris-pilot smoke fedavg seed 1: FloatingPointError" in out
  assert "1 run(s) failed" in err and "non-finite train loss" in err
  # The clean line only; the traceback is kept beside the result, and the line says where.
  kept = directory / "fedavg-seed1.traceback"
  assert "Traceback" not in out + err and f"traceback in {kept}; --debug prints it here" in out
  assert kept.read_text().startswith("Traceback") and "in runner" in kept.read_text()
  assert (directory / "report.md").is_file()  # the finished runs are reported
  assert cli.main(args) == 0 and calls == [0, 1, 2, 1]  # a rerun retries only the failed run
  assert not kept.exists()  # the retried run succeeded: its old traceback is gone


def test_debug_prints_a_failed_runs_traceback(tmp_path, capsys, monkeypatch):
  def runner(claim, config, work, log):
    raise ValueError("data/x.npz is truncated")

  monkeypatch.setitem(runners.RUNNERS, "pilot", runner)
  argv = [*PILOT_SMOKE, "--seeds=0", f"--results={tmp_path}", "--debug"]
  assert cli.main(argv) == 1
  err = capsys.readouterr().err
  assert "Traceback (most recent call last)" in err and "in runner" in err


def test_a_diverged_run_is_recorded_as_an_outcome_and_not_rerun(tmp_path, capsys, monkeypatch):
  from fedjax_proj.training.session import last_good

  calls = []

  class Kept:  # a checkpointer holding round 1, as the loop's error names it
    directory = tmp_path / "feddf-seed1.work" / "checkpoints"

    def steps(self):
      return [1]

  def runner(claim, config, work, log):
    calls.append((config["method"], config["seed"]))
    if config["method"] == "feddf" and config["seed"] == 1:
      (work / "metrics.jsonl").write_text('{"round": 1, "train_loss": 2.0}\n')
      kept = last_good(Kept())
      raise runners.Diverged(
        f"Round 2 of feddf produced non-finite train_loss. {kept} Lower the lr."
      )
    value = 50.0 + config["seed"] + (5.0 if config["method"] == "fedproj" else 0.0)
    return {"global_accuracy": value, "client_accuracy": value}, [{"round": 1}]

  monkeypatch.setitem(runners.RUNNERS, "pilot", runner)
  args = ["fedproj-iris-pilot", "--budget=smoke", f"--results={tmp_path}", "--report"]
  assert cli.main(args) == 0  # an outcome, not a failure
  out = capsys.readouterr().out
  assert "done fedproj-iris-pilot smoke feddf seed 1: DIVERGED after round 1 (Round 2" in out
  path = tmp_path / "fedproj-iris-pilot" / "smoke" / "feddf-seed1.json"
  result = json.loads(path.read_text())
  assert result["metrics"] == {} and result["diverged"]["last_finite_round"] == 1
  assert result["curve"] == [{"round": 1, "train_loss": 2.0}]
  n = len(calls)
  assert cli.main(args) == 0 and len(calls) == n  # done: an outcome, never retried
  text = (path.parent / "report.md").read_text()
  assert "Diverged (a non-finite loss or parameters stopped the run" in text
  assert "feddf seed 1 (last finite round: 1)" in text
  # The error, less the checkpoint it names: the run's work folder is gone once it is recorded.
  assert "First error: Round 2 of feddf produced non-finite train_loss. Lower the lr." in text
  assert "checkpoint" not in text and not (path.parent / "feddf-seed1.work").exists()
  assert "| fedproj > feddf | global_accuracy | 2 |" in text  # seeds 0 and 2 only
  assert "not computable: feddf diverged on seed 1" in text
  assert "| fedproj > fedavg | global_accuracy | 3 |" in text  # untouched by feddf's seed
  assert "To complete the verdicts" not in text  # a diverged run is not missing


def test_continual_runs_in_process_and_a_divergence_is_recorded(tmp_path, monkeypatch):
  """The continual runner resolves the planned config through the claim's config module
  (fedjax_proj/configs/pmnist.py) and runs it in this process: a non-finite run (NonFiniteError)
  becomes run.Diverged (recorded), a stop request (TrainingInterrupted) and any other failure
  reach the queue as they are (a stop, a failure retried by the next command)."""
  import signal

  from fedjax_proj.configs import pmnist
  from fedjax_proj.reproduce import claims
  from fedjax_proj.training import continual_tasks
  from fedjax_proj.training.loop import NonFiniteError
  from fedjax_proj.training.signals import TrainingInterrupted

  claim = claims.get_claim("fot-pmnist-noniid")
  planned = resolve.resolve_config(claim, "smoke", "ewc", 0, data_root=tmp_path)
  config = resolve.substitute_data(planned, tmp_path)
  ran = []
  outcomes = iter(
    [
      NonFiniteError("Round 26 of ewc produced non-finite train_loss"),
      TrainingInterrupted("SIGTERM received", 1, signal.SIGTERM, True),
      ValueError("no MNIST here"),
    ]
  )

  def fake_run(c, benchmark):
    assert benchmark == pmnist.BENCHMARK
    ran.append(c)
    raise next(outcomes)

  monkeypatch.setattr(continual_tasks, "run", fake_run)
  with pytest.raises(runners.Diverged, match="^Round 26 of ewc produced non-finite train_loss$"):
    runners.run_continual(claim, config, tmp_path, print)
  # What ran is the planned config, with this run's directory: nothing re-typed through flags.
  got = ran[0].to_dict()
  assert got["output_dir"] == str(tmp_path)
  assert {k: got[k] for k in config} == config
  with pytest.raises(TrainingInterrupted) as stop:
    runners.run_continual(claim, config, tmp_path, print)
  assert stop.value.signum == signal.SIGTERM
  with pytest.raises(ValueError, match="no MNIST here"):
    runners.run_continual(claim, config, tmp_path, print)


def test_a_stop_request_stops_the_queue(tmp_path, capsys, monkeypatch):
  """SIGTERM inside a run (TrainingInterrupted) stops the runner, where a failing run does not."""
  import signal

  from fedjax_proj.training.signals import TrainingInterrupted

  calls = []

  def runner(claim, config, work, log):
    calls.append(config["seed"])
    if config["seed"] == 1:
      raise TrainingInterrupted(
        "SIGTERM received: stopped after round 1/2", 1, signal.SIGTERM, True
      )
    return {"global_accuracy": 50.0, "client_accuracy": 40.0}, [
      {"round": 1, "global_accuracy": 0.5}
    ]

  monkeypatch.setitem(runners.RUNNERS, "pilot", runner)
  args = [*PILOT_SMOKE, "--seeds=0,1,2", f"--results={tmp_path}"]
  assert cli.main(args) == 128 + signal.SIGTERM
  out, err = capsys.readouterr()
  assert calls == [0, 1]  # seed 2 never started
  assert "stopped fedproj-iris-pilot smoke fedavg seed 1" in out and "rerun the command" in err
  # The round loop's hint (an entry point's --resume flag) is not this command's.
  assert "fedavg-seed1 stopped after round 1; run the same command again" in out
  assert "--resume" not in out + err


def test_a_stop_request_in_the_last_round_stops_the_queue_after_it(tmp_path, capsys, monkeypatch):
  """SIGTERM caught by the round loop in a run's last round: that run finishes and is recorded
  (there is no later round to stop after), and the next run does not start."""
  import signal

  from fedjax_proj.training import signals

  calls = []

  def runner(claim, config, work, log):
    calls.append(config["seed"])
    if config["seed"] == 0:
      with signals.StopOnSignal(True, announce=False):  # the round loop's handler, last round
        signal.raise_signal(signal.SIGTERM)
    return {"global_accuracy": 50.0, "client_accuracy": 40.0}, [
      {"round": 1, "global_accuracy": 0.5}
    ]

  monkeypatch.setitem(runners.RUNNERS, "pilot", runner)
  monkeypatch.setattr(signals, "_caught", [signal.SIGINT])  # an earlier command's: forgotten
  args = [*PILOT_SMOKE, "--seeds=0,1", f"--results={tmp_path}"]
  assert cli.main(args) == 128 + signal.SIGTERM
  out, err = capsys.readouterr()
  assert calls == [0]  # seed 1 never started
  assert (tmp_path / "fedproj-iris-pilot" / "smoke" / "fedavg-seed0.json").exists()
  assert "stopped before fedproj-iris-pilot smoke fedavg seed 1: SIGTERM" in out
  assert "rerun the command" in err
  assert cli.main(args) == 0 and calls == [0, 1]  # the same command goes on with seed 1


def test_a_run_failed_in_one_job_is_not_retried_by_another_of_the_same_command(
  tmp_path, capsys, monkeypatch
):
  """--jobs workers share the parent's attempt name: a run that failed in one is left alone by
  the others (tried and listed once); a later command retries it, and its success clears the
  mark."""
  calls = []

  def runner(claim, config, work, log):
    calls.append(config["seed"])
    if len(calls) == 1:
      raise RuntimeError("out of memory")
    return {"global_accuracy": 50.0, "client_accuracy": 40.0}, [{"round": 1}]

  monkeypatch.setitem(runners.RUNNERS, "pilot", runner)
  worker = [*PILOT_SMOKE, "--seeds=0", f"--results={tmp_path}", "--job_worker"]
  marker = records.result_path(tmp_path, "fedproj-iris-pilot", "smoke", "fedavg", 0).with_suffix(
    ".failed"
  )
  assert cli.main([*worker, "--job_attempt=A"]) == 1 and calls == [0]
  assert json.loads(marker.read_text())["attempt"] == "A"
  capsys.readouterr()
  assert cli.main([*worker, "--job_attempt=A"]) == 0 and calls == [0]  # the other job of A
  assert "failed in another job of this command" in capsys.readouterr().out
  assert cli.main([*worker, "--job_attempt=B"]) == 0 and calls == [0, 0]  # a later command
  assert not marker.exists() and marker.with_suffix(".json").is_file()


def test_the_queue_is_announced_with_an_eta_from_recorded_run_times(tmp_path, capsys, monkeypatch):
  calls = []
  monkeypatch.setitem(runners.RUNNERS, "pilot", _fake_runner(calls))
  directory = tmp_path / "fedproj-iris-pilot" / "smoke"
  assert cli.main([*PILOT_SMOKE, "--seeds=0", f"--results={tmp_path}"]) == 0
  out = capsys.readouterr().out
  # Nothing recorded yet: the runs are counted, their time is not guessed, and the way to get
  # one is named.
  assert (
    "queue: 0 done, 1 to run, 1 missing; 1 run(s) of fedavg with no recorded time: no estimate; "
    "run one seed (--seeds=0) to get one"
  ) in out
  assert "queue: 1 of 1 run; nothing left" in out
  result = json.loads((directory / "fedavg-seed0.json").read_text())
  result["wall_seconds"] = 600.0  # as if the run had taken ten minutes
  (directory / "fedavg-seed0.json").write_text(json.dumps(result))
  args = ["fedproj-iris-pilot", "--budget=smoke", "--seeds=0,1,2,3"]
  assert cli.main([*args, "--methods=fedavg", f"--results={tmp_path}", "--no_run"]) == 0
  assert "queue: 1 done, 3 to run, 3 missing; about 30 min in one process for 3 run(s)" in (
    capsys.readouterr().out
  )
  # A method with no recorded time is named, with its runs, beside the estimate of the others.
  both = [*args, "--methods=fedavg,fedproj", f"--results={tmp_path}", "--no_run"]
  assert cli.main(both) == 0
  out = capsys.readouterr().out
  assert "about 30 min in one process for 3 run(s)" in out
  assert "4 run(s) of fedproj with no recorded time" in out
  # A stale result is left alone unless --rerun_stale, and the summary says which.
  result["config"]["rounds"] = 999
  (directory / "fedavg-seed0.json").write_text(json.dumps(result))
  stale = [*args, "--methods=fedavg", f"--results={tmp_path}", "--no_run"]
  assert cli.main(stale) == 0
  assert "0 done, 3 to run, 3 missing, 1 stale left alone (--rerun_stale reruns them)" in (
    capsys.readouterr().out
  )
  assert cli.main([*stale, "--rerun_stale"]) == 0
  assert "0 done, 4 to run, 3 missing, 1 stale; about 40 min" in capsys.readouterr().out
  assert calls == [0]  # --no_run ran nothing


def test_results_record_their_machine_and_etas_use_only_the_same_backend(
  tmp_path, capsys, monkeypatch
):
  monkeypatch.setitem(runners.RUNNERS, "pilot", _fake_runner([]))
  directory = tmp_path / "fedproj-iris-pilot" / "smoke"
  base = [*PILOT_SMOKE, "--methods=fedavg", f"--results={tmp_path}"]
  assert cli.main([*base, "--seeds=0,1"]) == 0
  capsys.readouterr()
  cpu = json.loads((directory / "fedavg-seed0.json").read_text())
  assert cpu["machine"]["backend"] == "cpu"  # where this test runs
  assert cpu["machine"]["cores"] >= 1 and cpu["machine"]["device_kind"]
  cpu["wall_seconds"] = 600.0
  (directory / "fedavg-seed0.json").write_text(json.dumps(cpu))
  gpu = json.loads((directory / "fedavg-seed1.json").read_text())
  gpu["wall_seconds"] = 6.0
  gpu["machine"] = {"backend": "gpu", "device_kind": "NVIDIA H200", "cores": 2, "cpu_count": 16}
  (directory / "fedavg-seed1.json").write_text(json.dumps(gpu))
  queued = [*base, "--seeds=0,1,2,3", "--no_run"]
  # Here (a CPU) the two missing runs are timed at the CPU run's 600 s, not averaged with 6 s.
  monkeypatch.setattr(provenance, "local_backend", lambda: "cpu")
  assert cli.main(queued) == 0
  assert "2 to run, 2 missing; about 20 min in one process for 2 run(s)" in capsys.readouterr().out
  monkeypatch.setattr(provenance, "local_backend", lambda: "gpu")
  assert cli.main(queued) == 0
  assert "2 to run, 2 missing; about 12 s in one process for 2 run(s)" in capsys.readouterr().out
  # The report names each machine with its number of runs.
  assert cli.main([*queued, "--report"]) == 0
  text = (directory / "report.md").read_text()
  card = cpu["machine"]["card"]  # the CPU's model name, where /proc/cpuinfo gives one
  assert f"machines: CPU{f' ({card})' if card else ''}, " in text
  assert "NVIDIA H200 (gpu, matmul precision default): 1 run" in text


def _write(directory, method, seed, value):
  directory.mkdir(parents=True, exist_ok=True)
  result = {
    "claim": "fedproj-iris-pilot",
    "budget": "cpu",
    "method": method,
    "seed": seed,
    "config": {"method": method, "seed": seed},
    "metrics": {"global_accuracy": value, "client_accuracy": value},
    "curve": [{"round": 1, "global_accuracy": value / 100}],
    "wall_seconds": 1.0,
    "fingerprint": "x",
    "git_commit": "abc",
    "load_average": [1.0, 1.0, 1.0],
  }
  (directory / f"{method}-seed{seed}.json").write_text(json.dumps(result))


def _verdicts(directory):
  found, _, _ = report_results.load_results(directory)
  return {(b, w, m): v for b, w, m, _, v in report_verdicts.paired_rows(PILOT, found)}


def test_report_verdicts_from_result_files(tmp_path):
  # fedproj - fedavg = [+1, -2, +0.5]: straddles 0; fedproj - feddf = [6, 4, 6.5]: sd 1.32.
  for seed, (avg, df, proj) in enumerate([(80, 75, 81), (82, 76, 80), (81, 75, 81.5)]):
    for method, value in (("fedavg", avg), ("feddf", df), ("fedproj", proj)):
      _write(tmp_path, method, seed, value)
  v = _verdicts(tmp_path)
  assert v[("fedproj", "fedavg", "global_accuracy")] == stats.INCONCLUSIVE
  assert v[("fedproj", "feddf", "global_accuracy")] == stats.REPRODUCED
  text = report_writer.write_report(PILOT, "cpu", tmp_path, None)
  assert "| fedproj > fedavg | global_accuracy | 3 | -0.17 |" in text
  assert "| fedproj > feddf | global_accuracy | 3 | 5.50 | 1.32 | 3/3 |" in text
  assert (tmp_path / "report.md").read_text() == text


def test_report_too_few_seeds(tmp_path):
  for seed in (0, 1):
    _write(tmp_path, "fedavg", seed, 70.0)
    _write(tmp_path, "fedproj", seed, 90.0)
  v = _verdicts(tmp_path)
  assert v[("fedproj", "fedavg", "global_accuracy")] == stats.TOO_FEW
  assert v[("fedproj", "feddf", "client_accuracy")] == stats.TOO_FEW  # no feddf results at all


def test_report_names_the_runs_its_verdicts_lack_and_their_time(tmp_path):
  # The pilot's cpu budget pre-registers 3 seeds of fedavg, feddf and fedproj.
  for seed in (0, 1, 2):
    _write(tmp_path, "fedavg", seed, 70.0)
  _write(tmp_path, "fedproj", 0, 90.0)
  found, _, _ = report_results.load_results(tmp_path)
  (line, _) = report_timing.completion_lines(PILOT, found, "cpu")
  assert "5 run(s) of the pre-registered seeds are missing" in line
  assert "(feddf seeds 0-2; fedproj seeds 1-2)" in line
  assert "fedproj-iris-pilot --budget=cpu` runs them" in line
  # fedproj's recorded second counts for its 2 runs; feddf has none, so its 3 are not guessed.
  assert "about 2 s in one process for 2 run(s)" in line
  assert "3 run(s) of feddf with no recorded time" in line
  # Nothing recorded at all: the seed it names to time one is the first missing, not 0.
  (line, _) = report_timing.completion_lines(PILOT, {"fedavg": found["fedavg"]}, "cpu", timing={})
  assert "no estimate; run one seed (--seeds=0)" in line
  both = {m: {0: found["fedavg"][0]} for m in ("fedavg", "feddf", "fedproj")}
  (line, _) = report_timing.completion_lines(PILOT, both, "cpu", timing={})
  assert "(fedavg seeds 1-2; feddf seeds 1-2; fedproj seeds 1-2)" in line
  assert "no estimate; run one seed (--seeds=1) to get one" in line
  for seed in (0, 1, 2):
    _write(tmp_path, "feddf", seed, 60.0)
    _write(tmp_path, "fedproj", seed, 90.0)
  found, _, _ = report_results.load_results(tmp_path)
  assert report_timing.completion_lines(PILOT, found, "cpu") == []  # complete: nothing to say
  assert report_results.seed_ranges([0, 1, 2, 5, 7, 8]) == "seeds 0-2, 5, 7-8"
  assert report_results.seed_ranges([4]) == "seed 4"


def test_completion_times_a_gpu_only_budget_from_its_gpu_runs(tmp_path):
  # A budget whose runs all ran on an accelerator (the gpu budget) is timed from them, and says
  # so; one CPU result makes the CPU's seconds the estimate again, the accelerator's left out.
  for seed in (0, 1, 2):
    _write(tmp_path, "fedavg", seed, 70.0)
  _write(tmp_path, "fedproj", 0, 90.0)
  for path in tmp_path.glob("*.json"):
    r = json.loads(path.read_text())
    r["machine"], r["wall_seconds"] = {"backend": "gpu"}, 40.0
    path.write_text(json.dumps(r))
  found, _, _ = report_results.load_results(tmp_path)
  (line, _) = report_timing.completion_lines(PILOT, found, "cpu")
  assert "about 80 s in one process for 2 run(s)" in line  # fedproj's 40 s, twice
  assert line.endswith("no recorded time, timed on gpu.")
  _write(tmp_path, "fedproj", 1, 90.0)  # a CPU run, 1 s
  found, _, _ = report_results.load_results(tmp_path)
  (line, _) = report_timing.completion_lines(PILOT, found, "cpu")
  assert "about 1 s in one process for 1 run(s)" in line
  assert "timed on" not in line


@pytest.mark.parametrize(
  "argv, message",
  [
    (["nope"], "Unknown claim 'nope'. Valid claims: fedproj-cifar10-dir0.3"),
    (["fedproj-iris-pilot", "--methods=fedavg,moon"], "--methods: ['moon'] not in claim"),
    (["fedproj-iris-pilot", "--seeds=0,x"], "--seeds must be comma-separated integers"),
    (["fedproj-iris-pilot", "--seeds=0,1,0,1"], "--seeds lists 0, 1 more than once"),
    (["fedproj-iris-pilot", "--seeds="], "--seeds= lists no seed; list them, e.g. --seeds=0,1,2"),
    (["fedproj-iris-pilot", "--seeds=,"], "--seeds=, lists no seed"),
    (["fot-pmnist-iid", "--sweep"], "--sweep applies to fedproj-iris-pilot only"),
    # Empty, as an unset shell variable gives: not the default (every method of the budget).
    (["fedproj-iris-pilot", "--methods="], "--methods= lists no method; list them, e.g."),
    (["fedproj-iris-pilot", "--methods=,"], "or leave the flag out for the budget's methods"),
    # Twice: the second would find the first's result and call it another process's.
    (["fedproj-iris-pilot", "--methods=fedavg,fedavg"], "--methods lists fedavg more than once"),
    # A mode that only prints drops the others silently: refused by name.
    (
      ["fedproj-iris-pilot", "--dry_run", "--no_run", "--report"],
      "--dry_run only prints (it runs and reports nothing), so --report, --no_run would be",
    ),
    (["fedproj-iris-pilot", "--power", "--dry_run"], "--power only prints (it runs and"),
    (["fedproj-iris-pilot", "--power", "--report"], "so --report would be ignored"),
    (
      ["fedproj-iris-pilot", "--dry_run", "--rerun_stale", "--jobs=2"],
      "--rerun_stale, --jobs would",
    ),
    # An unknown budget lists the claim's budgets, not every claim's.
    (
      ["fedproj-iris-pilot", "--budget=cpuu"],
      "has no budget 'cpuu'; its budgets: paper, cpu, smoke",
    ),
    (["--list", "--budget=cpuu"], "unknown --budget=cpuu; choose from paper, cpu"),
  ],
)
def test_bad_input_exits_2_with_the_fix(argv, message, capsys):
  with pytest.raises(SystemExit) as e:
    cli.main(argv)
  assert e.value.code == 2
  assert message in capsys.readouterr().err


def test_list_names_each_claims_paper_by_title(capsys):
  from fedjax_proj.reproduce import claims
  from fedjax_proj.reproduce.claims import common as claims_common

  assert cli.main(["--list"]) == 0
  lines = capsys.readouterr().out.splitlines()
  assert len(lines) == 2 * len(claims.CLAIMS)  # a claim's line, then its paper's
  for name, paper in zip(lines[::2], lines[1::2]):
    claim = claims.get_claim(name.split()[0])
    number = claim.reference.split()[0]
    assert paper.split()[:3] == ["paper", number, "="] and claims_common.PAPERS[number] in paper
  fot = lines.index(next(x for x in lines if x.startswith("fot-pmnist-iid ")))
  assert '003 = FOT, "Federated Orthogonal Training: Mitigating' in lines[fot + 1]


def test_missing_data_folder_is_an_error_before_any_run(tmp_path, capsys):
  argv = ["fedproj-cifar10-dir0.3", "--budget=smoke", f"--data={tmp_path / 'absent'}"]
  assert cli.main([*argv, f"--results={tmp_path}"]) == 1
  assert f"--data={tmp_path / 'absent'} does not exist" in capsys.readouterr().err
  assert not (tmp_path / "fedproj-cifar10-dir0.3").exists()
  (tmp_path / "file").write_text("")  # a file where the folder goes: named, not replaced
  assert cli.main([*argv[:2], f"--data={tmp_path / 'file'}", f"--results={tmp_path}"]) == 1
  assert f"--data={tmp_path / 'file'} is a file, not a folder" in capsys.readouterr().err


def _read_only_folder(tmp_path):
  """A folder no file can be created in (root writes through permission bits: /sys)."""
  if os.geteuid() == 0:
    if not Path("/sys").is_dir():
      pytest.skip("no read-only /sys to write into")
    return Path("/sys/fedjax_proj_test_results")
  ro = tmp_path / "ro"
  ro.mkdir(mode=0o500)
  return ro


def test_unwritable_results_folder_is_one_line_before_any_run(tmp_path, capsys, monkeypatch):
  calls = []
  monkeypatch.setitem(runners.RUNNERS, "pilot", _fake_runner(calls))
  results = _read_only_folder(tmp_path)
  assert cli.main([*PILOT_SMOKE, "--seeds=0", f"--results={results}"]) == 1
  err = capsys.readouterr().err
  assert f"--results={results / PILOT.name} is not writable" in err and "Traceback" not in err
  assert len(err.strip().splitlines()) == 1 and calls == []
  # Reading only (the queue, the configs) needs no writable folder.
  assert cli.main([*PILOT_SMOKE, "--seeds=0", f"--results={results}", "--no_run"]) == 0
  (tmp_path / "file").write_text("")  # a file where the folder goes, even only to read
  assert cli.main([*PILOT_SMOKE, f"--results={tmp_path / 'file'}", "--no_run"]) == 1
  assert f"--results={tmp_path / 'file'} is a file, not a folder" in capsys.readouterr().err


def test_update_docs_regenerates_only_the_marked_block(tmp_path):
  results = tmp_path / "results"
  directory = results / "fedproj-iris-pilot" / "cpu"
  for seed in range(3):
    _write(directory, "fedavg", seed, 80.0 + seed)
    _write(directory, "fedproj", seed, 82.0 + seed)
  report_writer.write_report(PILOT, "cpu", directory, None)
  doc = tmp_path / "docs" / "reproduction.md"
  doc.parent.mkdir()
  stale = f"{report_writer.BEGIN}\nstale block\n{report_writer.END}"
  doc.write_text(f"# Title\n\n## Results\n\nhand text\n\n{stale}\ntail\n")
  text = report_writer.update_docs(doc, results)
  assert text.startswith("# Title\n\n## Results\n\nhand text\n\n") and text.endswith("tail\n")
  assert "stale block" not in text
  block = text.split(report_writer.BEGIN)[1].split(report_writer.END)[0]
  assert "| fedproj > fedavg | global_accuracy | 3 | 2.00 | 0.00 | 3/3 |" in block
  assert "](../results/fedproj-iris-pilot/cpu/accuracy.png)" in block
  assert report_writer.update_docs(doc, results) == text  # idempotent
  # The glance table leads the block, one line per pre-registered ordering, from verdicts.json.
  assert block.index("### Verdicts at a glance") < block.index("### fedproj-iris-pilot")
  verdicts = json.loads((directory / report_results.VERDICTS_FILE).read_text())["verdicts"]
  assert len(verdicts) == len(PILOT.at("cpu").orderings)
  row = next(v for v in verdicts if (v["worse"], v["metric"]) == ("fedavg", "global_accuracy"))
  assert (row["seeds"], row["declared"], row["mean"]) == (3, 3, pytest.approx(2.0))
  assert "| fedproj-iris-pilot | cpu | v1 | fedproj > fedavg | global_accuracy | " in block
  assert "| 3/3 | 2.00 [2.00, 2.00] |" in block
  assert "| 0/3 | — | — | — | — | incomplete |" in block  # no feddf results: nothing paired yet


def test_added_field_at_its_default_keeps_old_fingerprints():
  old = {"lr": 0.001, "rounds": 8}  # a config recorded before lr_schedule existed
  assert resolve.fingerprint({**old, "lr_schedule": "constant", "lr_step_gamma": 0.1}) == (
    resolve.fingerprint(old)
  )
  assert resolve.fingerprint({**old, "lr_schedule": "step"}) != resolve.fingerprint(old)
  assert resolve.fingerprint({**old, "rounds": 9}) != resolve.fingerprint(old)


def test_a_field_added_to_one_family_keeps_only_that_familys_old_fingerprints():
  # The continual entry points took --client_chunk after their results were recorded; the FL ones
  # had it all along, so their fingerprints keep it.
  continual = {"method": "fot", "rounds_per_task": 20}
  assert resolve.fingerprint({**continual, "client_chunk": "auto"}) == resolve.fingerprint(
    continual
  )
  assert resolve.fingerprint({**continual, "client_chunk": "4"}) != resolve.fingerprint(continual)
  fl = {"method": "fedavg", "rounds": 8}
  assert resolve.fingerprint({**fl, "client_chunk": "auto"}) != resolve.fingerprint(fl)


def test_every_committed_result_is_current():
  """A config field added, renamed or re-defaulted without keeping what committed results computed
  turns them stale: the runner would rerun hours of runs, and the docs' tables would show results
  the current budget no longer produces. Such a change must be deliberate: give the field its
  old-behaviour value in resolve.ADDED_FIELDS (or RUN_FIELDS), or rerun and commit the results."""
  from fedjax_proj.data.sources import find_shared_data
  from fedjax_proj.reproduce.claims import get_claim

  data = find_shared_data()  # the configs name the data files, which must exist to resolve
  if data is None:
    pytest.skip("../shared/data not found")
  root = run.DEFAULT_RESULTS
  paths = sorted([*root.glob("*/*/*-seed*.json"), *root.glob("*/sweep/*/*-seed*.json")])
  if not paths:
    pytest.skip("no committed results")
  stale = []
  for path in paths:
    result = json.loads(path.read_text())
    # <claim>/<budget>/<file>, or <claim>/sweep/<regime>/<file> (budget "sweep/<regime>").
    budget = path.parent.relative_to(root / result["claim"]).as_posix()
    config, _ = claim_queue.planned_config(
      get_claim(result["claim"]), budget, result["method"], result["seed"], data
    )
    if records.status(path, resolve.fingerprint(config)) != "done":
      now, then = resolve.canonical(config), resolve.canonical(result["config"])
      diff = sorted(k for k in now.keys() | then.keys() if now.get(k, "-") != then.get(k, "-"))
      stale.append(f"{path.relative_to(run.DEFAULT_RESULTS)}: {', '.join(diff)}")
  assert not stale, "committed results made stale:\n" + "\n".join(stale)


def test_runner_extras_go_to_detail_not_metrics(tmp_path, monkeypatch):
  def runner(claim, config, work, log):
    return {"global_accuracy": 50.0, "client_accuracy": 40.0, "acc_matrix": [[0.5]]}, [{"round": 1}]

  monkeypatch.setitem(runners.RUNNERS, "pilot", runner)
  result = run.run_one(PILOT, "smoke", "fedavg", 0, results=tmp_path, data_root=tmp_path)
  assert set(result["metrics"]) == {"global_accuracy", "client_accuracy"}
  assert result["detail"] == {"acc_matrix": [[0.5]]}


def test_ablation_resolves_to_its_base_method_with_changed_hyperparameters():
  from fedjax_proj.reproduce.claims.fedproj import FEDPROJ_DIR03

  base = resolve.resolve_config(FEDPROJ_DIR03, "smoke", "fedproj", 0)
  ablated = resolve.resolve_config(FEDPROJ_DIR03, "smoke", "fedproj-proj0.5", 0)
  assert ablated["method"] == "fedproj"
  assert ablated["method_kwargs"] == {**base["method_kwargs"], "projection_prob": 0.5}
  assert {k: v for k, v in ablated.items() if k != "method_kwargs"} == {
    k: v for k, v in base.items() if k != "method_kwargs"
  }
  assert resolve.fingerprint(ablated) != resolve.fingerprint(base)
  with pytest.raises(SystemExit):
    cli.parse_args(["fedproj-cifar10-dir0.3", "--methods=fedproj-bogus"])
  assert cli.parse_args(["fedproj-cifar10-dir0.3", "--methods=fedproj-nodistill"]).method_list == [
    "fedproj-nodistill"
  ]


def test_ablation_table_pairs_headline_against_ablation(tmp_path):
  from fedjax_proj.reproduce.claims.fedproj import FEDPROJ_DIR03

  def res(method, seed, acc):
    return {"method": method, "seed": seed, "metrics": {"test_accuracy": acc}, "curve": []}

  found = {
    "fedproj": {s: res("fedproj", s, a) for s, a in enumerate([30.0, 32.0, 31.0])},
    "fedproj-nodistill": {
      s: res("fedproj-nodistill", s, a) for s, a in enumerate([29.0, 33.0, 30.0])
    },
  }
  text = "\n".join(report_tables.ablation_table(FEDPROJ_DIR03, found))
  # Differences 1, -1, 1: mean 1/3, 2 of 3 seeds favour the headline, straddles 0.
  assert "| fedproj-nodistill | no server distillation: client projection only | 3 | 0.33 |" in text
  assert "| 2/3 |" in text and "inconclusive" in text


def test_a_run_held_by_another_process_is_left_alone(tmp_path, capsys, monkeypatch):
  """Lock first, then clean: a second runner on the same run touches nothing and exits 0."""
  from filelock import FileLock

  calls = []
  monkeypatch.setitem(runners.RUNNERS, "pilot", _fake_runner(calls))
  path = records.result_path(tmp_path, "fedproj-iris-pilot", "smoke", "fedavg", 0)
  work = path.with_suffix(".work")
  work.mkdir(parents=True)
  (work / "metrics.jsonl").write_text('{"round": 1}\n')  # the other process's work in progress
  args = [*PILOT_SMOKE, "--seeds=0", f"--results={tmp_path}"]
  with FileLock(str(path.with_suffix(".lock"))):
    assert cli.main(args) == 0
  assert "locked fedproj-iris-pilot smoke fedavg seed 0" in capsys.readouterr().out
  assert calls == [] and (work / "metrics.jsonl").is_file() and not path.exists()
  assert cli.main(args) == 0 and calls == [0]  # once free, it runs
  assert records.status(path, json.loads(path.read_text())["fingerprint"]) == "done"


def test_jobs_run_every_run_once_and_equal_one_process(tmp_path):
  """--jobs=2: two pinned workers start on the same run and share the queue through the run
  locks; every run is done once, and each result equals the one a single runner writes (same
  program, same seed)."""
  import os
  import subprocess

  if len(os.sched_getaffinity(0)) < 2:
    pytest.skip("needs 2 usable cores")
  args = [*PILOT_SMOKE, "--seeds=0,1"]
  cmd = [sys.executable, "-m", "fedjax_proj.reproduce", *args, "--jobs=2"]
  out = subprocess.run(
    [*cmd, f"--results={tmp_path / 'jobs'}"],
    cwd=provenance.REPO_ROOT,
    capture_output=True,
    text=True,
    timeout=600,
    check=True,
  ).stdout
  assert "starting 2 jobs" in out and "queue: 2 of 2 run; nothing left" in out
  done = [line for line in out.splitlines() if " done fedproj-iris-pilot" in line]
  assert len(done) == 2 and len(set(d.split("] ", 1)[1].split(":")[0] for d in done)) == 2
  # Only the worker that holds a run announces it.
  assert sum(line.split("] ", 1)[-1].startswith("run ") for line in out.splitlines()) == 2
  assert cli.main([*args, f"--results={tmp_path / 'one'}"]) == 0
  for seed in (0, 1):
    a, b = (
      json.loads(
        records.result_path(tmp_path / d, "fedproj-iris-pilot", "smoke", "fedavg", seed).read_text()
      )
      for d in ("jobs", "one")
    )
    assert a["metrics"] == b["metrics"] and a["curve"] == b["curve"], seed
  assert not list((tmp_path / "jobs").rglob("*.work"))  # no worker left a work folder


def test_sigterm_to_a_jobs_runner_stops_every_worker(tmp_path):
  import os
  import signal
  import subprocess

  if len(os.sched_getaffinity(0)) < 2:
    pytest.skip("needs 2 usable cores")
  cmd = [sys.executable, "-m", "fedjax_proj.reproduce", *PILOT_SMOKE, "--seeds=0,1,2,3,4,5,6,7"]
  proc = subprocess.Popen(
    [*cmd, "--jobs=2", f"--results={tmp_path}"],
    cwd=provenance.REPO_ROOT,
    stdout=subprocess.PIPE,
    stderr=subprocess.PIPE,
    text=True,
  )
  for line in proc.stdout:  # a worker holds its first run
    if "] run fedproj-iris-pilot" in line:
      break
  proc.send_signal(signal.SIGTERM)
  out, err = proc.communicate(timeout=300)
  assert proc.returncode == 128 + signal.SIGTERM, (out, err)
  assert "stopped by a signal" in err and "rerun the command" in err
  finished = list(tmp_path.rglob("fedavg-seed*.json"))
  assert len(finished) < 8  # the queue stopped; what finished is whole
  assert all(records.read_result(p)[1] is None for p in finished)


def test_jobs_beyond_the_usable_cores_is_refused_before_any_run(capsys):
  import os

  cores = len(os.sched_getaffinity(0))
  with pytest.raises(SystemExit) as e:
    cli.main([*PILOT_SMOKE, f"--jobs={cores + 1}"])
  assert e.value.code == 2
  assert f"--jobs={cores + 1} but this process may use {cores} core(s)" in capsys.readouterr().err
  with pytest.raises(SystemExit):
    cli.main([*PILOT_SMOKE, "--jobs=2", "--sweep"])


@pytest.mark.parametrize(
  "text, why", [("{not json", "unreadable"), ('{"method": "fedavg"}', "missing claim")]
)
def test_corrupt_result_is_reported_as_corrupt_and_rerun(tmp_path, capsys, monkeypatch, text, why):
  calls = []
  monkeypatch.setitem(runners.RUNNERS, "pilot", _fake_runner(calls))
  path = records.result_path(tmp_path, "fedproj-iris-pilot", "smoke", "fedavg", 0)
  path.parent.mkdir(parents=True)
  path.write_text(text)
  found, stale, corrupt = report_results.load_results(path.parent, {})
  assert not found and not stale and corrupt[0].startswith(f"fedavg-seed0.json ({why}")
  assert cli.main([*PILOT_SMOKE, "--seeds=0", f"--results={tmp_path}"]) == 0
  out = capsys.readouterr().out
  assert "corrupt fedproj-iris-pilot smoke fedavg seed 0" in out
  assert "from another config" not in out
  assert calls == [0] and path.with_suffix(".json.corrupt").read_text() == text
  assert records.read_result(path)[1] is None


def test_a_result_with_an_empty_curve_is_not_done(tmp_path):
  path = tmp_path / "fedavg-seed0.json"
  result = {k: 1 for k in records.REQUIRED_KEYS} | {
    "metrics": {"a": 1.0},
    "curve": [],
    "config": {},
  }
  path.write_text(json.dumps(result))
  assert records.status(path, resolve.fingerprint({})) == "corrupt"
  assert records.read_result(path) == (None, "empty curve")


def test_diagnostics_leave_out_rounds_without_a_memory_gradient():
  """FedProj's client diagnostics are null in rounds without a memory gradient (round 0 without
  an ensemble, rounds outside proj_rounds): first and last are each run's first and last values."""
  curve = lambda *values: [{"round": r + 1, "mean_cos": v} for r, v in enumerate(values)]  # noqa: E731
  found = {"fedproj": {0: {"curve": curve(None, 0.2, 0.4)}, 1: {"curve": curve(None, 0.4, None)}}}
  rows = [line for line in report_tables.diagnostics(found) if "mean_cos" in line]
  assert rows == ["| fedproj | mean_cos | 0.3000 | 0.3333 | 0.4000 |"]
  assert report_tables.diagnostics({"fedproj": {0: {"curve": curve(None, None)}}}) == []


def test_deviations_print_the_data_folder_not_its_placeholder(tmp_path, capsys, monkeypatch):
  note = "public set: used {data}/cifar100/public_20k.npz"
  monkeypatch.setattr(
    availability, "public_fallback", lambda config, root, fallback: (config, [note])
  )
  argv = [*PILOT_SMOKE, "--seeds=0", f"--results={tmp_path}", f"--data={tmp_path}", "--no_run"]
  assert cli.main(argv) == 0
  out = capsys.readouterr().out
  assert f"deviation: public set: used {tmp_path}/cifar100/public_20k.npz" in out
  assert "{data}" not in out


def test_a_continual_report_draws_the_accuracy_after_each_task(tmp_path):
  from fedjax_proj.reproduce import claims

  claim = claims.get_claim("fot-pmnist-iid")
  matrix = [[0.9, 0.8, 0.7], [None, 0.9, 0.85], [None, None, 0.95]]  # a[i, t]: task i after t
  found = {m: {s: {"detail": {"acc_matrix": matrix}} for s in (0, 1)} for m in ("fl", "fot")}
  assert report_figures.plot_curves(claim, found, tmp_path) == ["accuracy.png"]
  assert (tmp_path / "accuracy.png").read_bytes()[:4] == b"\x89PNG"
  assert report_figures.plot_curves(claim, {"fl": {0: {"detail": {}}}}, tmp_path / "none") == []


def test_a_continual_report_splits_acc_into_learning_and_forgetting():
  from fedjax_proj.reproduce import claims
  from fedjax_proj.training.task_rounds import acc_fgt

  claim = claims.get_claim("fot-pmnist-iid")
  # fl learns each task well and forgets; fot learns the last task worse and forgets little.
  fl = [[0.9, 0.7, 0.6], [None, 0.9, 0.8], [None, None, 0.9]]
  fot = [[0.88, 0.87, 0.87], [None, 0.8, 0.79], [None, None, 0.6]]
  found = {
    "fl": {0: {"detail": {"acc_matrix": fl}}},
    "fot": {0: {"detail": {"acc_matrix": fot}}, 1: {"detail": {"acc_matrix": fot}}},
    "er": {0: {"detail": {}}},  # no matrix: left out
  }
  lines = report_tables.plasticity_table(claim, found)
  rows = {line.split(" | ")[0].lstrip("| "): line.split(" | ") for line in lines[4:-1]}
  assert set(rows) == {"fl", "fot"} and rows["fot"][1] == "2"
  for name, matrix in (("fl", fl), ("fot", fot)):
    acc, fgt = acc_fgt(np.array([[0.0 if v is None else v for v in r] for r in matrix]))
    p, first, last, loss = (float(x.split(" ")[0]) for x in rows[name][2:6])
    assert p == pytest.approx(100 * np.mean(np.diag(matrix)), abs=0.006)
    assert (first, last) == (round(100 * matrix[0][0], 2), round(100 * matrix[2][2], 2))
    # The identity the table rests on: ACC = P - (K - 1)/K * FGT.
    assert loss == pytest.approx(100 * 2 / 3 * fgt, abs=0.006)
    assert float(rows[name][6].rstrip(" |")) == pytest.approx(100 * acc, abs=0.006)
  assert "K = 3 tasks" in lines[0]
  assert report_tables.plasticity_table(claim, {"fl": {0: {"detail": {}}}}) == []


def test_a_finished_run_leaves_no_lock_file(tmp_path, monkeypatch):
  monkeypatch.setitem(runners.RUNNERS, "pilot", _fake_runner([]))
  assert cli.main([*PILOT_SMOKE, "--seeds=0,1", f"--results={tmp_path}", "--report"]) == 0
  directory = tmp_path / "fedproj-iris-pilot" / "smoke"
  assert sorted(p.name for p in directory.glob("fedavg-seed*")) == [
    "fedavg-seed0.json",
    "fedavg-seed1.json",
  ]


def test_a_run_found_finished_under_its_lock_leaves_no_lock_file(tmp_path, monkeypatch):
  # As when a second runner reaches a run another finished while it waited in its queue: it takes
  # the lock, finds the result done, and leaves it alone, without leaving a .lock beside it.
  calls = []
  monkeypatch.setitem(runners.RUNNERS, "pilot", _fake_runner(calls))
  done = run.run_one(PILOT, "smoke", "fedavg", 0, results=tmp_path, data_root=tmp_path)
  with pytest.raises(run.RunLocked, match="finished by another process meanwhile"):
    run.run_one(PILOT, "smoke", "fedavg", 0, results=tmp_path, data_root=tmp_path)
  assert calls == [0]  # run once
  directory = tmp_path / "fedproj-iris-pilot" / "smoke"
  assert sorted(p.name for p in directory.iterdir()) == ["fedavg-seed0.json"]
  assert json.loads((directory / "fedavg-seed0.json").read_text()) == json.loads(
    json.dumps(done, default=str)
  )


def test_time_step_estimates_an_unrecorded_queue_from_one_step_per_method(
  tmp_path, capsys, monkeypatch
):
  from fedjax_proj.reproduce import runners

  calls = []

  def timer(claim, config):
    calls.append((config["method"], config["seed"], "{data}" in json.dumps(config)))
    return {"step_seconds": 0.1, "steps": 100, "seconds": 10.0}

  monkeypatch.setitem(runners.STEP_TIMERS, "image", timer)
  args = ["fedproj-cifar10-dir0.5", "--budget=smoke", "--seeds=0,1", "--methods=fedavg,fedproj"]
  args += [f"--results={tmp_path}", "--no_run"]
  # Without --time_step: no guess, and both ways to get an estimate are named.
  assert cli.main(args) == 0
  assert (
    "no estimate; run one seed (--seeds=0) or time one step of each (--no_run --time_step) to "
    "get one"
  ) in capsys.readouterr().out
  assert calls == []
  assert cli.main([*args, "--time_step"]) == 0
  out = capsys.readouterr().out
  # One step of each method, from its first queued run's config with the data folder filled in.
  assert calls == [("fedavg", 0, False), ("fedproj", 0, False)]
  assert "timed fedavg: 100.0 ms a step x 100 local steps = 10 s a run" in out
  assert (
    "queue: 0 done, 4 to run, 4 missing; about 40 s of local steps for 4 run(s) of fedavg, "
    "fedproj with no recorded time, from one step of each timed now"
  ) in out
  assert list(tmp_path.iterdir()) == []  # nothing written, nothing run
  # A method with recorded times keeps them; only the others are timed.
  monkeypatch.setitem(
    runners.RUNNERS, "image", lambda *a: ({"test_accuracy": 50.0}, [{"round": 1}])
  )
  assert cli.main([*args[:2], "--seeds=0", "--methods=fedavg", f"--results={tmp_path}"]) == 0
  capsys.readouterr()
  calls.clear()
  assert cli.main([*args, "--time_step"]) == 0
  out = capsys.readouterr().out
  assert calls == [("fedproj", 0, False)]
  assert "0 s in one process for 1 run(s) at this budget's recorded times" in out
  assert "about 20 s of local steps for 2 run(s) of fedproj with no recorded time" in out


@pytest.mark.parametrize(
  "argv, message",
  [
    (["fedproj-cifar10-dir0.5", "--time_step"], "--time_step estimates a queue without running"),
    (
      ["fot-pmnist-iid", "--no_run", "--time_step"],
      "--time_step: fot-pmnist-iid is a continual claim, whose runs have no step timer",
    ),
    (["fedproj-iris-pilot", "--no_run", "--time_step"], "is a pilot claim"),
  ],
)
def test_time_step_is_refused_where_it_cannot_apply(argv, message, capsys):
  with pytest.raises(SystemExit) as e:
    cli.main(argv)
  assert e.value.code == 2
  assert message in capsys.readouterr().err
