"""GPSE and FedProject: sketch additivity, planted subspace, orthogonality, im2col order, the
threshold rules, and the device server step against a float64 NumPy reference."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.linalg
from jax import lax

from fedjax_proj.algorithms.base import make_round
from fedjax_proj.algorithms.continual import gpse
from fedjax_proj.algorithms.continual.fot import fot
from fedjax_proj.core.executor import Executor
from fedjax_proj.data.federated import FederatedData
from fedjax_proj.data.pipeline import make_batch_fn, normalizer
from fedjax_proj.models import multi_head
from fedjax_proj.models.conv import Conv


class _Lin(nn.Module):
  width: int = 6

  @nn.compact
  def __call__(self, x, train, mask=None):
    return None, jnp.tanh(nn.Dense(self.width)(x.reshape(x.shape[0], -1)))


class _ConvNet(nn.Module):
  @nn.compact
  def __call__(self, x, train, mask=None):
    h = nn.relu(nn.Conv(4, (3, 3), strides=(2, 2), padding="SAME")(x))
    h = nn.relu(Conv(5, (2, 2), padding="VALID")(h))
    return None, nn.Dense(6)(h.reshape(h.shape[0], -1))


def _orthonormal(d, r, seed):
  q, _ = np.linalg.qr(np.random.default_rng(seed).normal(size=(d, r)))
  return q.astype(np.float32)


def test_sketch_sum_over_clients_equals_sketch_of_concatenation():
  rng = np.random.default_rng(0)
  basis = np.zeros((12, 12), np.float32)
  basis[:, :3] = _orthonormal(12, 3, 1)
  xs = [rng.normal(size=(n, 12)).astype(np.float32) for n in (5, 9, 3)]
  gs = [rng.normal(size=(n, 20)).astype(np.float32) for n in (5, 9, 3)]
  per_client = sum(gpse.sketch(gpse.residual(x, basis), g) for x, g in zip(xs, gs))
  whole = gpse.sketch(gpse.residual(np.concatenate(xs), basis), np.concatenate(gs))
  np.testing.assert_allclose(per_client, whole, rtol=1e-4, atol=1e-4)
  # What FOT actually ships: raw client sketches, projected once by the server after the sum
  # ((I − U Uᵀ) A, written with the rows-in-input-space residual on Aᵀ).
  raw_sum = sum(gpse.sketch(x, g) for x, g in zip(xs, gs))
  projected = gpse.residual(raw_sum.T, basis).T
  np.testing.assert_allclose(projected, whole, rtol=1e-4, atol=1e-4)
  # The residual is orthogonal to the stored basis, so the sketch is too.
  np.testing.assert_allclose(basis.T @ whole, 0.0, atol=1e-3)


def test_im2col_rows_match_kernel_reshape():
  x = jax.random.normal(jax.random.key(0), (2, 7, 7, 3))
  kernel = jax.random.normal(jax.random.key(1), (3, 3, 3, 4))
  for strides, padding in (((1, 1), "VALID"), ((2, 2), "SAME")):
    spec = gpse.LayerSpec(("c",), "conv", 27, (3, 3), strides, padding)
    rows = gpse.input_rows(spec, x)
    out = lax.conv_general_dilated(
      x, kernel, strides, padding, dimension_numbers=("NHWC", "HWIO", "NHWC")
    )
    np.testing.assert_allclose(rows @ gpse.kernel_matrix(kernel), out.reshape(-1, 4), atol=1e-4)
  np.testing.assert_array_equal(
    gpse.matrix_kernel(gpse.kernel_matrix(kernel), kernel.shape), kernel
  )
  # The ordering is exactly the kernel's own reshape (k·k·C_in) x C_out.
  np.testing.assert_array_equal(gpse.kernel_matrix(kernel), np.asarray(kernel).reshape(27, 4))


def test_find_layers_and_captured_conv_inputs_reproduce_outputs():
  model = multi_head(_ConvNet(), 2, 3)
  x = jax.random.normal(jax.random.key(0), (2, 8, 8, 2))
  v = model.init(jax.random.key(1), x)
  specs = gpse.find_layers(model, v, x, task=0)
  assert [s.kind for s in specs] == ["conv", "conv", "dense"]
  assert [s.in_dim for s in specs] == [18, 16, 5 * 3 * 3]
  _, cap = gpse.capture_inputs(model, v, x, task=1)
  s0 = specs[0]
  k = gpse.get_kernel(v["params"], s0)
  b = v["params"]["backbone"]["Conv_0"]["bias"]
  conv = nn.Conv(4, (3, 3), strides=(2, 2), padding="SAME").apply(
    {"params": {"kernel": k, "bias": b}}, x
  )
  rows = gpse.input_rows(s0, cap[s0.path][1])
  np.testing.assert_allclose(rows @ gpse.kernel_matrix(k) + b, conv.reshape(-1, 4), atol=1e-4)


def _planted_setup(d=20, true_rank=3, n=400, clients=4, seed=0):
  rng = np.random.default_rng(seed)
  b = _orthonormal(d, true_rank, seed + 10)
  z = rng.normal(size=(n, true_rank)) * np.array([5.0, 3.0, 2.0])[:true_rank]
  x = (z @ b.T + 0.01 * rng.normal(size=(n, d))).astype(np.float32)
  y = rng.integers(0, 3, n).astype(np.int32)
  model = multi_head(_Lin(), 2, 3)
  v = model.init(jax.random.key(0), jnp.asarray(x[:2]))
  batch_fn = make_batch_fn(normalizer(0.0, 1.0))
  parts = np.array_split(np.arange(n), clients)
  fd = FederatedData(parts, batch_size=32)
  sampled = np.arange(clients, dtype=np.int32)
  rd = fd.round_data(jnp.asarray(x), jnp.asarray(y), sampled, 0, 0, {"task": jnp.int32(0)})
  return model, v, batch_fn, rd, b


def test_rademacher_sketch_matrix():
  g = np.asarray(gpse.sketch_matrix(jax.random.key(0), 400, 70, "rademacher"))
  assert g.shape == (400, 70) and set(np.unique(g)) == {-1.0, 1.0}
  assert abs(g.mean()) < 0.02 and np.abs(g.T @ g / 400 - np.eye(70)).max() < 0.3
  with pytest.raises(ValueError, match="gaussian"):
    gpse.sketch_matrix(jax.random.key(0), 2, 2, "uniform")


@pytest.mark.parametrize("strategy,dist", [("vmap_scan", "gaussian"), ("sequential", "rademacher")])
def test_gpse_basis_is_orthonormal_and_spans_planted_subspace(strategy, dist):
  model, v, batch_fn, rd, b = _planted_setup()
  import optax

  method = fot(
    model,
    optax.sgd(0.1),
    Executor(strategy, batch_fn, client_chunk=3),  # the GPSE pass in chunks of the run's chunk
    variables=v,
    sample_x=rd.images[:2],
    eps=0.97,
    sketch_multiplier=2.0,
    sketch_dist=dist,
  )
  state = method.algorithm.init(v, jax.random.key(0))
  state, metrics = method.end_task(state, rd, jax.random.key(1), 0)
  key = "backbone/Dense_0"
  r = int(state.ranks[key])
  u = np.asarray(state.bases[key])
  assert 3 <= r <= 6, metrics
  np.testing.assert_allclose(u[:, :r].T @ u[:, :r], np.eye(r), atol=1e-5)
  np.testing.assert_array_equal(u[:, r:], 0.0)
  cosines = np.linalg.svd(b.T @ u[:, :r], compute_uv=False)  # cosines of principal angles
  assert cosines.min() > 0.999
  # A second GPSE on the same data adds (almost) nothing: the inputs are already covered.
  state2, m2 = method.end_task(state, rd, jax.random.key(2), 1)
  assert m2[f"rho/{key}"] < 0.05
  assert int(state2.ranks[key]) - r <= 2


class _ChunkSpy(Executor):
  """An executor recording the size of every chunk its ``client_chunks`` passes run."""

  def client_chunks(self, program, reduce, chunk=None):
    sizes = self.__dict__.setdefault("sizes", [])
    # The chunk's client count leaves the chunk's program beside its reduction.
    run = super().client_chunks(program, lambda out: (reduce(out), out["n"].shape[0]), chunk)

    def spied(*args):
      for value, size in run(*args):
        sizes.append(int(size))
        yield value

    return spied


def test_gpse_pass_runs_in_the_runs_chunks_with_the_basis_of_one_chunk():
  import optax

  model, v, batch_fn, rd, _ = _planted_setup(clients=7)
  bases = {}
  for chunk in (None, 3):
    executor = _ChunkSpy("vmap_scan", batch_fn, client_chunk=chunk)
    method = fot(model, optax.sgd(0.1), executor, variables=v, sample_x=rd.images[:2], eps=0.97)
    state = method.algorithm.init(v, jax.random.key(0))
    state, _ = method.end_task(state, rd, jax.random.key(1), 0)
    # ceil(7 / 3) = 3 chunks with the run's chunk of 3; one chunk of all 7 without one.
    assert executor.sizes == ([7] if chunk is None else [3, 3, 1])
    key = "backbone/Dense_0"
    r = int(state.ranks[key])
    bases[chunk] = np.asarray(state.bases[key])[:, :r]
  whole, chunked = bases[None], bases[3]
  assert whole.shape == chunked.shape and whole.shape[1] >= 3
  # The same subspace (the sums differ in float summation order only): principal angles ~0.
  cosines = np.linalg.svd(whole.T @ chunked, compute_uv=False)
  np.testing.assert_allclose(cosines, 1.0, atol=1e-5)


def test_fedproject_aggregate_is_orthogonal_to_bases_dense_and_conv():
  import optax

  model = multi_head(_ConvNet(), 2, 3)
  rng = np.random.default_rng(0)
  x = rng.normal(size=(64, 8, 8, 2)).astype(np.float32)
  y = rng.integers(0, 3, 64).astype(np.int32)
  v = model.init(jax.random.key(1), jnp.asarray(x[:2]))
  executor = Executor("vmap_scan", make_batch_fn(normalizer(0.0, 1.0)))
  method = fot(model, optax.sgd(0.5), executor, variables=v, sample_x=jnp.asarray(x[:2]))
  state = method.algorithm.init(v, jax.random.key(0))
  specs = gpse.find_layers(model, v, jnp.asarray(x[:2]), task=0)
  bases = {}
  for i, s in enumerate(specs):
    u = np.zeros((s.in_dim, s.in_dim), np.float32)
    u[:, : s.in_dim // 2] = _orthonormal(s.in_dim, s.in_dim // 2, i)
    bases[s.key] = u
  # The round donates its state: hand it copies.
  state = state._replace(bases={k: jnp.array(u) for k, u in bases.items()})
  old = jax.tree.map(np.asarray, state.variables["params"])
  fd = FederatedData(np.array_split(np.arange(64), 4), batch_size=16)
  sampled = np.arange(4, dtype=np.int32)
  rd = fd.round_data(jnp.asarray(x), jnp.asarray(y), sampled, 0, 0, {"task": jnp.int32(1)})
  round_fn = make_round(method.algorithm, executor)
  state, _ = round_fn(state, rd, jax.random.key(3))
  new = state.variables["params"]
  for s in specs:
    delta = gpse.kernel_matrix(gpse.get_kernel(old, s) - gpse.get_kernel(new, s))
    assert float(jnp.linalg.norm(delta)) > 1e-4  # the layer did move...
    u = bases[s.key]
    assert float(jnp.linalg.norm(u.T @ delta)) < 1e-4 * float(jnp.linalg.norm(delta)) + 1e-6
  # Heads (and biases) are not projected: task 1's head moved freely.
  assert float(jnp.linalg.norm(new["heads"]["kernel"][1] - old["heads"]["kernel"][1])) > 1e-4
  np.testing.assert_array_equal(new["heads"]["kernel"][0], old["heads"]["kernel"][0])


def _reference(a, basis, rank, target, inclusive):
  """Float64 NumPy: (I − U Uᵀ) A, its full SVD, the rule's k and the top-k left vectors."""
  u_old = np.asarray(basis, np.float64)[:, :rank]
  a = np.asarray(a, np.float64)
  a = a - u_old @ (u_old.T @ a)
  u, sv, _ = np.linalg.svd(a, full_matrices=False)
  frac = np.cumsum(sv**2) / np.sum(a * a)
  hit = frac >= target if inclusive else frac > target
  k = 0 if target <= 0 else int(np.argmax(hit)) + 1
  return u[:, :k], k, frac


