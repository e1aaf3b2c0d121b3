"""The Iris pilot study's trainer (paper 000, Section 3; partition from paper 001, C.5).

Iris reduced to 2-D by PCA, three non-IID clients, a 3-layer MLP trained by FedAvg, FedDF and
FedProj from the same initial model, with its own round loop: the round driver with an aggregate
that also returns the clients' local models, whose decision regions the figure draws. The flags,
presets and regimes are :mod:`fedjax_proj.configs.pilot_iris`'s; ``experiments/pilot_iris.py``
runs :func:`run_pilot`, the claim runner (fedjax_proj/reproduce) :func:`run_config`.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
from sklearn.decomposition import PCA

from fedjax_proj.algorithms.distillation.feddf import ensemble_distillation
from fedjax_proj.algorithms.distillation.fedproj import fedproj
from fedjax_proj.algorithms.fedavg import fedavg
from fedjax_proj.core import random as random_lib
from fedjax_proj.core import tree as tree_lib
from fedjax_proj.core.engine import run_vmap_scan
from fedjax_proj.core.rounds import drive_round
from fedjax_proj.data.federated import FederatedData
from fedjax_proj.data.partition import manual
from fedjax_proj.data.pipeline import make_batch_fn, normalizer
from fedjax_proj.data.sources import load_sklearn
from fedjax_proj.models import get_model

# The default regime is the one closest to the papers' text (docs/reproduction.md, "Results"):
# clients start from a strong pretrained global model (001 §3, 000 §1: forgetting "even when
# clients begin training from a pre-trained global model"), and FedProj's g_mem is the
# cross-entropy on labelled public data in every round (000 Algorithm 1 line 9). The local batch
# size is not stated; 10 is the middle of the swept {1, 10, 50}.
PRETRAIN_STEPS = 200
PUBLIC_KINDS = ("gaussian", "iris", "iris_labelled")
PUBLIC_DEFAULT = "iris_labelled"
PILOT_COUNTS = np.array([[50, 0, 0], [0, 40, 10], [0, 10, 40]])
CLASS_NAMES = ("Setosa", "Versicolor", "Virginica")


def pilot_data(seed: int = 0, public_kind: str = "gaussian"):
  """Iris in 2-D, the clients' index sets and the public set (images, labels or None).

  ``public_kind``: ``gaussian`` (1,000 unlabelled points ~ N(mean, 1.5 cov) of the data),
  ``iris`` (the 150 points, unlabelled) or ``iris_labelled`` (the 150 points with labels).
  """
  if public_kind not in PUBLIC_KINDS:
    raise ValueError(f"Unknown public data {public_kind!r}; choose one of {PUBLIC_KINDS}.")
  ds = load_sklearn("iris", "all")
  x2 = PCA(n_components=2, random_state=0).fit_transform(ds.images).astype(np.float32)
  y = ds.labels.astype(np.int32)
  parts = manual(ds.labels, PILOT_COUNTS, seed)
  if public_kind == "gaussian":
    rng = np.random.default_rng(seed)
    cov = np.cov(x2.T) * 1.5
    public = rng.multivariate_normal(x2.mean(0), cov, size=1000).astype(np.float32)
    return x2, y, parts, (public, None)
  return x2, y, parts, (x2, y if public_kind == "iris_labelled" else None)


def labelled_memory(alg):
  """FedProj whose memory loss is the cross-entropy on the public labels in EVERY round.

  000 Algorithm 1 line 9 / 001 Algorithm 1 line 16 with a labelled public set: g_mem is the
  gradient of the CE on the memory batch, not of the KL to the ensemble. The algorithm's round-0
  CE path does exactly that; this keeps it on after round 0.
  """

  def broadcast(state, rd, key):
    shared, inputs = alg.broadcast(state, rd, key)
    shared = {**shared, "use_memory": jnp.asarray(False), "round0_ce": jnp.asarray(True)}
    return shared, inputs

  return alg._replace(broadcast=broadcast)


def build(method: str, model, public_size: int, args, labelled: bool = False):
  opt = optax.sgd(args.lr, momentum=0.9)
  ident = lambda z: z
  distill_kw = dict(
    distill_epochs=args.distill_epochs, distill_lr=args.distill_lr, distill_batch_size=100
  )
  if method == "fedavg":
    return fedavg(model, opt)
  if method == "feddf":
    return ensemble_distillation(model, opt, ident, public_size=public_size, **distill_kw)
  alg = fedproj(
    model,
    opt,
    ident,
    public_size=public_size,
    memory_size=public_size,
    memory_batch_size=args.memory_batch,
    temperature=1.0,  # plain KL (001 Eq. 3)
    round0="ce" if labelled else "skip",
    lmem_global=True,  # the pilot's history and its claim report show the drift metric
    **distill_kw,
  )
  return labelled_memory(alg) if labelled else alg


def pretrain(model, variables, x, y, steps: int, lr: float = 1e-2):
  """Full-batch Adam on all 150 points: the "strong pretrained global model" of 001, Section 3."""
  if steps <= 0:
    return variables
  opt = optax.adam(lr)
  xs, ys = jnp.asarray(x), jnp.asarray(y)

  def loss(v):
    logits = model.apply(v, xs, train=False).logits
    return optax.softmax_cross_entropy_with_integer_labels(logits, ys).mean()

  def step(carry, _):
    v, o = carry
    u, o = opt.update(jax.grad(loss)(v), o, v)
    return (optax.apply_updates(v, u), o), None

  (variables, _), _ = jax.lax.scan(step, (variables, opt.init(variables)), None, length=steps)
  return variables


def run_method(method, args, x, y, parts, public, seed):
  """Runs one method; ``public`` is (images, labels or None)."""
  public, public_labels = public
  model = get_model("mlp", 3, hidden=(args.hidden, args.hidden))
  alg = build(method, model, len(public), args, labelled=public_labels is not None)
  batch_fn = make_batch_fn(normalizer(0.0, 1.0))
  extra = {"public_images": jnp.asarray(public)}
  if public_labels is not None:
    extra["public_labels"] = jnp.asarray(public_labels)
  fd = FederatedData(parts, args.batch_size, local_epochs=args.local_epochs)
  variables = model.init(jax.random.key(seed), jnp.asarray(x[:2]))
  variables = pretrain(model, variables, x, y, args.pretrain_steps)
  seed_key = jax.random.key(seed)
  state = alg.init(variables, random_lib.stream_key(seed_key, "init"))

  @jax.jit
  def round_step(state, rd, key):
    # The round driver with an aggregate that also returns the clients' local models (the figure).
    run = lambda *a: run_vmap_scan(alg.client, batch_fn, *a)

    def finish(state, rd, outputs, key):
      return (*alg.aggregate(state, rd, outputs, key), outputs["variables"])

    return drive_round(alg.broadcast, run, finish, state, rd, key)

  accuracy = jax.jit(
    lambda v: jnp.mean(jnp.argmax(model.apply(v, jnp.asarray(x), train=False).logits, -1) == y)
  )
  history = []
  sampled = np.arange(3, dtype=np.int32)
  for r in range(args.rounds):
    rd = fd.round_data(jnp.asarray(x), jnp.asarray(y), sampled, r, seed, extra)
    state, metrics, client_vars = round_step(state, rd, random_lib.round_key(seed_key, r))
    g = alg.global_variables(state)
    history.append(
      {
        "round": r + 1,
        "global_accuracy": float(accuracy(g)),
        # How much global knowledge each client kept after local training (paper's Figure 1).
        "client_accuracy_all_data": float(jnp.mean(jax.vmap(accuracy)(client_vars))),
        **{k: float(v) for k, v in metrics.items()},
      }
    )
  clients = tree_lib.unstack_clients(client_vars)
  return model, alg.global_variables(state), clients, history, float(accuracy(variables))


def plot(results, x, y, parts, path: Path):
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  from matplotlib.colors import ListedColormap

  pad = 1.0
  gx, gy = np.meshgrid(
    np.linspace(x[:, 0].min() - pad, x[:, 0].max() + pad, 200),
    np.linspace(x[:, 1].min() - pad, x[:, 1].max() + pad, 200),
  )
  grid = jnp.asarray(np.stack([gx.ravel(), gy.ravel()], 1), jnp.float32)
  colors = ["#d62728", "#ffbf00", "#1f77b4"]
  fig, axes = plt.subplots(len(results), 4, figsize=(16, 4 * len(results)), squeeze=False)
  for row, (method, res) in enumerate(results.items()):
    model = res["model"]
    panels = [(f"client {k}", v, parts[k]) for k, v in enumerate(res["clients"])]
    panels.append((f"global: acc {100 * res['final_accuracy']:.2f}%", res["global"], None))
    for col, (title, v, idx) in enumerate(panels):
      ax = axes[row, col]
      pred = np.asarray(jnp.argmax(model.apply(v, grid, train=False).logits, -1)).reshape(gx.shape)
      ax.contourf(
        gx, gy, pred, levels=[-0.5, 0.5, 1.5, 2.5], cmap=ListedColormap(colors), alpha=0.3
      )
      pts = slice(None) if idx is None else idx
      ax.scatter(x[pts, 0], x[pts, 1], c=[colors[c] for c in y[pts]], s=14, edgecolors="k", lw=0.3)
      ax.set_title(f"{method} - {title}")
      ax.set_xticks([])
      ax.set_yticks([])
  fig.suptitle("Iris (2-D PCA), 3 non-IID clients: decision regions after the last round")
  fig.tight_layout()
  fig.savefig(path, dpi=80)
  plt.close(fig)


def run_config(config: dict) -> list[dict]:
  """Runs ``config["method"]`` with ``config["seed"]`` (every other key of the pilot's
  ``default_config``, fedjax_proj/configs/pilot_iris.py); returns the per-round history."""
  args = argparse.Namespace(**config)
  x, y, parts, public = pilot_data(args.seed, args.public)
  return run_method(args.method, args, x, y, parts, public, args.seed)[3]


def run_pilot(config: dict, methods: Sequence[str], seeds: Sequence[int]) -> int:
  """Runs every method with every seed, prints the comparison and writes ``pilot_iris.json``
  (and ``pilot_iris.png`` unless ``config["no_plot"]``) to ``config["output_dir"]``; returns 0.

  ``config``: the pilot's flags (fedjax_proj/configs/pilot_iris.py, ``FIELDS``), recorded in the
  JSON; ``methods`` and ``seeds``: the checked ``--methods`` and ``--seeds`` lists.
  """
  args = argparse.Namespace(**config)
  out = Path(args.output_dir)
  out.mkdir(parents=True, exist_ok=True)
  print(
    f"backend={jax.default_backend()} devices={jax.device_count()} strategy=vmap_scan "
    f"clients=3 rounds={args.rounds} local_epochs={args.local_epochs} "
    f"pretrain_steps={args.pretrain_steps} seeds={seeds}"
  )
  per_seed = {m: [] for m in methods}
  client_acc = {m: [] for m in methods}
  first = {}
  for seed in seeds:
    x, y, parts, public = pilot_data(seed, args.public)
    for method in methods:
      model, g, clients, history, initial = run_method(method, args, x, y, parts, public, seed)
      per_seed[method].append(history[-1]["global_accuracy"])
      client_acc[method].append(np.mean([h["client_accuracy_all_data"] for h in history]))
      if seed == seeds[0]:
        first[method] = {
          "model": model,
          "global": g,
          "clients": clients,
          "final_accuracy": history[-1]["global_accuracy"],
          "history": history,
        }
    print(
      f"seed {seed}: "
      + "  ".join(f"{m} {100 * per_seed[m][-1]:.2f}%" for m in methods)
      + f"  (initial model {100 * initial:.2f}%)"
    )
  mean = {m: float(np.mean(v)) for m, v in per_seed.items()}
  std = {m: float(np.std(v)) for m, v in per_seed.items()}
  for m in methods:
    print(
      f"{m:8s} final global accuracy {100 * mean[m]:.2f} ± {100 * std[m]:.2f}%  "
      f"clients' accuracy on all data after local training (mean over rounds) "
      f"{100 * np.mean(client_acc[m]):.2f} ± {100 * np.std(client_acc[m]):.2f}% "
      f"({len(seeds)} seed(s))"
    )
  summary = {
    "config": vars(args),
    "public_data": args.public,
    "final_global_accuracy": mean,
    "final_global_accuracy_std": std,
    "per_seed": {"seeds": seeds, **per_seed},
    "client_accuracy_all_data_per_seed": {m: [float(a) for a in v] for m, v in client_acc.items()},
    "history": {m: r["history"] for m, r in first.items()},
  }
  if "fedproj" in per_seed and "fedavg" in per_seed:
    diff = np.array(per_seed["fedproj"]) - np.array(per_seed["fedavg"])
    summary["fedproj_minus_fedavg"] = {"per_seed": diff.tolist(), "wins": int((diff > 0).sum())}
    print(
      f"fedproj - fedavg per seed: {np.round(100 * diff, 2).tolist()} "
      f"(wins {(diff > 0).sum()}/{len(diff)})"
    )
  (out / "pilot_iris.json").write_text(json.dumps(summary, indent=2) + "\n")
  if not args.no_plot:
    x, y, parts, _ = pilot_data(seeds[0])
    plot(first, x, y, parts, out / "pilot_iris.png")
    print(f"wrote {out / 'pilot_iris.png'}")
  print(f"wrote {out / 'pilot_iris.json'}")
  return 0
