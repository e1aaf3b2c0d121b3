"""What each claim x budget resolves to: the generated docs table, ``--dry_run``, the protocol."""

from __future__ import annotations

import math
import os

import pytest

from fedjax_proj.reproduce import __main__ as cli
from fedjax_proj.reproduce import (
  availability,
  claims,
  docs_tables,
  protocol,
  provenance,
  resolve,
  run,
)
from fedjax_proj.reproduce.claims import CLAIMS
from fedjax_proj.reproduce.claims import fedgkd as fedgkd_claims
from fedjax_proj.reproduce.claims import fedproj as fedproj_claims
from fedjax_proj.reproduce.claims import fot as fot_claims
from fedjax_proj.reproduce.claims import pilot as pilot_claims
from fedjax_proj.reproduce.claims import presets as claims_presets
from fedjax_proj.reproduce.claims import sfedkd as sfedkd_claims
from fedjax_proj.reproduce.report import results as report_results
from fedjax_proj.reproduce.report import verdicts as report_verdicts

DOC = provenance.REPO_ROOT / "docs" / "reproduction.md"


def test_docs_claim_tables_equal_the_resolved_configs():
  """Every field of every claim x budget x method, as resolved, is the committed table."""
  assert docs_tables.committed_block(DOC) == docs_tables.generate().strip("\n"), (
    "docs/reproduction.md's claim-config tables are stale: run "
    "`python -m fedjax_proj.reproduce --update_docs`"
  )


def test_dry_run_prints_every_field_and_hyperparameter(capsys):
  assert cli.main(["fedgkd-cifar10", "--budget=paper", "--dry_run"]) == 0
  out = capsys.readouterr().out
  for method in fedgkd_claims.FEDGKD.methods:
    config = resolve.resolve_config(fedgkd_claims.FEDGKD, "paper", method, 0)
    for key, value in config.items():
      if key not in ("method", "method_kwargs", "method_defaults"):
        assert f"  {key} = {value!r}" in out
    for key, value in resolve.effective_hparams(config).items():
      assert f"  {method}.{key} = {value!r}" in out
  # 002 Sec. 5: ResNet-8 with GroupNorm (16 channels per group), 45k, server-side validation.
  assert "  model = 'resnet8'" in out and "  train_subset = 45000" in out
  assert "  model_kwargs = {'group_size': 16, 'norm': 'group'}" in out
  assert "  fedgkd_vote.vote_validation = 'server'" in out
  assert "--preset=fedgkd_paper" in out


@pytest.mark.parametrize("budget", ["paper", "cpu"])
def test_fedproj_alpha_follows_001_table3(budget):
  alpha = {
    claim: resolve.effective_hparams(resolve.resolve_config(CLAIMS[claim], budget, "fedproj", 0))[
      "alpha"
    ]
    for claim in ("fedproj-cifar10-dir0.3", "fedproj-cifar10-dir0.5")
  }
  assert alpha == {"fedproj-cifar10-dir0.3": 0.0, "fedproj-cifar10-dir0.5": 0.3}


def test_paper_budget_distils_alike_and_memory_batch_is_the_private_batch():
  claim = fedproj_claims.FEDPROJ_DIR03
  hp = {
    m: resolve.effective_hparams(resolve.resolve_config(claim, "paper", m, 0))
    for m in ("fedproj", "feddf", "fedet")
  }
  keys = ("distill_lr", "distill_epochs", "distill_batch_size", "distill_temperature")
  assert {tuple(h[k] for k in keys) for h in hp.values()} == {(1e-5, 1, 256, 3.0)}
  config = resolve.resolve_config(claim, "paper", "fedproj", 0)
  assert hp["fedproj"]["memory_batch_size"] == config["batch_size"] == 64
  assert config["public_data"] == "cifar100" and config["public_split"] == "train+test"


def test_fedproj_claims_carry_all_table1_baselines():
  for claim in (fedproj_claims.FEDPROJ_DIR03, fedproj_claims.FEDPROJ_DIR05):
    baselines = {"fedavg", "fedprox", "fednova", "feddyn", "moon", "fedrcl", "feddf", "fedet"}
    assert baselines <= set(claim.paper) and baselines <= set(claim.methods)
    assert {o.worse for o in claim.orderings} >= baselines


