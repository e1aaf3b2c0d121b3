"""The conv implementations equal ``nn.Conv``: forward, input/kernel/bias gradients, layout."""

import functools
import os
import subprocess
import sys
from pathlib import Path

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from models_testutil import built, jit, key, traceable

from fedjax_proj.core.engine import has_convolution
from fedjax_proj.models import CONV_IMPLS, CONV_MODELS, MODELS, Conv, get_model, onednn
from fedjax_proj.models import conv as conv_lib

TOL = dict(rtol=1e-5, atol=1e-5)
CIN, COUT = 3, 5


def _skip_without_onednn(impl="onednn_grad"):
  """onednn_grad (onednn) without its handler would compute gemm_grad's gradient (and XLA's
  convolution); skip it, saying why."""
  if impl in ("onednn_grad", "onednn") and (reason := onednn.unavailable_reason()):
    pytest.skip(reason)


def _close(a, b, **tol):
  jax.tree_util.tree_map(lambda u, v: np.testing.assert_allclose(u, v, **(tol or TOL)), a, b)


def _normal(shape, seed, scale=1.0):
  # numpy, not jax.random: tests would otherwise compile a sampler per shape.
  return jnp.asarray(np.random.default_rng(seed).standard_normal(shape) * scale, jnp.float32)


def _forward_and_grads(module, kernel, padding):
  """(y, (d params, d x)) of sum(y * cotangent) for fixed inputs, in one jitted program."""
  x = _normal((2, 9, 8, CIN), 0)
  params = {
    "params": {"kernel": _normal((kernel, kernel, CIN, COUT), 1, 0.3), "bias": _normal((COUT,), 2)}
  }

  def f(params, x):
    y = module.apply(params, x)
    return jnp.sum(y * _normal(y.shape, 3)), y

  grads, y = jit(jax.grad(f, argnums=(0, 1), has_aux=True))(params, x)
  return y, grads


@functools.cache
def _reference(kernel, strides, padding):
  module = nn.Conv(COUT, (kernel, kernel), strides=(strides, strides), padding=padding)
  return _forward_and_grads(module, kernel, padding)


CASES = [
  # (kernel, strides, padding): odd and even kernels (even makes SAME padding asymmetric),
  # explicit PyTorch-style padding and the 1x1 strided shortcut used by the ResNets.
  (3, 1, "SAME"),
  (3, 2, "SAME"),
  (4, 2, "SAME"),
  (3, 1, "VALID"),
  (3, 2, "VALID"),
  (4, 1, "VALID"),
  (3, 2, ((1, 1), (1, 1))),
  (1, 2, ((0, 0), (0, 0))),
]


@pytest.mark.parametrize("impl", ["patches_grad", "gemm_grad", "onednn_grad", "onednn", "patches"])
@pytest.mark.parametrize("kernel,strides,padding", CASES)
def test_conv_matches_nn_conv(impl, kernel, strides, padding):
  _skip_without_onednn(impl)
  mine = Conv(COUT, (kernel, kernel), strides=(strides, strides), padding=padding, impl=impl)
  y_ref, grads_ref = _reference(kernel, strides, padding)
  y, grads = _forward_and_grads(mine, kernel, padding)
  assert y.shape == y_ref.shape
  _close(y, y_ref)
  _close(grads, grads_ref)


def test_xla_impl_and_param_layout():
  x = jnp.zeros((1, 8, 8, CIN))
  for impl in CONV_IMPLS:
    for use_bias in (True, False):
      mine = jax.eval_shape(Conv(COUT, (3, 3), use_bias=use_bias, impl=impl).init, key(0), x)
      ref = jax.eval_shape(nn.Conv(COUT, (3, 3), use_bias=use_bias).init, key(0), x)
      assert jax.tree_util.tree_map(jnp.shape, mine) == jax.tree_util.tree_map(jnp.shape, ref)
  y_ref, grads_ref = _reference(3, 2, "SAME")
  y, grads = _forward_and_grads(Conv(COUT, (3, 3), strides=(2, 2), impl="xla"), 3, "SAME")
  _close(y, y_ref)
  _close(grads, grads_ref)


