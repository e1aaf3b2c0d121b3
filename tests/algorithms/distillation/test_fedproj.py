"""FedProj: the projection rule, the memory loss, the vmapped round, and the server pieces."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from fedjax_proj.algorithms import losses
from fedjax_proj.algorithms.base import make_round
from fedjax_proj.algorithms.distillation import distill, fedproj
from fedjax_proj.core import tree as T
from fedjax_proj.data.federated import FederatedData
from tests import helpers


def _tree(key, scale=1.0):
  k1, k2 = jax.random.split(key)
  return {
    "w": scale * jax.random.normal(k1, (3, 4)),
    "b": {"c": scale * jax.random.normal(k2, (5,))},
  }


def test_projection_equals_closed_form_and_removes_conflict():
  for seed in range(20):
    g, gm = _tree(jax.random.key(seed)), _tree(jax.random.key(100 + seed))
    out, fired, cos = fedproj.project_gradient(g, gm, tau=1e-6)
    gv, mv = np.asarray(T.tree_ravel(g), np.float64), np.asarray(T.tree_ravel(gm), np.float64)
    dot = gv @ mv
    expected = gv - dot / (mv @ mv) * mv if dot < 0 else gv
    np.testing.assert_allclose(T.tree_ravel(out), expected, rtol=1e-5, atol=1e-5)
    assert bool(fired) == (dot < 0)
    assert float(T.tree_dot(out, gm)) >= -1e-4  # <g, g_mem> >= 0 after projection
    np.testing.assert_allclose(cos, dot / np.linalg.norm(gv) / np.linalg.norm(mv), rtol=1e-4)


def test_projection_leaves_aligned_and_tiny_memory_gradients_alone():
  g = _tree(jax.random.key(0))
  aligned = T.tree_scale(0.5, g)
  out, fired, _ = fedproj.project_gradient(g, aligned)
  assert not bool(fired)
  np.testing.assert_array_equal(T.tree_ravel(out), T.tree_ravel(g))
  tiny_conflict = T.tree_scale(-1e-5, g)  # ‖g_mem‖² ≈ 1e-10·‖g‖² < τ
  out, fired, _ = fedproj.project_gradient(g, tiny_conflict, tau=1e-6)
  assert not bool(fired)
  np.testing.assert_array_equal(T.tree_ravel(out), T.tree_ravel(g))


def test_projection_uses_one_inner_product_across_leaves():
  # Leaf "a" conflicts, leaf "b" agrees strongly: the whole-vector dot is positive, so nothing
  # is projected (a per-tensor rule would have changed leaf "a").
  g = {"a": jnp.array([1.0, 0.0]), "b": jnp.array([3.0])}
  gm = {"a": jnp.array([-1.0, 0.0]), "b": jnp.array([2.0])}
  out, fired, _ = fedproj.project_gradient(g, gm)
  assert not bool(fired)
  np.testing.assert_array_equal(out["a"], g["a"])
  # Now the total conflicts: the correction touches every leaf with one coefficient.
  gm2 = {"a": jnp.array([-4.0, 0.0]), "b": jnp.array([0.5])}
  out, fired, _ = fedproj.project_gradient(g, gm2)
  coef = (-4.0 + 1.5) / (16.0 + 0.25)
  assert bool(fired)
  np.testing.assert_allclose(out["a"], [1.0 - coef * -4.0, 0.0], rtol=1e-6)
  np.testing.assert_allclose(out["b"], [3.0 - coef * 0.5], rtol=1e-6)


def test_clamp_limits_the_coefficient():
  g = {"a": jnp.array([1.0, 0.0])}
  gm = {"a": jnp.array([-0.1, 0.0])}  # coefficient -10
  out, _, _ = fedproj.project_gradient(g, gm, max_coef=2.0)
  np.testing.assert_allclose(out["a"], [1.0 - 2.0 * 0.1, 0.0], rtol=1e-6)


def test_memory_kl_matches_numpy():
  rng = np.random.default_rng(0)
  zt, zs = rng.normal(size=(6, 5)), rng.normal(size=(6, 5))
  t = 3.0

  def softmax(z):
    e = np.exp(z - z.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)

  p, q = softmax(zt / t), softmax(zs / t)
  expected = t * t * np.mean(np.sum(p * (np.log(p) - np.log(q)), -1))
  got = losses.kl_from_logits(jnp.asarray(zt), jnp.asarray(zs), t)
  np.testing.assert_allclose(got, expected, rtol=1e-5)
  model = helpers.tiny_model(num_classes=5)
  v = model.init(jax.random.key(0), jnp.zeros((1, 4)))
  x = jnp.asarray(rng.normal(size=(6, 4)), jnp.float32)
  logits = model.apply(v, x, train=False).logits
  q_model = softmax(np.asarray(logits, np.float64))
  p_plain = softmax(zt)
  # Default: the papers' plain KL (000 Eq. 3, 001 Eq. 4): no temperature, no T².
  plain = np.mean(np.sum(p_plain * (np.log(p_plain) - np.log(q_model)), -1))
  np.testing.assert_allclose(fedproj.memory_kl(jnp.asarray(zt), logits), plain, rtol=1e-5)
  # The authors' code: KL at T = 3 without the T² factor.
  p_t, q_t = softmax(zt / t), softmax(np.asarray(logits, np.float64) / t)
  tempered = np.mean(np.sum(p_t * (np.log(p_t) - np.log(q_t)), -1))
  np.testing.assert_allclose(fedproj.memory_kl(jnp.asarray(zt), logits, t), tempered, rtol=1e-5)
  # The distillation convention (this library's default before it followed the papers' plain
  # KL): T²·KL at T.
  np.testing.assert_allclose(
    fedproj.memory_kl(jnp.asarray(zt), logits, t, True),
    t * t * tempered,
    rtol=1e-5,
  )


# The FedProj of fp_setup (its lmem_global aside).
_SETUP_HPARAMS = dict(
  public_size=48,
  memory_size=32,
  memory_batch_size=8,
  distill_epochs=1,
  distill_batch_size=16,
  distill_lr=1e-2,
)


@pytest.fixture(scope="module")
def fp_setup():
  x, y = helpers.synthetic_data(n=160)
  public = jnp.asarray(helpers.synthetic_data(n=48, seed=5)[0])
  model = helpers.tiny_model()
  fd = FederatedData(helpers.unequal_clients(len(x)), batch_size=6, local_epochs=2)
  alg = fedproj.fedproj(model, optax.sgd(0.1), lambda z: z, **_SETUP_HPARAMS, lmem_global=True)
  variables = model.init(jax.random.key(0), jnp.asarray(x[:2]))
  return x, y, public, model, fd, alg, variables


def _rd(fd, x, y, public, r):
  rd = helpers.round_data(fd, x, y, round_idx=r)
  return rd._replace(extra={"public_images": public})


def _two_rounds(alg, strategy, fd, x, y, public, variables, compiler_options=None):
  round_fn = make_round(alg, strategy, helpers.float_batch_fn())
  if compiler_options:  # the jitted round inlined into one program compiled with these options
    round_fn = jax.jit(round_fn, compiler_options=compiler_options)
  state = alg.init(variables, jax.random.key(0))
  out = []
  for r in range(2):
    state, metrics = round_fn(state, _rd(fd, x, y, public, r), jax.random.key(10 + r))
    out.append(metrics)
  return state, out


@pytest.mark.parametrize("strategy", ["sequential", "vmap_stepwise"])
def test_vmapped_round_equals_per_client_loop(fp_setup, strategy):
  x, y, public, model, fd, alg, variables = fp_setup
  ref, ref_m = _two_rounds(alg, "vmap_scan", fd, x, y, public, variables)
  got, got_m = _two_rounds(alg, strategy, fd, x, y, public, variables)
  np.testing.assert_allclose(T.tree_ravel(got.variables), T.tree_ravel(ref.variables), atol=1e-5)
  np.testing.assert_allclose(got.memory_logits, ref.memory_logits, atol=1e-5)
  for k in ("projected_fraction", "mean_cos", "lmem_global", "distill_loss"):
    np.testing.assert_allclose(got_m[1][k], ref_m[1][k], atol=1e-5)
  assert ref_m[0]["projected_fraction"] == 0.0  # round 0: no ensemble yet, projection skipped
  assert ref_m[1]["projected_fraction"] > 0.0


def test_client_matches_hand_written_projected_sgd(fp_setup):
  """One client, round 1: replay its steps by hand (SGD, projection) and compare."""
  x, y, public, model, fd, alg, variables = fp_setup
  state = alg.init(variables, jax.random.key(0))
  round_fn = make_round(alg, "vmap_scan", helpers.float_batch_fn())
  state, _ = round_fn(state, _rd(fd, x, y, public, 0), jax.random.key(10))
  rd = _rd(fd, x, y, public, 1)
  shared, _ = alg.broadcast(state, rd, jax.random.key(0))
  keys = jax.random.split(jax.random.key(3), rd.idx.shape[0])
  from fedjax_proj.core.engine import run_vmap_scan

  out = run_vmap_scan(
    alg.client, helpers.float_batch_fn(), shared, {}, rd.images, rd.labels, rd.idx, rd.mask, keys
  )
  c = 1
  params = variables_params = state.variables["params"]
  mem_x, mem_z = shared["memory_images"], shared["memory_logits"]
  ce_grad = jax.jit(
    jax.grad(
      lambda p, xb, yb: optax.softmax_cross_entropy_with_integer_labels(
        model.apply({"params": p}, xb, train=False).logits, yb
      ).mean()
    )
  )

  def plain_kl(p, xm, zm):  # the default memory loss: KL(σ(Z_ens) ‖ σ(f)), batchmean, no T
    log_q = jax.nn.log_softmax(model.apply({"params": p}, xm, train=False).logits)
    log_p = jax.nn.log_softmax(zm)
    return jnp.mean(jnp.sum(jnp.exp(log_p) * (log_p - log_q), -1))

  kl_grad = jax.jit(jax.grad(plain_kl))
  cursor = 0
  for s in range(rd.idx.shape[1]):
    m = np.asarray(rd.mask[c, s])
    if not m.any():
      continue
    ii = np.asarray(rd.idx[c, s])[m]
    rows = (cursor * 8 + np.arange(8)) % 32
    g = ce_grad(params, jnp.asarray(x[ii]), jnp.asarray(y[ii]))
    gm = kl_grad(params, mem_x[rows], mem_z[rows])
    gv, mv = np.asarray(T.tree_ravel(g), np.float64), np.asarray(T.tree_ravel(gm), np.float64)
    dot = float(gv @ mv)
    coef = dot / float(mv @ mv) if (dot < 0 and float(mv @ mv) > 1e-6) else 0.0
    params = jax.tree.map(lambda p, a, b, k=coef: p - 0.1 * (a - k * b), params, g, gm)
    cursor += 1
  del variables_params
  np.testing.assert_allclose(
    T.tree_ravel(T.index_clients(out["variables"]["params"], c)), T.tree_ravel(params), atol=2e-5
  )


def test_no_recompilation_on_second_round(fp_setup):
  x, y, public, model, fd, alg, variables = fp_setup
  round_fn = make_round(alg, "vmap_scan", helpers.float_batch_fn())
  state = alg.init(variables, jax.random.key(0))
  state, _ = round_fn(state, _rd(fd, x, y, public, 0), jax.random.key(1))
  size = round_fn._cache_size()
  state, _ = round_fn(state, _rd(fd, x, y, public, 1), jax.random.key(2))
  assert round_fn._cache_size() == size


def test_server_distillation_lowers_kl_and_keeps_batch_stats():
  model = helpers.tiny_bn_model()
  key = jax.random.key(0)
  public = jax.random.randint(key, (40, 8, 8, 3), 0, 255).astype(jnp.uint8)
  normalize = lambda im: im.astype(jnp.float32) / 255.0
  student = model.init(jax.random.key(1), normalize(public[:2]))
  # give the student non-trivial running statistics so "unchanged" is meaningful
  student = {**student, "batch_stats": jax.tree.map(lambda s: s + 0.3, student["batch_stats"])}
  teachers = T.stack_clients([model.init(jax.random.key(k), normalize(public[:2])) for k in (2, 3)])
  logits = distill.client_logits_scan(model, teachers, normalize, public, batch_size=16)
  assert logits.shape == (2, 40, 4)
  teacher = distill.mean_teacher(logits)
  kl = lambda v: float(
    losses.kl_from_logits(teacher, model.apply(v, normalize(public), train=False).logits, 3.0)
  )
  cfg = distill.DistillConfig(epochs=3, batch_size=16, lr=3e-3, temperature=3.0)
  new, loss = jax.jit(lambda s, t, p, k: distill.distill_scan(model, s, t, p, normalize, k, cfg))(
    student, teacher, public, key
  )
  assert kl(new) < 0.7 * kl(student)
  np.testing.assert_array_equal(
    T.tree_ravel(new["batch_stats"]), T.tree_ravel(student["batch_stats"])
  )
  # the host loop computes the same thing
  host_logits = distill.HostClientLogits(model, normalize, 16)(teachers, public)
  np.testing.assert_allclose(host_logits, logits, atol=1e-5)
  host_new, host_loss = distill.HostDistiller(model, normalize, cfg)(student, teacher, public, key)
  np.testing.assert_allclose(T.tree_ravel(host_new), T.tree_ravel(new), atol=1e-5)
  np.testing.assert_allclose(host_loss, loss, rtol=1e-5)


def test_weight_divergence_term_pulls_towards_anchor():
  model = helpers.tiny_model(num_classes=3)
  public = jnp.asarray(helpers.synthetic_data(n=32, seed=2)[0])
  student = model.init(jax.random.key(0), public[:2])
  teacher = model.apply(model.init(jax.random.key(9), public[:2]), public, train=False).logits
  dist = {}
  for alpha in (0.0, 10.0):
    cfg = distill.DistillConfig(epochs=5, batch_size=8, lr=1e-2, temperature=3.0, alpha=alpha)
    new, _ = distill.distill_scan(
      model, student, teacher, public, lambda z: z, jax.random.key(1), cfg
    )
    dist[alpha] = float(T.tree_norm(T.tree_sub(new["params"], student["params"])))
  assert 0 < dist[10.0] < 0.5 * dist[0.0]


def test_clients_anchor_has_the_gradient_of_the_sum_over_clients():
  """001, C.1: L_div = Σ_k ‖θ_k − θ_g‖²; the 'clients' anchor is K‖θ_g − θ̄‖² (same gradient)."""
  model = helpers.tiny_model(num_classes=3)
  public = jnp.asarray(helpers.synthetic_data(n=16, seed=2)[0])
  clients = T.stack_clients([model.init(jax.random.key(k), public[:2]) for k in (4, 5, 6)])
  student = model.init(jax.random.key(0), public[:2])
  teacher = jnp.zeros((16, 3))
  cfg = distill.DistillConfig(epochs=1, batch_size=16, lr=1e-2, alpha=0.3, anchor="clients")
  params = clients["params"]
  mean = T.weighted_mean(params, jnp.ones(3))
  # One Adam step from the same start: the student moves the same way for both objectives.
  new, _ = distill.distill_scan(
    model, student, teacher, public, lambda z: z, jax.random.key(1), cfg, mean, 3.0
  )

  def explicit(p):
    div = sum(T.tree_sq_norm(T.tree_sub(T.index_clients(params, k), p)) for k in range(3))
    out = model.apply({"params": p}, public, train=False).logits
    return losses.kl_from_logits(teacher, out, cfg.temperature) + cfg.alpha * div

  g = jax.grad(explicit)(student["params"])
  opt = optax.adam(cfg.lr)
  upd, _ = opt.update(g, opt.init(student["params"]), student["params"])
  expected = optax.apply_updates(student["params"], upd)
  np.testing.assert_allclose(T.tree_ravel(new["params"]), T.tree_ravel(expected), atol=1e-6)


def test_server_divergence_anchor(fp_setup):
  """Algorithm 1 (default) anchors on θ_g^(t); 'fedavg' on this round's average; 'clients' (C.1)."""
  x, y, public, model, fd, _, variables = fp_setup
  rd = _rd(fd, x, y, public, 0)
  kwargs = dict(public_size=48, memory_size=32, memory_batch_size=8, distill_batch_size=16)

  def run(**kw):
    alg = fedproj.fedproj(model, optax.sgd(0.1), lambda z: z, **kwargs, **kw)
    state = alg.init(variables, jax.random.key(0))
    round_fn = make_round(alg, "vmap_scan", helpers.float_batch_fn())
    return round_fn(state, rd, jax.random.key(1))[0].variables["params"]

  averaged = run(distill_epochs=0)  # θ_avg of this round
  previous = variables["params"]  # θ_g^(t)
  new = {
    a: run(distill_epochs=3, distill_lr=3e-2, alpha=1e3, divergence_anchor=a)
    for a in ("previous", "fedavg", "clients")
  }
  dist = lambda a, b: float(T.tree_norm(T.tree_sub(a, b)))
  # Each anchor pulls the distilled model towards itself, not towards the other one.
  assert dist(new["previous"], previous) < 0.5 * dist(new["fedavg"], previous)
  assert dist(new["fedavg"], averaged) < 0.5 * dist(new["previous"], averaged)
  # θ̄ (unweighted) differs from θ_avg (weighted by |D_k|): a third, distinct result.
  assert dist(new["clients"], new["fedavg"]) > 0
  with pytest.raises(ValueError, match="divergence_anchor"):
    run(divergence_anchor="x")