def test_public_fallback_caps_memory_and_says_so(tmp_path, monkeypatch):
  import numpy as np

  (tmp_path / "cifar100").mkdir()
  np.savez(
    tmp_path / "cifar100" / "public_20k.npz",
    image=np.zeros((30, 32, 32, 3), np.uint8),
    label=np.zeros(30, np.int64),
  )
  monkeypatch.setattr(availability, "tfds_has", lambda name: False)
  config = resolve.resolve_config(fedproj_claims.FEDPROJ_DIR05, "paper", "fedproj", 0)
  used, notes = availability.public_fallback(config, tmp_path, claims_presets.PUBLIC)
  assert used["public_data"] == claims_presets.PUBLIC and used["memory_size"] == 30
  assert "memory_size 50,000 capped at the public set's 30" in notes[1]
  monkeypatch.setattr(availability, "tfds_has", lambda name: True)
  assert availability.public_fallback(config, tmp_path, claims_presets.PUBLIC) == (config, [])


def test_power_matches_a_known_value_and_declared_seeds_follow_the_plan():
  # Paired t-test, d = 1, n = 10, two-sided 0.05: power 0.803 (G*Power).
  assert abs(protocol.power(10, 1.0, 1.0, 0.05) - 0.803) < 0.005
  assert protocol.required_seeds(1.0, 1.0, 0.05) == 10
  assert protocol.power(3, 50.0, 0.1, 0.005) == 1.0  # scipy's tail failure handled
  for claim in CLAIMS.values():
    for budget in set(claim.budgets) - {"smoke"}:  # every budget a verdict is declared for
      rows = protocol.plan(claim, budget)
      b = claim.budgets[budget]
      # 0: no v1 seeds, a budget declared for its v2 replication only (which it must have).
      assert b.seeds in (0, protocol.recommended_seeds(rows)), (claim.name, budget)
      assert b.seeds or b.v2 is not None, (claim.name, budget)
      if b.v2 is not None:  # protocol v2's count follows its own plan, under its own cap
        view = protocol.v2_view(claim, budget)
        rows = protocol.plan(view, budget)
        assert b.v2.seeds == protocol.recommended_seeds(rows, protocol.V2_MAX_SEEDS), claim.name
        assert view.budgets[budget].declared == range(
          protocol.V2_FIRST_SEED, protocol.V2_FIRST_SEED + b.v2.seeds
        )


def test_v2_view_scores_each_v1_ordering_once_on_seeds_no_v1_verdict_uses():
  view = protocol.v2_view(fedgkd_claims.FEDGKD, "cpu")
  # FedGKD's four v1 orderings (two metrics) are two pairs on the one v2 metric.
  assert [(o.better, o.worse, o.metric) for o in view.orderings] == [
    ("fedgkd", "fedavg", protocol.V2_METRIC),
    ("fedgkd_vote", "fedavg", protocol.V2_METRIC),
  ]
  # The effects are Table 3's (best over rounds), not Table 6's 24-point final-round gaps.
  assert protocol.paper_effect(view, "fedgkd", "fedavg", protocol.V2_METRIC, False) == (
    pytest.approx(72.27 - 69.22)
  )
  assert {r.alpha for r in protocol.plan(view, "cpu")} == {protocol.ALPHA / 2}
  for claim in CLAIMS.values():
    for budget, b in claim.budgets.items():
      assert max(b.declared, default=0) < protocol.V2_FIRST_SEED, (claim.name, budget)
      if b.v2 is None:
        with pytest.raises(ValueError, match="declares no protocol v2"):
          protocol.v2_view(claim, budget)


