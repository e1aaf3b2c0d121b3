"""Client partitions: which sample indices each simulated client holds.

Implements the partitions of docs/methods.md ("Data partitions"): IID, Dirichlet label skew
Dir(beta) (Hsu et al.), label-sorted shards (McMahan et al.), ExDir(C, alpha) (Li & Lyu) and an
explicit client x class count table. Every partition is a pure function of (labels, parameters,
seed) drawing from ``np.random.default_rng(seed)``, so it is reproducible bit for bit, and returns
one int64 index array per client. Except for ``manual``, the arrays together hold every sample
exactly once. Index arrays are sorted ascending (their order carries no information; batching
shuffles), except ExDir's, which are shuffled as its step 3 prescribes.

Draws that can fail (a client below ``min_size``) are retried a bounded number of times and then
raise :class:`PartitionError`, never loop forever.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

_PARTITION_SYNTAX = (
  "valid partition specs: 'iid'; 'dirichlet:<beta>' or 'dirichlet:<beta>:<min_size>' "
  "(e.g. 'dirichlet:0.5', 'dirichlet:0.1:15'); 'shards:<shards_per_client>' (e.g. 'shards:2'); "
  "'exdir:<classes_per_client>:<alpha>' or 'exdir:<C>:<alpha>:<min_size>' (e.g. 'exdir:2:0.5')"
)


class PartitionError(ValueError):
  """A partition whose constraints cannot be met (or were not met within the retry budget)."""


# --------------------------------------------------------------------------------------------
# Validation helpers.


def _as_labels(labels: np.ndarray) -> np.ndarray:
  """Returns labels as a 1-D int64 array of non-negative class ids, or raises."""
  labels = np.asarray(labels)
  if labels.ndim != 1:
    raise ValueError(f"labels must be 1-D [N], got shape {labels.shape}.")
  if labels.size == 0:
    raise ValueError("labels is empty: there is nothing to partition.")
  if not np.issubdtype(labels.dtype, np.integer):
    raise ValueError(
      f"labels must be integer class ids, got dtype {labels.dtype}; convert with "
      "labels.astype(np.int64)."
    )
  if labels.min() < 0:
    raise ValueError(f"labels must be >= 0, got minimum {labels.min()}.")
  return labels.astype(np.int64, copy=False)


def _check_positive_int(value: int, what: str) -> int:
  if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < 1:
    raise ValueError(f"{what} must be a positive integer, got {value!r}.")
  return int(value)


def _check_concentration(value: float, what: str) -> float:
  value = float(value)
  if not (math.isfinite(value) and value > 0):
    raise ValueError(f"{what} must be a finite number > 0, got {value!r}.")
  return value


def _check_seed(seed: int) -> int:
  # A None seed would draw from OS entropy: the partition would not be reproducible.
  if isinstance(seed, bool) or not isinstance(seed, int | np.integer):
    raise ValueError(f"seed must be an integer (partitions must be reproducible), got {seed!r}.")
  return int(seed)


def _check_clients(num_clients: int, num_samples: int) -> int:
  num_clients = _check_positive_int(num_clients, "num_clients")
  if num_clients > num_samples:
    raise PartitionError(
      f"num_clients={num_clients} exceeds the number of samples ({num_samples}): some clients "
      "would hold no data. Use fewer clients or more data."
    )
  return num_clients


def _check_min_size(min_size: int, num_clients: int, num_samples: int) -> int:
  if isinstance(min_size, bool) or not isinstance(min_size, int | np.integer) or min_size < 0:
    raise ValueError(f"min_size must be a non-negative integer, got {min_size!r}.")
  if num_clients * min_size > num_samples:
    raise PartitionError(
      f"Impossible: num_clients={num_clients} x min_size={min_size} = {num_clients * min_size} "
      f"exceeds the {num_samples} samples. Use fewer clients or a smaller min_size."
    )
  return int(min_size)


def _finish(parts: list[np.ndarray]) -> list[np.ndarray]:
  return [np.sort(part).astype(np.int64, copy=False) for part in parts]


def _class_indices(labels: np.ndarray) -> tuple[np.ndarray, list[np.ndarray]]:
  """Present classes (sorted) and, for each, its sample indices in increasing order."""
  classes = np.unique(labels)
  return classes, [np.flatnonzero(labels == c) for c in classes]


# --------------------------------------------------------------------------------------------
# Partitions.


def iid(labels: np.ndarray, num_clients: int, seed: int) -> list[np.ndarray]:
  """IID: shuffle all samples, split into ``num_clients`` near-equal parts (np.array_split).

  Args:
    labels: int [N] class ids (only N is used).
    num_clients: number of clients, at most N.
    seed: RNG seed.

  Returns:
    ``num_clients`` sorted int64 index arrays whose sizes differ by at most one.
  """
  labels = _as_labels(labels)
  num_clients = _check_clients(num_clients, labels.shape[0])
  rng = np.random.default_rng(_check_seed(seed))
  return _finish(np.array_split(rng.permutation(labels.shape[0]), num_clients))


def _dirichlet_draw(
  class_indices: list[np.ndarray],
  num_clients: int,
  concentration: float,
  num_samples: int,
  rng: np.random.Generator,
  holders: list[np.ndarray] | None = None,
) -> list[list[np.ndarray]]:
  """One draw of the Hsu et al. split, optionally restricted to each class's holders (ExDir).

  For each class: shuffle its indices, draw p ~ Dir(concentration * 1_N), zero the clients that
  already hold >= n/N samples (and, for ExDir, those not holding the class), renormalise, cut at
  the cumulative points. What the cut points leave over goes to the last client, or for ExDir
  to the class's last holder. When every eligible share is zero (all holders already full, or
  all shares underflowed) the whole class is that remainder; the reference code ends up doing
  the same through NaN cut points.

  Returns:
    Per client, the list of index chunks it received.
  """
  chunks: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
  sizes = np.zeros(num_clients, np.int64)
  cap = num_samples / num_clients
  for k, idx_k in enumerate(class_indices):
    n_k = idx_k.shape[0]
    idx_k = rng.permutation(idx_k)
    p = rng.dirichlet(np.full(num_clients, concentration))
    eligible = sizes < cap
    if holders is not None:
      held = np.zeros(num_clients, bool)
      held[holders[k]] = True
      eligible &= held
    p = p * eligible
    total = p.sum()
    if total > 0:
      cuts = (np.cumsum(p / total) * n_k).astype(np.int64)[:-1]
    else:
      cuts = np.zeros(num_clients - 1, np.int64)  # everything is remainder
    if holders is not None:
      # Clients after the last holder get nothing; the remainder goes to that holder.
      cuts[holders[k][-1] :] = n_k
    for client, part in enumerate(np.split(idx_k, cuts)):
      if part.size:
        chunks[client].append(part)
        sizes[client] += part.size
  return chunks


def _concat(chunks: list[np.ndarray]) -> np.ndarray:
  return np.concatenate(chunks) if chunks else np.zeros(0, np.int64)


def dirichlet(
  labels: np.ndarray,
  num_clients: int,
  beta: float,
  seed: int,
  min_size: int = 10,
  max_retries: int = 1000,
) -> list[np.ndarray]:
  """Dirichlet label skew Dir(beta) (Hsu et al. 2019, with the balancing rule of their code).

  For each class, p ~ Dir(beta * 1_N) over the N clients; clients already holding >= n/N samples
  get share 0; the rest is renormalised and the class's shuffled indices are cut at the
  cumulative points. The whole draw is repeated until every client has at least ``min_size``
  samples. Smaller beta means more skew.

  Args:
    labels: int [N] class ids.
    num_clients: number of clients.
    beta: Dirichlet concentration, > 0.
    seed: RNG seed.
    min_size: minimum samples per client (FedProj's code used 15).
    max_retries: number of whole draws tried before giving up.

  Returns:
    ``num_clients`` sorted int64 index arrays partitioning ``arange(N)``.

  Raises:
    PartitionError: ``num_clients * min_size > N``, or no draw met ``min_size`` within
      ``max_retries``.
  """
  labels = _as_labels(labels)
  num_samples = labels.shape[0]
  num_clients = _check_clients(num_clients, num_samples)
  beta = _check_concentration(beta, "beta")
  min_size = _check_min_size(min_size, num_clients, num_samples)
  max_retries = _check_positive_int(max_retries, "max_retries")
  rng = np.random.default_rng(_check_seed(seed))
  _, class_indices = _class_indices(labels)
  smallest = 0
  for _ in range(max_retries):
    chunks = _dirichlet_draw(class_indices, num_clients, beta, num_samples, rng)
    smallest = min(sum(c.size for c in client) for client in chunks)
    if smallest >= min_size:
      return _finish([_concat(client) for client in chunks])
  raise PartitionError(
    f"Dirichlet partition failed: no draw out of max_retries={max_retries} gave every one of "
    f"num_clients={num_clients} clients at least min_size={min_size} samples (beta={beta}, "
    f"{num_samples} samples; smallest client in the last draw: {smallest}). Use a larger beta, "
    "fewer clients or a smaller min_size (or raise max_retries)."
  )


def shards(
  labels: np.ndarray, num_clients: int, shards_per_client: int = 2, *, seed: int
) -> list[np.ndarray]:
  """Label-sorted shards (McMahan et al. 2017; FOT's non-IID split).

  Sorts the samples by label (stable), cuts them into ``num_clients * shards_per_client``
  near-equal shards (np.array_split) and gives each client ``shards_per_client`` shards drawn at
  random without replacement. When shards do not straddle class boundaries each client sees at
  most ``shards_per_client`` classes.

  Args:
    labels: int [N] class ids.
    num_clients: number of clients.
    shards_per_client: shards per client.
    seed: RNG seed (keyword-only because it follows an optional argument).

  Returns:
    ``num_clients`` sorted int64 index arrays partitioning ``arange(N)``.
  """
  labels = _as_labels(labels)
  num_clients = _check_positive_int(num_clients, "num_clients")
  shards_per_client = _check_positive_int(shards_per_client, "shards_per_client")
  num_shards = num_clients * shards_per_client
  if num_shards > labels.shape[0]:
    raise PartitionError(
      f"shards: num_clients={num_clients} x shards_per_client={shards_per_client} = {num_shards} "
      f"shards exceed the {labels.shape[0]} samples, so some shards would be empty. Use fewer "
      "clients or fewer shards per client."
    )
  rng = np.random.default_rng(_check_seed(seed))
  pieces = np.array_split(np.argsort(labels, kind="stable"), num_shards)
  order = rng.permutation(num_shards).reshape(num_clients, shards_per_client)
  return _finish([np.concatenate([pieces[s] for s in row]) for row in order])


def _allocate_classes(
  num_classes: int,
  num_clients: int,
  classes_per_client: int,
  rng: np.random.Generator,
  max_retries: int,
) -> list[np.ndarray]:
  """ExDir step 1: each client draws C distinct classes; redraw until coverage is met.

  Returns:
    For each class (position in the sorted present classes), its holders in increasing order.
  """
  required = max(classes_per_client * num_clients // num_classes // 5, 1)
  for _ in range(max_retries):
    chosen = np.stack(
      [rng.choice(num_classes, classes_per_client, replace=False) for _ in range(num_clients)]
    )
    holders = [np.flatnonzero((chosen == k).any(axis=1)) for k in range(num_classes)]
    if min(h.size for h in holders) >= required:
      return holders
  raise PartitionError(
    f"ExDir step 1 failed: in max_retries={max_retries} class draws, some class was held by "
    f"fewer than {required} clients (num_clients={num_clients}, classes_per_client="
    f"{classes_per_client}, {num_classes} classes). Use more clients or a larger "
    "classes_per_client."
  )


def exdir(
  labels: np.ndarray,
  num_clients: int,
  classes_per_client: int,
  alpha: float,
  seed: int,
  min_size: int = 10,
  max_retries: int = 1000,
) -> list[np.ndarray]:
  """Extended Dirichlet ExDir(C, alpha) (SFedKD; Li & Lyu's reference code).

  1. Each client draws C distinct classes uniformly; redraw all until every class is held by at
     least ``max(C * N // K // 5, 1)`` clients (N clients, K classes).
  2. For each class draw p ~ Dir(alpha * 1_N), zero the clients that do not hold the class or
     already hold >= n/N samples, renormalise and cut the class's shuffled indices at the
     cumulative points; the remainder goes to the class's last holder. Redraw step 2 until the
     smallest client has >= ``min_size`` samples.
  3. Shuffle each client's indices.

  Args:
    labels: int [N] class ids; K is the number of distinct classes present.
    num_clients: number of clients.
    classes_per_client: C, classes per client, at most K.
    alpha: Dirichlet concentration, > 0.
    seed: RNG seed.
    min_size: minimum samples per client (10 in the reference code).
    max_retries: retry budget of step 1 and, separately, of step 2.

  Returns:
    ``num_clients`` shuffled int64 index arrays partitioning ``arange(N)``; client k holds only
    its C drawn classes.

  Raises:
    PartitionError: C > K, or the coverage of step 1 or ``min_size`` in step 2 cannot be met
      within ``max_retries``.
  """
  labels = _as_labels(labels)
  num_samples = labels.shape[0]
  num_clients = _check_clients(num_clients, num_samples)
  classes_per_client = _check_positive_int(classes_per_client, "classes_per_client")
  alpha = _check_concentration(alpha, "alpha")
  min_size = _check_min_size(min_size, num_clients, num_samples)
  max_retries = _check_positive_int(max_retries, "max_retries")
  _, class_indices = _class_indices(labels)
  num_classes = len(class_indices)
  if classes_per_client > num_classes:
    raise PartitionError(
      f"ExDir: classes_per_client={classes_per_client} exceeds the {num_classes} classes present "
      f"in the labels. Use classes_per_client <= {num_classes}."
    )
  rng = np.random.default_rng(_check_seed(seed))
  holders = _allocate_classes(num_classes, num_clients, classes_per_client, rng, max_retries)
  smallest = 0
  for _ in range(max_retries):
    chunks = _dirichlet_draw(class_indices, num_clients, alpha, num_samples, rng, holders)
    smallest = min(sum(c.size for c in client) for client in chunks)
    if smallest >= min_size:
      return [rng.permutation(_concat(client)).astype(np.int64) for client in chunks]
  raise PartitionError(
    f"ExDir step 2 failed: no draw out of max_retries={max_retries} gave every one of "
    f"num_clients={num_clients} clients at least min_size={min_size} samples (C="
    f"{classes_per_client}, alpha={alpha}, {num_samples} samples; smallest client in the last "
    f"draw: {smallest}). Use a larger alpha, a larger classes_per_client, fewer clients or a "
    "smaller min_size."
  )


def manual(labels: np.ndarray, counts: np.ndarray, seed: int) -> list[np.ndarray]:
  """An explicit client x class count table (e.g. the Iris pilot of paper 000, Figure 1).

  Client k receives ``counts[k, c]`` samples of class c, drawn without replacement; different
  clients never share a sample. Samples not requested by the table are left out.

  Args:
    labels: int [N] class ids.
    counts: non-negative integers [clients, classes]; column c is class id c.
    seed: RNG seed.

  Returns:
    One sorted int64 index array per row of ``counts``.

  Raises:
    PartitionError: a class has fewer samples than its column asks for.
  """
  labels = _as_labels(labels)
  counts = np.asarray(counts)
  if counts.ndim != 2 or not np.issubdtype(counts.dtype, np.integer) or (counts < 0).any():
    raise ValueError(
      f"counts must be a non-negative integer table [clients, classes], got dtype {counts.dtype} "
      f"and shape {counts.shape}."
    )
  rng = np.random.default_rng(_check_seed(seed))
  parts: list[list[np.ndarray]] = [[] for _ in range(counts.shape[0])]
  for c in range(counts.shape[1]):
    idx_c = np.flatnonzero(labels == c)
    wanted = int(counts[:, c].sum())
    if wanted > idx_c.size:
      raise PartitionError(
        f"manual: class {c} has {idx_c.size} samples but the table asks for {wanted} "
        f"(column {c}: {counts[:, c].tolist()}). Lower the counts of that column."
      )
    idx_c = rng.permutation(idx_c)
    ends = np.cumsum(counts[:, c])
    for k, (start, end) in enumerate(zip(ends - counts[:, c], ends)):
      parts[k].append(idx_c[start:end])
  return _finish([_concat(part) for part in parts])


# --------------------------------------------------------------------------------------------
# Flag syntax.


class PartitionScheme(NamedTuple):
  """A parsed partition flag: how the clients get their samples.

  ``str(scheme)`` gives back its canonical flag form. Not to be confused with
  ``jax.sharding.PartitionSpec``, which places arrays on devices.

  Attributes:
    kind: ``"iid"``, ``"dirichlet"``, ``"shards"`` or ``"exdir"``.
    concentration: beta (dirichlet) or alpha (exdir); None otherwise.
    min_size: minimum samples per client (dirichlet, exdir).
    shards_per_client: shards per client (shards).
    classes_per_client: C (exdir).
  """

  kind: str
  concentration: float | None = None
  min_size: int = 10
  shards_per_client: int = 2
  classes_per_client: int | None = None

  def __str__(self) -> str:
    if self.kind == "dirichlet":
      return f"dirichlet:{self.concentration:g}:{self.min_size}"
    if self.kind == "shards":
      return f"shards:{self.shards_per_client}"
    if self.kind == "exdir":
      return f"exdir:{self.classes_per_client}:{self.concentration:g}:{self.min_size}"
    return self.kind


def parse_partition(spec: str) -> PartitionScheme:
  """Parses a partition flag such as ``"dirichlet:0.5"`` or ``"exdir:2:0.5"``.

  Syntax: ``iid``; ``dirichlet:<beta>[:<min_size>]``; ``shards:<shards_per_client>``;
  ``exdir:<C>:<alpha>[:<min_size>]``.

  Raises:
    ValueError: the string does not follow that syntax or a value is out of range; the message
      lists the valid syntaxes with examples.
  """

  def fail(reason: str) -> ValueError:
    return ValueError(f"Bad partition spec {spec!r}: {reason}. {_PARTITION_SYNTAX}.")

  if not isinstance(spec, str):
    raise fail(f"expected a string, got {type(spec).__name__}")
  fields = [field.strip() for field in spec.strip().split(":")]
  kind, args = fields[0].lower(), fields[1:]

  def number(text: str, what: str, integer: bool) -> float | int:
    try:
      value = int(text) if integer else float(text)
    except ValueError:
      raise fail(f"{what} {text!r} is not {'an integer' if integer else 'a number'}") from None
    if not math.isfinite(value) or value < (0 if what == "min_size" else 1e-300):
      raise fail(f"{what} must be {'>= 0' if what == 'min_size' else '> 0'}, got {text}")
    return value

  if kind == "iid" and not args:
    return PartitionScheme("iid")
  if kind == "dirichlet" and len(args) in (1, 2):
    beta = number(args[0], "beta", integer=False)
    min_size = number(args[1], "min_size", integer=True) if len(args) == 2 else 10
    return PartitionScheme("dirichlet", concentration=beta, min_size=min_size)
  if kind == "shards" and len(args) == 1:
    return PartitionScheme("shards", shards_per_client=number(args[0], "shards_per_client", True))
  if kind == "exdir" and len(args) in (2, 3):
    classes = number(args[0], "classes_per_client", integer=True)
    alpha = number(args[1], "alpha", integer=False)
    min_size = number(args[2], "min_size", integer=True) if len(args) == 3 else 10
    return PartitionScheme(
      "exdir", concentration=alpha, min_size=min_size, classes_per_client=classes
    )
  if kind in ("iid", "dirichlet", "shards", "exdir"):
    raise fail(f"wrong number of ':'-separated values for {kind!r}")
  raise fail(f"unknown partition kind {fields[0]!r}")


def partition(
  labels: np.ndarray, spec: str | PartitionScheme, num_clients: int, seed: int
) -> list[np.ndarray]:
  """Partitions ``labels`` over ``num_clients`` clients as ``spec`` says.

  Args:
    labels: int [N] class ids.
    spec: a flag string (see :func:`parse_partition`) or a :class:`PartitionScheme`.
    num_clients: number of clients.
    seed: RNG seed.

  Returns:
    One int64 index array per client.
  """
  if isinstance(spec, str):
    spec = parse_partition(spec)
  if spec.kind == "iid":
    return iid(labels, num_clients, seed)
  if spec.kind == "dirichlet":
    return dirichlet(labels, num_clients, spec.concentration, seed, min_size=spec.min_size)
  if spec.kind == "shards":
    return shards(labels, num_clients, spec.shards_per_client, seed=seed)
  if spec.kind == "exdir":
    return exdir(
      labels, num_clients, spec.classes_per_client, spec.concentration, seed, spec.min_size
    )
  raise ValueError(f"Unknown partition kind {spec.kind!r}; {_PARTITION_SYNTAX}.")


def label_histogram(labels: np.ndarray, parts: list[np.ndarray], num_classes: int) -> np.ndarray:
  """Counts each client's samples per class.

  Args:
    labels: int [N] class ids.
    parts: one index array per client.
    num_classes: number of columns; every label must be below it.

  Returns:
    int64 [clients, num_classes] counts.
  """
  labels = _as_labels(labels)
  num_classes = _check_positive_int(num_classes, "num_classes")
  if labels.max() >= num_classes:
    raise ValueError(f"label {labels.max()} is out of range for num_classes={num_classes}.")
  hist = np.zeros((len(parts), num_classes), np.int64)
  for k, part in enumerate(parts):
    hist[k] = np.bincount(labels[np.asarray(part, np.int64)], minlength=num_classes)
  return hist
