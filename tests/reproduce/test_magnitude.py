"""A verdict's magnitude beside its direction (docs/reproduction.md, "Results", the protocol's
"Magnitude beside direction") against hand computations on constructed records."""

from __future__ import annotations

import json
import math

import pytest

from fedjax_proj.reproduce import claims
from fedjax_proj.reproduce.claims import pilot as pilot_claims
from fedjax_proj.reproduce.report import results as report_results
from fedjax_proj.reproduce.report import tables as report_tables
from fedjax_proj.reproduce.report import verdicts as report_verdicts

# t_{0.975} with 2 degrees of freedom (a printed table): the half-width of a 3-seed interval is
# T975 * sd / sqrt(3).
T975 = 4.302653
HALF = T975 / math.sqrt(3)  # for a paired sd of 1


@pytest.mark.parametrize(
  "gap, mean, low, high, inside, ratio, cells",
  [
    (4.0, 2.0, -0.5, 4.5, True, 0.5, "yes | 0.50"),  # inside, half the paper's size
    (2.0, 9.5, 6.8, 12.2, False, 4.75, "no | 4.75"),  # outside above: same sign, larger
    (2.0, -1.0, -3.5, 1.5, False, -0.5, "no | -0.50 (opposite sign)"),  # sign flip
    (-5.0, 2.0, -0.5, 4.5, False, -0.4, "no | -0.40 (opposite sign)"),  # the paper's flipped
    (4.5, 2.0, -0.5, 4.5, True, 2 / 4.5, "yes | 0.44"),  # on the interval's edge: inside
    (0.0, 1.0, -1.5, 3.5, True, None, "yes | n/a (paper gap 0)"),  # a tie in the paper
    (0.004, 1.0, 0.5, 1.5, False, None, "no | n/a (paper gap 0)"),  # 0.00 as printed: a tie
    (0.01, 1.0, 0.5, 1.5, False, 100.0, "no | 100.00"),  # 0.01 printed: a gap
    (None, 1.0, 0.5, 1.5, None, None, "— | —"),  # no paper number
    (math.nan, 1.0, 0.5, 1.5, None, None, "— | —"),  # NaN reads as None, never as a tie
    (2.0, math.nan, math.nan, math.nan, None, None, "— | —"),  # no seed run
    (2.0, 3.0, None, None, None, 1.5, "— | 1.50"),  # one seed: a mean, no interval
  ],
)
def test_magnitude_against_hand_arithmetic(gap, mean, low, high, inside, ratio, cells):
  m = report_verdicts.magnitude(gap, mean, low, high)
  assert m.inside is inside
  assert m.ratio == (None if ratio is None else pytest.approx(ratio))
  assert report_verdicts.magnitude_cells(m, gap, mean) == cells


def _result(method, seed, value):
  return {
    "claim": "fedproj-iris-pilot",
    "budget": "cpu",
    "method": method,
    "seed": seed,
    "config": {},
    "metrics": value,
    "curve": [{"round": 1}],
  }


