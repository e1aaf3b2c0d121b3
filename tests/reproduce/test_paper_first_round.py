"""Every claim's ``paper`` budget runs its first rounds on tiny data through the runner's code path.

The config is the budget's resolved one (resolve.resolve_config), the public set goes through the
offline fallback (availability.public_fallback, TFDS unavailable), and runners.tiny shrinks only
data sizes, rounds and client counts; the runs go through run.run_one and its runner, so a paper
budget that cannot run (a memory larger than the public set, a missing held-out split, ...) fails
here.
"""

from __future__ import annotations

import contextlib

import pytest

from fedjax_proj.reproduce import availability, records, resolve, run, runners
from fedjax_proj.reproduce.claims import CLAIMS
from fedjax_proj.reproduce.claims import presets as claims_presets

# Per claim, one method whose paper path covers the others' (kept to one run per claim for the
# suite's time): FedProj exercises the public set, the memory and the server distillation FedDF
# and FedET share (α > 0 at Dir 0.5); VOTE is FedGKD plus the server's held-out validation; the
# two FOT claims differ only in the partition, so one runs FOT and the other EWC's Fishers.
METHODS = {
  "fedproj-cifar10-dir0.5": ("fedproj",),
  "fedgkd-cifar10": ("fedgkd_vote",),
  # FedGen: the server's generator on the paper's GroupNorm ResNet-8 head (the table's one
  # method with a server-side model of its own).
  "fedgkd-cifar10-table3": ("fedgen",),
  "sfedkd-cifar10-exdir": ("sfedkd",),
  "sfedkd-fmnist-exdir": ("sfedkd",),  # LeNet-5 on grayscale Fashion-MNIST
  # FedCurv on the chain's data: the parallel baseline whose Fisher state the others lack.
  "sfedkd-fmnist-exdir-baselines": ("fedcurv",),
  "fot-pmnist-noniid": ("ewc",),
  "fot-pmnist-iid": ("fot",),
  "fot-pmnist-noniid-table1": ("rgo",),  # RGO's per-client projectors at the end of a task
  # FOT: FedCIL's paper path (a generator per client, 100 consolidation steps a round) takes
  # minutes to compile and run even on tiny data; tests/algorithms/continual/test_fedcil.py runs
  # its rounds at small sizes.
  "fot-pmnist-noniid-fedcil": ("fot",),
  "fot-pmnist-iid-table1": ("glfc",),  # GLFC's buffer under its gradient compensation, IID
  "fedproj-iris-pilot": ("fedproj",),
  # Text: NLI pairs with an unlabelled public set and α > 0, and FedGKD's buffer on AG News.
  "fedproj-mnli-dir0.5": ("fedproj",),
  "fedgkd-agnews": ("fedgkd",),
}
# Claims whose paper budget is another claim's with only the task's data or β changed: the same
# config path, run above (SST-2's single sentences run in tests/reproduce/test_nlp_claims.py,
# MARC's local file source in tests/data/sources/test_text.py). CIFAR-10 at Dir 0.3 is Dir 0.5's
# budget with FedProj's α = 0 (paper 001 Table 3), the distillation without its divergence term,
# which is FedDF's (tests/algorithms/test_conformance.py); test_every_claim_is_covered checks that
# nothing else differs and that its tiny partition can run.
COVERED_BY = {
  "fedproj-cifar10-dir0.3": "fedproj-cifar10-dir0.5",
  "fedproj-mnli-dir0.3": "fedproj-mnli-dir0.5",
  "fedproj-sst2-dir0.3": "fedproj-mnli-dir0.5",
  "fedproj-sst2-dir0.5": "fedproj-mnli-dir0.5",
  "fedproj-marc-dir0.3": "fedproj-mnli-dir0.5",
  "fedproj-marc-dir0.5": "fedproj-mnli-dir0.5",
}


def test_every_claim_is_covered(data_root):
  assert set(METHODS) | set(COVERED_BY) == set(CLAIMS)
  assert set(COVERED_BY.values()) <= set(METHODS)
  for name, covering in COVERED_BY.items():
    claim, other = CLAIMS[name], CLAIMS[covering]
    assert (claim.entry, claim.preset, claim.kind) == (other.entry, other.preset, other.kind)
    if claim.kind == "image":
      _differs_only_in_partition_and_alpha(claim, other, data_root)
    else:
      assert claim.kind == "nlp"
  assert all(set(m) <= set(CLAIMS[c].methods) for c, m in METHODS.items())


def _differs_only_in_partition_and_alpha(claim, other, data_root):
  """``claim``'s paper budget is ``other``'s but for the partition and FedProj's α, and its tiny
  run's partition gives every client a batch (the data steps before any compile)."""
  from fedjax_proj.data.partition import partition
  from fedjax_proj.data.sources import load_dataset
  from fedjax_proj.training.experiment import check_batch_size
  from fedjax_proj.training.inputs import subset

  for method in METHODS[other.name]:
    mine, theirs = (
      resolve.resolve_config(c, "paper", method, 0, data_root) for c in (claim, other)
    )
    differ = {k for k in mine.keys() | theirs.keys() if mine.get(k) != theirs.get(k)}
    assert differ == {"partition", "method_defaults"}, differ
    mine_defaults, their_defaults = dict(mine["method_defaults"]), dict(theirs["method_defaults"])
    assert {k for k in mine_defaults if mine_defaults[k] != their_defaults[k]} == {"fedproj"}
    alpha = {k for k, v in mine_defaults["fedproj"].items() if their_defaults["fedproj"][k] != v}
    assert alpha == {"alpha"} and mine_defaults["fedproj"]["alpha"] == 0.0
    c = resolve.substitute_data(runners.tiny(claim, mine), data_root)
    train = load_dataset(c["dataset"], "train", c["data_dir"] or None)
    _, labels = subset(train, c["train_subset"], c["seed"])
    check_batch_size(c["batch_size"], partition(labels, c["partition"], c["num_clients"], 0), "")


@pytest.mark.parametrize("name", sorted(METHODS))
def test_paper_budget_first_rounds_run(name, data_root, tmp_path, monkeypatch):
  monkeypatch.setattr(availability, "tfds_has", lambda dataset: False)  # offline: the fallback path
  claim = CLAIMS[name]
  mock = contextlib.nullcontext()
  if claim.kind == "nlp":  # TFDS's text sets, mocked (tfds.testing.mock_data serves downloads)
    pytest.importorskip("tokenizers")
    tfds = pytest.importorskip("tensorflow_datasets")
    from fedjax_proj.data.sources import text

    monkeypatch.setattr(text, "network_available", lambda: True)
    monkeypatch.setenv("FEDJAX_PROJ_CACHE", str(tmp_path / "cache"))
    mock = tfds.testing.mock_data(num_examples=64)
  with mock:
    _first_rounds(claim, name, data_root, tmp_path)


def _first_rounds(claim, name, data_root, tmp_path):
  for method in METHODS[name]:
    config = resolve.resolve_config(claim, "paper", method, 0, data_root)
    config, deviations = availability.public_fallback(config, data_root, claims_presets.PUBLIC)
    result = run.run_one(
      claim,
      "paper",
      method,
      0,
      results=tmp_path,
      data_root=data_root,
      config=runners.tiny(claim, config),
      deviations=deviations,
      log=lambda *a, **k: None,
    )
    assert records.check_result(result) is None
    assert set(claim.metrics) <= set(result["metrics"]), result["metrics"]
    if config.get("public_split") == "train" and method == "fedproj" and claim.kind == "image":
      assert any("capped" in d for d in result["deviations"])  # |M| 50k > the 128 images
