"""Tests for fedjax_proj.data.partition: conservation, reproducibility, skew and failure modes."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from fedjax_proj.data import partition as P
from fedjax_proj.data.partition import PartitionError, PartitionScheme


def balanced_labels(num_classes: int = 10, per_class: int = 100, seed: int = 0) -> np.ndarray:
  labels = np.repeat(np.arange(num_classes), per_class)
  return np.random.default_rng(seed).permutation(labels)


def assert_exact_cover(parts: list[np.ndarray], n: int) -> None:
  for part in parts:
    assert part.dtype == np.int64
  assert np.array_equal(np.sort(np.concatenate(parts)), np.arange(n))


def assert_same(a: list[np.ndarray], b: list[np.ndarray]) -> None:
  assert len(a) == len(b)
  for x, y in zip(a, b):
    np.testing.assert_array_equal(x, y)


def differs(a: list[np.ndarray], b: list[np.ndarray]) -> bool:
  return any(x.shape != y.shape or not np.array_equal(x, y) for x, y in zip(a, b))


def raises_within(seconds: float, exc: type[Exception], fn, *args, **kwargs) -> Exception:
  """Runs fn in a daemon thread; fails if it does not raise ``exc`` within ``seconds``.

  A daemon thread, so a hanging implementation fails the test instead of hanging the session.
  """
  outcome: dict = {}

  def target():
    try:
      outcome["value"] = fn(*args, **kwargs)
    except Exception as e:  # noqa: BLE001
      outcome["error"] = e

  thread = threading.Thread(target=target, daemon=True)
  start = time.monotonic()
  thread.start()
  thread.join(seconds)
  assert not thread.is_alive(), f"{fn.__name__} did not finish within {seconds}s (hang?)"
  assert "error" in outcome, f"{fn.__name__} returned instead of raising {exc.__name__}"
  assert isinstance(outcome["error"], exc), repr(outcome["error"])
  assert time.monotonic() - start < seconds
  return outcome["error"]


# Every partition that must cover all samples, as (name, callable(labels, seed)).
COVERING = {
  "iid": lambda y, seed: P.iid(y, 20, seed),
  "dirichlet": lambda y, seed: P.dirichlet(y, 20, 0.5, seed),
  "shards": lambda y, seed: P.shards(y, 20, 2, seed=seed),
  "exdir": lambda y, seed: P.exdir(y, 20, 2, 0.5, seed),
}


@pytest.mark.parametrize("kind", sorted(COVERING))
def test_covers_every_sample_exactly_once(kind):
  labels = balanced_labels(per_class=97)  # 970: not divisible by the client count
  assert_exact_cover(COVERING[kind](labels, 0), labels.shape[0])


@pytest.mark.parametrize("kind", sorted(COVERING))
def test_reproducible_and_seed_dependent(kind):
  labels = balanced_labels()
  assert_same(COVERING[kind](labels, 3), COVERING[kind](labels, 3))
  assert differs(COVERING[kind](labels, 3), COVERING[kind](labels, 4))


def test_iid_sizes_differ_by_at_most_one():
  sizes = [len(p) for p in P.iid(balanced_labels(per_class=101), 7, seed=0)]
  assert max(sizes) - min(sizes) <= 1 and sum(sizes) == 1010


def test_dirichlet_respects_min_size():
  labels = balanced_labels(per_class=200)
  for seed in range(3):
    parts = P.dirichlet(labels, 30, 0.1, seed, min_size=15)
    assert min(len(p) for p in parts) >= 15
    assert_exact_cover(parts, labels.shape[0])


def mean_max_class_share(labels, parts, num_classes=10) -> float:
  hist = P.label_histogram(labels, parts, num_classes)
  return float((hist.max(axis=1) / hist.sum(axis=1)).mean())


def test_small_beta_dirichlet_is_skewed():
  labels = balanced_labels(per_class=500)
  skewed = mean_max_class_share(labels, P.dirichlet(labels, 20, 0.05, seed=0))
  iid_share = mean_max_class_share(labels, P.iid(labels, 20, seed=0))
  assert iid_share < 0.25
  assert skewed > 0.6
  assert skewed > 2.5 * iid_share


def test_shards_aligned_with_classes_give_at_most_two_labels():
  labels = balanced_labels(num_classes=10, per_class=100)  # 200 shards of 5: never straddle
  parts = P.shards(labels, 100, 2, seed=0)
  assert_exact_cover(parts, labels.shape[0])
  hist = P.label_histogram(labels, parts, 10)
  assert (np.count_nonzero(hist, axis=1) <= 2).all()
  assert (hist.sum(axis=1) == 10).all()


def test_exdir_clients_hold_at_most_c_classes():
  labels = balanced_labels(num_classes=10, per_class=300)
  for c in (1, 2, 3):
    parts = P.exdir(labels, 30, c, 5.0, seed=1)
    assert_exact_cover(parts, labels.shape[0])
    hist = P.label_histogram(labels, parts, 10)
    assert (np.count_nonzero(hist, axis=1) <= c).all()
    assert min(len(p) for p in parts) >= 10
    assert (hist.sum(axis=0) > 0).all()  # every class is held by someone


def test_exdir_shuffles_client_indices():
  parts = P.exdir(balanced_labels(per_class=300), 10, 2, 10.0, seed=0)
  assert any(not np.all(np.diff(p) > 0) for p in parts)


def test_exdir_rejects_more_classes_per_client_than_classes():
  with pytest.raises(PartitionError, match="classes_per_client=11"):
    P.exdir(balanced_labels(), 10, 11, 0.5, seed=0)


def test_impossible_configs_raise_quickly():
  labels = balanced_labels(num_classes=10, per_class=10)  # 100 samples
  err = raises_within(5, PartitionError, P.dirichlet, labels, 1000, 0.5, 0)
  assert "1000" in str(err)
  err = raises_within(5, PartitionError, P.dirichlet, labels, 20, 0.5, 0, min_size=6)
  assert "min_size=6" in str(err)
  raises_within(5, PartitionError, P.exdir, labels, 1000, 2, 0.5, 0)
  raises_within(5, PartitionError, P.iid, labels, 101, 0)
  raises_within(5, PartitionError, P.shards, labels, 60, 2, seed=0)


def test_unreachable_min_size_exhausts_retries_with_clear_error():
  # Possible in principle (10 x 10 = 100) but a Dir(0.01) draw essentially never balances.
  labels = balanced_labels(num_classes=10, per_class=10)
  err = raises_within(
    10, PartitionError, P.dirichlet, labels, 10, 0.01, 0, min_size=10, max_retries=50
  )
  for needle in ("beta=0.01", "num_clients=10", "min_size=10", "larger beta"):
    assert needle in str(err)
  err = raises_within(
    10, PartitionError, P.exdir, labels, 10, 2, 0.01, 0, min_size=10, max_retries=50
  )
  assert "step 2" in str(err) and "min_size=10" in str(err)


IRIS_PILOT = np.array([[50, 0, 0], [0, 40, 10], [0, 10, 40]])


def test_manual_iris_pilot_counts():
  labels = np.repeat(np.arange(3), 50)
  parts = P.manual(labels, IRIS_PILOT, seed=0)
  np.testing.assert_array_equal(P.label_histogram(labels, parts, 3), IRIS_PILOT)
  assert_exact_cover(parts, 150)
  assert_same(parts, P.manual(labels, IRIS_PILOT, seed=0))


def test_manual_takes_only_requested_samples_and_rejects_too_many():
  labels = np.repeat(np.arange(3), 50)
  parts = P.manual(labels, [[5, 0, 1], [2, 3, 0]], seed=1)
  assert [len(p) for p in parts] == [6, 5]
  assert len(np.unique(np.concatenate(parts))) == 11
  with pytest.raises(PartitionError, match="class 1 has 50 samples"):
    P.manual(labels, [[0, 30, 0], [0, 21, 0]], seed=0)


def test_label_histogram():
  labels = np.array([0, 1, 1, 2, 2, 2])
  hist = P.label_histogram(labels, [np.array([0, 3]), np.array([1, 2, 4, 5])], 4)
  np.testing.assert_array_equal(hist, [[1, 0, 1, 0], [0, 2, 2, 0]])


@pytest.mark.parametrize(
  "text, expected",
  [
    ("iid", PartitionScheme("iid")),
    (" IID ", PartitionScheme("iid")),
    ("dirichlet:0.5", PartitionScheme("dirichlet", concentration=0.5, min_size=10)),
    ("dirichlet:0.1:15", PartitionScheme("dirichlet", concentration=0.1, min_size=15)),
    ("shards:2", PartitionScheme("shards", shards_per_client=2)),
    ("exdir:2:0.5", PartitionScheme("exdir", concentration=0.5, classes_per_client=2)),
    (
      "exdir:20:1.0:5",
      PartitionScheme("exdir", concentration=1.0, min_size=5, classes_per_client=20),
    ),
  ],
)
def test_parse_partition_good(text, expected):
  spec = P.parse_partition(text)
  assert spec == expected
  assert P.parse_partition(str(spec)) == spec


@pytest.mark.parametrize(
  "text",
  [
    "",
    "dirichlet",
    "dirichlet:abc",
    "dirichlet:-1",
    "dirichlet:0",
    "dirichlet:nan",
    "dirichlet:0.5:1.5",
    "shards",
    "shards:0",
    "shards:1.5",
    "exdir:2",
    "exdir:0.5:2",
    "iid:3",
    "pathological:2",
  ],
)
def test_parse_partition_bad(text):
  with pytest.raises(ValueError, match="valid partition specs") as info:
    P.parse_partition(text)
  assert "dirichlet:0.5" in str(info.value)  # examples are listed


def test_partition_dispatch_matches_direct_calls():
  labels = balanced_labels()
  assert_same(P.partition(labels, "iid", 10, 0), P.iid(labels, 10, 0))
  assert_same(P.partition(labels, "dirichlet:0.3:12", 10, 0), P.dirichlet(labels, 10, 0.3, 0, 12))
  assert_same(P.partition(labels, "shards:3", 10, 0), P.shards(labels, 10, 3, seed=0))
  spec = P.parse_partition("exdir:2:0.5")
  assert_same(P.partition(labels, spec, 10, 0), P.exdir(labels, 10, 2, 0.5, 0))


def test_bad_inputs_are_rejected():
  with pytest.raises(ValueError, match="integer class ids"):
    P.iid(np.array([0.0, 1.0]), 1, 0)
  with pytest.raises(ValueError, match="seed must be an integer"):
    P.iid(np.array([0, 1]), 1, None)
  with pytest.raises(ValueError, match="beta must be"):
    P.dirichlet(balanced_labels(), 5, 0.0, 0)