def test_uncertainty_teacher_prefers_confident_agreeing_clients():
  confident = jnp.array([[[8.0, 0.0, 0.0]]])
  unsure = jnp.array([[[0.5, 0.4, 0.3]]])
  logits = jnp.concatenate([confident, unsure, unsure])
  weighted = distill.uncertainty_weighted_teacher(logits)
  mean = distill.mean_teacher(logits)
  # the confident client's vote counts more than in the plain mean
  assert float(weighted[0, 0] - weighted[0, 1]) > float(mean[0, 0] - mean[0, 1])
  same = jnp.stack([confident[0]] * 3)
  np.testing.assert_allclose(distill.uncertainty_weighted_teacher(same), confident[0], rtol=1e-5)


def test_round0_ce_uses_labelled_public_data(fp_setup):
  x, y, public, model, fd, alg, variables = fp_setup
  alg_ce = fedproj.fedproj(
    model,
    optax.sgd(0.1),
    lambda z: z,
    public_size=48,
    memory_size=32,
    memory_batch_size=8,
    round0="ce",
    distill_epochs=0,
  )
  rd = _rd(fd, x, y, public, 0)
  round_fn = make_round(alg_ce, "vmap_scan", helpers.float_batch_fn())
  with pytest.raises(ValueError, match="public_labels"):
    round_fn(alg_ce.init(variables, jax.random.key(0)), rd, jax.random.key(1))
  labels = jnp.asarray(helpers.synthetic_data(n=48, seed=5)[1])
  rd = rd._replace(extra={"public_images": public, "public_labels": labels})
  _, metrics = round_fn(alg_ce.init(variables, jax.random.key(0)), rd, jax.random.key(1))
  assert float(metrics["projected_fraction"]) > 0.0