def test_a_continual_replication_scores_the_claims_own_orderings_on_acc_and_fgt():
  for claim in (fot_claims.FOT_NONIID, fot_claims.FOT_IID):
    r = claim.budgets["cpu"].v2
    view = protocol.v2_view(claim, "cpu")
    assert r.metrics == ("acc", "fgt") and view.metrics == ("acc", "fgt")
    # Every v1 ordering once, on its own metric (FGT lower is better), none on the late mean.
    assert view.orderings == claim.orderings and len(view.orderings) == 8
    assert view.budgets["cpu"].power_sd == dict(r.power_sd)
    assert protocol.paper_effect(view, "fot", "gpm", "fgt", True) == pytest.approx(
      claim.paper["gpm"]["fgt"] - claim.paper["fot"]["fgt"]
    )
    assert view.budgets["cpu"].declared[0] == protocol.V2_FIRST_SEED
  # A replication without a usable seed count is refused by name, not an empty-sequence crash.
  bad = fot_claims.FOT_IID._replace(
    budgets={"cpu": fot_claims.FOT_IID.budgets["cpu"]._replace(v2=r._replace(seeds=0))}
  )
  with pytest.raises(ValueError, match="declares a replication of 0 seeds; declare 3..20"):
    protocol.v2_view(bad, "cpu")


def test_late_mean_is_the_mean_of_the_last_evaluations_and_refuses_short_curves():
  curve = [{"round": 1, "train_loss": 1.0}] + [
    {"round": r, "test_accuracy": a} for r, a in ((2, 0.1), (4, 0.3), (6, 0.2), (8, 0.4))
  ]
  assert protocol.late_mean(curve) == pytest.approx(100 * (0.3 + 0.2 + 0.4) / 3)
  assert protocol.late_mean(curve, k=1) == pytest.approx(40.0)
  with pytest.raises(KeyError, match="needs 3 evaluations"):
    protocol.late_mean(curve[:3])


def test_power_command_prints_the_plan(capsys, tmp_path):
  assert cli.main(["sfedkd-cifar10-exdir", "--budget=cpu", "--power", f"--results={tmp_path}"]) == 0
  out = capsys.readouterr().out
  assert "| sfedkd > fedseq | test_accuracy | +6.90 | 2.34 | 5 |" in out
  assert "declared (claims.py): 5" in out
  assert "Paired sd used (pre-registered): test_accuracy 2.34 (measured on " in out


def test_power_says_in_words_when_no_sd_was_measured(capsys, tmp_path):
  pilot = claims.get_claim("fedproj-iris-pilot")
  assert pilot.budgets["smoke"].power_sd is None  # the case the sentence is for
  assert cli.main([pilot.name, "--budget=smoke", "--power", f"--results={tmp_path}"]) == 0
  out = capsys.readouterr().out
  assert (
    "Paired sd: none measured for this budget yet, so the plan recommends the minimum, 3 " in out
  )
  assert "none from" not in out and "from not measured" not in out


def test_holm_adjustment():
  adjusted = protocol.holm([0.01, 0.04, 0.03])
  assert adjusted == pytest.approx([0.03, 0.06, 0.06])
  adjusted = protocol.holm([0.01, 0.04, 0.03, math.nan])  # an untested ordering still counts
  assert adjusted[:3] == pytest.approx([0.04, 0.09, 0.09]) and math.isnan(adjusted[3])


def _result(method, seed, value, code=None):
  out = {
    "claim": "fedproj-iris-pilot",
    "budget": "cpu",
    "method": method,
    "seed": seed,
    "config": {},
    "metrics": {"global_accuracy": value, "client_accuracy": value},
    "curve": [{"round": 1}],
  }
  if code:
    out["code"] = {"fingerprint": code}
  return out


