"""Class-distribution discrepancies, SFedKD's greedy teacher selection and its teacher weights.

Paper: Xu et al., "SFedKD: Sequential Federated Learning with Discrepancy-Aware Multi-Teacher
Knowledge Distillation" (papers/004; docs/methods.md "SFedKD"). What this module computes:

* :func:`class_distribution`: a client's normalised label histogram D (from its round layout).
* :func:`distance`: d(P, Q) for the metrics ``kl`` (KL(P‖Q)), ``l1``, ``l2`` (Euclidean) and ``js``
  (Jensen–Shannon). Distributions are smoothed as (P + s)/(1 + C·s) first (``smoothing``), because
  ExDir(2, α) clients hold 2 classes: KL(D_T‖D_S) between clients with different classes is
  otherwise infinite and g_k, h_k would be NaN. The paper does not say how it avoids this.
* :func:`greedy_select` (Algorithm 1): start empty; repeatedly add the not-yet-chosen client whose
  distribution makes d(mean(D_agg ∪ {D}), U) smallest. We compare the MEAN of the chosen
  distributions with U (the paper writes D_agg + D, a sum): for KL the two rankings coincide
  (KL(kQ‖U) = k·KL(Q‖U) + k·log k at every candidate of a step), for L1/L2/JS only the mean is a
  distribution. Ties go to the lowest index.
  Greedy is exact for K = 1 and K = M. For 1 < K < M it is not in general (the problem is a
  maximum-coverage variant, NP-hard): tests/algorithms/sequential/test_teacher_selection.py holds
  a brute-force check of the cases where it is exact and a documented counterexample where it is
  not. What it always guarantees: K distinct clients, each the best single addition to the
  previous picks.
* :func:`teacher_weights` (Eq. 5): g_k = d_k/Σ_j d_j (NCKD weights: more different → more weight)
  and h_k = (1/(d_k + ε))/Σ_j 1/(d_j + ε) (TCKD weights: more similar → more weight), with
  d_k = d(D^{T_k}, D^S), ε = 1e-4. If every d_k is 0, g is uniform (0/0 otherwise).
* Ablations of 004 (Tables 2-3): :func:`random_select` (Table 3's "Random": K distinct clients
  drawn uniformly, without replacement, from the key) in place of :func:`greedy_select`, and
  ``uniform_g`` / ``uniform_h`` of :func:`teacher_weights` (Table 2's ✗ rows: the plain average
  1/K in place of the discrepancy-aware weight).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from fedjax_proj.core.types import Array

METRICS = ("kl", "l1", "l2", "js")
# How the K teachers are chosen from the previous round's M clients: Algorithm 1 or, for 004's
# Table 3 ablation, uniformly at random.
SELECTIONS = ("greedy", "random")


def validate_metric(metric: str) -> str:
  if metric not in METRICS:
    raise ValueError(f"Unknown distribution metric {metric!r}; choose one of {', '.join(METRICS)}.")
  return metric


def validate_selection(selection: str) -> str:
  if selection not in SELECTIONS:
    raise ValueError(
      f"Unknown teacher selection {selection!r}; choose one of {', '.join(SELECTIONS)}."
    )
  return selection


def class_distribution(labels: Array, mask: Array, num_classes: int) -> Array:
  """Normalised label histogram of the unmasked ``labels`` (any shape); uniform if all masked."""
  counts = jnp.sum(
    jax.nn.one_hot(labels.reshape(-1), num_classes) * mask.reshape(-1, 1).astype(jnp.float32),
    axis=0,
  )
  total = jnp.sum(counts)
  return jnp.where(total > 0, counts / jnp.maximum(total, 1.0), 1.0 / num_classes)


def _smooth(p: Array, smoothing: float) -> Array:
  return (p + smoothing) / (1.0 + p.shape[-1] * smoothing)


def _kl(p: Array, q: Array) -> Array:
  return jnp.sum(jax.scipy.special.xlogy(p, p) - jax.scipy.special.xlogy(p, q), axis=-1)


def distance(p: Array, q: Array, metric: str = "kl", smoothing: float = 1e-6) -> Array:
  """d(P, Q) between two distributions over the last axis (see the module docstring)."""
  validate_metric(metric)
  p = _smooth(p.astype(jnp.float32), smoothing)
  q = _smooth(q.astype(jnp.float32), smoothing)
  if metric == "kl":
    return _kl(p, q)
  if metric == "l1":
    return jnp.sum(jnp.abs(p - q), axis=-1)
  if metric == "l2":
    return jnp.sqrt(jnp.sum(jnp.square(p - q), axis=-1))
  m = 0.5 * (p + q)
  return 0.5 * _kl(p, m) + 0.5 * _kl(q, m)


def greedy_select(
  dists: Array, num_teachers: int, metric: str = "kl", smoothing: float = 1e-6
) -> Array:
  """Algorithm 1: indices [K] of ``num_teachers`` distinct rows of ``dists`` [M, C], in pick order.

  Traceable (K is static), so it runs inside the jitted round.
  """
  validate_metric(metric)
  m, c = dists.shape
  if not 1 <= num_teachers <= m:
    raise ValueError(
      f"num_teachers={num_teachers} must be in [1, {m}] (the clients of the previous round); "
      "lower num_teachers or raise clients_per_round."
    )
  uniform = jnp.full((c,), 1.0 / c, jnp.float32)
  dists = dists.astype(jnp.float32)
  chosen = jnp.zeros((m,), bool)
  agg = jnp.zeros((c,), jnp.float32)
  picks = []
  for k in range(num_teachers):
    candidates = (agg[None] + dists) / (k + 1)
    scores = jax.vmap(lambda p: distance(p, uniform, metric, smoothing))(candidates)
    best = jnp.argmin(jnp.where(chosen, jnp.inf, scores))
    picks.append(best)
    chosen = chosen.at[best].set(True)
    agg = agg + dists[best]
  return jnp.stack(picks).astype(jnp.int32)


def random_select(key: Array, num_clients: int, num_teachers: int) -> Array:
  """Table 3's "Random" (004 §4.3.4): indices [K] of K distinct clients of M, uniformly at random.

  Every K-subset is equally likely (the first K of a uniform permutation); a pure function of
  ``key``, so a run stays reproducible from its seed. Traceable (K, M static).
  """
  if not 1 <= num_teachers <= num_clients:
    raise ValueError(
      f"num_teachers={num_teachers} must be in [1, {num_clients}] (the clients of the previous "
      "round); lower num_teachers or raise clients_per_round."
    )
  return jax.random.permutation(key, num_clients)[:num_teachers].astype(jnp.int32)


def select(
  dists: Array,
  num_teachers: int,
  selection: str = "greedy",
  metric: str = "kl",
  smoothing: float = 1e-6,
  key: Array | None = None,
) -> Array:
  """Indices [K] of the teachers among the M rows of ``dists``: Algorithm 1 or :func:`random_select`
  (which reads ``key`` only)."""
  if validate_selection(selection) == "random":
    if key is None:
      raise ValueError("selection='random' needs a PRNG key; pass key=...")
    return random_select(key, dists.shape[0], num_teachers)
  return greedy_select(dists, num_teachers, metric, smoothing)


def teacher_weights(
  teacher_dists: Array,
  student_dist: Array,
  metric: str = "kl",
  eps: float = 1e-4,
  smoothing: float = 1e-6,
  uniform_g: bool = False,
  uniform_h: bool = False,
) -> tuple[Array, Array]:
  """Eq. 5: (g [K] NCKD weights, h [K] TCKD weights); each sums to 1.

  ``uniform_g`` / ``uniform_h`` replace g or h by the plain average 1/K (004 Table 2's ✗ rows).
  """
  d = jax.vmap(lambda t: distance(t, student_dist, metric, smoothing))(teacher_dists)
  d = jnp.maximum(d, 0.0)  # KL of smoothed float32 vectors can round to a tiny negative
  total = jnp.sum(d)
  k = d.shape[0]
  g = jnp.where(total > 0, d / jnp.where(total > 0, total, 1.0), 1.0 / k)
  inv = 1.0 / (d + eps)
  h = inv / jnp.sum(inv)
  uniform = jnp.full((k,), 1.0 / k, jnp.float32)
  return (uniform if uniform_g else g), (uniform if uniform_h else h)
