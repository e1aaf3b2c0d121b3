"""One training step on one pinned CPU core: ours against PyTorch and the FedProj authors' client.

    taskset -c 1 python -m benchmarks.perf.cpu_step --authors_repo=/path/to/FedProj_Neurips

Both sides run in this one process on one core (``os.sched_setaffinity``), torch with one intra-op
thread, oneDNN's OpenMP at one thread (``OMP_NUM_THREADS=1`` unless set), XLA:CPU without its
multi-threaded Eigen (``--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1``, set
before JAX is imported). Each case is compiled (or warmed) once, the compile timed apart, then
timed in rounds alternating A, B, B, A; every timing records
process CPU seconds and wall seconds, and the tables give medians with the [min, max] spread. The
machine's cores are shared with other jobs, so CPU time is the fairer measure.

``--unpinned`` measures the multi-core step instead: no affinity, XLA:CPU's default threading,
torch at ``--torch_threads`` (default: every core), ``OMP_NUM_THREADS`` as the environment has it
(unset: OpenMP's one thread per core). The speedups are then of wall seconds (the step's latency;
process CPU seconds add up every thread, spinning OpenMP waiters included, and are kept beside).

Cases (the same batches, and for the CNN the same initial weights, on both sides):

- ``conv``: each convolution's kernel gradient (ours: XLA's own, ``xla``, the matmul one,
  ``gemm_grad``, and oneDNN's through an FFI call, ``onednn_grad``, where oneDNN's wheels are
  installed, as on Linux x86-64; :mod:`fedjax_proj.models.conv`) and input gradient, against torch's
  ``convolution_backward``, for the CNN at batch 64 and 256 and ResNet-8 at batch 64; with the
  wheels also ``conv_impl="onednn"``'s forward and input gradient (oneDNN's forward and
  backward-data primitives) against XLA's and torch's forward.
- ``pool``: the CNN's ReLU and 2x2 max pooling, forward and gradient, at its two activation
  shapes (batch 64): flax's ``nn.max_pool`` (XLA's reduce_window, its gradient select_and_scatter),
  the same maximum as a reshape to the 2x2 windows and ``jnp.max`` (its gradient splits ties), and
  the models' :func:`fedjax_proj.models.pool.max_pool` (that reshape with flax's tie rule),
  against torch's.
- ``cnn_step``: a FedAvg client step of the CNN (SGD with momentum, batch 64): our sequential
  strategy's jitted step (:class:`fedjax_proj.core.engine.ClientEngine`) with ``conv_impl`` xla,
  gemm_grad and (when available) onednn_grad and onednn, against a torch loop step; the last
  ``conv_impl`` also with the models' pooling traced as flax's ``nn.max_pool`` (``... flax
  pool``), the library before :mod:`fedjax_proj.models.pool`, side by side.
- ``fedproj_step``: a FedProj client step inside the projection window (our client with the
  ``paper_code`` preset's Adam, memory batch 64 and 256) against the authors' ``Client_FedProj``
  (``src/client/client_fedproj.py``, loaded from ``--authors_repo``; the memory batch size of its
  DataLoader set to the case's), whose ``train`` runs two whole local epochs (its StepLR needs
  two): its time per step is theirs over its steps (its optimizer's creation included).
- ``resnet8_step``: as ``cnn_step`` for ResNet-8 (torch: benchmarks/perf/torch_reference.py's
  ResNet-8 with torch's own initial weights; the speed of a step does not depend on the weights).

Writes ``results/cpu_step.json`` (``--out``): per case the seconds of every timing,
medians and, for the steps, ``speedup_vs_torch`` / ``speedup_vs_authors`` = their median CPU
seconds over ours (above 1: ours is faster), for each of our ``conv_impl``. The distance to the
limit (docs/performance.md, "Peer benchmark"), for the training steps (``cnn_step``,
``resnet8_step``, ``fedproj_step``): ``flops_per_step`` (counted from the model: the CNN's by hand,
the others' from the traced step's convolutions and matrix products, :func:`matmul_flops`, which
gives the CNN's hand count exactly; XLA's cost analysis beside), per
implementation ``gflops_per_cpu_second`` (those FLOPs over its CPU seconds per step) and
``share_of_peak``, against ``peak``: the core's float32 GEMM rate per CPU second, measured in the
same process under the same pinning before the cases (``benchmarks.perf.peer.peak``, reused as is).
"""

from __future__ import annotations

import argparse
import ast
import copy
import os
import platform
import statistics
import sys
import time
from pathlib import Path

from benchmarks.results_io import RESULTS_DIR, write_results

# The cases of --cases, and our conv_impl columns --conv_impls may pick (models/conv.py's
# CONV_IMPLS without the patches ones; the onednn pair needs the cpu-onednn extra). Named here, not
# imported, since JAX must not load before one_thread_environment sets its flags.
CASES = ("conv", "pool", "cnn_step", "fedproj_step", "resnet8_step")
COLUMNS = ("xla", "gemm_grad", "onednn_grad", "onednn")


def _pin(cpu: int | None) -> int:
  cpu = min(os.sched_getaffinity(0)) if cpu is None else cpu
  os.sched_setaffinity(0, {cpu})
  return cpu