def test_verdict_uses_only_preregistered_seeds_and_refuses_mixed_code():
  pilot = pilot_claims.PILOT  # 3 pre-registered seeds at cpu
  found = {
    "fedproj": {s: _result("fedproj", s, 90.0 + s, "A") for s in range(5)},
    "fedavg": {s: _result("fedavg", s, 60.0 + 0.5 * s, "A") for s in range(5)},
    "feddf": {s: _result("feddf", s, 60.0, "A" if s else "B") for s in range(5)},
  }
  found["fedavg"][4] = _result("fedavg", 4, 99.0, "A")  # an exploratory seed cannot flip it
  rows = {(r.worse, r.metric): r for r in report_verdicts.confirmatory_rows(pilot, found, "cpu")}
  r = rows[("fedavg", "global_accuracy")]
  assert r.paired.n == 3 and r.verdict == "reproduced" and r.p_holm >= r.p
  # Seed 0 of feddf ran other code: refused, leaving 2 of 3 seeds: incomplete.
  r = rows[("feddf", "global_accuracy")]
  assert r.refused == (0,) and r.paired.n == 2 and r.verdict == protocol.INCOMPLETE
  # The incomplete ordering has no test: no adjusted p, and it counts in the family as p = 1.
  assert math.isnan(r.p_holm) and not math.isnan(r.p)
  complete = [x for x in rows.values() if x.paired.n == 3]
  assert [x.p_holm for x in complete] == protocol.holm(
    [x.p for x in complete] + [math.nan] * (len(rows) - len(complete))
  )[: len(complete)]
  assert report_verdicts.confirmatory_rows(pilot, found, "cpu", [{"A", "B"}])[1].paired.n == 3
  text = "\n".join(report_verdicts.verdict_table(pilot, found, "cpu"))
  assert "Pairs refused (the two runs recorded different code): fedproj > feddf seeds [0]" in text


def test_pairs_of_other_machine_kinds_or_precisions_are_refused():
  pilot = pilot_claims.PILOT
  found = {
    m: {s: _result(m, s, v + s, "A") for s in range(3)}
    for m, v in (("fedproj", 90.0), ("fedavg", 60.0), ("feddf", 61.0))
  }
  gpu = {"backend": "gpu", "device_kind": "NVIDIA H200", "cores": 2, "cpu_count": 16}
  found["fedproj"][1]["machine"] = {**gpu, "matmul_precision": "default"}  # TF32
  found["fedproj"][2]["machine"] = {**gpu, "matmul_precision": "float32"}  # another machine kind
  rows = {(r.better, r.worse): r for r in report_verdicts.confirmatory_rows(pilot, found, "cpu")}
  assert rows[("fedproj", "fedavg")].mismatched == (1, 2)
  assert rows[("fedproj", "fedavg")].paired.n == 1
  assert rows[("fedproj", "fedavg")].verdict == protocol.INCOMPLETE
  text = "\n".join(report_verdicts.verdict_table(pilot, found, "cpu"))
  assert "Pairs refused (the two runs computed on different kinds of machine" in text
  assert report_results.machine_label(found["fedproj"][1]) == (
    "NVIDIA H200 (gpu, matmul precision default)"
  )
  assert report_results.arithmetic(found["fedproj"][2]) == report_results.arithmetic(
    found["fedavg"][0]
  )
  # Every method of a seed on the same pinned GPU pairs again.
  for m in found:
    for r in found[m].values():
      r["machine"] = {**gpu, "matmul_precision": "float32"}
  assert "Pairs refused" not in "\n".join(report_verdicts.verdict_table(pilot, found, "cpu"))


def test_help_gives_the_defaults(capsys):
  with pytest.raises(SystemExit):
    cli.main(["--help"])
  out = "".join(capsys.readouterr().out.split())  # argparse wraps lines
  assert "(default:cpu)" in out and "(default:thebudget'spre-registeredseeds" in out


def test_public_split_reaches_tfds(monkeypatch):
  """The paper budgets' public_split=train+test is the split TFDS is asked for."""
  import ml_collections
  import numpy as np
  import tensorflow_datasets as tfds

  from fedjax_proj.training import inputs

  seen = []

  def load(name, split, *args, **kwargs):
    seen.append(split)
    return run_load(name, split, *args, download=False, **kwargs)

  run_load = inputs.load_dataset
  c = ml_collections.ConfigDict(
    dict(
      public_data="cifar100",
      public_split="train+test",
      public_size=0,
      seed=0,
      method="feddf",
      memory_size=0,
      method_kwargs={},
    )
  )
  with tfds.testing.mock_data(num_examples=6):
    _, n = inputs.public_inputs(c, np.zeros((1, 32, 32, 3), np.uint8), 10, "cifar10", load=load)
  assert seen == ["train+test"] and n == 6


