"""The toy rounds and the NumPy reference of tests/algorithms/test_{fedprox,fednova,feddyn,scaffold,
moon,fedrcl}.py (shared, so one reading of the formulas serves every method; not a test module).

Each method runs two hand-laid-out rounds (two sampled clients out of three, a linear softmax model,
plain or momentum SGD, unequal step counts and a padded example) through the vmapped round and the
sequential strategy; a float64 NumPy re-implementation of the formulas (docs/methods.md), looping
over clients in plain Python, must give the same global model and the same per-client state, and
clients that were not sampled must keep their state bit for bit.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax

from fedjax_proj.algorithms import registry
from fedjax_proj.algorithms.base import make_round
from fedjax_proj.core.types import Model, ModelOutput, RoundData
from fedjax_proj.data.pipeline import make_batch_fn, normalizer

D, C, N_CLIENTS, LR = 3, 3, 3, 0.2
SIZES = np.array([6.0, 3.0, 5.0], np.float32)  # n_k of clients 0, 1, 2
BATCH_FN = make_batch_fn(normalizer(0.0, 1.0))  # the toy data are model inputs already


def linear_model() -> Model:
  """logits = x W + b; the features are the logits, so contrastive terms depend on W and b."""

  def init(key, x):
    k1, k2 = jax.random.split(key)
    return {
      "params": {
        "w": jax.random.normal(k1, (D, C)) * 0.7,
        "b": jax.random.normal(k2, (C,)) * 0.1,
      }
    }

  def apply(variables, x, *, train, rng=None, mask=None):
    del train, rng, mask
    p = variables["params"]
    z = x @ p["w"] + p["b"]
    return ModelOutput(z, z, {})

  return Model("linear", init, apply, C)


def toy_data():
  rng = np.random.default_rng(3)
  labels = np.array([0, 0, 1, 1, 2, 0, 0, 0, 1, 2, 2, 1], np.int32)
  centers = rng.normal(size=(C, D)) * 1.5
  # Small noise: same-class examples are similar, so FedRCL's penalty branch is exercised.
  x = (centers[labels] + 0.15 * rng.normal(size=(len(labels), D))).astype(np.float32)
  return x, labels


def toy_rounds(x, y):
  """Two rounds: clients [0, 2] then [1, 2]; S = 2 steps of B = 3; padding on purpose."""
  idx1 = np.array([[[0, 1, 2], [3, 4, 5]], [[6, 7, 8], [9, 10, 11]]], np.int32)
  mask1 = np.ones((2, 2, 3), bool)
  mask1[1, 1, 2] = False  # client 2's second batch has 2 real examples
  idx2 = np.array([[[2, 3, 4], [0, 0, 0]], [[9, 6, 11], [7, 8, 10]]], np.int32)
  mask2 = np.ones((2, 2, 3), bool)
  mask2[0, 1] = False  # client 1 takes one step only (FedNova's a_k differ)
  rounds = []
  for ids, idx, mask in (([0, 2], idx1, mask1), ([1, 2], idx2, mask2)):
    rounds.append(
      RoundData(
        jnp.asarray(x),
        jnp.asarray(y),
        jnp.asarray(ids, jnp.int32),
        jnp.asarray(idx),
        jnp.asarray(mask),
        jnp.asarray(SIZES[ids]),
        {},
      )
    )
  return rounds


# ---------------------------------------------------------------- NumPy reference (float64)


def np_logits(p, x):
  return x @ p["w"] + p["b"]


def np_log_softmax(z):
  z = z - z.max(-1, keepdims=True)
  return z - np.log(np.exp(z).sum(-1, keepdims=True))


def np_ce(p, x, y):
  return -np_log_softmax(np_logits(p, x))[np.arange(len(y)), y].mean()


def np_ce_grad(p, x, y):
  prob = np.exp(np_log_softmax(np_logits(p, x)))
  prob[np.arange(len(y)), y] -= 1.0
  g = prob / len(y)
  return {"w": x.T @ g, "b": g.sum(0)}


def np_cos(a, b):
  return (a * b).sum(-1) / np.maximum(np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1), 1e-8)


def np_moon_term(p, p_global, p_prev, x, tau):
  z = np_logits(p, x)
  logits = np.stack([np_cos(z, np_logits(p_global, x)), np_cos(z, np_logits(p_prev, x))], -1)
  return -np_log_softmax(logits / tau)[:, 0].mean()


def np_rcl_terms(feat, y, tau=0.05, threshold=0.7, topk=2):
  """Anchor-by-anchor loops (an independent reading of the official CLLoss)."""
  f = feat / np.linalg.norm(feat, axis=1, keepdims=True)
  b = len(y)
  scl, pen, active = [], [], 0
  for i in range(b):
    sims = [float(f[i] @ f[j]) for j in range(b)]
    pos = min(sims[j] for j in range(b) if y[j] == y[i])
    negs = sorted((sims[j] for j in range(b) if y[j] != y[i]), reverse=True)[:topk]
    row = np.array([pos, *negs]) / tau
    scl.append(-(row[0] - np.log(np.exp(row - row.max()).sum()) - row.max()))
    same = [sims[j] for j in range(b) if j != i and y[j] == y[i]]
    neg = min(same) if same and min(same) >= threshold else -1.0
    active += neg != -1.0
    row = np.array([sims[i], neg]) / tau
    pen.append(-(row[0] - np.log(np.exp(row - row.max()).sum()) - row.max()))
  return np.mean(scl), np.mean(pen), active


def flat(p):
  return np.concatenate([p["w"].ravel(), p["b"]])


def unflat(v):
  return {"w": v[: D * C].reshape(D, C), "b": v[D * C :]}


def numeric_grad(fn, p, eps=1e-6):
  v = flat(p)
  g = np.zeros_like(v)
  for i in range(len(v)):
    e = np.zeros_like(v)
    e[i] = eps
    g[i] = (fn(unflat(v + e)) - fn(unflat(v - e))) / (2 * eps)
  return unflat(g)


def tmap(f, *ps):
  return {k: f(*(p[k] for p in ps)) for k in ps[0]}


def np_local(method, hp, theta_g, x, y, idx, mask, momentum, cstate):
  """One client's local SGD (heavy-ball momentum) on the masked steps; returns (θ_k, τ_k)."""
  p = tmap(np.copy, theta_g)
  buf = tmap(np.zeros_like, p)
  steps = 0
  for s in range(idx.shape[0]):
    if not mask[s].any():
      continue
    xb, yb = x[idx[s][mask[s]]], y[idx[s][mask[s]]]
    g = np_ce_grad(p, xb, yb)
    if method == "fedprox":
      g = tmap(lambda gi, pi, gg: gi + hp["mu"] * (pi - gg), g, p, theta_g)
    elif method == "feddyn":
      g = tmap(
        lambda gi, hk, pi, gg: gi - hk + hp["alpha"] * (pi - gg), g, cstate["h_k"], p, theta_g
      )
    elif method == "scaffold":
      g = tmap(lambda gi, c, ck: gi + c - ck, g, cstate["c"], cstate["c_k"])
    elif method == "moon":
      extra = numeric_grad(
        lambda q, xb=xb: np_moon_term(q, theta_g, cstate["prev"], xb, hp["temperature"]), p
      )
      g = tmap(lambda a, b: a + hp["mu"] * b, g, extra)
    elif method == "fedrcl":

      def rcl(q, xb=xb, yb=yb):
        scl, pen, _ = np_rcl_terms(np_logits(q, xb), yb)
        return scl + pen

      g = tmap(lambda a, b: a + b, g, numeric_grad(rcl, p))
    buf = tmap(lambda m, gi: momentum * m + gi, buf, g)
    p = tmap(lambda pi, m: pi - LR * m, p, buf)
    steps += 1
  return p, steps


