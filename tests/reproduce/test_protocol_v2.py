"""Protocol v2 (docs/reproduction.md, "Protocol v2"): its seeds, its metric, its report, and the
deviations a result records and the report refuses to pair across."""

from __future__ import annotations

import json

import pytest

from fedjax_proj.reproduce import __main__ as cli
from fedjax_proj.reproduce import claims, jobs, protocol, provenance, resolve, run
from fedjax_proj.reproduce.claims import fedproj as fedproj_claims
from fedjax_proj.reproduce.report import results as report_results
from fedjax_proj.reproduce.report import tables as report_tables
from fedjax_proj.reproduce.report import verdicts as report_verdicts
from fedjax_proj.reproduce.report import writer as report_writer

CLAIM = fedproj_claims.FEDPROJ_DIR05  # its drift budget declares a v2 replication of 17 seeds
V2_SEEDS = range(protocol.V2_FIRST_SEED, protocol.V2_FIRST_SEED + CLAIM.budgets["drift"].v2.seeds)


def _write(directory, method, seed, accuracies, machine=None, deviations=()):
  """A drift result whose curve evaluates ``accuracies`` (%) at rounds 2, 4, ..."""
  directory.mkdir(parents=True, exist_ok=True)
  curve = [{"round": 2 * i + 1, "train_loss": 1.0} for i in range(len(accuracies))]
  curve += [{"round": 2 * i + 2, "test_accuracy": a / 100} for i, a in enumerate(accuracies)]
  curve.sort(key=lambda c: c["round"])
  result = {
    "claim": CLAIM.name,
    "budget": "drift",
    "method": method,
    "seed": seed,
    "config": {"method": method, "seed": seed},
    "metrics": {"test_accuracy": accuracies[-1]},
    "curve": curve,
    "wall_seconds": 1.0,
    "fingerprint": "x",
    "deviations": list(deviations),
    "git_commit": "abc",
    "code": {"git_commit": "abc", "fingerprint": "c0de"},
    "load_average": [1.0, 1.0, 1.0],
    **({"machine": machine} if machine else {}),
  }
  (directory / f"{method}-seed{seed}.json").write_text(json.dumps(result))


def test_v2_scores_its_own_seeds_on_the_late_mean_and_leaves_v1_as_it_was(tmp_path):
  results, tmp_path = tmp_path, tmp_path / CLAIM.name / "drift"
  # v1 seeds 0-9: FedProj ahead on the final evaluation. v2 seeds: FedProj ahead on the mean of
  # the last three evaluations by 2 points over FedAvg (with noise), but behind on the last one.
  for seed in range(10):
    _write(tmp_path, "fedavg", seed, [30, 40, 50, 50, 50 + seed % 3])
    _write(tmp_path, "feddf", seed, [30, 40, 50, 50, 48 + seed % 2])
    _write(tmp_path, "fedproj", seed, [30, 40, 50, 50, 55 + seed % 3])
  for i, seed in enumerate(V2_SEEDS):
    noise = (i % 3) * 0.2
    _write(tmp_path, "fedavg", seed, [30, 40, 50, 50, 50])
    _write(tmp_path, "feddf", seed, [30, 40, 50, 50, 60])
    _write(tmp_path, "fedproj", seed, [30, 40, 54 + noise, 54, 48])
  text = report_writer.write_report(CLAIM, "drift", tmp_path, None)
  v1_part, v2_part = text.split("#### Protocol v2")
  # v1: seeds 0-9 only (v2's seeds are not its exploratory seeds), on the final evaluation.
  assert "seeds 0..9 (10 seeds" in v1_part and "Exploratory" not in v1_part
  assert "| fedproj > fedavg | test_accuracy | 10 | 5.00 |" in v1_part
  # v2: the 17 declared seeds, on the mean of the last 3 evaluations: +2.06 over FedAvg although
  # FedProj's last evaluation is 2 points below; -1.27 against FedDF, whose final 60 counts a third
  # (on the final evaluation alone: -2 and -12).
  assert f"seeds {V2_SEEDS[0]}..{V2_SEEDS[-1]} (17 seeds" in v2_part
  assert "| fedproj > fedavg | late_test_accuracy | 17 | 2.06 |" in v2_part
  assert "| fedproj > feddf | late_test_accuracy | 17 | -1.27 |" in v2_part
  records = json.loads((tmp_path / report_results.VERDICTS_FILE).read_text())["verdicts"]
  by = {(r["protocol"], r["worse"]): r for r in records}
  assert by[("v1", "fedavg")]["metric"] == "test_accuracy" and by[("v1", "fedavg")]["seeds"] == 10
  assert by[("v2", "fedavg")]["verdict"] == "reproduced" and by[("v2", "fedavg")]["declared"] == 17
  assert by[("v2", "feddf")]["verdict"] == "not reproduced"
  # The glance table shows both, v1 first.
  glance = [
    line
    for line in report_tables.glance_table(results)
    if line.startswith(f"| {CLAIM.name} | drift |")
  ]
  assert [line.split(" | ")[2] for line in glance] == ["v1", "v1", "v2", "v2"]