def _spectrum_sketch(d, s, rank, sv, seed):
  """A raw sketch [d, s] whose residual outside a stored basis of ``rank`` columns has singular
  values ``sv`` (plus energy inside the basis, which the server must project out)."""
  rng = np.random.default_rng(seed)
  q, _ = np.linalg.qr(rng.normal(size=(d, d)))
  v, _ = np.linalg.qr(rng.normal(size=(s, len(sv))))
  a = (q[:, rank : rank + len(sv)] * sv) @ v.T + q[:, :rank] @ rng.normal(size=(rank, s))
  basis = np.zeros((d, d), np.float32)
  basis[:, :rank] = q[:, :rank]
  return a.astype(np.float32), basis


def _mid_gap_target(frac, k):
  """A target halfway between the cumulative shares of k − 1 and k directions."""
  below = frac[k - 2] if k >= 2 else 0.0
  return 0.5 * (below + frac[k - 1])


@pytest.mark.parametrize("rule", gpse.THRESHOLD_RULES)
@pytest.mark.parametrize(
  "d,s,rank,want,max_exact,solver",
  [
    (48, 96, 0, 7, 2_000_000, "exact"),  # first task, d <= s: eigh of the Gram matrix
    (48, 96, 12, 9, 2_000_000, "exact"),  # populated basis
    (40, 24, 5, 6, 2_000_000, "exact"),  # s < d: SVD of A itself
    (160, 320, 20, 6, 0, "randomized"),  # found at the first width (10)
    (160, 320, 20, 15, 0, "randomized"),  # needs the width doubled (10, then 20)
  ],
)
def test_device_step_matches_float64_reference(rule, d, s, rank, want, max_exact, solver):
  sv = 0.75 ** np.arange(min(d - rank, s, 40))
  a, basis = _spectrum_sketch(d, s, rank, sv, seed=d + rank + want)
  _, _, frac = _reference(a, basis, rank, 1.0, True)
  target = _mid_gap_target(frac, want)  # well inside a gap of the spectrum
  ref, k_ref, _ = _reference(a, basis, rank, target, rule == "energy")
  assert k_ref == want
  new, new_rank, k, got_solver = gpse.extend_layer(
    jnp.asarray(a), jnp.asarray(basis), rank, target, rule=rule, max_exact=max_exact
  )
  new = np.asarray(new)
  assert (got_solver, int(k), int(new_rank)) == (solver, want, rank + want)
  angles = scipy.linalg.subspace_angles(new[:, rank : rank + want].astype(np.float64), ref)
  assert angles.max() < 1e-3, angles
  np.testing.assert_array_equal(new[:, :rank], basis[:, :rank])  # old columns untouched
  np.testing.assert_array_equal(new[:, rank + want :], 0.0)  # padding stays zero
  u = new[:, : rank + want]
  np.testing.assert_allclose(u.T @ u, np.eye(rank + want), atol=1e-5)