def test_verdict_rows_and_records_state_the_paper_gap_and_the_ratio():
  # The pilot's orderings with paper numbers chosen so the four rows are: inside, outside on the
  # same side, opposite sign, and a paper tie.
  pilot = pilot_claims.PILOT._replace(
    paper={
      "fedproj": {"global_accuracy": 80.0, "client_accuracy": 70.0},
      "fedavg": {"global_accuracy": 76.0, "client_accuracy": 68.0},  # gaps +4, +2
      "feddf": {"global_accuracy": 78.0, "client_accuracy": 70.0},  # gaps +2, 0
    }
  )
  values = {  # per seed 0, 1, 2: (global, client)
    "fedproj": [(70, 50), (71, 50), (72, 50)],
    "fedavg": [(69, 51), (69, 52), (69, 50)],  # d = 1, 2, 3 and -1, -2, 0
    "feddf": [(61, 49), (60, 50), (63, 48)],  # d = 9, 11, 9 and 1, 0, 2
  }
  found = {
    m: {
      s: _result(m, s, {"global_accuracy": g, "client_accuracy": c}) for s, (g, c) in enumerate(v)
    }
    for m, v in values.items()
  }
  sd_feddf = math.sqrt(((9 - 29 / 3) ** 2 * 2 + (11 - 29 / 3) ** 2) / 2)
  expected = {  # (worse, metric): (paper gap, mean, half-width, inside, ratio cell)
    ("fedavg", "global_accuracy"): (4.0, 2.0, HALF, True, "0.50"),  # [-0.48, 4.48]
    ("feddf", "global_accuracy"): (2.0, 29 / 3, sd_feddf * HALF, False, "4.83"),  # [6.80, 12.53]
    ("fedavg", "client_accuracy"): (2.0, -1.0, HALF, False, "-0.50 (opposite sign)"),
    ("feddf", "client_accuracy"): (0.0, 1.0, HALF, True, "n/a (paper gap 0)"),  # [-1.48, 3.48]
  }
  plain = report_verdicts.verdict_records(pilot, found, "cpu")
  assert json.loads(json.dumps(plain)) == plain  # verdicts.json holds them as written
  records = {(r["worse"], r["metric"]): r for r in plain}
  table = report_verdicts.verdict_table(pilot, found, "cpu")
  assert "| 95% interval | paper gap | paper gap in interval | ours / paper | p |" in table[2]
  for (worse, metric), (gap, mean, half, inside, ratio) in expected.items():
    r = records[(worse, metric)]
    assert r["paper_gap"] == pytest.approx(gap) and r["mean"] == pytest.approx(mean)
    assert (r["low"], r["high"]) == (pytest.approx(mean - half), pytest.approx(mean + half))
    assert r["paper_gap_in_interval"] is inside
    assert r["ratio_to_paper"] == (None if gap == 0 else pytest.approx(mean / gap))
    row = next(line for line in table if line.startswith(f"| fedproj > {worse} | {metric} |"))
    cells = f"| {gap:+.2f} | {'yes' if inside else 'no'} | {ratio} |"
    assert cells in row and row.endswith(f"| {r['verdict']} |")


def test_the_glance_table_states_magnitude_from_each_verdicts_json(tmp_path):
  claim = claims.CLAIMS["fedgkd-cifar10"]
  base = {"seeds": 7, "declared": 7, "wins": 7, "p": 0.001, "p_holm": 0.002}
  base["metric"], base["verdict"] = "test_accuracy", "reproduced"

  def record(better, gap, mean, low, high):  # as written before verdicts.json held magnitude
    return {**base, "better": better, "worse": "fedavg", "paper_gap": gap, "mean": mean,
            "low": low, "high": high}  # fmt: skip

  records = [record("fedgkd", 2.0, 3.0, 1.0, 5.0), record("fedgkd_vote", 8.0, -1.0, -2.0, 0.5)]
  directory = tmp_path / claim.name / "cpu"
  directory.mkdir(parents=True)
  payload = {"claim": claim.name, "budget": "cpu", "verdicts": records}
  (directory / report_results.VERDICTS_FILE).write_text(json.dumps(payload))
  lines = report_tables.glance_table(tmp_path)
  assert "| mean diff [95% interval] | paper gap in interval | ours / paper | p (Holm) |" in (
    "\n".join(lines)
  )
  rows = {
    (cells[2], cells[3]): cells
    for cells in (line.split(" | ") for line in lines if line.startswith(f"| {claim.name}"))
  }
  assert rows[("v1", "fedgkd > fedavg")][7:10] == ["3.00 [1.00, 5.00]", "yes", "1.50"]
  assert rows[("v1", "fedgkd_vote > fedavg")][7:10] == [
    "-1.00 [-2.00, 0.50]",
    "no",
    "-0.12 (opposite sign)",
  ]
