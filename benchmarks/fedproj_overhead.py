"""FedProj's cost over FedAvg: client-step time ratio and whole-round time with distillation.

    python benchmarks/fedproj_overhead.py [--clients 2] [--steps 10] [--batch 64]

Client phase: the same model (FedDF's ResNet-8), the same private batches and the same engine
strategy for FedAvg and FedProj (memory batch = private batch size, so the memory gradient costs
one extra forward/backward of the same size); the paper reports 2.03x. Whole round: FedAvg vs
FedDF vs FedProj with server distillation over a public set. Ratios are measured side by side in
one run; absolute times on a shared CPU are noisy.

Fusion probe (``--fusion_probe``): one client step, jitted alone, for FedAvg, FedProj as
implemented (separate private and memory passes), and the two ways of fusing the private and
memory forward passes into one: (a) one forward over the concatenated batch and one VJP per loss,
(b) per-group gradients by vmapping the loss over [private, memory] with shared parameters. The
fused variants run both halves in the same BatchNorm mode, so they are speed probes, not
drop-in FedProj steps. This is the measurement behind FedProj's separate passes on XLA:CPU.
"""

from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
from common import best_time, cifar10, cifar100_public, header, write_results

from fedjax_proj.algorithms import client as client_lib
from fedjax_proj.algorithms import losses
from fedjax_proj.algorithms.base import make_round
from fedjax_proj.algorithms.fedavg import fedavg
from fedjax_proj.algorithms.feddf import ensemble_distillation
from fedjax_proj.algorithms.fedproj import fedproj, project_gradient
from fedjax_proj.core import engine as engine_lib
from fedjax_proj.core.types import RoundData
from fedjax_proj.data.federated import FederatedData
from fedjax_proj.data.pipeline import make_batch_fn, normalizer_for
from fedjax_proj.models import get_model


def main():
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--clients", type=int, default=2)
  p.add_argument("--steps", type=int, default=10)
  p.add_argument("--batch", type=int, default=64)
  p.add_argument("--public", type=int, default=2000)
  p.add_argument("--strategy", default="auto", choices=engine_lib.STRATEGIES)
  p.add_argument("--model", default="resnet8")
  p.add_argument("--fusion_probe", action="store_true", help="also time fused client steps")
  args = p.parse_args()

  n = args.clients * args.steps * args.batch
  x, y = cifar10(n)
  public = jnp.asarray(cifar100_public(args.public))
  model = get_model(args.model, 10)
  normalize = normalizer_for("cifar10")
  batch_fn = make_batch_fn(normalize)
  variables = model.init(jax.random.key(0), normalize(jnp.asarray(x[:2])))
  has_conv = engine_lib.has_convolution(
    lambda v, z: model.apply(v, z, train=False).logits, variables, normalize(jnp.asarray(x[:2]))
  )
  strategy = engine_lib.choose_strategy(args.strategy, has_conv=has_conv)
  parts = np.array_split(np.arange(n), args.clients)
  fd = FederatedData(parts, args.batch, local_epochs=1)
  idx, mask, nk = fd.round_layout(np.arange(args.clients), 0, 0)
  rd = RoundData(
    jnp.asarray(x),
    jnp.asarray(y, jnp.int32),
    jnp.arange(args.clients, dtype=jnp.int32),
    jnp.asarray(idx),
    jnp.asarray(mask),
    jnp.asarray(nk),
    {"public_images": public},
  )
  opt = optax.adam(1e-3)
  algs = {
    "fedavg": fedavg(model, opt, batch_fn),
    "feddf": ensemble_distillation(model, opt, batch_fn, normalize, public_size=args.public),
    "fedproj": fedproj(
      model,
      opt,
      batch_fn,
      normalize,
      public_size=args.public,
      memory_size=args.public,
      memory_batch_size=args.batch,
    ),
  }
  print(
    header(),
    f"strategy={strategy} model={args.model} clients={args.clients} "
    f"steps={args.steps} batch={args.batch} public={args.public}",
  )

  # Client phase only (the engine), FedProj with an ensemble present (round > 0).
  client_times = {}
  for name in ("fedavg", "fedproj"):
    alg = algs[name]
    engine = engine_lib.ClientEngine(alg.client, alg.batch_fn, strategy)
    state = alg.init(variables, jax.random.key(0))
    if name == "fedproj":
      state = state._replace(
        has_memory=jnp.ones((), bool),
        memory_logits=jax.random.normal(jax.random.key(1), state.memory_logits.shape),
      )
    shared, inputs = alg.broadcast(state, rd, jax.random.key(0))
    keys = jax.random.split(jax.random.key(2), args.clients)
    run = lambda e=engine, s=shared, i=inputs, k=keys: e.run(
      s, i, rd.images, rd.labels, rd.idx, rd.mask, k
    )
    if engine.traceable:
      run = jax.jit(run)
    jax.block_until_ready(run())  # compile
    client_times[name] = best_time(run)
  steps = args.clients * args.steps
  ratio = client_times["fedproj"] / client_times["fedavg"]
  print(
    f"client phase: fedavg {client_times['fedavg']:.3f}s  fedproj {client_times['fedproj']:.3f}s "
    f"({steps} steps each) -> fedproj/fedavg step time = {ratio:.2f}x (paper: 2.03x)"
  )

  # Whole rounds including server work.
  round_times = {}
  for name, alg in algs.items():
    round_fn = make_round(alg, strategy)
    state = alg.init(variables, jax.random.key(0))
    state, _ = round_fn(state, rd, jax.random.key(0))  # compile (round 0)
    state, _ = round_fn(state, rd, jax.random.key(1))  # FedProj: first round with memory
    times = []
    for r in range(2):
      t0 = time.perf_counter()
      state, m = round_fn(state, rd, jax.random.key(2 + r))
      jax.block_until_ready(state)
      times.append(time.perf_counter() - t0)
    round_times[name] = min(times)
  print("whole round (seconds): " + "  ".join(f"{k} {v:.2f}" for k, v in round_times.items()))
  print(
    "round time / fedavg: "
    + "  ".join(f"{k} {v / round_times['fedavg']:.2f}x" for k, v in round_times.items())
  )
  payload = {
    "args": vars(args),
    "strategy": strategy,
    "client_seconds": client_times,
    "client_step_ratio": ratio,
    "round_seconds": round_times,
  }
  if args.fusion_probe:
    payload["fusion_probe_seconds_per_step"] = fusion_probe(
      model, variables, normalize, x, y, public, args
    )
  path = write_results("fedproj_overhead", payload)
  print(f"wrote {path}")