def conv_impls() -> tuple[str, ...]:
  """Our ``conv_impl`` columns: xla, gemm_grad, and onednn_grad and onednn where the handler loads
  (else the one line saying why not is printed and those columns left out)."""
  from fedjax_proj.models import onednn

  reason = onednn.unavailable_reason()
  if reason:
    print(reason, flush=True)
    return ("xla", "gemm_grad")
  return ("xla", "gemm_grad", "onednn_grad", "onednn")


def _threads() -> int | None:
  task = Path("/proc/self/task")
  return len(list(task.iterdir())) if task.exists() else None


def _mapped(name: str) -> list[str]:
  maps = Path("/proc/self/maps")
  if not maps.exists():
    return []
  paths = {ln.split()[-1] for ln in maps.read_text().splitlines() if name in ln}
  return sorted(paths)


def _timed(fn, reps: int) -> tuple[float, float]:
  """(CPU s, wall s) per call of ``fn`` over ``reps`` calls."""
  c, w = time.process_time(), time.perf_counter()
  for _ in range(reps):
    fn()
  return (time.process_time() - c) / reps, (time.perf_counter() - w) / reps


# torch's intra-op threads while a torch callable runs, and the OpenMP default to restore after
# (set by main). torch.set_num_threads sets the calling thread's OpenMP thread count, which
# oneDNN's calls from that thread would otherwise inherit (torch and oneDNN share one libgomp).
TORCH_THREADS = {"torch": 1, "restore": 1}


def _is_theirs(name: str) -> bool:
  return name == "authors" or name.split()[0] == "torch"


def _with_torch_threads(fn):
  def run():
    torch = sys.modules["torch"]
    torch.set_num_threads(TORCH_THREADS["torch"])
    try:
      return fn()
    finally:
      torch.set_num_threads(TORCH_THREADS["restore"])

  return run


def alternate(fns: dict, rounds: int, reps: int) -> dict:
  """Times every callable in ``fns`` (after one warm-up call each, timed as ``first``) in
  ``rounds`` rounds whose order alternates forward and backward (A B B A ...); theirs (torch's,
  the authors') at ``TORCH_THREADS``."""
  fns = {n: _with_torch_threads(f) if _is_theirs(n) else f for n, f in fns.items()}
  out = {n: {"first_cpu": 0.0, "cpu": [], "wall": []} for n in fns}
  for n, f in fns.items():
    c = time.process_time()
    f()
    out[n]["first_cpu"] = time.process_time() - c
  names = list(fns)
  for r in range(rounds):
    for n in names if r % 2 == 0 else names[::-1]:
      cpu, wall = _timed(fns[n], reps)
      out[n]["cpu"].append(cpu)
      out[n]["wall"].append(wall)
  for v in out.values():
    for k in ("cpu", "wall"):
      v[f"{k}_median"] = statistics.median(v[k])
      v[f"{k}_spread"] = [min(v[k]), max(v[k])]
  return out


# ---------------------------------------------------------------------------------------------
# Convolution gradients


CONVS = {
  # name: (batch, H, cin, cout, kernel, stride, padding)
  "cnn.conv_0 b64": (64, 32, 3, 32, 5, 1, 2),
  "cnn.conv_1 b64": (64, 16, 32, 64, 5, 1, 2),
  "cnn.conv_0 b256": (256, 32, 3, 32, 5, 1, 2),
  "cnn.conv_1 b256": (256, 16, 32, 64, 5, 1, 2),
  "resnet8.stem b64": (64, 32, 3, 16, 3, 1, 1),
  "resnet8.stage1 b64": (64, 32, 16, 16, 3, 1, 1),
  "resnet8.stage2.conv_0 b64": (64, 32, 16, 32, 3, 2, 1),
  "resnet8.stage2.conv_1 b64": (64, 16, 32, 32, 3, 1, 1),
  "resnet8.stage2.shortcut b64": (64, 32, 16, 32, 1, 2, 0),
  "resnet8.stage3.conv_1 b64": (64, 8, 64, 64, 3, 1, 1),
}