@pytest.mark.parametrize("impl", ["patches_grad", "gemm_grad", "onednn_grad", "onednn", "patches"])
def test_conv_grads_under_vmap_and_scan(impl):
  """The engine's setting: per-client kernels (vmap) and a loop of local steps (scan)."""
  _skip_without_onednn(impl)
  x = _normal((3, 8, 8, 4), 4)
  kernels = _normal((2, 3, 3, 4, 6), 5, 0.3)

  def run(impl):
    conv = Conv(6, (3, 3), strides=(2, 2), use_bias=False, impl=impl)

    def client(kernel):
      def step(k, _):
        g = jax.grad(lambda k: jnp.sum(jnp.tanh(conv.apply({"params": {"kernel": k}}, x))))(k)
        return k - 0.1 * g, None

      return jax.lax.scan(step, kernel, None, length=3)[0]

    return jit(jax.vmap(client))(kernels)

  _close(run(impl), run("xla"))


def test_model_params_interchangeable_across_impls():
  """One set of ResNet-8 variables drives every implementation to the same outputs."""
  b = built("resnet8")
  ref = b.eval(b.variables, b.x)
  for impl in ("patches_grad", "gemm_grad", "patches"):
    model = get_model("resnet8", b.model.num_classes, conv_impl=impl)
    shapes = jax.eval_shape(model.init, key(0), b.x[:1])
    assert jax.tree_util.tree_structure(shapes) == jax.tree_util.tree_structure(b.variables)
    out = jit(functools.partial(model.apply, train=False))(b.variables, b.x)
    _close(out.logits, ref.logits, rtol=1e-4, atol=1e-5)
    _close(out.features, ref.features, rtol=1e-4, atol=1e-5)


def test_gemm_kernel_grad_chunks_the_batch(monkeypatch):
  """A batch cut into chunks (here 1, 2 and 2 examples) sums to the whole batch's kernel grad."""
  x, g = _normal((5, 7, 6, 3), 6), _normal((5, 4, 3, 4), 7)
  whole = conv_lib.gemm_kernel_grad(x, g, (3, 3, 3, 4), (2, 2), "SAME")
  monkeypatch.setattr(conv_lib, "GEMM_GRAD_CHUNK_BYTES", 2 * 3 * 3 * 3 * 4 * 3 * 4)
  chunked = conv_lib.gemm_kernel_grad(x, g, (3, 3, 3, 4), (2, 2), "SAME")
  _close(chunked, whole)
  _, vjp = jax.vjp(lambda k: conv_lib.conv2d(x, k, (2, 2), "SAME"), jnp.zeros((3, 3, 3, 4)))
  _close(whole, vjp(g)[0])


def test_conv_models_are_the_models_with_a_convolution():
  """The registry's CONV_MODELS (which the CPU placement gives ``gemm_grad``) is exactly the set
  of registered models whose traced forward has a convolution."""
  for name in MODELS:
    model, variables, x = traceable(name)  # shapes: has_convolution only traces
    has = has_convolution(lambda v, x, m=model: m.apply(v, x, train=False).logits, variables, x)
    assert has == (name in CONV_MODELS), name


def _convolutions(name):
  """{(input shape, kernel shape, strides, padding)} of the model's convolutions, from its jaxpr
  (tracing only: compiling each model's gradient twice took 13 CPU s per model)."""
  model, variables, x = traceable(name)
  jaxpr = jax.make_jaxpr(lambda v, x: model.apply(v, x, train=False).logits)(variables, x)
  found = set()

  def walk(jx):
    for eqn in jx.eqns:
      if eqn.primitive.name == "conv_general_dilated":
        p = eqn.params
        assert p["lhs_dilation"] == (1, 1) and p["rhs_dilation"] == (1, 1)
        assert p["feature_group_count"] == 1 and p["batch_group_count"] == 1
        lhs, rhs = (v.aval.shape for v in eqn.invars)
        found.add((lhs, rhs, p["window_strides"], tuple(map(tuple, p["padding"]))))
      for sub in jax.extend.core.jaxprs_in_params(eqn.params):
        walk(sub)

  walk(jaxpr.jaxpr)
  return found


