"""oneDNN's convolution primitives as XLA:CPU FFI calls: backward-weights
(``conv_impl="onednn_grad"``), and forward and backward-data too (``conv_impl="onednn"``).

The C++ handler ``onednn_conv.cc`` ships in this package. On first use it is compiled with the
system C++ compiler against ``onednn-cpu-gomp`` and ``onednn-devel-cpu-gomp`` (oneDNN's library
and headers: dependencies of the package on Linux x86-64, the only platform they are built for;
pyproject.toml) and jaxlib's XLA FFI headers, into a per-user cache folder
(``$XDG_CACHE_HOME/fedjax_proj/onednn``, else ``~/.cache/...``) under a name keyed by the source,
oneDNN's and jaxlib's versions and the compiler; later processes load that file. Loaded with
``ctypes`` and registered with ``jax.ffi.register_ffi_target``.

:func:`unavailable_reason` is None when the handler is registered, else one line saying why not
(oneDNN's wheels not installed, no compiler, build failed) and the fix; a model built with
``onednn_grad`` then computes ``gemm_grad``'s gradient (``onednn``: XLA's convolution too). The CPU
placement uses ``onednn`` where the handler loads, else ``gemm_grad`` with that line in the run's
log (``fedjax_proj.training.placement.conv_impl_choice``). Nothing here runs at import: the handler
is built on the first :func:`unavailable_reason`. See docs/performance.md, "The CPU convolution
kernel gradient".
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import importlib.metadata
import os
import platform
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_proj.core.user_cache import user_cache_root

TARGET = "fedjax_proj_onednn_conv_kernel_grad"
FORWARD_TARGET = "fedjax_proj_onednn_conv_forward"
INPUT_GRAD_TARGET = "fedjax_proj_onednn_conv_input_grad"
# XLA's target name -> the handler's symbol in the built library.
_SYMBOLS = {
  TARGET: "FedjaxOnednnConvKernelGrad",
  FORWARD_TARGET: "FedjaxOnednnConvForward",
  INPUT_GRAD_TARGET: "FedjaxOnednnConvInputGrad",
}
SOURCE = Path(__file__).with_name("onednn_conv.cc")
# The oneDNN build pyproject.toml pins: CPU only, GNU OpenMP (its libdnnl.so needs only libc,
# libstdc++ and libgomp). Newer "onednn" wheels depend on Intel's SYCL/TBB/OpenCL runtimes.
LIBRARY_DIST, HEADERS_DIST = "onednn-cpu-gomp", "onednn-devel-cpu-gomp"
VERSION = "2023.2.0"  # pyproject.toml pins both wheels at it (tests/models/test_conv.py checks)
# (sys.platform, platform.machine()) where the wheels exist: pyproject.toml's marker installs them.
WHEEL_PLATFORM = ("linux", "x86_64")
_registered: list[Path] = []  # the library registered in this process, if any


def install_hint(system: str | None = None, machine: str | None = None) -> str:
  """The fix for missing oneDNN wheels, in the one line: reinstall them where the package depends
  on them (``system``/``machine`` default to this machine's), else say where they exist."""
  where = (system or sys.platform, machine or platform.machine())
  if where == WHEEL_PLATFORM:
    return (
      f"a dependency of fedjax_proj on Linux x86-64: pip install '{LIBRARY_DIST}=={VERSION}' "
      f"'{HEADERS_DIST}=={VERSION}'"
    )
  return f"its wheels exist for Linux x86-64 only, not {where[0]} {where[1]}"


def cache_folder(environ=os.environ) -> Path:
  """Where built handlers are kept: ``$XDG_CACHE_HOME/fedjax_proj/onednn``, else
  ``~/.cache/fedjax_proj/onednn``."""
  return user_cache_root(environ) / "onednn"


class Unavailable(Exception):
  """The handler cannot be built or loaded; the message is the one line to report."""


def _find(dist: str, suffix: str) -> Path:
  try:
    d = importlib.metadata.distribution(dist)
  except importlib.metadata.PackageNotFoundError:
    raise Unavailable(f"{dist} is not installed ({install_hint()})") from None
  for f in d.files or ():
    if str(f).endswith(suffix):
      path = Path(d.locate_file(f)).resolve()
      if path.exists():
        return path
  raise Unavailable(
    f"{dist} {d.version} has no {suffix} "
    f"(reinstall it: pip install --force-reinstall '{dist}=={VERSION}')"
  )


def _compiler() -> str:
  # CXX is the build-tool convention for the C++ compiler (a build setting, not a flag).
  for name in (os.environ.get("CXX", "").strip(), "c++", "g++", "clang++"):
    if name and (path := shutil.which(name)):
      return path
  raise Unavailable("no C++ compiler found (install g++ or set CXX)")


# What to do about a failed build, in its one line.
BUILD_HINT = (
  "check the compiler and the oneDNN wheels "
  f"(pip install --force-reinstall {LIBRARY_DIST}=={VERSION} {HEADERS_DIST}=={VERSION})"
)


def _build(lib_dir: Path, include_dir: Path, out: Path, cxx: str) -> None:
  try:
    out.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    # Written under a temporary name and renamed: two processes building at once each write their
    # own file, and the rename is atomic.
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=out.parent)
    os.close(fd)
  except OSError as e:
    raise Unavailable(f"cannot write to {out.parent}: {e} (set XDG_CACHE_HOME elsewhere)") from None
  cmd = [
    cxx, "-O2", "-std=c++17", "-shared", "-fPIC", "-w", f"-I{include_dir}",
    f"-I{jax.ffi.include_dir()}", str(SOURCE), "-o", tmp, f"-L{lib_dir}", "-ldnnl",
    f"-Wl,-rpath,{lib_dir}",
  ]  # fmt: skip
  try:
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
      first = next((ln for ln in done.stderr.splitlines() if "error" in ln), done.stderr[-200:])
      raise Unavailable(f"building {SOURCE.name} with {cxx} failed: {first.strip()} ({BUILD_HINT})")
    os.replace(tmp, out)
  except (OSError, subprocess.TimeoutExpired) as e:
    raise Unavailable(f"building {SOURCE.name} with {cxx} failed: {e} ({BUILD_HINT})") from None
  finally:
    if os.path.exists(tmp):
      os.remove(tmp)


