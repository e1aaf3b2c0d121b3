"""FedProj's cost over FedAvg: client-step time ratio and whole-round time with distillation.

    python -m benchmarks.perf.fedproj_overhead [--clients 2] [--steps 10] [--batch 64]

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
import os
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax

from benchmarks import flag_checks
from benchmarks.common import (
  best_time,
  block,
  cifar10,
  cifar100_public,
  header,
  round_data,
)
from benchmarks.results_io import RESULTS_DIR, write_results
from fedjax_proj.algorithms import client as client_lib
from fedjax_proj.algorithms import losses
from fedjax_proj.algorithms.base import make_round
from fedjax_proj.algorithms.distillation import distill
from fedjax_proj.algorithms.distillation.feddf import ensemble_distillation
from fedjax_proj.algorithms.distillation.fedproj import fedproj, project_gradient
from fedjax_proj.algorithms.fedavg import fedavg
from fedjax_proj.core import engine as engine_lib
from fedjax_proj.core import tree as tree_lib
from fedjax_proj.data.pipeline import make_batch_fn, normalizer_for
from fedjax_proj.models import MODELS, get_model


def measure(
  model_name: str,
  clients: int,
  steps: int,
  batch: int,
  x,
  y,
  public,
  strategy: str = "auto",
  repeats: int = 2,
  breakdown: bool = True,
) -> dict:
  """Client phase and whole-round seconds of FedAvg, FedDF and FedProj, side by side.

  ``x, y`` hold at least ``clients * steps * batch`` training examples; ``public`` the public
  images. Returns a JSON-ready dict (also used by benchmarks/device/gpu_suite.py).
  """
  n = clients * steps * batch
  x, y = x[:n], y[:n]
  num_public = int(public.shape[0])
  public = jnp.asarray(public)
  model = get_model(model_name, 10)
  normalize = normalizer_for("cifar10")
  batch_fn = make_batch_fn(normalize)
  sample = normalize(jnp.asarray(x[:2]))
  variables = model.init(jax.random.key(0), sample)
  has_conv = engine_lib.has_convolution(
    lambda v, z: model.apply(v, z, train=False).logits, variables, sample
  )
  strategy = engine_lib.choose_strategy(strategy, has_conv=has_conv, num_clients=clients)
  parts = np.array_split(np.arange(n), clients)
  rd, _ = round_data(x, y, parts, batch, {"public_images": public})
  opt = optax.adam(1e-3)
  algs = {
    "fedavg": fedavg(model, opt),
    "feddf": ensemble_distillation(model, opt, normalize, public_size=num_public),
    "fedproj": fedproj(
      model,
      opt,
      normalize,
      public_size=num_public,
      memory_size=num_public,
      memory_batch_size=batch,
    ),
  }
  print(
    header(),
    f"strategy={strategy} model={model_name} clients={clients} "
    f"steps={steps} batch={batch} public={num_public}",
  )

  # Client phase only (the engine), FedProj with an ensemble present (round > 0).
  client_times = {}
  for name in ("fedavg", "fedproj"):
    alg = algs[name]
    engine = engine_lib.ClientEngine(alg.client, batch_fn, strategy)
    state = alg.init(variables, jax.random.key(0))
    if name == "fedproj":
      state = state._replace(
        has_memory=jnp.ones((), bool),
        memory_logits=jax.random.normal(jax.random.key(1), state.memory_logits.shape),
      )
    shared, inputs = alg.broadcast(state, rd, jax.random.key(0))
    keys = jax.random.split(jax.random.key(2), clients)
    run = lambda e=engine, s=shared, i=inputs, k=keys: e.run(
      s, i, rd.images, rd.labels, rd.idx, rd.mask, k
    )
    if engine.traceable:
      run = jax.jit(run)
    jax.block_until_ready(run())  # compile
    client_times[name] = best_time(run, repeats)
  ratio = client_times["fedproj"] / client_times["fedavg"]
  print(
    f"client phase: fedavg {client_times['fedavg']:.3f}s  fedproj {client_times['fedproj']:.3f}s "
    f"({clients * steps} steps each) -> fedproj/fedavg step time = {ratio:.2f}x (paper: 2.03x)"
  )

  # Whole rounds including server work, timed side by side (rotating order).
  round_fns, states = {}, {}
  for name, alg in algs.items():
    round_fns[name] = make_round(alg, strategy, batch_fn)
    state = alg.init(variables, jax.random.key(0))
    state, _ = round_fns[name](state, rd, jax.random.key(0))  # compile (round 0)
    states[name], _ = round_fns[name](state, rd, jax.random.key(1))  # FedProj: memory from now
    block(states[name])
  round_all = {name: [] for name in algs}
  names = list(algs)
  for r in range(repeats):
    for name in names[r % len(names) :] + names[: r % len(names)]:
      t0 = time.perf_counter()
      states[name], _ = round_fns[name](states[name], rd, jax.random.key(2 + r))
      jax.block_until_ready(states[name])
      round_all[name].append(time.perf_counter() - t0)
  round_times = {k: min(v) for k, v in round_all.items()}
  print("whole round (seconds): " + "  ".join(f"{k} {v:.2f}" for k, v in round_times.items()))
  print(
    "round time / fedavg: "
    + "  ".join(f"{k} {v / round_times['fedavg']:.2f}x" for k, v in round_times.items())
  )
  out = {
    "model": model_name,
    "clients": clients,
    "steps": steps,
    "batch": batch,
    "public": num_public,
    "strategy": strategy,
    "client_seconds": client_times,
    "client_step_ratio": ratio,
    "round_seconds": round_times,
    "round_seconds_all": round_all,
    "round_ratio_fedproj_over_fedavg": round_times["fedproj"] / round_times["fedavg"],
    "load_average": os.getloadavg(),
  }
  if breakdown:
    out["server_breakdown_seconds"] = server_breakdown(
      algs, model, variables, normalize, batch_fn, rd, public, strategy, clients, repeats
    )
  out["_setup"] = (model, variables, normalize)
  return out


# The real sets' sizes (benchmarks/common.py draws without replacement from them).
CIFAR10_TRAIN, PUBLIC = 50_000, 20_000


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--clients", type=int, default=2)
  p.add_argument("--steps", type=int, default=10)
  p.add_argument("--batch", type=int, default=64)
  p.add_argument("--public", type=int, default=2000)
  p.add_argument("--repeats", type=int, default=3)
  p.add_argument("--strategy", default="auto", choices=engine_lib.STRATEGIES)
  # Every image model (BERT reads tokens, not CIFAR-10 images).
  p.add_argument("--model", default="resnet8", choices=[m for m in MODELS if m != "bert"])
  p.add_argument("--fusion_probe", action="store_true", help="also time fused client steps")
  args = p.parse_args(argv)
  # Before the data loads and anything compiles: a count of 0 times nothing (or divides by 0),
  # and more examples than the set holds is NumPy's error from inside the sampling.
  flag_checks.at_least(p, args, 1, "clients", "steps", "batch", "public", "repeats")
  if (n := args.clients * args.steps * args.batch) > CIFAR10_TRAIN:
    p.error(
      f"--clients x --steps x --batch = {n} examples, more than CIFAR-10's {CIFAR10_TRAIN}; "
      "lower one of them"
    )
  if args.public > PUBLIC:
    p.error(f"--public={args.public} exceeds the public set's {PUBLIC} images; lower it")
  x, y = cifar10(args.clients * args.steps * args.batch)
  public = cifar100_public(args.public)
  payload = measure(
    args.model, args.clients, args.steps, args.batch, x, y, public, args.strategy, args.repeats
  )
  model, variables, normalize = payload.pop("_setup")
  payload["args"] = vars(args)
  if args.fusion_probe:
    payload["fusion_probe_seconds_per_step"] = fusion_probe(
      model, variables, normalize, x, y, jnp.asarray(public), args
    )
  path = write_results(
    RESULTS_DIR / "fedproj_overhead.json", payload, indent=2, sort_keys=True, default=float
  )
  print(f"wrote {path}")


def server_breakdown(
  algs, model, variables, normalize, batch_fn, rd, public, strategy, clients, repeats
) -> dict:
  """Seconds of each part of FedProj's server round, timed alone (host path on CPU).

  Parts (distill_server.py): ``clients`` (the client phase), ``teacher_logits`` (every sampled
  client's inference logits on the whole public set, C x P forwards), ``student`` (E_d epochs of
  distillation steps), ``memory_logits`` (Z_ens on the next memory buffer) and ``lmem_global``
  (the new global model's logits on that buffer, for the L_mem drift metric).
  """
  alg = algs["fedproj"]
  cfg = distill.DistillConfig()  # fedproj()'s defaults, as built above
  host = strategy != "vmap_scan"
  engine = engine_lib.ClientEngine(alg.client, batch_fn, strategy)
  state = alg.init(variables, jax.random.key(0))
  shared, inputs = alg.broadcast(state, rd, jax.random.key(0))
  keys = jax.random.split(jax.random.key(2), clients)
  run = lambda: engine.run(shared, inputs, rd.images, rd.labels, rd.idx, rd.mask, keys)
  if engine.traceable:
    run = jax.jit(run)
  outputs = block(run())
  stacked = outputs["variables"]
  averaged = tree_lib.weighted_mean(stacked, rd.num_examples)
  if host:
    logits_fn = distill.HostClientLogits(model, normalize, cfg.teacher_batch_size)
    distiller = distill.HostDistiller(model, normalize, cfg)
  else:
    logits_fn = jax.jit(
      lambda v, x: distill.client_logits_scan(model, v, normalize, x, cfg.teacher_batch_size)
    )
    distiller = jax.jit(lambda s, t, x, k: distill.distill_scan(model, s, t, x, normalize, k, cfg))
  next_idx = jnp.arange(public.shape[0])  # memory_size = the public set, as built above
  teacher = block(logits_fn(stacked, public))
  mean_teacher = jax.jit(distill.mean_teacher)
  gather_mean = jax.jit(lambda t, i: distill.mean_teacher(t[:, i]))
  new_vars, _ = block(distiller(averaged, mean_teacher(teacher), public, jax.random.key(3)))
  one = tree_lib.broadcast_clients(new_vars, 1)
  block(gather_mean(teacher, next_idx))
  block(logits_fn(one, public[next_idx]))
  times = {
    "clients": best_time(run, repeats),
    "teacher_logits": best_time(lambda: logits_fn(stacked, public), repeats),
    "student": best_time(
      lambda: distiller(averaged, mean_teacher(teacher), public, jax.random.key(3)), 2
    ),
    "memory_logits": best_time(lambda: gather_mean(teacher, next_idx), repeats),
    "lmem_global": best_time(lambda: logits_fn(one, public[next_idx]), repeats),
  }
  total = sum(times.values())
  print(
    "fedproj round parts (s, share): "
    + "  ".join(f"{k} {v:.3f} ({v / total:.0%})" for k, v in times.items())
  )
  return times


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