def conv_case(name, rounds, reps, impls):
  import jax
  import numpy as np
  import torch

  from fedjax_proj.models import conv as conv_lib

  b, h, cin, cout, k, s, p = CONVS[name]
  rng = np.random.default_rng(0)
  x = rng.standard_normal((b, h, h, cin)).astype(np.float32)
  w = (rng.standard_normal((k, k, cin, cout)) * 0.1).astype(np.float32)
  pad = ((p, p), (p, p))
  conv = lambda x, w: conv_lib.conv2d(x, w, (s, s), pad)  # noqa: E731
  g = rng.standard_normal(jax.eval_shape(conv, x, w).shape).astype(np.float32)
  dw_xla = jax.jit(lambda x, w, g: jax.vjp(lambda w: conv(x, w), w)[1](g)[0])
  dw_gemm = jax.jit(lambda x, w, g: conv_lib.gemm_kernel_grad(x, g, w.shape, (s, s), pad))
  dw_onednn = jax.jit(lambda x, w, g: conv_lib.onednn_kernel_grad(x, g, w.shape, (s, s), pad))
  dx = jax.jit(lambda x, w, g: jax.vjp(lambda x: conv(x, w), x)[1](g)[0])
  dx_onednn = jax.jit(lambda x, w, g: conv_lib.onednn_input_grad(g, w, x.shape, (s, s), pad))
  fwd = jax.jit(conv)
  fwd_onednn = jax.jit(lambda x, w: conv_lib.onednn_forward(x, w, (s, s), pad))
  xt = torch.from_numpy(x.transpose(0, 3, 1, 2).copy())
  wt = torch.from_numpy(w.transpose(3, 2, 0, 1).copy())
  gt = torch.from_numpy(g.transpose(0, 3, 1, 2).copy())

  def torch_bw(mask):
    with torch.no_grad():
      return torch.ops.aten.convolution_backward(
        gt, xt, wt, None, (s, s), (p, p), (1, 1), False, (0, 0), 1, mask
      )

  got = np.asarray(dw_gemm(x, w, g))
  ref = np.asarray(dw_xla(x, w, g))
  theirs = torch_bw((False, True, False))[1].numpy().transpose(2, 3, 1, 0)
  fns = {
    "ours dW xla": lambda: dw_xla(x, w, g).block_until_ready(),
    "ours dW gemm_grad": lambda: dw_gemm(x, w, g).block_until_ready(),
    "torch dW": lambda: torch_bw((False, True, False)),
    "ours dX": lambda: dx(x, w, g).block_until_ready(),
    "torch dX": lambda: torch_bw((True, False, False)),
  }
  if "onednn_grad" in impls:
    fns["ours dW onednn_grad"] = lambda: dw_onednn(x, w, g).block_until_ready()
  if "onednn" in impls:  # conv_impl="onednn": oneDNN's forward and input gradient too
    fns["ours fwd xla"] = lambda: fwd(x, w).block_until_ready()
    fns["ours fwd onednn"] = lambda: fwd_onednn(x, w).block_until_ready()
    fns["torch fwd"] = lambda: torch_fwd()
    fns["ours dX onednn"] = lambda: dx_onednn(x, w, g).block_until_ready()

  def torch_fwd():
    with torch.no_grad():
      return torch.nn.functional.conv2d(xt, wt, None, (s, s), (p, p))

  res = alternate(fns, rounds, reps)
  scale = float(np.abs(ref).max())
  res["max_rel_diff"] = {
    "gemm_grad_vs_xla": float(np.abs(got - ref).max() / scale),
    "torch_vs_xla": float(np.abs(theirs - ref).max() / scale),
  }
  if "onednn" in impls:
    y_ref, dx_ref = np.asarray(fwd(x, w)), np.asarray(dx(x, w, g))
    res["max_rel_diff"]["onednn_fwd_vs_xla"] = float(
      np.abs(np.asarray(fwd_onednn(x, w)) - y_ref).max() / np.abs(y_ref).max()
    )
    res["max_rel_diff"]["onednn_dx_vs_xla"] = float(
      np.abs(np.asarray(dx_onednn(x, w, g)) - dx_ref).max() / np.abs(dx_ref).max()
    )
  if "onednn_grad" in impls:
    mine = np.asarray(dw_onednn(x, w, g))
    res["max_rel_diff"]["onednn_grad_vs_xla"] = float(np.abs(mine - ref).max() / scale)
    # float64 truth: which float32 summation order is nearer (XLA's, gemm_grad's or oneDNN's).
    x64, g64 = x.astype(np.float64), g.astype(np.float64)
    truth = torch.ops.aten.convolution_backward(
      torch.from_numpy(g64.transpose(0, 3, 1, 2).copy()),
      torch.from_numpy(x64.transpose(0, 3, 1, 2).copy()),
      wt.double(), None, (s, s), (p, p), (1, 1), False, (0, 0), 1, (False, True, False),
    )[1].numpy().transpose(2, 3, 1, 0)  # fmt: skip
    res["max_rel_err_vs_float64"] = {
      n: float(np.abs(v - truth).max() / scale)
      for n, v in (("xla", ref), ("gemm_grad", got), ("onednn_grad", mine), ("torch", theirs))
    }
  return res


POOLS = {"cnn.pool_0 b64": (64, 32, 32), "cnn.pool_1 b64": (64, 16, 64)}