def test_projection_off_is_feddf_and_projection_on_differs(fp_setup):
  """FedDF and FedProj share the server (docs/methods.md), so FedProj minus its projection is
  FedDF: the paired FedProj − FedDF difference of the reproduce claims is the projection's."""
  from fedjax_proj.algorithms.distillation import feddf

  x, y, public, model, fd, alg, variables = fp_setup
  common = dict(public_size=48, distill_epochs=1, distill_batch_size=16, distill_lr=1e-2, alpha=0.0)
  args = (model, optax.sgd(0.1), lambda z: z)
  df = feddf.ensemble_distillation(*args, **common)
  off = fedproj.fedproj(*args, memory_size=48, memory_batch_size=8, projection_prob=0.0, **common)
  on = fedproj.fedproj(*args, memory_size=48, memory_batch_size=8, **common)
  # FedProj's client program also computes the memory gradient, so XLA may fuse (and reduce)
  # differently from FedDF's: equal to round-off, far tighter than the projection's effect below.
  # That round-off is XLA:CPU's with its default fusion emitters; the suite's classic emitter
  # (tests/core/multiprocess.py, FAST_COMPILE) reduces differently (one parameter of 67 differed by
  # 1.5e-6 relative), so both programs are compiled with the default emitters here.
  default_emitters = {"xla_cpu_use_fusion_emitters": True}
  ref, _ = _two_rounds(df, "vmap_scan", fd, x, y, public, variables, default_emitters)
  got, metrics = _two_rounds(off, "vmap_scan", fd, x, y, public, variables, default_emitters)
  assert metrics[1]["projected_fraction"] == 0.0
  np.testing.assert_allclose(
    T.tree_ravel(got.variables), T.tree_ravel(ref.variables), rtol=1e-6, atol=1e-7
  )
  proj, metrics = _two_rounds(on, "vmap_scan", fd, x, y, public, variables)
  assert metrics[1]["projected_fraction"] > 0.0
  assert not np.allclose(T.tree_ravel(proj.variables), T.tree_ravel(ref.variables), atol=1e-5)


