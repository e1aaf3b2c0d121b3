"""benchmarks/perf/cpu_step.py's distance to the limit: achieved GFLOP/s, share of the GEMM peak.

The rates are the step's FLOPs over its CPU seconds, the share that rate over the core's measured
GEMM peak (docs/performance.md, "Distance to the limit"); the CNN step's FLOPs are counted from the
model by the peer benchmark's function, ResNet-8's and FedProj's from the traced step's
convolutions and products (``matmul_flops``, which gives the CNN's hand count exactly), with XLA's
cost analysis beside. No torch is needed: the
functions are tested directly (cpu_step's run itself needs torch for its other column).
"""

from __future__ import annotations

import types

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


def test_matmul_flops_counts_products_convolutions_and_sub_programs(cpu_step):
  import jax
  import jax.numpy as jnp

  a, b = jnp.ones((3, 4)), jnp.ones((4, 5))
  assert cpu_step.matmul_flops(jax.make_jaxpr(jnp.dot)(a, b).jaxpr) == 2 * 3 * 5 * 4
  # 3x3 SAME convolution, 2 -> 6 features on 8x8, batch 2: every output element 3*3*2 MACs.
  x, w = jnp.ones((2, 8, 8, 2)), jnp.ones((3, 3, 2, 6))
  conv = lambda x, w: jax.lax.conv_general_dilated(  # noqa: E731
    x, w, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC")
  )
  assert cpu_step.matmul_flops(jax.make_jaxpr(conv)(x, w).jaxpr) == 2 * (2 * 8 * 8 * 6) * 3 * 3 * 2

  def scanned(a, b):  # 7 products inside a scan, plus a cond whose costlier branch has two
    c, _ = jax.lax.scan(lambda c, _: (c + jnp.dot(a, b).sum(), None), 0.0, None, length=7)
    return jax.lax.cond(c > 0, lambda: jnp.dot(a, b) @ b.T, lambda: a)

  got = cpu_step.matmul_flops(jax.make_jaxpr(scanned)(a, b).jaxpr)
  assert got == 7 * 120 + 120 + 2 * 3 * 4 * 5


def _program_and_data(model_name, batch):
  import jax
  import numpy as np
  import optax

  from fedjax_proj.algorithms import client as client_lib
  from fedjax_proj.data import pipeline
  from fedjax_proj.models import get_model

  rng = np.random.default_rng(0)
  x = rng.integers(0, 256, (batch, 32, 32, 3)).astype(np.uint8)
  y = rng.integers(0, 10, batch).astype(np.int32)
  normalize = pipeline.normalizer(0.0, 1.0)
  model = get_model(model_name, 10, conv_impl="xla")
  variables = model.init(jax.random.key(0), normalize(x[:2]))
  program = client_lib.local_training_client(
    model, optax.sgd(0.01), client_lib.cross_entropy_loss(model)
  )
  return model, program, pipeline.make_batch_fn(normalize), variables, x, y, normalize


def test_step_flops_of_the_cnn_equal_the_hand_count(cpu_step):
  _, program, batch_fn, variables, x, y, _ = _program_and_data("cnn", 2)
  got = cpu_step.step_flops(program, batch_fn, {"variables": variables}, x, y, 2)
  hand = cpu_step.cnn_step_flops(2)
  assert got["counted"] == hand["counted"]
  assert got["xla"] == pytest.approx(hand["xla"], rel=0.05)


def test_step_flops_of_resnet8_are_three_forwards_less_the_first_input_gradient(cpu_step):
  """Training costs a forward, a weight gradient and an input gradient per layer, except the
  first layer's input gradient (nobody needs the image's): 3 forwards less the stem's forward."""
  import jax

  model, program, batch_fn, variables, x, y, normalize = _program_and_data("resnet8", 2)
  got = cpu_step.step_flops(program, batch_fn, {"variables": variables}, x, y, 2)
  fwd_jaxpr = jax.make_jaxpr(lambda v, x: model.apply(v, x, train=True).logits)(
    variables, normalize(x)
  ).jaxpr
  forward = cpu_step.matmul_flops(fwd_jaxpr)

  def first_conv(jaxpr):
    from jax.extend.core import jaxprs_in_params

    for eqn in jaxpr.eqns:
      if eqn.primitive.name == "conv_general_dilated":
        return types.SimpleNamespace(eqns=[eqn])  # what matmul_flops reads of a jaxpr
      for sub in jaxprs_in_params(eqn.params):
        if (found := first_conv(sub)) is not None:
          return found
    return None

  stem = cpu_step.matmul_flops(first_conv(fwd_jaxpr))
  assert got["counted"] == 3 * forward - stem
  # Linear in the batch: twice the examples, twice the FLOPs.
  _, _, _, _, x4, y4, _ = _program_and_data("resnet8", 4)
  got4 = cpu_step.step_flops(program, batch_fn, {"variables": variables}, x4, y4, 4)
  assert got4["counted"] == 2 * got["counted"]
  # XLA leaves out the 3x3 convolutions' taps on the SAME padding: fewer, same order.
  assert 0.6 * got["counted"] < got["xla"] < got["counted"]


def test_step_flops_of_fedproj_count_the_private_and_the_memory_batch(cpu_step):
  """A FedProj step inside the projection window trains on the private batch and back-propagates
  the memory batch's distillation loss: two CNN training passes, the private one of ``b`` examples
  and the memory one of ``m``, plus the projection's dot products of parameter-sized gradient
  vectors (2 FLOPs a parameter each; a few, so at the benchmark's batch of 64 ~0.1% of the
  step). Outside the window the memory pass and the projection are gone."""
  import jax
  import jax.numpy as jnp
  import optax

  from fedjax_proj.algorithms.distillation.fedproj import projection_client

  model, _, batch_fn, variables, x, y, normalize = _program_and_data("cnn", 2)
  program = projection_client(
    model, optax.sgd(0.01), normalize, temperature=3.0, tau=1e-6, memory_batch_size=3,
    max_coef=10.0, memory_order="shuffle",
  )  # fmt: skip
  shared = {
    "variables": variables,
    "memory_images": jnp.asarray(x[:1].repeat(5, 0)),
    "memory_logits": jnp.zeros((5, 10)),
    "memory_labels": jnp.zeros(5, jnp.int32),
    "use_memory": jnp.asarray(True),
    "round0_ce": jnp.asarray(False),
  }
  per_example = cpu_step.cnn_step_flops(1)["counted"]
  got = cpu_step.step_flops(program, batch_fn, shared, x, y, 2)["counted"]
  params = sum(v.size for v in jax.tree.leaves(variables))
  dots, rest = divmod(got - (2 + 3) * per_example, 2 * params)
  assert rest == 0 and 1 <= dots <= 4, (dots, rest)
  outside = cpu_step.step_flops(program, batch_fn, {**shared, "use_memory": jnp.asarray(False)},
                                x, y, 2)["counted"]  # fmt: skip
  assert outside == 2 * per_example