def test_device_step_compiles_once_per_layer_shape():
  a, basis = _spectrum_sketch(24, 30, 4, 0.7 ** np.arange(12), seed=0)
  before = gpse.extend_step._cache_size()
  out = gpse.extend_layer(jnp.asarray(a), jnp.asarray(basis), 4, 0.9, rule="energy")
  # A later task: another rank, another target, the same compiled program.
  gpse.extend_layer(jnp.asarray(a), out[0], out[1], 0.5, rule="energy")
  assert gpse.extend_step._cache_size() - before == 1


def test_device_step_stops_at_full_rank():
  # ε = 1 asks for every direction; only d − rank are left, and no column may wrap around.
  d, rank = 16, 13
  a, basis = _spectrum_sketch(d, 40, rank, np.ones(3), seed=1)
  a = a + np.random.default_rng(2).normal(size=a.shape).astype(np.float32)  # noise everywhere
  target = gpse.energy_target(0.5, 1.0)
  new, new_rank, _, _ = gpse.extend_layer(
    jnp.asarray(a), jnp.asarray(basis), rank, target, rule="energy"
  )
  new = np.asarray(new)
  assert int(new_rank) == d
  np.testing.assert_array_equal(new[:, :rank], basis[:, :rank])
  np.testing.assert_allclose(new.T @ new, np.eye(d), atol=1e-5)