def fusion_probe(model, variables, normalize, x, y, public, args) -> dict[str, float]:
  """Seconds per client step: FedAvg, FedProj (separate passes) and two fused variants."""
  b = args.batch
  xb = normalize(jnp.asarray(x[:b]))
  yb = jnp.asarray(y[:b], jnp.int32)
  xm = normalize(public[:b])
  zm = jax.random.normal(jax.random.key(3), (b, 10))
  params, model_state = client_lib.split_variables(variables)
  opt = optax.adam(1e-3)
  opt_state = opt.init(params)

  def private_loss(p, xs):
    out = client_lib.forward(model, p, model_state, xs, train=True)
    return losses.cross_entropy(out.logits, yb), out.state

  def memory_loss(p, xs, train=False):
    out = client_lib.forward(model, p, model_state, xs, train=train)
    return losses.kl_from_logits(zm, out.logits, 3.0)

  def finish(p, o, g):
    u, o = opt.update(g, o, p)
    return optax.apply_updates(p, u), o

  def fedavg_step(p, o):
    (_, _), g = jax.value_and_grad(private_loss, has_aux=True)(p, xb)
    return finish(p, o, g)

  def separate_step(p, o):  # what fedproj.projection_client does
    (_, _), g = jax.value_and_grad(private_loss, has_aux=True)(p, xb)
    g, _, _ = project_gradient(g, jax.grad(memory_loss)(p, xm))
    return finish(p, o, g)

  def fused_vjp_step(p, o):
    def both(p):
      out = client_lib.forward(model, p, model_state, jnp.concatenate([xb, xm]), train=True)
      return jnp.stack(
        [
          losses.cross_entropy(out.logits[:b], yb),
          losses.kl_from_logits(zm, out.logits[b:], 3.0),
        ]
      )

    _, vjp = jax.vjp(both, p)
    (g,) = vjp(jnp.array([1.0, 0.0]))
    (g_mem,) = vjp(jnp.array([0.0, 1.0]))
    return finish(p, o, project_gradient(g, g_mem)[0])

  def grouped_step(p, o):
    def group_loss(p, xs, which):
      out = client_lib.forward(model, p, model_state, xs, train=True)
      ce = losses.cross_entropy(out.logits, yb)
      return jnp.where(which == 0, ce, losses.kl_from_logits(zm, out.logits, 3.0))

    g2 = jax.vmap(jax.grad(group_loss), in_axes=(None, 0, 0))(p, jnp.stack([xb, xm]), jnp.arange(2))
    g, g_mem = jax.tree.map(lambda a: a[0], g2), jax.tree.map(lambda a: a[1], g2)
    return finish(p, o, project_gradient(g, g_mem)[0])

  steps = {
    "fedavg": fedavg_step,
    "fedproj_separate": separate_step,
    "fused_forward_two_vjps": fused_vjp_step,
    "fused_grouped_vmap": grouped_step,
  }
  times = {}
  for name, fn in steps.items():
    fn = jax.jit(fn)

    def run(fn=fn):
      p, o = params, opt_state
      for _ in range(args.steps):
        p, o = fn(p, o)
      return p

    jax.block_until_ready(run())  # compile
    times[name] = best_time(run) / args.steps
  print(
    "fusion probe (s/step, ratio to fedavg): "
    + "  ".join(f"{k} {v:.4f} ({v / times['fedavg']:.2f}x)" for k, v in times.items())
  )
  return times


if __name__ == "__main__":
  main()