@pytest.mark.parametrize("name", CONV_MODELS)
def test_gemm_kernel_grad_equals_autodiff_on_every_model_convolution(name):
  """``gemm_grad``'s kernel gradient equals ``jax.grad`` of the plain convolution on each of the
  model's convolutions (shapes, strides, padding as the model calls it). ``onednn_grad``'s, the
  same function as ``onednn``'s, is checked there
  (``test_onednn_forward_and_gradients_equal_xla_on_every_model_convolution``)."""
  convs = _convolutions(name)
  assert convs
  for n, (xs, ks, strides, padding) in enumerate(sorted(convs)):
    x, kernel = _normal(xs, 10 + n), _normal(ks, 20 + n, 0.3)
    conv = functools.partial(conv_lib.conv2d, strides=strides, padding=padding)
    g = _normal(jax.eval_shape(conv, x, kernel).shape, 30 + n)

    def both(x, kernel, g, conv=conv, ks=ks, strides=strides, padding=padding):
      ref = jax.vjp(lambda k: conv(x, k), kernel)[1](g)[0]
      return ref, conv_lib.gemm_kernel_grad(x, g, ks, strides, padding)

    ref, mine = jit(both)(x, kernel, g)
    scale = float(jnp.max(jnp.abs(ref)))
    np.testing.assert_allclose(mine, ref, rtol=0, atol=1e-5 * scale, err_msg=str((xs, ks)))


@pytest.mark.parametrize("name", CONV_MODELS)
def test_onednn_forward_and_gradients_equal_xla_on_every_model_convolution(name):
  """``conv_impl="onednn"``'s forward, input gradient and kernel gradient (all oneDNN's) equal
  the plain convolution's and ``jax.grad``'s on each of the model's convolutions (shapes,
  strides, padding as the model calls it), each within float32 round-off of its largest entry."""
  _skip_without_onednn("onednn")
  convs = _convolutions(name)
  assert convs
  for n, (xs, ks, strides, padding) in enumerate(sorted(convs)):
    # oneDNN takes no negative (cropping) padding; onednn would fall back to XLA and gemm_grad.
    assert min(min(p) for p in padding) >= 0, (name, padding)
    x, kernel = _normal(xs, 10 + n), _normal(ks, 20 + n, 0.3)
    conv = functools.partial(conv_lib.conv2d, strides=strides, padding=padding)
    g = _normal(jax.eval_shape(conv, x, kernel).shape, 30 + n)

    def both(x, kernel, g, conv=conv):
      outs = []
      for impl in ("xla", "onednn"):
        y, vjp = jax.vjp(functools.partial(conv, impl=impl), x, kernel)
        outs.append((y, *vjp(g)))
      return outs

    ref, mine = jit(both)(x, kernel, g)
    for part, a, b in zip(("forward", "input grad", "kernel grad"), mine, ref, strict=True):
      scale = float(jnp.max(jnp.abs(b)))
      assert scale > 0, (name, part, xs)
      np.testing.assert_allclose(a, b, rtol=0, atol=1e-5 * scale, err_msg=f"{part} {(xs, ks)}")