def pool_case(name, rounds, reps):
  import flax.linen as nn
  import jax
  import jax.numpy as jnp
  import numpy as np
  import torch

  from fedjax_proj.models.pool import max_pool

  b, h, c = POOLS[name]
  a = jnp.asarray(np.random.default_rng(0).standard_normal((b, h, h, c)), jnp.float32)

  def window_max(x):  # non-overlapping 2x2 windows as axes 2 and 4
    return jnp.max(x.reshape(b, h // 2, 2, h // 2, 2, c), axis=(2, 4))

  pools = {
    "flax max_pool": lambda x: nn.max_pool(x, (2, 2), strides=(2, 2)),
    "reshape max": window_max,
    "models.pool max_pool": lambda x: max_pool(x, (2, 2), strides=(2, 2), impl="reshape"),
  }
  grads = {
    n: jax.jit(jax.grad(lambda a, p=p: jnp.sum(p(nn.relu(a)) ** 2))) for n, p in pools.items()
  }
  fns = {f"ours {n}": (lambda f=f: f(a).block_until_ready()) for n, f in grads.items()}
  at = torch.from_numpy(np.asarray(a).transpose(0, 3, 1, 2).copy()).requires_grad_()

  def torch_run():
    at.grad = None
    torch.sum(torch.nn.functional.max_pool2d(torch.relu(at), 2) ** 2).backward()

  fns["torch"] = torch_run
  res = alternate(fns, rounds, reps)
  ref = np.asarray(grads["flax max_pool"](a))
  res["reshape_max_grad_equals_flax"] = bool(
    np.array_equal(np.asarray(grads["reshape max"](a)), ref)
  )
  res["models_pool_grad_equals_flax"] = bool(
    np.array_equal(np.asarray(grads["models.pool max_pool"](a)), ref)
  )
  return res


# ---------------------------------------------------------------------------------------------
# Steps


def _cifar_batches(n_steps, batch, seed=0):
  import numpy as np

  rng = np.random.default_rng(seed)
  x = rng.integers(0, 256, (n_steps * batch, 32, 32, 3)).astype(np.uint8)
  y = rng.integers(0, 10, n_steps * batch).astype(np.int32)
  return x, y


def _our_engine(program, batch_fn):
  from fedjax_proj.core.engine import ClientEngine

  return ClientEngine(program, batch_fn, "sequential")


def _step_runner(engine, shared, images, labels, batch, steps):
  """Our sequential strategy's client loop over ``steps`` steps of ``batch`` (one client)."""
  import jax
  import jax.numpy as jnp
  import numpy as np

  idx = np.arange(steps * batch, dtype=np.int32).reshape(1, steps, batch)
  mask = np.ones_like(idx, dtype=bool)
  keys = jax.random.split(jax.random.key(0), 1)
  images, labels = jax.device_put(images), jax.device_put(labels)

  def run():
    out = engine.run(shared, {}, images, labels, jnp.asarray(idx), mask, keys)
    jax.block_until_ready(out)

  return run


def _per_step(res: dict, fns: dict, steps_of, theirs: str) -> None:
  """Adds to ``res`` the seconds per step of every timed callable (CPU and wall medians over
  ``steps_of(name)`` steps) and each of ours' speedup against ``theirs`` (their time over ours;
  above 1: ours is faster): ``speedup_vs_<theirs>`` of CPU seconds, ``wall_speedup_vs_<theirs>``
  of wall seconds."""
  ours = [n for n in fns if n.startswith("ours ")]
  for k in ("cpu", "wall"):
    per_step = {n: res[n][f"{k}_median"] / steps_of(n) for n in fns}
    res[f"{k}_seconds_per_step"] = per_step
    prefix = "" if k == "cpu" else "wall_"
    res[f"{prefix}speedup_vs_{theirs}"] = {
      n[len("ours ") :]: per_step[theirs] / per_step[n] for n in ours
    }


def flop_rates(flops_per_step: float, seconds_per_step: dict, peak_gflops: float | None) -> dict:
  """Achieved GFLOP/s of every timed step and its share of the measured peak.

  Args:
    flops_per_step: the training FLOPs of one step (the same model and batch on every side).
    seconds_per_step: CPU seconds of one step per callable name (``cpu_seconds_per_step``).
    peak_gflops: the core's GEMM rate per CPU second (``benchmarks.perf.peer.peak.gemm_peak``), or
      None where it was not measured (then no shares).

  Returns:
    ``gflops_per_cpu_second`` (FLOPs / CPU seconds / 1e9) and, with a peak, ``share_of_peak``
    (that rate over the peak: 1 is the rate of a large GEMM on the same core), each per name.
  """
  if flops_per_step <= 0 or any(s <= 0 for s in seconds_per_step.values()):
    raise ValueError(
      f"flop_rates needs FLOPs > 0 and seconds > 0 per step, got {flops_per_step} and "
      f"{seconds_per_step}; a zero timing means --reps or --steps too small for the clock"
    )
  rates = {n: flops_per_step / s / 1e9 for n, s in seconds_per_step.items()}
  out = {"gflops_per_cpu_second": rates}
  if peak_gflops:
    out["share_of_peak"] = {n: r / peak_gflops for n, r in rates.items()}
  return out


def cnn_step_flops(batch: int) -> dict:
  """FLOPs of one FedAvg CNN training step of ``batch`` examples, counted two ways, with the
  peer benchmark's functions (docs/performance.md, "Peer benchmark"): ``counted``, the
  model's multiply-adds (``benchmarks.perf.peer.common.cnn_train_flops_per_example`` x batch,
  the one the rates use, as the peer benchmark's do), and ``xla``, XLA's cost analysis of the
  compiled step (``benchmarks.perf.peer.peak.xla_step_flops``; it leaves out the SAME padding's
  taps, which dense kernels compute anyway; None with the reason where it fails)."""
  from benchmarks.perf.peer.common import cnn_train_flops_per_example
  from benchmarks.perf.peer.peak import xla_step_flops

  out = {"counted": cnn_train_flops_per_example()["train"] * batch, "used": "counted"}
  try:
    out["xla"] = xla_step_flops(batch)
  except Exception as e:  # noqa: BLE001 - the second count is a check; the first stands alone
    out["xla"], out["xla_error"] = None, f"{type(e).__name__}: {e}"
  return out


_MATMULS = ("dot_general", "conv_general_dilated")


def matmul_flops(jaxpr) -> int:
  """FLOPs (2 per multiply-add) of every convolution and matrix product in ``jaxpr``.

  A convolution costs 2 x output elements x (kernel window x input features per group), taps over
  SAME padding included (what dense kernels compute, as ``cnn_train_flops_per_example`` counts),
  the zeros that dilate a strided convolution's input gradient left out (so that gradient costs
  what the forward does);
  a ``dot_general`` 2 x output elements x contracted size. Sub-programs count too: a ``scan`` times
  its length, a ``cond`` its costliest branch. Element-wise work, reductions and pooling are left
  out (about 1% of a CNN step, ``cnn_train_flops_per_example``).
  """
  import math

  from jax.extend.core import jaxprs_in_params

  total = 0
  for eqn in jaxpr.eqns:
    name = eqn.primitive.name
    out = math.prod(eqn.outvars[0].aval.shape) if name in _MATMULS else 0
    if name == "dot_general":
      (contract, _), _ = eqn.params["dimension_numbers"]
      lhs = eqn.invars[0].aval.shape
      total += 2 * out * math.prod(lhs[d] for d in contract)
    elif name == "conv_general_dilated":
      rhs = eqn.invars[1].aval.shape
      out_feature_dim = eqn.params["dimension_numbers"].rhs_spec[0]
      # The input gradient of a strided convolution is a convolution of the cotangent dilated
      # with zeros (lhs_dilation): only 1 in prod(dilation) of its taps multiplies a value.
      holes = math.prod(eqn.params.get("lhs_dilation") or (1,))
      total += 2 * out * math.prod(rhs) // rhs[out_feature_dim] // holes
    else:
      subs = [matmul_flops(sub) for sub in jaxprs_in_params(eqn.params)]
      if not subs:
        continue
      if name == "cond":
        total += max(subs)
      elif name == "scan":
        total += eqn.params["length"] * sum(subs)
      else:
        total += sum(subs)
  return total


def step_flops(program, batch_fn, shared, images, labels, batch: int) -> dict:
  """FLOPs of one local step of a :class:`~fedjax_proj.core.engine.ClientProgram` on a full batch
  of ``batch`` examples, counted two ways: ``counted``, :func:`matmul_flops` of the traced step
  (the model's convolutions and matrix products as the program runs them, forward and backward;
  the one the rates use), and ``xla``, XLA's cost analysis of the compiled step (None with the
  reason where it fails). Build ``program`` on ``conv_impl="xla"``: a convolution run as a
  library call is not a convolution in the trace."""
  import jax
  import jax.numpy as jnp

  from fedjax_proj.core.engine import specialize, static_values

  program = specialize(program, static_values(program, shared))
  key = jax.random.key(0)
  idx, mask = jnp.arange(batch, dtype=jnp.int32), jnp.ones(batch, bool)
  init = (shared, {}, key) + ((jnp.int32(1),) if program.round_steps else ())
  state = program.init(*init)
  images, labels = jnp.asarray(images), jnp.asarray(labels)

  def step(state):
    return program.step(shared, state, batch_fn(images, labels, idx, mask, key), key)

  out = {"counted": matmul_flops(jax.make_jaxpr(step)(state).jaxpr), "used": "counted"}
  try:
    cost = jax.jit(step).lower(state).compile().cost_analysis()
    out["xla"] = float((cost[0] if isinstance(cost, list) else cost)["flops"])
  except Exception as e:  # noqa: BLE001 - the second count is a check; the first stands alone
    out["xla"], out["xla_error"] = None, f"{type(e).__name__}: {e}"
  return out


def _with_flax_pool(run):
  """``run`` with every model's max pooling traced as flax's ``nn.max_pool`` (the library's path
  before :mod:`fedjax_proj.models.pool`), for a side-by-side timing: the patch is held around every
  call, so whichever call compiles sees it."""
  from unittest import mock

  def patched():
    with mock.patch("fedjax_proj.models.pool.pool_impl_for", lambda backend=None: "reduce_window"):
      run()

  return patched


def torch_client(net, images, labels, batch, steps):
  """A torch FedAvg client of ``steps`` SGD-with-momentum steps of ``batch`` on the normalised NHWC
  ``images``, each call starting from ``net``'s weights as given (the global model, as ours)."""
  import numpy as np
  import torch

  init_state = copy.deepcopy(net.state_dict())
  xt = torch.from_numpy(np.asarray(images).transpose(0, 3, 1, 2).copy())
  yt = torch.from_numpy(np.asarray(labels).astype(np.int64))

  def run():
    net.load_state_dict(init_state)
    net.train()
    opt = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9)
    for s in range(steps):
      sl = slice(s * batch, (s + 1) * batch)
      opt.zero_grad()
      torch.nn.functional.cross_entropy(net(xt[sl]), yt[sl]).backward()
      opt.step()

  return run


def fedavg_step_case(
  model_name, rounds, reps, steps, batch, torch_init_from_ours, impls, flax_pool=True, peak=None
):
  import jax
  import numpy as np
  import optax

  from benchmarks.perf.torch_reference import torch_cifar_model
  from fedjax_proj.algorithms import client as client_lib
  from fedjax_proj.data import pipeline
  from fedjax_proj.models import get_model

  x, y = _cifar_batches(steps, batch)
  normalize = pipeline.normalizer(0.0, 1.0)
  batch_fn = pipeline.make_batch_fn(normalize, augment=False)
  opt = optax.sgd(0.01, momentum=0.9)
  fns = {}
  variables = None
  for impl in impls:
    model = get_model(model_name, 10, conv_impl=impl)
    if variables is None:
      variables = model.init(jax.random.key(0), normalize(x[:2]))
    program = client_lib.local_training_client(model, opt, client_lib.cross_entropy_loss(model))
    run = _step_runner(_our_engine(program, batch_fn), {"variables": variables}, x, y, batch, steps)
    fns[f"ours {impl}"] = run
    if flax_pool and impl == impls[-1]:
      run = _step_runner(
        _our_engine(program, batch_fn), {"variables": variables}, x, y, batch, steps
      )
      fns[f"ours {impl} flax pool"] = _with_flax_pool(run)
  net = torch_cifar_model(model_name)
  if torch_init_from_ours:
    from benchmarks.perf.torch_reference import torch_state_from_flax

    net.load_state_dict(torch_state_from_flax(jax.tree.map(np.asarray, variables)))
  fns["torch"] = torch_client(net, normalize(x), y, batch, steps)
  res = alternate(fns, rounds, reps)
  _per_step(res, fns, lambda n: steps, "torch")
  if model_name == "cnn":  # the hand count, as the peer benchmark's (equal to step_flops')
    res["flops_per_step"] = cnn_step_flops(batch)
  else:  # counted from the traced step of the same program on XLA's convolutions
    model = get_model(model_name, 10, conv_impl="xla")
    program = client_lib.local_training_client(model, opt, client_lib.cross_entropy_loss(model))
    shared = {"variables": variables}
    res["flops_per_step"] = step_flops(program, batch_fn, shared, x[:batch], y[:batch], batch)
  res.update(flop_rates(res["flops_per_step"]["counted"], res["cpu_seconds_per_step"], peak))
  return res


def _authors_client(repo: Path, memory_batch: int):
  """The authors' Client_FedProj class, its memory DataLoader's batch set to ``memory_batch``
  (their file fixes 256) and without the integer cast of the memory (their lines 85-86, a defect
  our paper_code preset leaves off too; benchmarks/parity/fedproj.py)."""
  import numpy as np
  import torch
  import torch.nn.functional as F
  from torch import nn

  text = (repo / "src" / "client" / "client_fedproj.py").read_text()
  want = "public_dl = torch.utils.data.DataLoader(public_ds, batch_size=256,"
  if want not in text:
    raise ValueError(f"{repo}: client_fedproj.py has no {want!r}; another version of the code?")
  text = text.replace(want, want.replace("256", str(memory_batch)))
  text = text.replace(".type(torch.LongTensor).float().to(self.device)", ".float().to(self.device)")
  tree = ast.parse(text)
  keep = [n for n in tree.body if getattr(n, "name", None) == "Client_FedProj"]
  namespace = {"np": np, "torch": torch, "copy": copy, "nn": nn, "F": F, "optim": torch.optim}
  exec(compile(ast.Module(keep, []), "client_fedproj.py", "exec"), namespace)
  return namespace["Client_FedProj"]


def fedproj_step_case(
  args, memory_batch, rounds, reps, steps, batch, impls, flax_pool=True, peak=None
):
  import jax
  import jax.numpy as jnp
  import numpy as np
  import optax
  import torch

  from benchmarks.perf.torch_reference import torch_cnn, torch_state_from_flax
  from fedjax_proj.algorithms.distillation.fedproj import projection_client
  from fedjax_proj.data import pipeline
  from fedjax_proj.models import get_model

  x, y = _cifar_batches(steps, batch)
  public, _ = _cifar_batches(4, memory_batch, seed=1)
  rng = np.random.default_rng(2)
  logits = rng.standard_normal((len(public), 10)).astype(np.float32)
  normalize = pipeline.normalizer(0.0, 1.0)
  batch_fn = pipeline.make_batch_fn(normalize, augment=False)
  opt = optax.adamw(1e-3, weight_decay=5e-5)  # the code's Adam(lr, weight_decay=5e-5)
  fns = {}
  variables = None

  def program_of(model):
    return projection_client(
      model, opt, normalize, temperature=3.0, tau=1e-6, memory_batch_size=memory_batch,
      max_coef=10.0, memory_order="shuffle",
    )  # fmt: skip

  for impl in impls:
    model = get_model("cnn", 10, conv_impl=impl)
    if variables is None:
      variables = model.init(jax.random.key(0), normalize(x[:2]))
    program = program_of(model)
    shared = {
      "variables": variables,
      "memory_images": jnp.asarray(public),
      "memory_logits": jnp.asarray(logits),
      "memory_labels": jnp.zeros(len(public), jnp.int32),
      "use_memory": jnp.asarray(True),
      "round0_ce": jnp.asarray(False),
    }
    fns[f"ours {impl}"] = _step_runner(_our_engine(program, batch_fn), shared, x, y, batch, steps)
    if flax_pool and impl == impls[-1]:
      run = _step_runner(_our_engine(program, batch_fn), shared, x, y, batch, steps)
      fns[f"ours {impl} flax pool"] = _with_flax_pool(run)
  client_cls = _authors_client(Path(args.authors_repo), memory_batch)
  net = torch_cnn()
  net.load_state_dict(torch_state_from_flax(jax.tree.map(np.asarray, variables)))
  init_state = copy.deepcopy(net.state_dict())
  xt = torch.from_numpy(np.asarray(normalize(x)).transpose(0, 3, 1, 2).copy())
  yt = torch.from_numpy(y.astype(np.int64))
  pub = torch.from_numpy(np.asarray(normalize(public)).transpose(0, 3, 1, 2).copy())
  public_ds = torch.utils.data.TensorDataset(pub, torch.zeros(len(pub)), torch.from_numpy(logits))
  loader = [
    (xt[s * batch : (s + 1) * batch], yt[s * batch : (s + 1) * batch]) for s in range(steps)
  ]

  def authors_run():
    net.load_state_dict(init_state)
    # Two local epochs: their StepLR's step is local_ep // 2, which one epoch makes 0.
    client = client_cls("c0", net, batch, 2, 1e-3, 0.9, 3.0, "cpu", train_dl_local=loader)
    client.train(public_ds, is_proj=True)

  fns["authors"] = authors_run
  res = alternate(fns, rounds, reps)
  _per_step(res, fns, lambda n: 2 * steps if n == "authors" else steps, "authors")
  # A step: the private batch's and the memory batch's forward and backward and the projection.
  program = program_of(get_model("cnn", 10, conv_impl="xla"))
  res["flops_per_step"] = step_flops(program, batch_fn, shared, x[:batch], y[:batch], batch)
  res.update(flop_rates(res["flops_per_step"]["counted"], res["cpu_seconds_per_step"], peak))
  return res


def one_thread_environment() -> None:
  """XLA:CPU without its multi-threaded Eigen and oneDNN's OpenMP at one thread (unless
  ``OMP_NUM_THREADS`` is set): both read when they load, so set before JAX is imported."""
  os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "")
    + " --xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"
  ).strip()
  os.environ.setdefault("OMP_NUM_THREADS", "1")