def np_counter_sum(tau, rho):
  counter = total = 0.0
  for _ in range(tau):
    counter = rho * counter + 1.0
    total += counter
  return total


def np_server(method, hp, theta, st, ids, p_k, locals_, taus, momentum):
  """The server update of one round (mutates the per-client state ``st``); returns θ_g."""
  avg = tmap(lambda *ts: sum(w * t for w, t in zip(p_k, ts)), *locals_)
  if method == "fednova":
    a = np.array([np_counter_sum(t, momentum) for t in taus])
    d = tmap(
      lambda g, *ts: sum(pk * (g - t) / ak for pk, t, ak in zip(p_k, ts, a)), theta, *locals_
    )
    return tmap(lambda g, dd: g - (p_k * a).sum() * dd, theta, d)
  if method == "scaffold":
    delta_c = []
    for j, k in enumerate(ids):
      new_ck = tmap(
        lambda ck, c, g, t, tau=taus[j]: ck - c + (g - t) / (tau * LR),
        st["c_k"][k],
        st["c"],
        theta,
        locals_[j],
      )
      delta_c.append(tmap(lambda a, b: a - b, new_ck, st["c_k"][k]))
      st["c_k"][k] = new_ck
    st["c"] = tmap(lambda c, *ds: c + sum(ds) / N_CLIENTS, st["c"], *delta_c)
  elif method == "feddyn":
    al = hp["alpha"]
    for j, k in enumerate(ids):
      st["h_k"][k] = tmap(lambda hk, t, g: hk - al * (t - g), st["h_k"][k], locals_[j], theta)
    st["h"] = tmap(
      lambda h, g, *ts: h - al / N_CLIENTS * sum(t - g for t in ts), st["h"], theta, *locals_
    )
    mean = tmap(lambda *ts: sum(ts) / len(ts), *locals_)
    return tmap(lambda m, h: m - h / al, mean, st["h"])
  elif method == "moon":
    for j, k in enumerate(ids):
      st["prev"][k] = locals_[j]
  return avg  # fedavg, fedprox, fedrcl, scaffold, moon: n_k-weighted mean