def test_projection_window_turns_projection_off_outside_it(fp_setup):
  """proj_rounds=(start, stop): the code's is_proj only in rounds start <= t < stop."""
  x, y, public, model, fd, _, variables = fp_setup
  kwargs = dict(public_size=48, memory_size=32, memory_batch_size=8, distill_epochs=0)
  args = (model, optax.sgd(0.1), lambda z: z)
  projected = {}
  for window in ((0, 1), "1:2"):
    alg = fedproj.fedproj(*args, proj_rounds=window, **kwargs)
    _, metrics = _two_rounds(alg, "vmap_scan", fd, x, y, public, variables)
    projected[str(window)] = float(metrics[1]["projected_fraction"])
  assert projected["1:2"] > 0.0  # round 1 inside [1, 2)
  assert projected["(0, 1)"] == 0.0  # round 1 outside [0, 1)
  for bad in ((3, 2), (-1, 4), "x"):
    with pytest.raises(ValueError, match="proj_rounds"):
      fedproj.fedproj(*args, proj_rounds=bad, **kwargs)


def test_memory_order_shuffle_covers_each_row_once_per_pass_per_client():
  key_a = jax.random.key_data(jax.random.key(1))
  key_b = jax.random.key_data(jax.random.key(2))
  rows = lambda key, order, steps=6: np.concatenate(
    [np.asarray(fedproj.memory_batch_rows(jnp.int32(c), key, 12, 4, order)) for c in range(steps)]
  )
  np.testing.assert_array_equal(rows(key_a, "cycle"), np.arange(24) % 12)
  a, b = rows(key_a, "shuffle"), rows(key_b, "shuffle")
  for p in range(2):  # every pass is a permutation of the buffer ...
    assert sorted(a[12 * p : 12 * (p + 1)]) == list(range(12))
  assert not np.array_equal(a[:12], a[12:])  # ... reshuffled per pass ...
  assert not np.array_equal(a, b)  # ... and per client
  # A batch straddling two passes (10 rows, 4 per batch) still covers each pass once.
  c = np.concatenate(
    [np.asarray(fedproj.memory_batch_rows(jnp.int32(s), key_a, 10, 4, "shuffle")) for s in range(5)]
  )
  assert sorted(c[:10]) == list(range(10)) and sorted(c[10:20]) == list(range(10))
  with pytest.raises(ValueError, match="memory_order"):
    fedproj.fedproj(helpers.tiny_model(), optax.sgd(0.1), lambda z: z, public_size=8,
                    memory_size=8, memory_order="random")  # fmt: skip


