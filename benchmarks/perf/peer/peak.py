"""The core's measured peak and the model's counted FLOPs, for the peer benchmark's share of peak.

    python -m benchmarks.perf.peer.peak  # run by perf.peer.run under the runners' pinning

Peak: the best float32 GEMM rate of numpy (its BLAS) and of jax.numpy (XLA:CPU's Eigen/oneDNN) on
square n x n matrices, 2 n^3 FLOPs each, best of several repeats after a warm-up: a GEMM is the
most arithmetic-dense kernel there is, so its rate is what the cores can reach in practice. Rates
are per CPU second (``time.process_time``), as the runners' are, so that the other engineers' load
on this shared machine, which stretches wall time, cancels out of the share.
FLOPs: XLA's cost analysis of one compiled FedAvg CNN training step (forward, loss, gradient, SGD
update; ``conv_impl="xla"``, since a custom call's work is invisible to it) next to the count of
``common.cnn_train_flops_per_example``, so the runners' GFLOP/s rests on two independent counts.
"""

from __future__ import annotations

import json
import time

import numpy as np

from benchmarks.perf.peer.common import cnn_train_flops_per_example


def _best_rate(matmul, a, b, repeats: int, clock=time.process_time) -> float:
  matmul(a, b)  # warm-up (compilation for jax, thread start for BLAS)
  best = float("inf")
  for _ in range(repeats):
    t0 = clock()
    matmul(a, b)
    best = min(best, clock() - t0)
  return 2 * a.shape[0] ** 3 / best / 1e9


def _operands(n: int):
  return np.random.default_rng(0).standard_normal((2, n, n), dtype=np.float32)


def jax_gemm_rate(n: int, repeats: int = 10, clock=time.process_time) -> float:
  """Best float32 GFLOP/s of jax.numpy's n x n GEMM on the default device, timed by ``clock``
  (CPU seconds on a CPU, as the runners; wall seconds on an accelerator, whose work the host's
  CPU clock does not see)."""
  import jax
  import jax.numpy as jnp

  a, b = _operands(n)
  mm = jax.jit(jnp.matmul)
  ja, jb = jnp.asarray(a), jnp.asarray(b)
  return _best_rate(lambda x, y: mm(x, y).block_until_ready(), ja, jb, repeats, clock)


def gemm_peak(n: int = 1024, repeats: int = 10) -> dict:
  """Best float32 GEMM GFLOP/s of numpy and of jax.numpy on n x n matrices."""
  a, b = _operands(n)
  numpy_rate = _best_rate(np.matmul, a, b, repeats)
  jax_rate = jax_gemm_rate(n, repeats)
  return {"n": n, "numpy_gflops": numpy_rate, "jax_gflops": jax_rate,
          "peak_gflops": max(numpy_rate, jax_rate)}  # fmt: skip


def xla_step_flops(batch: int = 32) -> float:
  """XLA's FLOP count of one SGD step of the FedAvg CNN on a CIFAR-10 batch."""
  import jax
  import jax.numpy as jnp
  import optax

  from fedjax_proj.models import get_model

  model = get_model("cnn", 10, conv_impl="xla")
  x = jnp.zeros((batch, 32, 32, 3), jnp.float32)
  y = jnp.zeros((batch,), jnp.int32)
  params = model.init(jax.random.key(0), x[:1])

  def step(p, x, y):
    def loss(p):
      logits = model.apply(p, x, train=True).logits
      return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()

    g = jax.grad(loss)(p)
    return jax.tree.map(lambda a, b: a - 0.05 * b, p, g)

  cost = jax.jit(step).lower(params, x, y).compile().cost_analysis()
  cost = cost[0] if isinstance(cost, list) else cost
  return float(cost["flops"])


def main() -> None:
  out = gemm_peak()
  counted = cnn_train_flops_per_example()["train"]
  try:
    xla = xla_step_flops(32) / 32
  except Exception as e:  # noqa: BLE001 - the check is optional; the count stands on its own
    xla = None
    out["xla_error"] = f"{type(e).__name__}: {e}"
  out.update({"counted_train_flops_per_example": counted, "xla_train_flops_per_example": xla})
  print(json.dumps(out))


if __name__ == "__main__":
  main()