@pytest.mark.parametrize("impl", ["gemm_grad", "onednn_grad", "onednn"])
@pytest.mark.parametrize("name", ["cnn", "resnet8"])
def test_model_gradients_equal_autodiff_under_vmap(name, impl):
  """A whole model's parameter and input gradients with ``gemm_grad`` / ``onednn_grad`` equal
  ``jax.grad`` with the plain convolution (``xla``), per client under ``vmap`` as the engine
  batches clients (two clients: the test variables and a perturbed copy, each on its own
  inputs)."""
  _skip_without_onednn(impl)
  b = built(name)
  model = get_model(name, b.model.num_classes, conv_impl=impl)
  variables = jax.tree_util.tree_map(lambda v: jnp.stack([v, v * 1.01 + 0.01]), b.variables)
  x = jnp.stack([b.x, -0.5 * b.x])

  def grads(model):
    def loss(variables, x):
      out = model.apply(variables, x, train=False)
      return jnp.sum(jnp.tanh(out.logits)) + 0.1 * jnp.sum(out.features**2)

    return jit(jax.vmap(jax.grad(loss, argnums=(0, 1))))(variables, x)

  # Another summation order: each leaf within float32 round-off of its own largest entry.
  def check(a, b):
    scale = float(jnp.max(jnp.abs(b)))
    assert scale > 0  # a gradient that vanished would compare equal trivially
    np.testing.assert_allclose(a, b, rtol=0, atol=1e-5 * scale)

  jax.tree_util.tree_map(check, grads(model), grads(b.model))


def _kernel_grad_case(seed=40):
  x, g = _normal((3, 9, 8, 4), seed), _normal((3, 5, 4, 6), seed + 1)
  return x, g, (3, 3, 4, 6), (2, 2), "SAME"


def test_onednn_kernel_grad_is_the_ffi_call_and_batches_under_vmap():
  """The jitted CPU kernel gradient is oneDNN's custom call (not a silent gemm_grad), and under vmap
  (clients' own inputs, inputs shared by all clients, two nested client axes) each client's
  gradient is its own."""
  _skip_without_onednn()
  x, g, ks, strides, padding = _kernel_grad_case()
  grad = functools.partial(conv_lib.onednn_kernel_grad, kernel_shape=ks, strides=strides)
  grad = functools.partial(grad, padding=padding)
  traced = jax.jit(grad).trace(x, g)
  assert onednn.TARGET in traced.lower(lowering_platforms=("cpu",)).as_text()
  # The handler is CPU-only: a GPU program computes gemm_grad's gradient instead.
  assert onednn.TARGET not in traced.lower(lowering_platforms=("cuda",)).as_text()
  ref = lambda x, g: conv_lib.gemm_kernel_grad(x, g, ks, strides, padding)  # noqa: E731
  xs, gs = jnp.stack([x, -2.0 * x, x[::-1]]), jnp.stack([g, g[::-1], 0.5 * g])
  scale = float(jnp.max(jnp.abs(ref(x, g))))

  def check(got, want):
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5 * scale)

  check(jit(jax.vmap(grad))(xs, gs), jax.vmap(ref)(xs, gs))
  check(jit(jax.vmap(grad, in_axes=(None, 0)))(x, gs), jax.vmap(ref, in_axes=(None, 0))(x, gs))
  nested = jnp.stack([xs, -xs]), jnp.stack([gs, gs])
  check(jit(jax.vmap(jax.vmap(grad)))(*nested), jax.vmap(jax.vmap(ref))(*nested))
  # An empty batch (which oneDNN rejects) has a zero gradient.
  np.testing.assert_array_equal(grad(x[:0], g[:0]), np.zeros(ks, np.float32))