def _load() -> None:
  lib = _find(LIBRARY_DIST, "libdnnl.so")
  header = _find(HEADERS_DIST, "oneapi/dnnl/dnnl.hpp")
  include_dir = header.parents[2]
  cxx = _compiler()
  key = hashlib.sha256()
  for part in (
    SOURCE.read_bytes(),
    importlib.metadata.version(LIBRARY_DIST).encode(),
    importlib.metadata.version("jaxlib").encode(),
    cxx.encode(),
    str(lib.parent).encode(),
  ):
    key.update(part + b"\0")
  out = cache_folder() / f"onednn_conv-{key.hexdigest()[:16]}.so"
  if not out.exists():
    _build(lib.parent, include_dir, out, cxx)
  if _registered:
    # XLA refuses a second handler under one name; the first one loaded serves the process.
    return
  try:
    handle = ctypes.CDLL(str(out))
    capsules = {t: jax.ffi.pycapsule(getattr(handle, sym)) for t, sym in _SYMBOLS.items()}
  except (OSError, AttributeError) as e:
    raise Unavailable(f"loading {out} failed: {e} (delete it to rebuild)") from None
  try:
    for target, capsule in capsules.items():
      jax.ffi.register_ffi_target(target, capsule, platform="cpu")
  except Exception as e:  # XLA's own refusal (JaxRuntimeError), reported as the one line
    raise Unavailable(f"registering {out.name} with XLA failed: {e}") from None
  _registered.append(out)


@functools.cache
def unavailable_reason() -> str | None:
  """None once the handler is built, loaded and registered; else one line saying why it is not
  (computed once per process). Never raises: the CPU placement asks it for every run, and a
  handler that cannot be had must cost the run its speed, not the run."""
  try:
    _load()
  except Unavailable as e:
    return f"oneDNN convolutions unavailable: {e}"
  except Exception as e:  # anything unforeseen in the lookup, build or load, as one line
    line = " ".join(str(e).split())[:300]
    return f"oneDNN convolutions unavailable: {type(e).__name__}: {line} ({BUILD_HINT})"
  return None


def available() -> bool:
  return unavailable_reason() is None


def _attrs(strides: tuple[int, int], pads) -> dict:
  (plo, phi), (qlo, qhi) = pads
  return dict(
    stride_h=np.int64(strides[0]),
    stride_w=np.int64(strides[1]),
    pad_h_lo=np.int64(plo),
    pad_h_hi=np.int64(phi),
    pad_w_lo=np.int64(qlo),
    pad_w_hi=np.int64(qhi),
  )


def forward(x: jax.Array, kernel: jax.Array, strides: tuple[int, int], pads) -> jax.Array:
  """The NHWC/HWIO convolution of ``x`` with ``kernel`` (float32; explicit non-negative ``pads``
  ((lo, hi), (lo, hi))), by oneDNN's forward primitive; under ``vmap`` as :func:`kernel_grad`."""
  (plo, phi), (qlo, qhi) = pads
  kh, kw, _, cout = kernel.shape[-4:]
  b, h, w = x.shape[-4:-1]
  ho, wo = (h + plo + phi - kh) // strides[0] + 1, (w + qlo + qhi - kw) // strides[1] + 1
  out = jax.ShapeDtypeStruct((*x.shape[:-4], b, ho, wo, cout), jnp.float32)
  call = jax.ffi.ffi_call(FORWARD_TARGET, out, vmap_method="broadcast_all")
  return call(x, kernel, **_attrs(strides, pads))


def input_grad(
  g: jax.Array, kernel: jax.Array, input_shape, strides: tuple[int, int], pads
) -> jax.Array:
  """The input gradient of an NHWC/HWIO convolution of an input of ``input_shape`` [B, H, W, cin]
  at output gradient ``g``, by oneDNN's backward-data primitive; under ``vmap`` as
  :func:`kernel_grad`."""
  out = jax.ShapeDtypeStruct((*g.shape[:-4], *input_shape[-4:]), jnp.float32)
  call = jax.ffi.ffi_call(INPUT_GRAD_TARGET, out, vmap_method="broadcast_all")
  return call(g, kernel, **_attrs(strides, pads))


def kernel_grad(
  x: jax.Array, g: jax.Array, kernel_shape, strides: tuple[int, int], pads
) -> jax.Array:
  """The kernel gradient of an NHWC/HWIO convolution at input ``x`` and output gradient ``g``
  (float32; explicit ``pads`` ((lo, hi), (lo, hi)), non-negative), by oneDNN.

  Under ``vmap`` both operands are broadcast to the same leading axes (``broadcast_all``) and the
  handler computes one kernel gradient per leading index; it accepts any number of leading axes.
  """
  out = jax.ShapeDtypeStruct(tuple(kernel_shape), jnp.float32)
  call = jax.ffi.ffi_call(TARGET, out, vmap_method="broadcast_all")
  return call(x, g, **_attrs(strides, pads))