def test_drift_budget_tests_only_its_methods_with_their_own_holm_family(capsys, tmp_path):
  for claim in (fedproj_claims.FEDPROJ_DIR03, fedproj_claims.FEDPROJ_DIR05):
    at = claim.at("drift")
    assert at.methods == ("fedavg", "feddf", "fedproj")
    assert {(o.better, o.worse) for o in at.orderings} == {
      ("fedproj", "fedavg"),
      ("fedproj", "feddf"),
    }
    assert set(at.paper) == set(at.methods) and claim.at("cpu") is claim
    assert {r.alpha for r in protocol.plan(claim, "drift")} == {protocol.ALPHA / 2}
    config = resolve.resolve_config(claim, "drift", "fedproj", 0)
    assert (config["num_clients"], config["rounds"], config["local_epochs"]) == (20, 10, 2)
  # Every budget's methods are the claim's.
  for claim in CLAIMS.values():
    for b in claim.budgets.values():
      assert b.methods is None or set(b.methods) <= set(claim.methods), claim.name
  # The runner's default methods are the budget's; the report's verdicts are its 2 orderings.
  argv = ["fedproj-cifar10-dir0.3", "--budget=drift", "--no_run", f"--results={tmp_path}"]
  assert cli.main(argv) == 0
  out = capsys.readouterr().out
  assert "drift fedproj seed 9" in out and "fedprox" not in out
  found = {
    m: {s: {**_result(m, s, 50.0 + (m == "fedproj") + s % 2), "budget": "drift"} for s in range(10)}
    for m in ("fedavg", "feddf", "fedproj")
  }
  for rs in found.values():
    for r in rs.values():
      r["metrics"] = {"test_accuracy": r["metrics"]["global_accuracy"]}
  rows = report_verdicts.confirmatory_rows(fedproj_claims.FEDPROJ_DIR03, found, "drift")
  assert [(r.better, r.worse) for r in rows] == [("fedproj", "fedavg"), ("fedproj", "feddf")]


def test_sfedkd_fashion_mnist_claim_has_the_paper_budget_and_its_mnist_analogue(capsys, tmp_path):
  claim = CLAIMS["sfedkd-fmnist-exdir"]
  assert set(claim.paper) == set(claim.methods) == {"fedavg", "fedseq", "cwc", "sfedkd"}
  paper = resolve.resolve_config(claim, "paper", "sfedkd", 0)
  mnist = resolve.resolve_config(claim, "mnist", "sfedkd", 0)
  # 004 Sect. 4.1: LeNet-5 on Fashion-MNIST under ExDir(2, 0.5); the mnist budget keeps network,
  # partition and client recipe and swaps in MNIST, its offline analogue.
  assert (paper["dataset"], paper["model"], paper["partition"]) == (
    "fashion_mnist",
    "lenet5",
    "exdir:2:0.5",
  )
  assert (mnist["dataset"], mnist["model"], mnist["partition"]) == (
    "mnist",
    "lenet5",
    "exdir:2:0.5",
  )
  for key in ("clients_per_round", "batch_size", "optimizer", "lr", "momentum", "weight_decay"):
    assert mnist[key] == paper[key], key
  assert mnist["method_kwargs"]["num_teachers"] == 5
  # A v2-style late metric needs at least 3 evaluations; the mnist budget has 10.
  assert mnist["rounds"] // mnist["eval_every"] >= protocol.LATE_EVALS
  # The CIFAR-10 claim's paper budget is unchanged by it.
  assert resolve.resolve_config(sfedkd_claims.SFEDKD, "paper", "sfedkd", 0)["model"] == "alexnet8"
  argv = ["sfedkd-fmnist-exdir", "--budget=mnist", "--no_run", f"--results={tmp_path}"]
  assert cli.main(argv) == 0
  assert "mnist sfedkd seed 9" in capsys.readouterr().out


def _code_equivalence():
  from tools import code_equivalence

  return code_equivalence


def _ran(code):
  return {"code": {"fingerprint": code}}