def _gpm_loop_rank(shares, residual_share, eps):
  """GPM's update_GPM loop (Saha et al., 2021) on normalised σ² of the residual: start from the
  covered share 1 − q, add q·share_j while the total is below ε; the count added."""
  covered, r = 1.0 - residual_share, 0
  for share in shares:
    if covered >= eps:
      break
    covered += residual_share * share
    r += 1
  return r


def test_energy_rule_picks_the_smallest_rank_reaching_eps():
  # Dyadic shares, so the tie at 0.75 is exact: with q = 1/2 and ε = 7/8 the covered share is
  # 1/2 + 1/2 · (1/2, 3/4, 7/8, 1) = 0.75, 0.875, ...: two directions reach ε exactly.
  sq = np.array([4.0, 2.0, 1.0, 1.0])
  target = gpse.energy_target(0.5, 0.875)
  assert target == 0.75
  assert int(gpse.select_rank(sq, 8.0, target, inclusive=True)[0]) == 2
  assert int(gpse.select_rank(sq, 8.0, target, inclusive=False)[0]) == 3  # > needs one more
  assert _gpm_loop_rank(sq / 8.0, 0.5, 0.875) == 2
  # Already covered (1 − q >= ε): nothing is added, as GPM's loop adds nothing.
  assert gpse.energy_target(0.1, 0.9) == 0.0
  assert int(gpse.select_rank(sq, 8.0, gpse.energy_target(0.1, 0.9), True)[0]) == 0
  assert int(gpse.select_rank(sq, 8.0, gpse.energy_target(0.05, 0.9), True)[0]) == 0
  assert int(gpse.select_rank(sq, 8.0, gpse.energy_target(0.0, 0.9), True)[0]) == 0
  # Random spectra and basis shares, away from ties: the same count as GPM's loop.
  rng = np.random.default_rng(0)
  checked = 0
  for _ in range(200):
    sq = np.sort(rng.exponential(size=12) ** 3)[::-1]
    shares = sq / sq.sum()
    q, eps = rng.uniform(0.05, 1.0), rng.uniform(0.5, 0.99)
    covered = 1.0 - q + q * np.cumsum(shares)
    if np.min(np.abs(np.r_[1.0 - q, covered] - eps)) < 1e-4:
      continue
    k, found = gpse.select_rank(sq, sq.sum(), gpse.energy_target(q, eps), True)
    assert bool(found) and int(k) == _gpm_loop_rank(shares, q, eps)
    checked += 1
  assert checked > 150


