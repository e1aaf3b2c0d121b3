"""benchmarks/pilots/sfedkd_pilot.py's forgetting numbers (004 Figure 1) on hand-made accuracy
matrices."""

from __future__ import annotations

import numpy as np
import pytest

from benchmarks.pilots import sfedkd_pilot

# Three classes; each row is the per-class accuracy (points) after one client of a chain.
CHAIN = np.array(
  [
    [90.0, 10.0, 50.0],
    [20.0, 80.0, 50.0],  # the second client's classes overwrite the first's
    [60.0, 40.0, 70.0],
  ]
)


def test_forgetting_measure_is_the_best_earlier_minus_the_final_averaged_over_classes():
  # Class 0: max(90, 20) - 60 = 30; class 1: max(10, 80) - 40 = 40; class 2: 50 - 70 = -20.
  assert sfedkd_pilot.forgetting_measure(CHAIN) == pytest.approx((30 + 40 - 20) / 3)
  # A chain that only improves forgets nothing: FM <= 0.
  assert sfedkd_pilot.forgetting_measure(np.sort(CHAIN, axis=0)) <= 0
  with pytest.raises(ValueError, match="points >= 2"):
    sfedkd_pilot.forgetting_measure(CHAIN[:1])


def test_swing_and_cosine_between_consecutive_clients():
  swing = sfedkd_pilot.classwise_swing(CHAIN)
  np.testing.assert_allclose(swing, [(70 + 70 + 0) / 3, (40 + 40 + 20) / 3])
  cos = sfedkd_pilot.consecutive_cosine(CHAIN)
  assert cos.shape == (2,) and np.all(cos < 1)
  # Scaling every class alike keeps the direction (004 Fig. 1b's i.i.d. case is near 1).
  np.testing.assert_allclose(sfedkd_pilot.consecutive_cosine(np.array([[10.0, 20], [30, 60]])), 1)
  # A model right on no class has no direction and counts as unlike its neighbour.
  assert sfedkd_pilot.consecutive_cosine(np.array([[0.0, 0], [30, 60]]))[0] == 0


def test_chain_summary_excludes_the_untrained_model_and_reads_the_late_rounds():
  # Row 0 (untrained: 100% on one class by predicting only it) must not count as knowledge.
  acc = np.vstack([[100.0, 0.0, 0.0], CHAIN, CHAIN[::-1]])  # 2 rounds of 3 clients
  s = sfedkd_pilot.chain_summary(acc, points_per_round=3, late_rounds=1)
  assert s["fm_chain"] == pytest.approx(sfedkd_pilot.forgetting_measure(acc[1:]))
  # The late round's FM reads the previous round's end (row 3) and the round's own points.
  assert s["fm_late_round"] == pytest.approx(sfedkd_pilot.forgetting_measure(acc[3:]))
  assert s["swing"] == pytest.approx(sfedkd_pilot.classwise_swing(acc)[3:].mean())
  assert s["final_acc"] == pytest.approx(CHAIN[0].mean()) and s["late_rounds"] == 1
  with pytest.raises(ValueError, match="rounds x 3"):
    sfedkd_pilot.chain_summary(acc[:-1], points_per_round=3, late_rounds=1)


def test_table_has_a_row_per_run_and_method():
  acc = np.vstack([[100.0, 0.0, 0.0], CHAIN, CHAIN[::-1]])
  summary = sfedkd_pilot.chain_summary(acc, points_per_round=3, late_rounds=1)
  run = {"summary": summary, "wall_s": 12.0}
  result = {
    "args": {"partition": "exdir:2:0.5", "local_epochs": 1, "rounds": 2},
    "methods": {"fedavg": run, "fedseq": run},
  }
  lines = sfedkd_pilot.table([result, result])
  assert len(lines) == 2 + 4
  assert lines[2].startswith("| exdir:2:0.5 | 1 x 2 | fedavg | ")
  assert f"| {summary['swing']:.1f} |" in lines[3] and lines[3].endswith("| 12 s |")