def test_code_equivalence_pairs_only_what_was_compared_directly():
  ce = _code_equivalence()
  data = ce.record_check({}, ("b", "a"), {"n": 1}, True)
  data = ce.record_check(data, ("b", "c"), {"n": 2}, True)
  assert [p["fingerprints"] for p in data["pairs"]] == [["a", "b"], ["b", "c"]]
  pairs = report_results.equivalent_pairs(data)
  assert report_results.same_code(_ran("a"), _ran("b"), pairs)
  assert report_results.same_code(_ran("c"), _ran("b"), pairs)
  # a = b and b = c: no chain, a and c were never compared.
  assert report_results.same_code(_ran("a"), _ran("c"), pairs) is False
  data = ce.record_check(data, ("a", "c"), {"n": 3}, True)
  assert report_results.same_code(_ran("a"), _ran("c"), report_results.equivalent_pairs(data))


def test_a_difference_refutes_a_pair_for_good():
  ce = _code_equivalence()
  data = ce.record_check({}, ("a", "b"), {"runs": "narrow"}, True)
  data = ce.record_check(data, ("b", "a"), {"runs": "edge_cases"}, False)
  assert data["pairs"] == []
  assert data["refuted"] == [
    {
      "fingerprints": ["a", "b"],
      "evidence": [{"runs": "edge_cases"}],
      "matched": [{"runs": "narrow"}],
    }
  ]
  # A later match (say on fewer runs) is kept as evidence but does not undo the difference.
  data = ce.record_check(data, ("a", "b"), {"runs": "narrow again"}, True)
  assert not report_results.same_code(_ran("a"), _ran("b"), report_results.equivalent_pairs(data))
  with pytest.raises(ValueError, match="two different"):
    ce.record_check(data, ("a", "a"), {}, True)


def test_transitive_groups_are_refused_and_convert_to_their_direct_pairs():
  ce = _code_equivalence()
  chain = {"fingerprints": ["a", "b", "c"], "evidence": []}
  chain["evidence"] = [{"code_fingerprints": ["a", "b"]}, {"code_fingerprints": ["c", "b"]}]
  with pytest.raises(ValueError, match="--convert"):
    report_results.equivalent_pairs({"groups": [chain]})
  pairs = report_results.equivalent_pairs(ce.pairs_from_groups({"groups": [chain]}))
  assert pairs == [{"a", "b"}, {"b", "c"}]


def test_the_committed_equivalences_are_direct_pairs_backed_by_their_evidence():
  import json

  data = json.loads((run.DEFAULT_RESULTS / report_results.EQUIVALENCE_FILE).read_text())
  assert "groups" not in data
  for entry in data["pairs"] + data["refuted"]:
    assert len(set(entry["fingerprints"])) == 2
    for evidence in entry["evidence"] + entry.get("matched", []):
      assert sorted(evidence["code_fingerprints"]) == sorted(entry["fingerprints"]), entry


def test_fot_claims_run_the_papers_rule_and_keep_the_authors_rule_runs_as_an_ablation():
  for claim in (fot_claims.FOT_IID, fot_claims.FOT_NONIID):
    fot = resolve.resolve_config(claim, "cpu", "fot", 0)
    authors = resolve.resolve_config(claim, "cpu", "fot-authors-rule", 0)
    assert fot["method_kwargs"]["threshold_rule"] == "energy"
    assert authors["method_kwargs"]["threshold_rule"] == "authors"
    assert resolve.resolve_config(claim, "cpu", "fot-eps0.90", 0)["method_kwargs"][
      "threshold_rule"
    ] == ("authors")
    # The runs recorded before the rule existed (no threshold_rule in their config) are the
    # authors' rule's: the same fingerprint as the ablation, another than the claim's FOT.
    before = {
      **authors,
      "method_kwargs": {k: v for k, v in authors["method_kwargs"].items() if k != "threshold_rule"},
    }
    assert resolve.fingerprint(before) == resolve.fingerprint(authors) != resolve.fingerprint(fot)


def test_moon_runs_the_papers_layout_and_the_cpu_budget_keeps_its_v1_layout():
  for name in ("fedproj-cifar10-dir0.3", "fedproj-cifar10-dir0.5"):
    claim = CLAIMS[name]
    paper = resolve.resolve_config(claim, "paper", "moon", 0)
    cpu = resolve.resolve_config(claim, "cpu", "moon", 0)
    assert paper["model_kwargs"]["classifier_on_projection"] is True
    assert cpu["model_kwargs"] == {"projection_dim": 256, "classifier_on_projection": False}
    # The cpu runs recorded before the fix carried no model_kwargs: the pinned layout has their
    # fingerprint, the paper's layout another; other methods record none.
    before = {k: v for k, v in cpu.items() if k != "model_kwargs"}
    assert resolve.fingerprint(before) == resolve.fingerprint(cpu)
    on_head = {**cpu["model_kwargs"], "classifier_on_projection": True}
    paper_layout = {**cpu, "model_kwargs": on_head}
    assert resolve.fingerprint(paper_layout) != resolve.fingerprint(cpu)
    assert "model_kwargs" not in resolve.resolve_config(claim, "cpu", "fedavg", 0)