def keep_freed_memory() -> dict[str, str]:
  """What a training run's entry point does first (fedjax_proj.configs.common.keep_step_memory):
  XLA:CPU's per-step buffers kept in the heap; the parts that could not apply, printed."""
  from fedjax_proj.training import host_memory

  missing = host_memory.keep_freed_memory()
  for part, line in missing.items():
    print(f"note: {part}: {line}", flush=True)
  return missing


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--authors_repo", default="", help="checkout of the FedProj authors' code")
  ap.add_argument("--cpu", type=int, default=None, help="core to pin to (default: the lowest)")
  ap.add_argument(
    "--cases", default=",".join(CASES), help=f"comma-separated, of {', '.join(CASES)}"
  )
  ap.add_argument("--rounds", type=int, default=4, help="alternating timing rounds")
  ap.add_argument("--reps", type=int, default=2, help="calls per timing")
  ap.add_argument("--steps", type=int, default=4, help="local steps per timed client")
  ap.add_argument("--out", default=str(RESULTS_DIR / "cpu_step.json"))
  ap.add_argument(
    "--unpinned",
    action="store_true",
    help="every core: no affinity, XLA's default threading, OMP_NUM_THREADS as set (or unset), "
    "speedups of wall seconds",
  )
  ap.add_argument(
    "--torch_threads", type=int, default=0, help="torch's intra-op threads (default: 1 pinned, "
    "every core unpinned)",
  )  # fmt: skip
  ap.add_argument(
    "--conv_impls",
    default="",
    help="our conv_impl columns, comma-separated (default: all loadable)",
  )
  ap.add_argument(
    "--flax_pool",
    action=argparse.BooleanOptionalAction,
    default=True,
    help="also time the last conv_impl with flax's nn.max_pool (the library's pooling before)",
  )
  ap.add_argument(
    "--keep_freed_memory",
    action=argparse.BooleanOptionalAction,
    default=True,
    help="as the entry points do, keep XLA:CPU's per-step buffers in the heap "
    "(fedjax_proj.training.host_memory; --no-keep_freed_memory: the library before it)",
  )
  args = ap.parse_args(argv)
  # Every flag, then torch, checked before anything is pinned, imported or timed (flag_checks).
  from benchmarks import flag_checks

  if args.unpinned and args.cpu is not None:
    ap.error("--cpu pins to one core; --unpinned runs on every core: pass one of them")
  cases = flag_checks.names(ap, "--cases", args.cases, CASES)
  wanted = ()
  if args.conv_impls:  # empty (the default): every column that loads here
    wanted = flag_checks.names(ap, "--conv_impls", args.conv_impls, COLUMNS)
  flag_checks.at_least(ap, args, 1, "rounds", "reps", "steps")
  flag_checks.at_least(ap, args, 0, "torch_threads")
  flag_checks.usable_cpu(ap, args.cpu)
  if "fedproj_step" in cases and not args.authors_repo:
    ap.error(
      "--cases fedproj_step needs --authors_repo=<checkout of FedProj_Neurips>, or leave it out "
      "of --cases"
    )
  flag_checks.require_torch(ap, "bench")
  cpu = None if args.unpinned else _pin(args.cpu)
  if not args.unpinned:
    one_thread_environment()
  os.environ.setdefault("JAX_PLATFORMS", "cpu")
  kept = keep_freed_memory() if args.keep_freed_memory else None
  import jax
  import torch

  # torch.get_num_threads() before any set_num_threads: OpenMP's default (OMP_NUM_THREADS, else
  # one per core), which our side's oneDNN calls should see on every thread.
  TORCH_THREADS["restore"] = torch.get_num_threads()
  TORCH_THREADS["torch"] = args.torch_threads or (
    len(os.sched_getaffinity(0)) if args.unpinned else 1
  )
  torch.set_num_threads(TORCH_THREADS["restore"])
  impls = conv_impls()
  if wanted:
    if missing := [i for i in wanted if i not in impls]:  # onednn's need the cpu-onednn extra
      raise SystemExit(f"--conv_impls={args.conv_impls}: {missing} not loadable here, only {impls}")
    impls = tuple(wanted)
  measure = "wall" if args.unpinned else "cpu"
  result = {
    "command": " ".join(["python -m benchmarks.perf.cpu_step", *sys.argv[1:]]),
    "cpu": cpu,
    "unpinned": args.unpinned,
    "cores": sorted(os.sched_getaffinity(0)),
    "measure": measure,
    "machine": platform.processor() or platform.machine(),
    "jax": jax.__version__,
    "torch": torch.__version__,
    "torch_threads": TORCH_THREADS["torch"],
    "openmp_default_threads": TORCH_THREADS["restore"],
    "xla_flags": os.environ.get("XLA_FLAGS", ""),
    "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
    "conv_impls": impls,
    # None: not applied (--no-keep_freed_memory); else the parts that could not apply.
    "keep_freed_memory": kept,
    "loadavg_before": os.getloadavg(),
    "cases": {},
  }
  if {"cnn_step", "fedproj_step", "resnet8_step"} & set(cases):  # the cases with FLOP counts:
    # the core's peak, this run, this pinning
    from benchmarks.perf.peer.peak import gemm_peak

    result["peak"] = {
      **gemm_peak(),
      "method": "benchmarks.perf.peer.peak.gemm_peak: best float32 n x n GEMM GFLOP/s per CPU "
      "second of numpy and of jax.numpy (2 n^3 FLOPs), in this process before the cases",
    }
  peak = result.get("peak", {}).get("peak_gflops")
  out = Path(args.out)
  out.parent.mkdir(parents=True, exist_ok=True)

  def record(name, res):
    result["cases"][name] = res
    result["loadavg_after"] = os.getloadavg()
    # Oversubscription evidence: the process's threads (XLA's pool, torch's and OpenMP's teams)
    # and which OpenMP runtimes are mapped (torch ships its own libgomp.so.1; a second copy of the
    # same soname is not loaded, so oneDNN and torch share whichever loaded first).
    result["threads_after"] = _threads()
    result["openmp_libraries"] = _mapped("libgomp")
    write_results(out, result)
    brief = {
      k: round(v[f"{measure}_median"] * 1e3, 2)
      for k, v in res.items()
      if isinstance(v, dict) and f"{measure}_median" in v
    }
    prefix = "" if measure == "cpu" else "wall_"
    extra = {
      k: res[k] for k in (f"{prefix}speedup_vs_torch", f"{prefix}speedup_vs_authors") if k in res
    }
    print(f"{name}: {measure} ms {brief} {extra}", flush=True)
    if "gflops_per_cpu_second" in res:
      shares = res.get("share_of_peak", {})
      rates = ", ".join(
        f"{n} {g:.1f}" + (f" ({100 * shares[n]:.0f}%)" if n in shares else "")
        for n, g in res["gflops_per_cpu_second"].items()
      )
      print(
        f"  {res['flops_per_step']['counted'] / 1e6:.0f} MFLOP a step, GFLOP/s per CPU second "
        f"(share of the {peak or float('nan'):.1f} GFLOP/s GEMM peak): {rates}",
        flush=True,
      )

  step = dict(rounds=args.rounds, reps=args.reps, steps=args.steps, batch=64, impls=impls)
  step["flax_pool"] = args.flax_pool
  if "cnn_step" in cases:
    record("cnn_step b64", fedavg_step_case("cnn", torch_init_from_ours=True, peak=peak, **step))
  if "fedproj_step" in cases:
    for mb in (64, 256):
      record(f"fedproj_step b64 memory{mb}", fedproj_step_case(args, mb, peak=peak, **step))
  if "resnet8_step" in cases:
    record(
      "resnet8_step b64", fedavg_step_case("resnet8", torch_init_from_ours=False, peak=peak, **step)
    )
  if "conv" in cases:
    for name in CONVS:
      record(f"conv {name}", conv_case(name, args.rounds, args.reps, impls))
  if "pool" in cases:
    for name in POOLS:
      record(f"pool {name}", pool_case(name, args.rounds, args.reps))
  print(f"wrote {out}")


if __name__ == "__main__":
  main()