def test_authors_rule_and_where_the_rules_differ():
  sq = np.array([6.0, 3.0, 1.0])
  rank = lambda t, total=10.0: gpse.select_rank(sq, total, t, inclusive=False)  # noqa: E731
  assert int(rank(0.5)[0]) == 1
  assert int(rank(0.6)[0]) == 2  # 0.6 is not > 0.6
  assert int(rank(-0.1)[0]) == 0
  assert int(rank(0.0)[0]) == 1  # ε' = 0 still takes one direction, as the authors' code
  assert not bool(rank(0.9, 20.0)[1])  # the σ given cover half of the total: not found
  assert int(gpse.select_rank(sq, 0.0, 0.5, inclusive=False)[0]) == 0  # a zero sketch
  assert gpse.eps_prime(1.0, 0.95) == pytest.approx(0.95)
  assert gpse.eps_prime(0.5, 0.9) == pytest.approx(0.8)
  # First task (nothing stored, every ratio 1): both rules ask for the same share of A's energy.
  one = np.ones(3)
  energy = gpse.rule_target("energy", 0.95, one, one, one, one)
  authors = gpse.rule_target("authors", 0.95, one, one, one, one)
  assert energy[0] == pytest.approx(0.95) and authors[0] == pytest.approx(0.95)
  # A populated basis: one client with 1/4 of its squared energy outside it (ratio 1/2). The text
  # needs 0.9 − 0.75 = 0.15 more, 0.6 of the residual; the authors' ε' = (0.5 − 0.1)/0.5 = 0.8.
  e_t, rho, q = gpse.rule_target("energy", 0.9, [0.5], [10], [1.0], [4.0])
  a_t, _, _ = gpse.rule_target("authors", 0.9, [0.5], [10], [1.0], [4.0])
  assert (rho, q) == (0.5, 0.25)
  assert e_t == pytest.approx(0.6) and a_t == pytest.approx(0.8)
  shares = np.array([8.0, 4.0, 2.0, 1.0, 1.0])  # cumulative 0.5, 0.75, 0.875, ...
  assert int(gpse.select_rank(shares, 16.0, e_t, True)[0]) == 2
  assert int(gpse.select_rank(shares, 16.0, a_t, False)[0]) == 3
  # The energy rule pools squared norms: a client with more energy counts for more, whatever n.
  pooled = gpse.rule_target("energy", 0.9, [1.0, 0.0], [1, 1], [3.0, 0.0], [3.0, 1.0])
  assert pooled[2] == pytest.approx(0.75) and pooled[1] == pytest.approx(0.5)