def test_the_glance_table_states_declared_v2_replications_with_no_run_as_owed(tmp_path):
  # Nothing has run: no glance table at all, however many replications are declared.
  assert report_tables.glance_table(tmp_path) == []
  # Only dir0.5 drift's v1 has run. Its v2 and every other declared v2 replication (gpu here, and
  # other claims' without even a directory) get their orderings at 0 of their declared seeds.
  directory = tmp_path / CLAIM.name / "drift"
  for seed in range(10):
    for method in ("fedavg", "feddf", "fedproj"):
      _write(directory, method, seed, [30, 40, 50, 50, 50 + (method == "fedproj") + seed % 2])
  report_writer.write_report(CLAIM, "drift", directory, None)
  rows = [
    line.split(" | ") for line in report_tables.glance_table(tmp_path) if line.startswith("| ")
  ]
  by = {(r[0][2:], r[1], r[2], r[3]): r for r in rows[1:]}  # past the header
  v1 = by[(CLAIM.name, "drift", "v1", "fedproj > fedavg")]
  assert v1[6] == "10/10" and v1[-1] != "incomplete: no runs yet |"
  for budget in ("drift", "gpu"):
    declared = CLAIM.budgets[budget].v2.seeds
    owed = by[(CLAIM.name, budget, "v2", "fedproj > feddf")]
    assert owed[4] == "late_test_accuracy" and owed[6] == f"0/{declared}"
    assert owed[-1] == "incomplete: no runs yet |"
  declared_v2 = {
    (c.name, b) for c in claims.CLAIMS.values() for b, spec in c.budgets.items() if spec.v2
  }
  assert {(k[0], k[1]) for k in by if k[2] == "v2"} == declared_v2


def test_an_incomplete_v2_replication_says_what_it_lacks_with_its_command(tmp_path):
  for seed in V2_SEEDS[:3]:
    for method in ("fedavg", "feddf", "fedproj"):
      _write(tmp_path, method, seed, [30, 40, 50, 50, 50])
  text = report_writer.write_report(CLAIM, "drift", tmp_path, None)
  assert "No protocol v1 results; the v2 ones are below." in text  # v1 has none here
  v2_part = text.split("#### Protocol v2")[1]
  assert "| incomplete |" in v2_part
  assert "42 run(s) of the pre-registered seeds are missing" in v2_part
  assert "--budget=drift --protocol=v2` runs them" in v2_part


def _write_timed_v1_runs(directory):
  """v1 seeds 0-9 of FedAvg at 100 s a run and FedDF at 300 s; FedProj never ran."""
  for seed in range(10):
    for method, seconds in (("fedavg", 100.0), ("feddf", 300.0)):
      _write(directory, method, seed, [30, 40, 50, 50, 50])
      path = directory / f"{method}-seed{seed}.json"
      path.write_text(path.read_text().replace('"wall_seconds": 1.0', f'"wall_seconds": {seconds}'))


def test_a_v2_replication_with_no_run_says_what_it_lacks_timed_from_the_v1_runs(tmp_path):
  # v1 has run (FedAvg 100 s and FedDF 300 s a run); v2 nothing: its section lists every declared
  # run with its command, timed from the budget's v1 runs (the same configs but for the seed).
  _write_timed_v1_runs(tmp_path)
  v2_part = report_writer.write_report(CLAIM, "drift", tmp_path, None).split("#### Protocol v2")[1]
  assert "No protocol v2 results yet." in v2_part
  assert "51 run(s) of the pre-registered seeds are missing" in v2_part
  assert "--budget=drift --protocol=v2` runs them" in v2_part
  # 17 FedAvg runs at 100 s and 17 FedDF runs at 300 s: 6,800 s; FedProj has no recorded time.
  assert "about 1.9 h in one process for 34 run(s) at this budget's recorded times" in v2_part
  assert "17 run(s) of fedproj with no recorded time" in v2_part


