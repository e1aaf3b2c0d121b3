"""FedProx, FedNova, FedDyn, SCAFFOLD, MOON and FedRCL against independent NumPy references.

Each method runs two hand-laid-out rounds (two sampled clients out of three, a linear softmax model,
plain or momentum SGD, unequal step counts and a padded example) through the vmapped round and the
sequential strategy; a float64 NumPy re-implementation of METHODS.md's formulas, looping over
clients in plain Python, must give the same global model and the same per-client state, and
clients that were not sampled must keep their state bit for bit.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from fedjax_proj.algorithms import fednova, registry
from fedjax_proj.algorithms.base import make_round
from fedjax_proj.algorithms.fedrcl import relaxed_contrastive_terms
from fedjax_proj.algorithms.moon import model_contrastive_loss
from fedjax_proj.core.engine import run_vmap_scan
from fedjax_proj.core.types import Model, ModelOutput, RoundData
from fedjax_proj.data.pipeline import make_batch_fn, normalizer

D, C, N_CLIENTS, LR = 3, 3, 3, 0.2
SIZES = np.array([6.0, 3.0, 5.0], np.float32)  # n_k of clients 0, 1, 2


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
  ctx = registry.BuildContext(
    model, opt, make_batch_fn(normalizer(0.0, 1.0)), lambda a: a, num_clients=N_CLIENTS
  )
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


@pytest.fixture(scope="module")
def toy():
  x, y = toy_data()
  return x, y, toy_rounds(x, y)


@pytest.mark.parametrize("case", sorted(CASES))
def test_toy_rounds_match_numpy_reference(toy, case):
  method, hp, momentum = CASES[case]
  x, y, rounds = toy
  model, alg = build(method, hp, momentum)
  variables = model.init(jax.random.key(0), jnp.asarray(x[:2]))
  exp_theta, exp_state = np_run(
    method, hp, to_np(variables["params"]), x.astype(np.float64), y, rounds, momentum
  )
  tol = 2e-4 if method in ("moon", "fedrcl") else 2e-5
  for strategy in ("vmap_scan", "sequential"):
    round_fn = make_round(alg, strategy)
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


def test_reference_is_not_fedavg(toy):
  """The hand-laid-out rounds separate each method from plain FedAvg (the tests can fail)."""
  x, y, rounds = toy
  p0 = to_np(linear_model().init(jax.random.key(0), jnp.asarray(x[:2]))["params"])
  fedavg_theta, _ = np_run("fedavg", {}, p0, x.astype(np.float64), y, rounds, 0.0)
  for case, (method, hp, momentum) in CASES.items():
    if momentum:
      continue
    theta, _ = np_run(method, hp, p0, x.astype(np.float64), y, rounds, momentum)
    assert np.abs(flat(theta) - flat(fedavg_theta)).max() > 1e-3, case
  # FedRCL's relaxation penalty is active on this data (some same-class pairs are ≥ 0.7 similar).
  feats = np_logits(p0, x[:6].astype(np.float64))
  assert np_rcl_terms(feats, y[:6])[2] > 0


def test_unsampled_clients_state_unchanged_in_first_round(toy):
  """Round 1 samples clients 0 and 2: client 1's state is still exactly its initial value."""
  x, y, rounds = toy
  for method in ("scaffold", "feddyn", "moon"):
    model, alg = build(method, CASES[method][1], 0.0)
    variables = model.init(jax.random.key(0), jnp.asarray(x[:2]))
    before = to_np(client_state(method, alg.init(variables, jax.random.key(0))))
    state, _ = make_round(alg, "vmap_scan")(
      alg.init(variables, jax.random.key(0)), rounds[0], jax.random.key(0)
    )
    after = to_np(client_state(method, state))
    for name in after:
      if name in ("c_k", "h_k", "prev"):
        for k in ("w", "b"):
          np.testing.assert_array_equal(after[name][k][1], before[name][k][1])
          assert not np.array_equal(after[name][k][0], before[name][k][0]), (method, name)


@pytest.mark.parametrize("momentum", [0.0, 0.5, 0.9])
def test_fednova_a_k_equals_momentum_counter_rule(momentum):
  table = np.asarray(fednova.unit_gradient_displacement(optax.sgd(0.3, momentum or None), 6))
  expected = [np_counter_sum(t, momentum) for t in range(7)]
  np.testing.assert_allclose(table / table[1], expected, rtol=1e-5)


def test_fednova_a_k_for_adam_is_step_count_and_ignores_weight_decay():
  adam = optax.adam(1e-3)
  steps = jnp.array([0, 1, 4, 7])
  np.testing.assert_allclose(fednova.normalized_steps(adam, steps, 7), [0, 1, 4, 7], rtol=1e-5)
  sgdw = optax.chain(optax.add_decayed_weights(0.1), optax.sgd(0.1, momentum=0.9))
  np.testing.assert_allclose(
    fednova.normalized_steps(sgdw, steps, 7),
    [np_counter_sum(int(t), 0.9) for t in steps],
    rtol=1e-5,
  )


