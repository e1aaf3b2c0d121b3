"""The NLP claims (001 Table 2, 002 AG News) resolve through experiments/nlp.py at every budget,
and one claim's smoke budget runs a round through the claim runner on mocked TFDS text."""

from __future__ import annotations

import json

import pytest

from fedjax_proj.reproduce import availability, claims, records, resolve, run, runners

NLP = [c for c in claims.CLAIMS.values() if c.kind == "nlp"]


def test_every_nlp_claim_resolves():
  assert len(NLP) == 7  # 3 tasks x 2 betas + AG News
  for claim in NLP:
    for budget in claim.budgets:
      for method in claim.methods:
        config = resolve.resolve_config(claim, budget, method, seed=0)
        assert config["dataset"] == claim.entry_kwargs["task"] and config["model"] == "bert"
  paper = resolve.resolve_config(claims.get_claim("fedproj-mnli-dir0.5"), "paper", "fedproj", 0)
  assert (paper["public_data"], paper["partition"], paper["num_clients"]) == (
    "snli", "dirichlet:0.5", 15,
  )  # fmt: skip
  assert paper["checkpoint"] == "huawei-noah/TinyBERT_General_4L_312D"
  assert claims.get_claim("fedproj-sst2-dir0.3").paper["fedproj"]["test_accuracy"] == 64.80


def test_smoke_budget_runs_through_the_runner(tmp_path, monkeypatch):
  pytest.importorskip("tokenizers")
  tfds = pytest.importorskip("tensorflow_datasets")
  from fedjax_proj.data.sources import text  # noqa: PLC0415

  monkeypatch.setattr(text, "network_available", lambda: True)  # the mock serves downloads
  monkeypatch.setenv("FEDJAX_PROJ_CACHE", str(tmp_path / "cache"))
  claim = claims.get_claim("fedproj-sst2-dir0.5")
  # FedAvg: the runner's text path is under test (FedProj's round: tests/configs/test_nlp.py)
  config = resolve.resolve_config(claim, "smoke", "fedavg", seed=0)
  config.update(num_clients=2, clients_per_round=2, rounds=1, max_len=16, public_size=40,
                batch_size=16, memory_size=32, partition="iid")  # fmt: skip
  with tfds.testing.mock_data(num_examples=40):
    result = run.run_one(
      claim, "smoke", "fedavg", 0, results=tmp_path, data_root=tmp_path, config=config,
      log=lambda *a, **k: None,
    )  # fmt: skip
  assert 0.0 <= result["metrics"]["test_accuracy"] <= 100.0 and len(result["curve"]) == 1
  saved = json.loads(records.result_path(tmp_path, claim.name, "smoke", "fedavg", 0).read_text())
  assert saved["config"]["dataset"] == "sst2"


def test_missing_text_data_is_one_line_before_any_run(tmp_path, capsys, monkeypatch):
  from fedjax_proj.reproduce import __main__ as cli

  started = []
  monkeypatch.setitem(runners.RUNNERS, "nlp", lambda *args: started.append(args))
  base = ["--budget=smoke", "--methods=fedavg,fedproj", "--seeds=0", f"--results={tmp_path}"]
  # MARC is a local file under the data folder; this one has none.
  assert cli.main(["fedproj-marc-dir0.3", *base, f"--data={tmp_path}"]) == 1
  err = capsys.readouterr().err
  assert err.count("\n") == 1 and "Traceback" not in err
  assert f"the private set 'marc' is not in {tmp_path}/marc (no train.csv|.tsv|.jsonl" in err
  # The TFDS sets offline: the private set, and the public set FedProj reads (FedAvg reads none).
  monkeypatch.setattr(availability, "tfds_has", lambda name: False)
  assert cli.main(["fedproj-sst2-dir0.3", *base, f"--data={tmp_path}"]) == 1
  err = capsys.readouterr().err
  assert "the private set 'sst2' (TFDS glue/sst2) is not prepared here" in err
  assert "the public set 'sentiment140' (TFDS sentiment140)" in err and err.count("\n") == 1
  # --no_run --time_step loads the data to time a step: the same line, before any timing.
  timed = []
  monkeypatch.setitem(runners.STEP_TIMERS, "nlp", lambda *args: timed.append(args))
  argv = ["fedproj-sst2-dir0.3", *base, f"--data={tmp_path}", "--no_run", "--time_step"]
  assert cli.main(argv) == 1
  err = capsys.readouterr().err
  assert "the private set 'sst2' (TFDS glue/sst2) is not prepared here" in err
  assert err.count("\n") == 1 and timed == []
  assert started == [] and not list(tmp_path.glob("**/*.json"))