def test_a_replication_declared_for_a_device_names_its_command_there_and_its_times(tmp_path):
  # The drift replication as if declared for a GPU: v1's CPU runs (100 s, 300 s) would time it
  # for a CPU, not where it runs, so its missing runs get the device's command and no estimate.
  drift = CLAIM.budgets["drift"]
  on_gpu = CLAIM._replace(
    budgets={**CLAIM.budgets, "drift": drift._replace(v2=drift.v2._replace(device="gpu"))}
  )
  _write_timed_v1_runs(tmp_path)
  v2_part = report_writer.write_report(on_gpu, "drift", tmp_path, None).split("#### Protocol v2")[1]
  command = (
    f"EXTRA_ARGS=--protocol=v2 bash benchmarks/device/claims_on_device.sh 480 {CLAIM.name}:drift"
  )
  assert f"`{command}` runs them on a gpu, where they are declared to run (its data" in v2_part
  assert "51 run(s) of fedavg, feddf, fedproj with no recorded time: no estimate" in v2_part
  assert "1.9 h" not in v2_part and "timed on" not in v2_part
  line = next(x for x in v2_part.splitlines() if x.startswith("To complete"))
  assert "python -m fedjax_proj.reproduce" not in line


@pytest.mark.parametrize(
  "argv", [["fot-pmnist-iid", "--budget=cpu"], ["fedproj-cifar10-dir0.3", "--budget=gpu"]]
)
def test_a_replication_declared_for_a_gpu_refuses_to_run_elsewhere(argv, tmp_path, monkeypatch):
  argv = [*argv, "--protocol=v2", f"--results={tmp_path}"]
  monkeypatch.setattr(provenance, "local_backend", lambda: "cpu")
  with pytest.raises(SystemExit) as e:
    cli.parse_args(argv)
  assert e.value.code == 2
  cli.parse_args([*argv, "--no_run"])  # seeing what is left is not a run
  cli.parse_args([*argv, "--power"])
  monkeypatch.setattr(provenance, "local_backend", lambda: "gpu")
  assert cli.parse_args(argv).protocol == "v2"  # on the machine it is declared for
  # Every replication declared for a device says so, and those not declared for one run anywhere.
  on_device = {
    (c.name, k)
    for c in claims.CLAIMS.values()
    for k, b in c.budgets.items()
    if b.v2 and b.v2.device
  }
  assert on_device == {
    ("fot-pmnist-iid", "cpu"),
    ("fedproj-cifar10-dir0.3", "gpu"),
    ("fedproj-cifar10-dir0.5", "gpu"),
    # FedCIL's convolutional generator (docs/reproduction.md, "fot-pmnist-noniid-fedcil").
    ("fot-pmnist-noniid-fedcil", "cpu"),
    ("fot-pmnist-iid-table1", "cpu"),
  }


def test_the_refusal_names_the_device_command(tmp_path, monkeypatch, capsys):
  monkeypatch.setattr(provenance, "local_backend", lambda: "cpu")
  argv = ["fot-pmnist-iid", "--budget=cpu", "--protocol=v2", f"--results={tmp_path}"]
  with pytest.raises(SystemExit):
    cli.main(argv)
  err = capsys.readouterr().err
  assert "its protocol v2 runs are declared to run on a gpu" in err
  assert (
    "`EXTRA_ARGS=--protocol=v2 bash benchmarks/device/claims_on_device.sh 480 fot-pmnist-iid:cpu`"
    in err
  )
  assert not any(tmp_path.iterdir())  # refused before anything was written