def np_run(method, hp, theta0, x, y, rounds, momentum):
  """Plain-Python reference of the rounds; returns (θ_g, per-client state dict)."""
  theta = tmap(np.float64, theta0)
  zeros = tmap(np.zeros_like, theta)
  st = {
    "c": tmap(np.copy, zeros),
    "c_k": [tmap(np.copy, zeros) for _ in range(N_CLIENTS)],
    "h": tmap(np.copy, zeros),
    "h_k": [tmap(np.copy, zeros) for _ in range(N_CLIENTS)],
    "prev": [tmap(np.copy, theta) for _ in range(N_CLIENTS)],
  }
  for rd in rounds:
    ids, idx, mask = np.asarray(rd.client_ids), np.asarray(rd.idx), np.asarray(rd.mask)
    n = np.asarray(rd.num_examples, np.float64)
    locals_, taus = [], []
    for j, k in enumerate(ids):
      cstate = {"c": st["c"], "c_k": st["c_k"][k], "h_k": st["h_k"][k], "prev": st["prev"][k]}
      th, tau = np_local(method, hp, theta, x, y, idx[j], mask[j], momentum, cstate)
      locals_.append(th)
      taus.append(tau)
    theta = np_server(method, hp, theta, st, ids, n / n.sum(), locals_, taus, momentum)
  return theta, st


# ---------------------------------------------------------------- the algorithm under test

CASES = {
  # name: (method, hparams, momentum)
  "fedprox": ("fedprox", {"mu": 0.5}, 0.0),
  "fednova_sgd": ("fednova", {}, 0.0),
  "fednova_momentum": ("fednova", {}, 0.9),
  "feddyn": ("feddyn", {"alpha": 0.1}, 0.0),
  "scaffold": ("scaffold", {}, 0.0),
  "moon": ("moon", {"mu": 1.0, "temperature": 0.5}, 0.0),
  "fedrcl": ("fedrcl", {}, 0.0),
}


def build(method, hp, momentum):
  model = linear_model()
  opt = optax.sgd(LR, momentum=momentum or None)
  ctx = registry.BuildContext(model, opt, lambda a: a, num_clients=N_CLIENTS)
  return model, registry.build_algorithm(method, ctx, **hp)


def client_state(method, state):
  """The method's per-client state as {name: stacked params-shaped tree} (empty if none)."""
  if method == "scaffold":
    return {"c_k": state.c_clients, "c": state.c}
  if method == "feddyn":
    return {"h_k": state.h_clients, "h": state.h}
  if method == "moon":
    return {"prev": state.prev_models["params"]}
  return {}