def test_int_cast_memory_truncates_images_and_logits(fp_setup):
  """int_cast_memory = the code's .type(LongTensor): the client sees trunc(x_mem), trunc(Z)."""
  from fedjax_proj.core.engine import run_vmap_scan

  x, y, public, model, fd, _, variables = fp_setup
  kwargs = dict(public_size=48, memory_size=32, memory_batch_size=8, distill_epochs=0)
  args = (model, optax.sgd(0.1), lambda z: 3.0 * z)  # scaled so truncation changes the inputs
  cast = fedproj.fedproj(*args, int_cast_memory=True, **kwargs)
  plain = fedproj.fedproj(*args, **kwargs)
  round_fn = make_round(plain, "vmap_scan", helpers.float_batch_fn())
  state = round_fn(
    plain.init(variables, jax.random.key(0)), _rd(fd, x, y, public, 0), jax.random.key(1)
  )[0]
  rd = _rd(fd, x, y, public, 1)
  shared, _ = plain.broadcast(state, rd, jax.random.key(0))
  shared = {**shared, "memory_logits": 2.5 * shared["memory_logits"]}
  truncated = {
    **shared,
    "memory_images": jnp.trunc(3.0 * shared["memory_images"]) / 3.0,
    "memory_logits": jnp.trunc(shared["memory_logits"]),
  }
  keys = jax.random.split(jax.random.key(3), rd.idx.shape[0])

  def client_params(alg, sh):
    out = run_vmap_scan(
      alg.client, helpers.float_batch_fn(), sh, {}, rd.images, rd.labels, rd.idx, rd.mask, keys
    )
    return T.tree_ravel(out["variables"]["params"])

  np.testing.assert_allclose(
    client_params(cast, shared), client_params(plain, truncated), atol=1e-5
  )
  assert not np.allclose(client_params(cast, shared), client_params(plain, shared), atol=1e-4)


