"""benchmarks/parity/fot_basis.py: its re-implementation of the authors' GPSE behaves as their code
reads (commit 6adce7c), and agrees with our server step where the two rules should agree."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
import scipy.linalg

from benchmarks.parity import fot_basis as parity
from fedjax_proj.algorithms.continual import gpse


def _sketch(d, s, sv, seed):
  rng = np.random.default_rng(seed)
  u, _ = np.linalg.qr(rng.normal(size=(d, len(sv))))
  v, _ = np.linalg.qr(rng.normal(size=(s, len(sv))))
  return (u * sv) @ v.T, u


def test_authors_loop_keeps_one_direction_below_zero_and_all_when_never_met():
  a, u = _sketch(12, 20, np.array([3.0, 2.0, 1.0]), 0)
  # ε' < 0 (ρ = 0.05 < 1 − ε = 0.1): the loop breaks at i = 0 and keeps U[:, :1].
  orth, added, new_eps, _ = parity.authors_expand([(a, 0.05, 10)], None, 0.9)
  assert new_eps < 0 and added == 1 and orth.shape == (12, 1)
  assert scipy.linalg.subspace_angles(orth, u[:, :1]).max() < 1e-8
  # ε' above 1 is never exceeded: the loop runs out and keeps every direction it was given. Not
  # ε' = 1 exactly: the cumulative energy ratio reaches 1 only up to rounding (1 + 4e-16 with
  # numpy 2.4's LAPACK), so whether the loop breaks at the rank there depends on the library.
  orth, added, new_eps, _ = parity.authors_expand([(a, 1.0, 10)], None, 1.0 + 1e-6)
  assert new_eps == pytest.approx(1.0 + 1e-6) and added == 12


def test_authors_client_ratio_and_residual_sketch():
  rng = np.random.default_rng(1)
  rows, g = rng.normal(size=(30, 8)), rng.normal(size=(30, 5))
  sk, ratio, n = parity.authors_client(rows, None, g)
  assert (ratio, n) == (1.0, 30)  # no basis stored: their code leaves the ratio at 1
  np.testing.assert_allclose(sk, rows.T @ g)
  orth, _ = np.linalg.qr(rng.normal(size=(8, 3)))
  sk, ratio, _ = parity.authors_client(rows, orth, g)
  res = rows - rows @ orth @ orth.T
  np.testing.assert_allclose(ratio, np.linalg.norm(res) / np.linalg.norm(rows))
  np.testing.assert_allclose(sk, res.T @ g, atol=1e-12)


@pytest.mark.parametrize("eps", [0.8, 0.95])
def test_our_authors_rule_matches_the_reference_on_a_separated_spectrum(eps):
  # A first task (nothing stored, every ratio 1): ε' = ε, so ours and theirs pick the same rank
  # whenever no cumulative share lies at ε; the spectrum 0.7^j keeps them away from it.
  sv = 0.7 ** np.arange(16)
  a, _ = _sketch(24, 40, sv, 2)
  frac = np.cumsum(sv**2) / np.sum(sv**2)
  assert np.min(np.abs(frac - eps)) > 1e-3
  orth, added, _, _ = parity.authors_expand([(a, 1.0, 5), (0 * a, 1.0, 5)], None, eps)
  target, _, _ = gpse.rule_target("authors", eps, [1.0, 1.0], [5, 5], [1.0, 1.0], [1.0, 1.0])
  basis, rank, k, _ = gpse.extend_layer(
    jnp.asarray(a, jnp.float32), jnp.zeros((24, 24)), 0, target, rule="authors"
  )
  assert int(k) == int(rank) == added
  angles = scipy.linalg.subspace_angles(np.asarray(basis, np.float64)[:, :added], orth)
  assert angles.max() < 1e-3
