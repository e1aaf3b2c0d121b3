"""FedProj's memory gradient inline vs inside ``lax.cond``, one jitted step, on this backend.

    JAX_PLATFORMS=cpu taskset -c 1 python -m studies.cond_memory_step.study

The gradient of FedDF's ResNet-8 (inference-mode forward, as FedProj's memory pass) on 64
CIFAR-shaped images, computed (a) inline with a select on a traced flag and (b) as the true branch
of ``lax.cond`` on it. Prints CPU and wall seconds per step (mean of 5, after one warm-up call),
twice in alternating order. Why: on XLA:CPU a conditional's branches are nested computations, and
convolutions there ran ~12x slower than inline (docs/fedproj.md, "What runs where"), which is why
``fedproj(memory_cond=None)`` selects instead on CPU in the one-program round (the host loops skip
the memory pass outside the window with a step of its own: studies/fedproj_window_step/study.py).
"""

from __future__ import annotations

import resource
import time

import jax
import jax.numpy as jnp

from fedjax_proj.algorithms import client as client_lib  # noqa: E402
from fedjax_proj.models import get_model  # noqa: E402


def _cpu() -> float:
  r = resource.getrusage(resource.RUSAGE_SELF)
  return r.ru_utime + r.ru_stime


def main(steps: int = 5) -> None:
  model = get_model("resnet8", 10)
  x = jnp.ones((64, 32, 32, 3))
  params, state = client_lib.split_variables(model.init(jax.random.key(0), x[:2]))

  def grad(p):
    loss = lambda p: client_lib.forward(model, p, state, x, train=False).logits.sum()  # noqa: E731
    return jax.grad(loss)(p)

  zeros = lambda p: jax.tree.map(jnp.zeros_like, p)  # noqa: E731
  inline = jax.jit(lambda p, on: jax.tree.map(lambda a, z: jnp.where(on, a, z), grad(p), zeros(p)))
  cond = jax.jit(lambda p, on: jax.lax.cond(on, grad, zeros, p))
  print(f"backend={jax.default_backend()} steps={steps}")
  for name, fn in [("inline", inline), ("cond", cond)] * 2:
    for on in (True, False):
      jax.block_until_ready(fn(params, on))
      c, t = _cpu(), time.perf_counter()
      for _ in range(steps):
        jax.block_until_ready(fn(params, on))
      cpu, wall = (_cpu() - c) / steps, (time.perf_counter() - t) / steps
      print(f"{name:7s} flag={on!s:5s} {cpu:.3f} CPU s/step {wall:.3f} wall s/step", flush=True)


if __name__ == "__main__":
  main()