def to_np(tree):
  return jax.tree.map(lambda a: np.asarray(a, np.float64), tree)


@functools.cache
def toy_setup():
  """(x, y, the two rounds), built once per process."""
  x, y = toy_data()
  return x, y, toy_rounds(x, y)


def check_rounds_match_reference(case: str) -> None:
  """Two toy rounds of ``CASES[case]`` under vmap_scan and sequential equal the NumPy
  reference: the global model, every client's state, and the unsampled clients' rows bit for
  bit."""
  toy = toy_setup()
  method, hp, momentum = CASES[case]
  x, y, rounds = toy
  model, alg = build(method, hp, momentum)
  variables = model.init(jax.random.key(0), jnp.asarray(x[:2]))
  exp_theta, exp_state = np_run(
    method, hp, to_np(variables["params"]), x.astype(np.float64), y, rounds, momentum
  )
  tol = 2e-4 if method in ("moon", "fedrcl") else 2e-5
  for strategy in ("vmap_scan", "sequential"):
    round_fn = make_round(alg, strategy, BATCH_FN)
    state = alg.init(variables, jax.random.key(0))
    history = []
    for r, rd in enumerate(rounds):
      if strategy == "vmap_scan" and r == 1:
        cache = round_fn._cache_size()
      state, metrics = round_fn(state, rd, jax.random.key(r))
      history.append(to_np(client_state(method, state)))
      assert all(np.isfinite(float(v)) for v in jax.tree.leaves(metrics))
    if strategy == "vmap_scan":
      assert round_fn._cache_size() == cache, "round 2 recompiled"
    got = to_np(alg.global_variables(state)["params"])
    for k in ("w", "b"):
      np.testing.assert_allclose(got[k], exp_theta[k], atol=tol, err_msg=f"{strategy} θ_g[{k}]")
    final = history[-1]
    for name, stacked in final.items():
      if name in ("c_k", "h_k", "prev"):
        for client in range(N_CLIENTS):
          for k in ("w", "b"):
            np.testing.assert_allclose(
              stacked[k][client],
              exp_state[name][client][k],
              atol=tol,
              err_msg=f"{strategy} {name}[{client}][{k}]",
            )
      else:
        for k in ("w", "b"):
          np.testing.assert_allclose(stacked[k], exp_state[name][k], atol=tol)
    # Client 0 was not sampled in round 2 and client 1 not in round 1: bit-identical rows.
    for name, stacked in final.items():
      if name in ("c_k", "h_k", "prev"):
        for k in ("w", "b"):
          np.testing.assert_array_equal(stacked[k][0], history[0][name][k][0])


def check_reference_is_not_fedavg(case: str) -> None:
  """The hand-laid-out rounds separate the method from plain FedAvg (so its test can fail)."""
  toy = toy_setup()
  x, y, rounds = toy
  p0 = to_np(linear_model().init(jax.random.key(0), jnp.asarray(x[:2]))["params"])
  fedavg_theta, _ = np_run("fedavg", {}, p0, x.astype(np.float64), y, rounds, 0.0)
  method, hp, momentum = CASES[case]
  theta, _ = np_run(method, hp, p0, x.astype(np.float64), y, rounds, momentum)
  assert np.abs(flat(theta) - flat(fedavg_theta)).max() > 1e-3, case


def check_unsampled_clients_state_unchanged(method: str) -> None:
  """Round 1 samples clients 0 and 2: client 1's state is still exactly its initial value."""
  toy = toy_setup()
  x, y, rounds = toy
  if True:
    model, alg = build(method, CASES[method][1], 0.0)
    variables = model.init(jax.random.key(0), jnp.asarray(x[:2]))
    before = to_np(client_state(method, alg.init(variables, jax.random.key(0))))
    state, _ = make_round(alg, "vmap_scan", BATCH_FN)(
      alg.init(variables, jax.random.key(0)), rounds[0], jax.random.key(0)
    )
    after = to_np(client_state(method, state))
    for name in after:
      if name in ("c_k", "h_k", "prev"):
        for k in ("w", "b"):
          np.testing.assert_array_equal(after[name][k][1], before[name][k][1])
          assert not np.array_equal(after[name][k][0], before[name][k][0]), (method, name)
