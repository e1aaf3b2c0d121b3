"""benchmarks/perf/cpu_step.py's distance to the limit: achieved GFLOP/s, share of the GEMM peak.

The rates are the step's FLOPs over its CPU seconds, the share that rate over the core's measured
GEMM peak (docs/performance.md, "Distance to the limit"); the CNN step's FLOPs are counted from the
model by the peer benchmark's function, with XLA's cost analysis beside. No torch is needed: the
functions are tested directly (cpu_step's run itself needs torch for its other column).
"""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def cpu_step():
  from benchmarks.perf import cpu_step

  return cpu_step


def test_flop_rates_are_flops_over_cpu_seconds_and_over_the_peak(cpu_step):
  # 6.4 GFLOP a step in 0.1 s and in 0.25 s: 64 and 25.6 GFLOP/s; against 80 GFLOP/s, 80% and 32%.
  got = cpu_step.flop_rates(6.4e9, {"ours onednn": 0.1, "torch": 0.25}, 80.0)
  assert got["gflops_per_cpu_second"] == pytest.approx({"ours onednn": 64.0, "torch": 25.6})
  assert got["share_of_peak"] == pytest.approx({"ours onednn": 0.8, "torch": 0.32})


def test_flop_rates_without_a_peak_give_rates_only(cpu_step):
  got = cpu_step.flop_rates(1e9, {"torch": 0.5}, None)
  assert got == {"gflops_per_cpu_second": pytest.approx({"torch": 2.0})}


@pytest.mark.parametrize("flops,seconds", [(1e9, {"torch": 0.0}), (0.0, {"torch": 0.1})])
def test_flop_rates_refuse_zero_flops_or_seconds(cpu_step, flops, seconds):
  with pytest.raises(ValueError, match="seconds > 0"):
    cpu_step.flop_rates(flops, seconds, 100.0)


def test_cnn_step_flops_count_the_model_and_xla_leaves_out_the_padding(cpu_step):
  # By hand, 2 FLOPs a multiply-add: conv 5x5x3 -> 32 on 32x32, conv 5x5x32 -> 64 on 16x16,
  # dense 8*8*64 -> 512 and 512 -> 10; training = 3 forwards less conv_0's input gradient.
  conv0 = 2 * 32 * 32 * 32 * 5 * 5 * 3
  forward = conv0 + 2 * 16 * 16 * 64 * 5 * 5 * 32 + 2 * 8 * 8 * 64 * 512 + 2 * 512 * 10
  got = cpu_step.cnn_step_flops(2)
  assert got["counted"] == 2 * (3 * forward - conv0)
  assert got["used"] == "counted"
  # XLA's count skips the taps on the SAME padding (about 11% of the counted work; the SGD
  # update adds under 1%): below the dense count, but the same order.
  assert 0.8 * got["counted"] < got["xla"] < got["counted"]