def test_the_code_fingerprint_leaves_out_exactly_the_report_side(tmp_path):
  """The code fingerprint covers what decides a run's numbers and nothing that only reads or draws
  results: editing fedjax_proj/plot.py or any file of reproduce/report/ (every one of them listed)
  keeps it, editing the runner, a claim module, a config module, an entry point or the package's C++
  source changes it."""
  package = provenance.REPO_ROOT / "fedjax_proj"
  names = {f.relative_to(provenance.REPO_ROOT).as_posix() for f in provenance.code_files()}
  assert {"fedjax_proj/reproduce/run.py", "fedjax_proj/configs/cifar10.py"} <= names
  assert {"fedjax_proj/reproduce/claims/fedproj.py", "fedjax_proj/reproduce/runners.py"} <= names
  assert "experiments/cifar10.py" in names
  assert "fedjax_proj/models/onednn_conv.cc" in names  # compiled C++ computes gradients too
  assert not {f"fedjax_proj/{r}" for r in provenance.REPORT_ONLY} & names
  assert all((package / r).is_file() for r in provenance.REPORT_ONLY)  # no stale entry
  # A file added to the report package is report-side too, so it must be listed.
  report_files = {f"reproduce/report/{f.name}" for f in (package / "reproduce/report").glob("*.py")}
  assert len(report_files) > 1
  assert report_files <= set(provenance.REPORT_ONLY)

  root = tmp_path / "repo"
  code_side = ("reproduce/run.py", "reproduce/claims/fedproj.py", "configs/cifar10.py")
  for rel in (*provenance.REPORT_ONLY, *code_side):
    (root / "fedjax_proj" / rel).parent.mkdir(parents=True, exist_ok=True)
    (root / "fedjax_proj" / rel).write_text("x = 1\n")
  (root / "experiments").mkdir()
  (root / "experiments" / "cifar10.py").write_text("x = 1\n")
  before = provenance.code_fingerprint(root)
  for rel in provenance.REPORT_ONLY:
    (root / "fedjax_proj" / rel).write_text("x = 2\n")
    assert provenance.code_fingerprint(root) == before, rel
  for rel in code_side:
    (root / "fedjax_proj" / rel).write_text("x = 2\n")
    assert provenance.code_fingerprint(root) != before, rel
    before = provenance.code_fingerprint(root)
  (root / "experiments" / "cifar10.py").write_text("x = 2\n")
  assert provenance.code_fingerprint(root) != before


def test_an_installed_package_defaults_to_the_working_directory(tmp_path, monkeypatch, capsys):
  """A checkout keeps its committed results folder as the default; a folder without the
  checkout's pyproject.toml, docs/ and benchmarks/ (site-packages) is no checkout, and there
  --update_docs refuses instead of writing a docs/ folder into it."""
  assert (
    provenance.in_checkout(provenance.REPO_ROOT) and run.DEFAULT_RESULTS == run.CHECKOUT_RESULTS
  )
  assert run.CHECKOUT_RESULTS == provenance.REPO_ROOT / "results" / "reproduce"
  assert not provenance.in_checkout(tmp_path) and not run.INSTALLED_RESULTS.is_absolute()
  assert provenance.git_commit(tmp_path) == "unknown" or os.environ.get("FEDJAX_PROJ_GIT_COMMIT")
  monkeypatch.setattr(provenance, "in_checkout", lambda root=provenance.REPO_ROOT: False)
  before = DOC.read_text()
  assert cli.main(["--update_docs"]) == 2
  assert "source checkout" in capsys.readouterr().err and DOC.read_text() == before