def test_live_anchor_is_the_codes_zero_divergence_term(fp_setup):
  """divergence_anchor='live' (the code's aliased anchor): α has no effect at all."""
  x, y, public, model, fd, _, variables = fp_setup
  rd = _rd(fd, x, y, public, 0)
  kwargs = dict(public_size=48, memory_size=32, memory_batch_size=8, distill_batch_size=16)

  def run(**kw):
    alg = fedproj.fedproj(model, optax.sgd(0.1), lambda z: z, **kwargs, distill_epochs=2, **kw)
    state = alg.init(variables, jax.random.key(0))
    round_fn = make_round(alg, "vmap_scan", helpers.float_batch_fn())
    return T.tree_ravel(round_fn(state, rd, jax.random.key(1))[0].variables["params"])

  # (test_server_divergence_anchor shows α = 1e3 moves the result under the other anchors.)
  live = run(alpha=1e3, divergence_anchor="live", distill_lr=3e-2)
  np.testing.assert_allclose(live, run(alpha=0.0, distill_lr=3e-2), atol=1e-6)


def test_feddf_distils_on_the_public_normaliser_as_fedproj_does(fp_setup):
  """Under --normalization=code the public set has its own normaliser; FedDF's server must use it
  as FedProj's does (registry builds), or FedProj − FedDF would mix in a normalisation effect."""
  import types

  from fedjax_proj.algorithms.distillation import feddf

  x, y, public, model, fd, _, variables = fp_setup
  hp = dict(distill_epochs=1, distill_batch_size=16, distill_lr=1e-2, alpha=0.0)

  def ctx(public_normalize):
    return types.SimpleNamespace(
      model=model,
      client_optimizer=optax.sgd(0.1),
      normalize=lambda z: z,
      public_size=48,
      public_normalize=public_normalize,
    )

  halve = lambda z: 0.5 * z  # noqa: E731 - a public normaliser unlike the private one
  built, _ = _two_rounds(
    feddf.SPEC.build(ctx(halve), **hp), "vmap_scan", fd, x, y, public, variables
  )
  direct = feddf.ensemble_distillation(model, optax.sgd(0.1), halve, public_size=48, **hp)
  ref, _ = _two_rounds(direct, "vmap_scan", fd, x, y, public, variables)
  plain, _ = _two_rounds(
    feddf.SPEC.build(ctx(None), **hp), "vmap_scan", fd, x, y, public, variables
  )
  np.testing.assert_array_equal(T.tree_ravel(built.variables), T.tree_ravel(ref.variables))
  assert not np.allclose(T.tree_ravel(built.variables), T.tree_ravel(plain.variables), atol=1e-6)