def test_bad_threshold_rule_errors_clearly():
  import optax

  from fedjax_proj.algorithms import registry

  with pytest.raises(ValueError, match="unknown threshold rule 'gpm'.*energy.*authors"):
    gpse.rule_target("gpm", 0.9, [1.0], [1], [1.0], [1.0])
  with pytest.raises(ValueError, match="unknown threshold rule"):
    gpse.extend_layer(jnp.zeros((4, 4)), jnp.zeros((4, 4)), 0, 0.5, rule="Energy")
  with pytest.raises(ValueError, match="threshold_rule='squared' is not one of fot's"):
    registry.check_hparams("fot", {"threshold_rule": "squared"})
  with pytest.raises(ValueError, match="takes a str"):
    registry.check_hparams("fot", {"threshold_rule": 1.0})
  registry.check_hparams("fot", {"threshold_rule": "authors"})
  model, v, batch_fn, rd, _ = _planted_setup()
  with pytest.raises(ValueError, match="unknown threshold_rule 'paper'"):
    fot(
      model,
      optax.sgd(0.1),
      Executor("vmap_scan", batch_fn),
      variables=v,
      sample_x=rd.images[:2],
      threshold_rule="paper",
    )


@pytest.mark.parametrize("rank", [0, 1, 5, 8, 9, 13, 20])
def test_covered_energy_matches_full_projection(rank):
  # Blocks of 4 columns over d = 13 (not a multiple): the clamped last block must not double count.
  rng = np.random.default_rng(rank)
  d = 13
  rows = rng.normal(size=(30, d)).astype(np.float32)
  weight = (rng.random(30) > 0.3).astype(np.float32)
  basis = np.zeros((d, d), np.float32)
  r = min(rank, d)
  basis[:, :r] = _orthonormal(d, r, 1) if r else basis[:, :0]
  want = float(np.sum(np.square(rows @ basis[:, :r]) * weight[:, None]))
  got = jax.jit(lambda x, w, u, k: gpse.covered_energy(x, w, u, k, block=4))(
    rows, weight, basis, jnp.int32(r)
  )
  np.testing.assert_allclose(float(got), want, rtol=1e-5, atol=1e-5)


class _TwoDense(nn.Module):
  @nn.compact
  def __call__(self, x, train, mask=None):
    h = jnp.tanh(nn.Dense(5)(x.reshape(x.shape[0], -1)))
    return None, nn.Dense(4)(h)