def test_onednn_impl_is_the_ffi_calls_on_cpu_only():
  """``conv_impl="onednn"``'s jitted forward and gradients are oneDNN's three custom calls on
  CPU and none elsewhere, and the engine's ``has_convolution`` (the ``auto`` strategy's model
  kind) still finds its convolution; an empty batch gives an empty output and zero gradients."""
  _skip_without_onednn("onednn")
  x, g, ks, strides, padding = _kernel_grad_case()
  kernel = _normal(ks, 41, 0.3)

  def f(x, kernel):
    y, vjp = jax.vjp(lambda x, k: conv_lib.conv2d(x, k, strides, padding, "onednn"), x, kernel)
    return y, vjp(jnp.ones_like(y))

  traced = jax.jit(f).trace(x, kernel)
  cpu = traced.lower(lowering_platforms=("cpu",)).as_text()
  cuda = traced.lower(lowering_platforms=("cuda",)).as_text()
  for target in (onednn.FORWARD_TARGET, onednn.INPUT_GRAD_TARGET, onednn.TARGET):
    assert target in cpu and target not in cuda, target
  # The auto strategy still sees a convolution (in platform_dependent's non-CPU branch).
  assert has_convolution(lambda x, k: conv_lib.conv2d(x, k, strides, padding, "onednn"), x, kernel)
  y, (dx, dk) = f(x[:0], kernel)
  assert y.shape == (0, 5, 4, 6) and dx.shape == (0, 9, 8, 4)
  np.testing.assert_array_equal(dk, np.zeros(ks, np.float32))


def test_onednn_kernel_grad_runs_on_any_thread_and_concurrently():
  """Each shape's cached oneDNN primitives, created on one thread, compute the right gradient when
  called from other threads, several at once (benchmarks/perf/onednn_stress.py, in a subprocess
  that a memory fault ends with a signal). With oneDNN's library-managed scratchpad, a per-thread
  buffer, the GEMM-based shapes wrote through a null scratchpad there: a segmentation fault every
  run."""
  _skip_without_onednn()
  root = Path(__file__).resolve().parents[2]
  path = os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")]))
  cmd = [sys.executable, "-m", "benchmarks.perf.onednn_stress", "--threads=3", "--rounds=2"]
  done = subprocess.run(
    [*cmd, "--shapes=2"],
    cwd=root,
    env={**os.environ, "PYTHONPATH": path},
    capture_output=True,
    text=True,
    timeout=600,
  )
  assert done.returncode == 0, (done.returncode, done.stdout[-2000:], done.stderr[-2000:])
  # 2 shapes, alone and under vmap: 2 calls on this thread, then 3 threads x 2 rounds x 4.
  assert done.stdout.startswith("ok: 26 calls on 3 threads"), done.stdout


@pytest.fixture
def onednn_missing(monkeypatch, tmp_path):
  """A process whose oneDNN wheels are not installed (its distribution lookup fails)."""
  import importlib.metadata

  real = importlib.metadata.distribution

  def distribution(name):
    if name == onednn.LIBRARY_DIST:
      raise importlib.metadata.PackageNotFoundError(name)
    return real(name)

  monkeypatch.setattr(importlib.metadata, "distribution", distribution)
  monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
  onednn.unavailable_reason.cache_clear()
  conv_lib._warn_onednn_fallback.cache_clear()
  yield
  onednn.unavailable_reason.cache_clear()
  conv_lib._warn_onednn_fallback.cache_clear()


def test_onednn_missing_says_so_in_one_line_and_computes_gemm_grad(onednn_missing):
  from fedjax_proj.training import placement

  reason = onednn.unavailable_reason()
  assert reason == (
    "oneDNN convolutions unavailable: onednn-cpu-gomp is not installed ("
    + onednn.install_hint()
    + ")"
  )
  # The CPU placement falls back to gemm_grad, and the run's log line says why and the fix.
  why = f"{reason}; the convolutions are XLA's with gemm_grad's kernel gradient"
  assert placement.conv_impl_choice("cpu") == ("gemm_grad", why)
  kwargs = {}
  assert placement.conv_impl_line(kwargs) == f"convolutions: conv_impl=gemm_grad ({why})"
  assert kwargs == {"conv_impl": "gemm_grad"}
  x, g, ks, strides, padding = _kernel_grad_case()
  with pytest.warns(UserWarning) as caught:
    got = conv_lib.onednn_kernel_grad(x, g, ks, strides, padding)
    conv_lib.onednn_kernel_grad(x, g, ks, strides, padding)
  assert len(caught) == 1 and "\n" not in str(caught[0].message)
  assert str(caught[0].message).startswith(reason)
  np.testing.assert_array_equal(got, conv_lib.gemm_kernel_grad(x, g, ks, strides, padding))