def _client_phase(alg, fd, x, y, public, state, r):
  """(round ``r``'s local updates of every client as a function of the broadcast, the broadcast
  from ``state``): the clients' part of the round, no server step."""
  from fedjax_proj.core.engine import run_vmap_scan

  rd = _rd(fd, x, y, public, r)
  shared, _ = alg.broadcast(state, rd, jax.random.key(0))
  keys = jax.random.split(jax.random.key(3), rd.idx.shape[0])
  batch_fn = helpers.float_batch_fn()
  run = lambda sh: run_vmap_scan(  # noqa: E731
    alg.client, batch_fn, sh, {}, rd.images, rd.labels, rd.idx, rd.mask, keys
  )
  return run, shared


def _one_local_update(alg, fd, x, y, public, state, r):
  run, shared = _client_phase(alg, fd, x, y, public, state, r)
  return jax.jit(run)(shared)


@pytest.mark.parametrize("window", ["on", "off"])
def test_local_update_is_the_same_whether_the_memory_pass_is_skipped_or_selected(fp_setup, window):
  """``memory_cond=True`` skips the memory gradient where the projection cannot act;
  ``memory_cond=False`` (XLA:CPU's default) computes it on every step and selects. The local
  updates are equal to float32 round-off (two different programs). Round 1 has an ensemble;
  ``proj_rounds=(5, None)`` puts it outside the window."""
  x, y, public, model, fd, _, variables = fp_setup
  hparams = {**_SETUP_HPARAMS, "distill_epochs": 0}
  window = (0, None) if window == "on" else (5, None)
  out = {}
  for cond in (True, False):
    alg = fedproj.fedproj(
      model, optax.sgd(0.1), lambda z: z, **hparams, proj_rounds=window, memory_cond=cond
    )
    state, _ = make_round(alg, "vmap_scan", helpers.float_batch_fn())(
      alg.init(variables, jax.random.key(0)), _rd(fd, x, y, public, 0), jax.random.key(10)
    )
    out[cond] = _one_local_update(alg, fd, x, y, public, state, 1)
  skipping, computing = out[True], out[False]
  np.testing.assert_allclose(
    T.tree_ravel(skipping["variables"]), T.tree_ravel(computing["variables"]), atol=1e-6
  )
  got, ref = skipping["proj_metrics"], computing["proj_metrics"]
  if window == (0, None):
    assert float(jnp.mean(got["projected_fraction"])) > 0.0
    for k in got:
      np.testing.assert_allclose(got[k], ref[k], rtol=1e-5, atol=1e-6)
  else:  # nothing projected, and no diagnostics of a gradient that is not used (NaN: null)
    for m in (got, ref):
      np.testing.assert_array_equal(m["projected_fraction"], 0.0)
      for k in ("mean_cos", "lmem_before", "lmem_after"):
        assert np.all(np.isnan(m[k])), k


def test_memory_cond_stays_a_conditional_under_vmap_and_is_off_on_cpu(fp_setup):
  """The engine vmaps the client step over clients with the broadcast unbatched, so the window
  predicate stays unbatched and, with ``memory_cond``, the memory branch runs only when the
  window is on (a batched predicate would make vmap compute both branches and select). On
  XLA:CPU the default is the select: a conditional's convolutions run there ~12x slower."""
  x, y, public, model, fd, _, variables = fp_setup
  traced = {}
  for cond in (True, None):
    alg = fedproj.fedproj(model, optax.sgd(0.1), lambda z: z, **_SETUP_HPARAMS, memory_cond=cond)
    state = alg.init(variables, jax.random.key(0))
    run, shared = _client_phase(alg, fd, x, y, public, state, 1)
    traced[cond] = str(jax.make_jaxpr(run)(shared))
  assert " cond[" in traced[True]
  assert (" cond[" in traced[None]) == (jax.default_backend() != "cpu")


class _CompileCounter:
  """Counts XLA compilations (the backend-compile event) while active."""

  def __enter__(self):
    self.count = 0
    jax.monitoring.register_event_duration_secs_listener(self._listen)
    return self

  def _listen(self, event, duration, **kwargs):
    del duration, kwargs
    self.count += event == "/jax/core/compile/backend_compile_duration"

  def __exit__(self, *exc):
    jax.monitoring.unregister_event_duration_listener(self._listen)