def test_moon_and_fedrcl_losses_match_numpy():
  rng = np.random.default_rng(0)
  z, zg, zp = (rng.normal(size=(6, 5)).astype(np.float32) for _ in range(3))
  logits = np.stack([np_cos(z, zg), np_cos(z, zp)], -1) / 0.5
  np.testing.assert_allclose(
    model_contrastive_loss(z, zg, zp, 0.5), -np_log_softmax(logits)[:, 0].mean(), rtol=1e-5
  )
  y = np.array([0, 0, 1, 1, 1, 2], np.int32)
  base = rng.normal(size=(3, 5))
  feats = (base[y] + 0.2 * rng.normal(size=(6, 5))).astype(np.float32)
  scl, pen, active = np_rcl_terms(feats.astype(np.float64), y)
  assert active > 0
  got = relaxed_contrastive_terms(jnp.asarray(feats), jnp.asarray(y))
  np.testing.assert_allclose(got, [scl, pen], rtol=1e-4)
  # Thresholds on either side of one same-class similarity switch that pair's penalty on and off.
  f = feats / np.linalg.norm(feats, axis=1, keepdims=True)
  s01 = float(f[0] @ f[1])  # the only other class-0 example of anchors 0 and 1
  for threshold in (s01 - 1e-3, s01 + 1e-3):
    ref = np_rcl_terms(feats.astype(np.float64), y, threshold=threshold, topk=1)
    got_t = relaxed_contrastive_terms(
      jnp.asarray(feats), jnp.asarray(y), threshold=threshold, topk_neg=1
    )
    np.testing.assert_allclose(got_t, ref[:2], rtol=1e-4)
  on = np_rcl_terms(feats.astype(np.float64), y, threshold=s01 - 1e-3)[2]
  off = np_rcl_terms(feats.astype(np.float64), y, threshold=s01 + 1e-3)[2]
  assert on == off + 2
  # Padding: masked rows must not change the result (neither as anchors nor as candidates).
  padded = np.concatenate([feats, rng.normal(size=(2, 5)).astype(np.float32)])
  y_pad = np.concatenate([y, [0, 1]]).astype(np.int32)
  mask = np.array([1] * 6 + [0, 0], np.float32)
  got_pad = relaxed_contrastive_terms(jnp.asarray(padded), jnp.asarray(y_pad), jnp.asarray(mask))
  np.testing.assert_allclose(got_pad, got, rtol=1e-5)


def test_fedrcl_clips_the_local_gradient(toy):
  """With clip_norm = c below the raw gradient norm, one plain-SGD step moves the parameters by
  exactly lr·c; with a large c the step is the ordinary, much larger one."""
  x, y, rounds = toy
  rd = rounds[0]._replace(mask=rounds[0].mask.at[:, 1].set(False))  # one step per client
  keys = jax.random.split(jax.random.key(0), 2)
  steps = {}
  for clip_norm in (1e-3, 1e3):
    model, alg = build("fedrcl", {"clip_norm": clip_norm}, 0.0)
    variables = model.init(jax.random.key(0), jnp.asarray(x[:2]))
    shared, inputs = alg.broadcast(alg.init(variables, jax.random.key(0)), rd, jax.random.key(0))
    res = run_vmap_scan(
      alg.client, alg.batch_fn, shared, inputs, rd.images, rd.labels, rd.idx, rd.mask, keys
    )
    p0 = flat(to_np(variables["params"]))
    steps[clip_norm] = [
      np.linalg.norm(
        flat(to_np(jax.tree.map(lambda a, c=c: a[c], res["variables"]["params"]))) - p0
      )
      for c in range(2)
    ]
  np.testing.assert_allclose(steps[1e-3], [LR * 1e-3] * 2, rtol=1e-3)
  assert min(steps[1e3]) > 10 * LR * 1e-3


@pytest.mark.parametrize(
  "method,hp,match",
  [
    ("feddyn", {"alpha": 0.0}, "alpha > 0"),
    ("fedprox", {"mu": -1.0}, "mu >= 0"),
    ("moon", {"temperature": 0.0}, "temperature > 0"),
    ("fedrcl", {"topk_neg": 0}, "topk_neg >= 1"),
  ],
)
def test_bad_hyperparameters_fail_clearly(method, hp, match):
  with pytest.raises(ValueError, match=match):
    build(method, hp, 0.0)


def test_feddyn_rejects_server_optimizer():
  ctx = registry.BuildContext(
    linear_model(),
    optax.sgd(0.1),
    make_batch_fn(normalizer(0.0, 1.0)),
    lambda a: a,
    3,
    server_optimizer=optax.sgd(1.0),
  )
  with pytest.raises(ValueError, match="server_optimizer=none"):
    registry.build_algorithm("feddyn", ctx)


def test_moon_declares_projection_head():
  assert registry.model_kwargs("moon") == {"projection_dim": 256}
  for name in ("fedprox", "fednova", "feddyn", "scaffold", "moon", "fedrcl"):
    assert not registry.needs_public(name)


def test_optimizer_caveat_flags_scaffold_with_adam_only():
  from fedjax_proj.algorithms import registry

  caveat = registry.optimizer_caveat("scaffold", "adam")
  assert caveat is not None and "--optimizer=sgd" in caveat
  assert registry.optimizer_caveat("scaffold", "sgd") is None
  assert registry.optimizer_caveat("fedavg", "adam") is None