def test_onednn_unforeseen_failure_is_one_line_not_a_lost_run(monkeypatch):
  """Any error while finding, building or loading the handler becomes the one line (the
  placement asks for it on every CPU run, so it must never raise)."""

  def boom():
    raise RuntimeError("unexpected\n  two lines")

  monkeypatch.setattr(onednn, "_load", boom)
  onednn.unavailable_reason.cache_clear()
  try:
    reason = onednn.unavailable_reason()
  finally:
    onednn.unavailable_reason.cache_clear()
  assert reason == (
    f"oneDNN convolutions unavailable: RuntimeError: unexpected two lines ({onednn.BUILD_HINT})"
  )


def test_onednn_tests_skip_naming_the_reason_without_the_extra(onednn_missing):
  """Where the extra is missing, the onednn_grad tests skip with the one line (they would
  otherwise compare gemm_grad's fallback with itself); tests of other impls never skip."""
  with pytest.raises(pytest.skip.Exception, match=r"onednn-cpu-gomp is not installed \("):
    _skip_without_onednn()
  for impl in ("xla", "gemm_grad", "patches_grad", "patches"):
    _skip_without_onednn(impl)


def test_onednn_wheels_are_core_dependencies_where_they_exist():
  """The README's plain install brings oneDNN's wheels, pinned at the version the handler is keyed
  to, on Linux x86-64 (the only platform they are built for) and nowhere else, where pip would
  find no wheel; the old ``cpu-onednn`` extra names the same requirements, so old commands work.
  Where the marker leaves them out, the missing-wheel line says where they exist instead of a pip
  command that would fail."""
  from packaging.requirements import Requirement

  tomllib = pytest.importorskip("tomllib")  # Python 3.11+
  root = Path(__file__).resolve().parents[2]
  project = tomllib.loads((root / "pyproject.toml").read_text())["project"]

  def onednn_requirements(specs):
    reqs = (Requirement(spec) for spec in specs)
    return {r.name: str(r) for r in reqs if r.name in (onednn.LIBRARY_DIST, onednn.HEADERS_DIST)}

  core = onednn_requirements(project["dependencies"])
  assert set(core) == {onednn.LIBRARY_DIST, onednn.HEADERS_DIST}
  assert onednn_requirements(project["optional-dependencies"]["cpu-onednn"]) == core
  platforms = [
    ("linux", "x86_64"),
    ("linux", "aarch64"),
    ("darwin", "arm64"),
    ("darwin", "x86_64"),
    ("win32", "AMD64"),
  ]
  for spec in core.values():
    req = Requirement(spec)
    assert str(req.specifier) == f"=={onednn.VERSION}", spec
    for system, machine in platforms:
      installs = req.marker.evaluate({"sys_platform": system, "platform_machine": machine})
      assert installs == ((system, machine) == onednn.WHEEL_PLATFORM), (spec, system, machine)
      hint = onednn.install_hint(system, machine)
      assert (f"{req.name}=={onednn.VERSION}" in hint) == installs, hint
      assert installs or f"not {system} {machine}" in hint, hint


def test_onednn_failed_build_says_so_in_one_line(monkeypatch, tmp_path):
  """A compiler that fails leaves no library behind and one line naming the source and compiler."""
  if reason := onednn.unavailable_reason():
    pytest.skip(reason)  # the extra is absent: the lookup fails before any build
  monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
  monkeypatch.setattr(onednn, "_compiler", lambda: "/bin/false")
  onednn.unavailable_reason.cache_clear()
  try:
    reason = onednn.unavailable_reason()
  finally:
    onednn.unavailable_reason.cache_clear()
  assert reason is not None and "\n" not in reason, reason
  want = "oneDNN convolutions unavailable: building onednn_conv.cc with /bin/false"
  assert reason.startswith(want), reason
  assert not list(tmp_path.rglob("*.so"))