def test_pairs_of_different_machines_or_deviations_are_refused(tmp_path):
  cpu = {"backend": "cpu", "device_kind": "cpu", "matmul_precision": None}
  h200 = {"backend": "gpu", "device_kind": "NVIDIA H200", "matmul_precision": "float32"}
  tf32 = {**h200, "matmul_precision": "default"}
  lossy = ["public set: a lossy copy (JPEG)"]
  for seed in range(10):
    # Seed 0: FedProj on another machine kind; seed 1: at TF32; seed 2: on a lossy public set.
    # Every other seed: both on this CPU (results from before machines were recorded count as it).
    proj = {0: h200, 1: tf32}.get(seed, cpu)
    _write(tmp_path, "fedavg", seed, [50] * 5, machine=None if seed == 9 else cpu)
    _write(tmp_path, "feddf", seed, [49] * 5, machine=cpu)
    _write(tmp_path, "fedproj", seed, [51 + seed % 2] * 5, proj, lossy if seed == 2 else ())
  found, _, _ = report_results.load_results(tmp_path)
  rows = {r.worse: r for r in report_verdicts.confirmatory_rows(CLAIM, found, "drift")}
  assert rows["fedavg"].mismatched == (0, 1, 2) and rows["fedavg"].paired.n == 7
  assert rows["fedavg"].verdict == protocol.INCOMPLETE  # 7 of the 10 pre-registered pairs
  text = "\n".join(report_verdicts.verdict_table(CLAIM, found, "drift"))
  assert "Pairs refused (the two runs computed on different kinds of machine" in text
  assert "fedproj > fedavg seeds [0, 1, 2]" in text
  # The same runs on one machine kind with the same deviations pair as before.
  assert report_results.computation(found["fedavg"][9]) == report_results.computation(
    found["fedavg"][8]
  )


def test_results_record_deviations_of_arithmetic_and_data_in_their_fingerprint(tmp_path):
  machine = {"backend": "gpu", "device_kind": "NVIDIA H200", "matmul_precision": "default"}
  (dev,) = provenance.arithmetic_deviations(machine)
  assert "matmul precision: default on NVIDIA H200" in dev and "not float32" in dev
  for pinned in ("float32", "highest"):
    assert provenance.arithmetic_deviations({**machine, "matmul_precision": pinned}) == []
  assert provenance.arithmetic_deviations({"backend": "cpu", "matmul_precision": None}) == []
  # A device pack's record: its lossy public set is a deviation of every run reading a public set.
  config = {"public_data": "{data}/cifar100/public_20k.npz", "rounds": 2}
  assert provenance.data_deviations(config, tmp_path) == []  # the shared folder: no record
  (tmp_path / provenance.DATA_RECORD).write_text(
    json.dumps({"about": "public set as JPEG (lossy)"})
  )
  assert provenance.data_deviations(config, tmp_path) == [
    "public set: a lossy copy (public set as JPEG (lossy))"
  ]
  assert provenance.data_deviations({**config, "public_data": ""}, tmp_path) == []
  (tmp_path / provenance.DATA_RECORD).write_text(json.dumps({"about": "as lossless WebP"}))
  assert provenance.data_deviations(config, tmp_path) == []
  # Without deviations the fingerprint is the config's (every committed result stays current).
  assert resolve.fingerprint(config, []) == resolve.fingerprint(config)
  assert resolve.fingerprint(config, [dev]) != resolve.fingerprint(config)
  assert resolve.fingerprint(config, ["a", "b"]) == resolve.fingerprint(config, ["b", "a"])


def test_the_committed_tf32_drift_results_carry_their_deviations():
  directory = run.DEFAULT_RESULTS / CLAIM.name / "drift"
  results = [json.loads(p.read_text()) for p in sorted(directory.glob("*-seed[0-9].json"))]
  assert len(results) == 30
  for r in results:
    assert any(d.startswith("matmul precision: default") for d in r["deviations"])
    assert any(d.startswith("public set: a lossy copy") for d in r["deviations"])
    assert r["fingerprint"] == resolve.fingerprint(r["config"], r["deviations"])


@pytest.mark.parametrize(
  "argv, message",
  [
    (
      ["fedproj-cifar10-dir0.3", "--budget=cpu", "--protocol=v2"],
      "budget cpu declares no protocol v2 replication; those that do: fedproj-cifar10-dir0.3 "
      "--budget=drift",
    ),
    (["fedproj-cifar10-dir0.3", "--budget=drift", "--seeds=1000"], "are protocol v2's"),
    (
      ["fedproj-cifar10-dir0.5", "--budget=gpu"],
      "budget gpu pre-registers no protocol v1 seeds; it is declared for protocol v2 only: add "
      "--protocol=v2",
    ),
    (
      ["fedproj-cifar10-dir0.3", "--budget=drift", "--protocol=v2", "--seeds=3,1000"],
      "--protocol=v2 runs seeds from 1000 on (declared: 1000..1019)",
    ),
  ],
)
def test_protocol_flags_refuse_what_would_mix_the_protocols(argv, message, capsys):
  with pytest.raises(SystemExit) as e:
    cli.main(argv)
  assert e.value.code == 2
  assert message in capsys.readouterr().err