@pytest.mark.parametrize("strategy", ["sequential", "vmap_stepwise"])
def test_host_looped_window_steps_equal_the_select_path(fp_setup, strategy):
  """The host loops run a step without the memory pass outside the window (round 0: no ensemble;
  round 2: past ``proj_rounds=(1, 2)``) and one with it inside (round 1). Parameters and
  metrics equal the select path's (every step computes the memory gradient; no static_shared)
  to float32 round-off, and round 2 compiles nothing: one step per window value."""
  x, y, public, model, fd, _, variables = fp_setup
  hp = {**_SETUP_HPARAMS, "distill_epochs": 0}
  alg = fedproj.fedproj(model, optax.sgd(0.1), lambda z: z, **hp, proj_rounds=(1, 2))
  select = alg._replace(client=alg.client._replace(static_shared=()))
  out = {}
  for name, a in (("skip", alg), ("select", select)):
    round_fn = make_round(a, strategy, helpers.float_batch_fn())
    state, metrics, compiles = a.init(variables, jax.random.key(0)), [], []
    for r in range(3):
      with _CompileCounter() as counter:
        state, m = round_fn(state, _rd(fd, x, y, public, r), jax.random.key(10 + r))
      metrics.append(m)
      compiles.append(counter.count)
    out[name] = state, metrics, compiles
  (got, got_m, compiles), (ref, ref_m, _) = out["skip"], out["select"]
  assert compiles[0] > 0 and compiles[1] > 0 and compiles[2] == 0, compiles
  np.testing.assert_allclose(T.tree_ravel(got.variables), T.tree_ravel(ref.variables), atol=1e-5)
  np.testing.assert_allclose(got.memory_logits, ref.memory_logits, atol=1e-5)
  for r in range(3):
    for k in ref_m[r]:
      np.testing.assert_allclose(got_m[r][k], ref_m[r][k], rtol=1e-5, atol=1e-6, err_msg=k)
    inside = r == 1
    assert (float(got_m[r]["projected_fraction"]) > 0.0) == inside, r
    assert np.isnan(float(got_m[r]["mean_cos"])) != inside, r  # null outside the window


def _count_primitive(fn, name: str, *args) -> int:
  """Equations of primitive ``name`` in the traced ``fn(*args)``, nested jaxprs included."""

  def walk(jx) -> int:
    n = 0
    for eqn in jx.eqns:
      n += eqn.primitive.name == name
      for sub in jax.extend.core.jaxprs_in_params(eqn.params):
        n += walk(sub)
    return n

  return walk(jax.make_jaxpr(fn)(*args).jaxpr)


def test_out_of_window_host_step_has_no_memory_pass(fp_setup):
  """The step the host loops jit for window flags (False, False) has exactly the matrix products
  of FedAvg's step: no memory forward or backward. With the window on, and in the traced step
  (select or cond), there are more."""
  from fedjax_proj.algorithms import client as client_lib
  from fedjax_proj.core import engine as engine_lib

  x, y, public, model, fd, alg, variables = fp_setup
  key = jax.random.key(0)
  rd = _rd(fd, x, y, public, 0)
  shared, _ = alg.broadcast(alg.init(variables, key), rd, key)
  batch = helpers.float_batch_fn()(rd.images, rd.labels, rd.idx[0, 0], rd.mask[0, 0], key)

  def matmuls(program):
    state = program.init(shared, {}, key, 4)
    return _count_primitive(lambda s: program.step(shared, s, batch, key), "dot_general", state)

  fedavg_client = client_lib.local_training_client(
    model, optax.sgd(0.1), client_lib.cross_entropy_loss(model)
  )
  plain = matmuls(fedavg_client)
  assert alg.client.static_shared == fedproj.WINDOW_FLAGS == ("use_memory", "round0_ce")
  assert matmuls(engine_lib.specialize(alg.client, (False, False))) == plain
  assert matmuls(engine_lib.specialize(alg.client, (True, False))) > plain
  assert matmuls(alg.client) > plain


def test_lmem_global_is_logged_only_when_asked_and_changes_nothing_else(fp_setup):
  """The drift metric is the server's one forward pass that trains nothing: off by default, and
  turning it on adds the metric without touching the model or the memory."""
  x, y, public, model, fd, alg, variables = fp_setup
  off = fedproj.fedproj(model, optax.sgd(0.1), lambda z: z, **_SETUP_HPARAMS)
  ref, ref_m = _two_rounds(alg, "sequential", fd, x, y, public, variables)
  got, got_m = _two_rounds(off, "sequential", fd, x, y, public, variables)
  assert "lmem_global" in ref_m[1] and np.isfinite(float(ref_m[1]["lmem_global"]))
  assert all("lmem_global" not in m for m in got_m)
  np.testing.assert_allclose(T.tree_ravel(got.variables), T.tree_ravel(ref.variables), atol=1e-7)
  np.testing.assert_allclose(got.memory_logits, ref.memory_logits, atol=1e-7)


@pytest.mark.parametrize("size", [0, 9])
def test_the_memory_is_one_to_the_public_sets_size(size):
  """One check of M against the public set (001, Algorithm 1), in the factory as in a run's
  config (training/config.py) and loaded public set (training/inputs.py): no silent clip."""
  with pytest.raises(ValueError, match=rf"--memory_size={size} must be from 1 to the size of"):
    fedproj.fedproj(
      helpers.tiny_model(), optax.sgd(0.1), lambda z: z, public_size=8, memory_size=size
    )
  with pytest.raises(ValueError, match=r"--public_size=8 \(8 examples\)"):
    fedproj.check_memory(size, 8, "--public_size=8")
  fedproj.check_memory(8, 8)  # the whole public set is a valid memory