def test_sketch_step_shares_g_across_layers_and_masks_padding():
  model = multi_head(_TwoDense(), 1, 3)
  x = jax.random.normal(jax.random.key(0), (6, 7))
  mask = jnp.asarray([1, 1, 0, 1, 0, 1], jnp.float32)
  v = model.init(jax.random.key(1), x)
  specs = gpse.find_layers(model, v, x, task=0)
  widths = {specs[0].key: 9, specs[1].key: 4}
  bases = gpse.empty_bases(specs)
  u = _orthonormal(5, 2, 3)
  bases[specs[1].key] = bases[specs[1].key].at[:, :2].set(u)
  ranks = {specs[0].key: jnp.int32(0), specs[1].key: jnp.int32(2)}
  key = jax.random.key(7)
  state = gpse.sketch_step(
    model, specs, widths, v, bases, ranks, gpse.init_sketch(specs, widths), x, mask, key, task=0
  )
  _, cap = gpse.capture_inputs(model, v, x, task=0)
  # Both dense layers have one row per example: one G [6, 9], the narrower layer uses 4 columns.
  g = np.asarray(gpse.sketch_matrix(jax.random.fold_in(key, 0), 6, 9)) * np.asarray(mask)[:, None]
  keep = np.asarray(mask) > 0
  for spec in specs:
    xr = np.asarray(gpse.input_rows(spec, cap[spec.path][1]))
    np.testing.assert_allclose(
      state.a[spec.key], xr.T @ g[:, : widths[spec.key]], rtol=1e-4, atol=1e-4
    )
    np.testing.assert_allclose(state.x_sq[spec.key], np.sum(xr[keep] ** 2), rtol=1e-5)
  x1 = np.asarray(gpse.input_rows(specs[1], cap[specs[1].path][1]))[keep]
  residual = x1 - (x1 @ u) @ u.T
  np.testing.assert_allclose(state.r_sq[specs[1].key], np.sum(residual**2), rtol=1e-4)
  assert float(state.n) == 4.0


def test_blas_threads_limits_and_restores():
  threadpoolctl = pytest.importorskip("threadpoolctl")
  blas = [p for p in threadpoolctl.threadpool_info() if p["user_api"] == "blas"]
  if not blas:
    pytest.skip("no BLAS library loaded")
  before = [p["num_threads"] for p in blas]
  with gpse.blas_threads(1):
    inside = [p["num_threads"] for p in threadpoolctl.threadpool_info() if p["user_api"] == "blas"]
    assert all(n == 1 for n in inside)
  after = [p["num_threads"] for p in threadpoolctl.threadpool_info() if p["user_api"] == "blas"]
  assert after == before


def test_sketch_step_conv_rows_masked_per_example():
  # Conv layers have one row per output position: the example mask must cover all of them.
  model = multi_head(_ConvNet(), 1, 3)
  x = jax.random.normal(jax.random.key(0), (3, 8, 8, 2))
  mask = jnp.asarray([1, 0, 1], jnp.float32)
  v = model.init(jax.random.key(1), x)
  specs = gpse.find_layers(model, v, x, task=0)
  widths = {s.key: s.in_dim for s in specs}
  ranks = {s.key: jnp.int32(0) for s in specs}
  key = jax.random.key(5)
  state = gpse.sketch_step(
    model,
    specs,
    widths,
    v,
    gpse.empty_bases(specs),
    ranks,
    gpse.init_sketch(specs, widths),
    x,
    mask,
    key,
    task=0,
  )
  _, cap = gpse.capture_inputs(model, v, x, task=0)
  for i, spec in enumerate(specs):  # three different row counts: three draws, in layer order
    xr = np.asarray(gpse.input_rows(spec, cap[spec.path][1])).reshape(3, -1, spec.in_dim)
    g = np.asarray(
      gpse.sketch_matrix(jax.random.fold_in(key, i), xr.shape[0] * xr.shape[1], widths[spec.key])
    )
    g = g.reshape(3, -1, widths[spec.key])
    want = sum(xr[b].T @ g[b] for b in (0, 2))
    np.testing.assert_allclose(state.a[spec.key], want, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(state.x_sq[spec.key], np.sum(xr[[0, 2]] ** 2), rtol=1e-5)
    np.testing.assert_allclose(state.r_sq[spec.key], state.x_sq[spec.key], rtol=1e-6)