def test_v2_power_and_queue_use_the_declared_replication(tmp_path, capsys):
  base = ["fedgkd-cifar10", "--budget=cpu", "--protocol=v2", f"--results={tmp_path}"]
  assert cli.main([*base, "--power"]) == 0
  out = capsys.readouterr().out
  assert "late_test_accuracy" in out and "seeds 1000..1006 decide the verdict" in out
  assert cli.main([*base, "--no_run", "--methods=fedavg"]) == 0
  out = capsys.readouterr().out
  assert "missing fedgkd-cifar10 cpu fedavg seed 1006" in out
  assert "seed 1007" not in out and "seed 6\n" not in out


def test_jobs_workers_run_the_parents_protocol(tmp_path, monkeypatch):
  # Each --jobs worker re-parses its command: without --protocol=v2 it would refuse v2's seeds.
  monkeypatch.setattr(jobs, "check_jobs", lambda n: None)  # whatever cores this machine has
  argv = ["fedgkd-cifar10", "--budget=cpu", "--protocol=v2", "--jobs=2", f"--results={tmp_path}"]
  parent = cli.parse_args(argv)
  worker = jobs.worker_argv(
    cli.run_options(parent), "fedgkd-cifar10", "cpu", tmp_path, tmp_path, "a"
  )
  again = cli.parse_args(worker[3:])
  assert again.protocol == "v2" and again.seed_list == list(range(1000, 1007))


def test_a_named_commit_stands_for_a_copied_checkout(monkeypatch):
  monkeypatch.setenv("FEDJAX_PROJ_GIT_COMMIT", "abc123")
  assert provenance.git_commit() == "abc123"
  monkeypatch.delenv("FEDJAX_PROJ_GIT_COMMIT")
  assert provenance.git_commit() != "abc123"


def test_the_gpu_budget_is_drift_three_times_as_long_declared_for_v2_only(tmp_path, capsys):
  for claim in (fedproj_claims.FEDPROJ_DIR03, fedproj_claims.FEDPROJ_DIR05):
    gpu, drift = claim.budgets["gpu"], claim.budgets["drift"]
    assert gpu.seeds == 0 and gpu.methods == drift.methods == ("fedavg", "feddf", "fedproj")
    for method in gpu.methods:
      longer = resolve.resolve_config(claim, "gpu", method, 1000)
      shorter = resolve.resolve_config(claim, "drift", method, 1000)
      assert longer["rounds"] == 3 * shorter["rounds"] == 30
      assert {**longer, "rounds": 10} == shorter  # nothing else differs
      assert resolve.fingerprint(longer) != resolve.fingerprint(shorter)
    # 20 seeds from 1000, the cap: the paper's gap to FedDF needs more at either borrowed sd.
    view = protocol.v2_view(claim, "gpu")
    assert view.budgets["gpu"].declared == range(1000, 1020)
    assert any(r.needed is None for r in protocol.plan(view, "gpu"))
  base = ["fedproj-cifar10-dir0.3", "--budget=gpu", "--protocol=v2", f"--results={tmp_path}"]
  assert cli.main([*base, "--no_run"]) == 0
  out = capsys.readouterr().out
  assert "missing fedproj-cifar10-dir0.3 gpu fedproj seed 1019" in out and "seed 1020" not in out
  # No recorded time at this budget: the way to get one names a seed the v2 command accepts.
  assert "run one seed (--seeds=1000) or time one step of each (--no_run --time_step)" in out


def test_the_declared_line_names_the_sds_own_protocol_not_always_v1():
  # The gpu budget's seed count came from drift's v2 sd; its report said "v1's paired sd".
  fedproj = claims.CLAIMS["fedproj-cifar10-dir0.5"]
  line = next(
    s for s in report_writer.v2_section(fedproj, "gpu", {}) if s.startswith("Declared before")
  )
  assert "v1's paired sd" not in line
  assert "on the paired sd 2.65 (fedproj-cifar10-dir0.5 drift v2 results" in line
