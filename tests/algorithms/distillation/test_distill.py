"""Teacher logits on the public set: batches of equal size, equal to the padded batches' rows."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_proj.algorithms.distillation import distill
from tests import helpers


def test_even_batches_pad_fewer_rows_than_batches_and_respect_the_limit():
  assert distill._even_batches(512, 500) == (256, 2)  # batches of 500: 488 rows of zeros
  assert distill._even_batches(20_000, 500) == (500, 40)
  assert distill._even_batches(30, 500) == (30, 1)
  for n in range(1, 130):
    for limit in (1, 7, 16, 50, 500):
      b, steps = distill._even_batches(n, limit)
      assert b <= limit and steps * b >= n
      assert steps * b - n < steps  # padding: under one row per batch
      assert steps == -(-n // min(limit, n))  # no more batches than the limit needs


@pytest.mark.parametrize("path", ["traced", "host"])
def test_teacher_logits_equal_the_padded_batches_rows(path):
  """52 public rows in batches of at most 50: forwarded as 2 batches of 26 (no padding), they
  give the rows the padded 2 x 50 batches gave (float round-off: another batch shape)."""
  model = helpers.tiny_model()
  public = jnp.asarray(helpers.synthetic_data(n=52, seed=5)[0])
  variables = model.init(jax.random.key(0), public[:2])
  clients = 3
  stacked = jax.tree.map(
    lambda v: v[None] + 0.3 * jax.random.normal(jax.random.key(7), (clients, *v.shape)),
    variables,
  )
  shapes = []

  def normalize(z):
    shapes.append(z.shape[0])  # at trace time: the rows of one forwarded batch
    return z

  if path == "traced":
    got = jax.jit(lambda v, x: distill.client_logits_scan(model, v, normalize, x, 50))(
      stacked, public
    )
  else:
    got = distill.HostClientLogits(model, normalize, 50)(stacked, public)
  assert set(shapes) == {26}
  padded = jnp.concatenate([public, jnp.zeros((48, public.shape[1]), public.dtype)])
  for c in range(clients):
    v = jax.tree.map(lambda a, c=c: a[c], stacked)
    ref = jnp.concatenate(
      [model.apply(v, padded[s * 50 : (s + 1) * 50], train=False).logits for s in range(2)]
    )[:52]
    np.testing.assert_allclose(got[c], ref, rtol=1e-6, atol=1e-6)
