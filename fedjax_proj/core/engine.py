"""The client engine: the only place the client axis is created.

Per-client code is written for ONE client as a :class:`ClientProgram` (fedjax's init/step/final
split). The engine maps it over the sampled clients of a round whose data arrive as indices laid out
[clients, steps, batch] with an example mask; a step whose mask is all False is a no-op, so clients
of unequal size are padded, never dropped.

Execution strategies (identical semantics; tests prove equality up to float tolerance):

* ``vmap_scan``: ``vmap`` over clients of a ``lax.scan`` over steps. Pure and traceable, so a whole
  round compiles into one program. The design for accelerators.
* ``vmap_stepwise``: ``vmap`` over clients, the step loop on the host (one jitted call per step).
* ``sequential``: a host loop over clients and their active steps, one jitted step per call. On
  XLA:CPU this is the fastest for convolutional models (docs/design.md, "Measured facts about
  XLA:CPU": convolutions inside ``scan`` run ~10x slower and vmapped convolutions ~2.3x slower than
  a loop of jitted steps). From ``rounds.STREAM_MIN_CLIENTS`` clients a round, a method with a
  streaming aggregate folds each client into its sums as it finishes
  (:meth:`ClientEngine.run_folded`) instead of keeping every output.
* ``auto``: a measured rule, :func:`choose_strategy`. Per backend, model kind (``conv`` or
  ``dense``) and cohort size it takes the fastest strategy from ``strategy_table.json`` beside this
  module, written by ``benchmarks/perf/strategies.py --write_table`` (the command and the
  measurements are in the file; docs/performance.md). A backend the table does not list (GPU, TPU)
  gets ``vmap_scan``, the design. Runs sharded over several devices or processes always get
  ``vmap_scan``: only the one-program round can be sharded.

PRNG: each client key is split into an init key and a step key; step ``s`` uses
``fold_in(step_key, s)``, so every strategy draws the same numbers.

Server computations that train a model (server distillation) can have the same two forms:
:class:`TwoForms` holds a traced function and a host loop of jitted steps with identical results,
and the round driver picks one from its strategy (:func:`host_form`), so algorithms never take a
strategy (docs/design.md, "The algorithm contract").
"""

from __future__ import annotations

import json
import pathlib
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.extend
import jax.numpy as jnp
import numpy as np

from fedjax_proj.core import tree as tree_lib
from fedjax_proj.core.types import Array, Batch, PyTree

STRATEGIES = ("auto", "vmap_scan", "vmap_stepwise", "sequential")

# batch_fn(images, labels, idx[B], mask[B], key) -> Batch
BatchFn = Callable[[Array, Array, Array, Array, Array], Batch]


class ClientProgram(NamedTuple):
  """One client's local computation as three pure functions.

  Attributes:
    init: ``init(shared, client_input, key) -> state``. ``shared`` is identical for every client
      (e.g. the global model); ``client_input`` is this client's slice of per-client inputs.
    step: ``step(shared, state, batch, key) -> state`` for one local step on a :class:`Batch`;
      ``shared`` is passed unbatched, so it is never copied per client.
    final: ``final(state) -> output``; outputs are stacked over clients by the engine.
    round_steps: if True, ``init`` takes a fourth argument, this client's number of active
      (unmasked) steps this round, int32: E·ceil(n_k/B) for E local epochs, so per-epoch
      schedules (the local learning-rate step schedule, algorithms/client.py) know where each of
      the client's own epochs ends although the step axis is padded to the largest client.
    static_shared: keys of ``shared`` (then a dict) whose values are round-level scalars, bool or
      integer, on which ``step`` may specialise. The host-looped strategies (``sequential``,
      ``vmap_stepwise``) read them on the host once per :meth:`ClientEngine.run` (one transfer),
      hand them to ``step`` as Python scalars (:func:`specialize`) and build one jitted step per
      distinct combination, cached for the engine's life: each combination compiles once. The
      one-program strategy passes them traced, like every other leaf. So ``step`` handles both:
      a Python branch when the value is a Python scalar, else ``lax.cond`` or a select (e.g.
      FedProj's projection window, algorithms/distillation/fedproj.py). Declare only values with
      few distinct values (flags, phases), never per-client ones: ``shared`` is never batched.
    trim_padding: if True, ``step`` on a batch gives the same result (up to float summation order)
      when its masked-out rows are dropped: a masked mean loss, no statistic over the padded batch
      size. Then the streamed ``sequential`` round (:meth:`ClientEngine.run_folded`, large
      cohorts) runs a partial batch trimmed to its valid rows rounded up to :data:`TRIM_GRANULE`
      (one compiled step per size), instead of computing the whole padded batch: with 40
      examples a client and batches of 32, padding is a third of the work. Random draws shaped
      like the batch (dropout, augmentation) then draw for the trimmed batch, so they differ from
      the untrimmed step's, with the same distribution.
  """

  init: Callable[..., PyTree]
  step: Callable[[PyTree, PyTree, Batch, Array], PyTree]
  final: Callable[[PyTree], PyTree]
  round_steps: bool = False
  static_shared: tuple[str, ...] = ()
  trim_padding: bool = False


# A trimmed partial batch is rounded up to a multiple of this many rows, so a batch size B has at
# most B / TRIM_GRANULE compiled step sizes (4 for batches of 32).
TRIM_GRANULE = 8

# The host-looped strategy whose client loop runs one client at a time (the pre-run step timing).
HOST_LOOP = "sequential"


def validate_strategy(strategy: str) -> str:
  if strategy not in STRATEGIES:
    raise ValueError(
      f"Unknown execution strategy {strategy!r}; choose one of {', '.join(STRATEGIES)}."
    )
  return strategy


def one_program(strategy: str) -> bool:
  """Whether ``strategy`` compiles a round into one program (``vmap_scan``): pure and traceable,
  the only form that can be sharded over devices."""
  return validate_strategy(strategy) == "vmap_scan"


def can_shard(strategy: str) -> bool:
  """Whether a run with ``strategy`` can shard its clients over devices or processes: the
  one-program strategy, or ``auto``, which resolves to it for a sharded run
  (:func:`choose_strategy`)."""
  return strategy == "auto" or one_program(strategy)


def has_convolution(fn: Callable[..., Any], *args: Any) -> bool:
  """True if the traced computation of ``fn(*args)`` contains a convolution."""
  jaxpr = jax.make_jaxpr(fn)(*args)

  def walk(jx) -> bool:
    for eqn in jx.eqns:
      if eqn.primitive.name == "conv_general_dilated":
        return True
      for sub in jax.extend.core.jaxprs_in_params(eqn.params):
        if walk(sub):
          return True
    return False

  return walk(jaxpr.jaxpr)


STRATEGY_TABLE = pathlib.Path(__file__).with_name("strategy_table.json")


def load_strategy_table(path: pathlib.Path = STRATEGY_TABLE) -> dict:
  """The measured ``auto`` rule: ``{"rules": {backend: {kind: [[max_clients, strategy], ...]}}}``.

  Each kind's buckets are ordered by ``max_clients``; the last one is open (``None``). The file
  also records, per backend, the command, machine, load and samples/s behind the rule.
  """
  return json.loads(path.read_text())


def choose_strategy(
  strategy: str,
  *,
  backend: str | None = None,
  has_conv: bool = False,
  num_clients: int | None = None,
  sharded: bool = False,
  table: dict | None = None,
) -> str:
  """Resolves ``auto`` from the measured table (``strategy_table.json``, docs/performance.md).

  Args:
    strategy: a name from :data:`STRATEGIES`; anything but ``auto`` is returned unchanged.
    backend: ``jax.default_backend()`` if None.
    has_conv: the model has a convolution (see :func:`has_convolution`): kind ``conv``, else
      ``dense``.
    num_clients: clients per round; None takes the table's largest-cohort bucket.
    sharded: the round's clients are sharded over several devices. Forced to ``vmap_scan``, as is
      any multi-process run (``jax.process_count() > 1``): the host-looped strategies cannot be
      sharded, so there the table does not apply.
    table: the rule table (default: :func:`load_strategy_table`).

  Returns:
    A concrete strategy name.
  """
  validate_strategy(strategy)
  if strategy != "auto":
    return strategy
  if sharded or jax.process_count() > 1:
    return "vmap_scan"  # forced: only the one-program round shards over devices and processes
  backend = backend or jax.default_backend()
  rules = (table or load_strategy_table())["rules"].get(backend, {})
  buckets = rules.get("conv" if has_conv else "dense")
  if not buckets:
    return "vmap_scan"  # not measured on this backend: the design for accelerators
  for max_clients, name in buckets:
    if max_clients is None or (num_clients is not None and num_clients <= max_clients):
      return name
  return buckets[-1][1]


def static_values(program: ClientProgram, shared: PyTree) -> tuple:
  """The values of ``program.static_shared`` in ``shared`` as Python scalars, read in one host
  transfer; ``()`` when the program declares none.

  Raises:
    ValueError: ``shared`` is not a dict holding every declared key, or a value is not a bool or
      integer scalar.
  """
  names = tuple(program.static_shared)
  if not names:
    return ()
  if not isinstance(shared, dict) or any(n not in shared for n in names):
    have = sorted(shared) if isinstance(shared, dict) else type(shared).__name__
    raise ValueError(
      f"The client program declares static_shared={names}, but the broadcast's shared value has "
      f"{have}: return a dict holding every declared key, or drop it from static_shared."
    )
  values = jax.device_get([shared[n] for n in names])
  out = []
  for name, value in zip(names, values):
    value = np.asarray(value)
    if value.shape != () or not (value.dtype == bool or np.issubdtype(value.dtype, np.integer)):
      raise ValueError(
        f"static_shared value {name!r} must be a bool or integer scalar (one compiled step per "
        f"distinct value), got dtype {value.dtype} and shape {value.shape}; declare only "
        "round-level flags or phases."
      )
    out.append(value.item())
  return tuple(out)


def specialize(program: ClientProgram, values: tuple) -> ClientProgram:
  """``program`` whose ``step`` sees ``shared[name]`` as the Python scalar ``values[i]`` for the
  i-th name of ``static_shared`` (what the host-looped strategies jit once per combination)."""
  names = tuple(program.static_shared)
  if len(values) != len(names):
    raise ValueError(f"specialize needs one value per static_shared name {names}, got {values}.")
  if not names:
    return program
  fixed = dict(zip(names, values))

  def step(shared, state, batch, key):
    return program.step({**shared, **fixed}, state, batch, key)

  return program._replace(step=step)


def _split_client_key(key: Array) -> tuple[Array, Array]:
  init_key, step_key = jax.random.split(key)
  return init_key, step_key


def _step_keys(step_key: Array, s: Array | int) -> tuple[Array, Array]:
  batch_key, update_key = jax.random.split(jax.random.fold_in(step_key, s))
  return batch_key, update_key


def _init_client(program: ClientProgram, shared, client_input, key, c_mask):
  """``program.init`` for one client whose step mask is ``c_mask`` [S, B]."""
  if not program.round_steps:
    return program.init(shared, client_input, key)
  active = jnp.sum(jnp.any(c_mask, axis=-1)).astype(jnp.int32)
  return program.init(shared, client_input, key, active)


def _masked_step(program, batch_fn, shared, state, images, labels, idx_s, mask_s, s, step_key):
  batch_key, update_key = _step_keys(step_key, s)
  batch = batch_fn(images, labels, idx_s, mask_s, batch_key)
  new_state = program.step(shared, state, batch, update_key)
  return tree_lib.tree_where(jnp.any(mask_s), new_state, state)


def run_vmap_scan(
  program: ClientProgram,
  batch_fn: BatchFn,
  shared: PyTree,
  client_inputs: PyTree,
  images: Array,
  labels: Array,
  idx: Array,
  mask: Array,
  keys: Array,
  unroll: int | bool = 1,
) -> PyTree:
  """Pure and traceable: ``vmap`` over clients of ``scan`` over steps. Returns stacked outputs."""
  num_steps = idx.shape[1]

  def one_client(client_input, c_idx, c_mask, key):
    init_key, step_key = _split_client_key(key)
    state = _init_client(program, shared, client_input, init_key, c_mask)

    def body(state, xs):
      s, idx_s, mask_s = xs
      return _masked_step(
        program, batch_fn, shared, state, images, labels, idx_s, mask_s, s, step_key
      ), None

    state, _ = jax.lax.scan(body, state, (jnp.arange(num_steps), c_idx, c_mask), unroll=unroll)
    return program.final(state)

  return jax.vmap(one_client)(client_inputs, idx, mask, keys)


class TwoForms:
  """One computation in two forms with identical results; calling it runs the traced form.

  Attributes:
    traced: the pure, traceable form (jit it, or trace it into a one-program round).
    host: a host loop of jitted steps, for host-looped strategies on XLA:CPU, where convolutions
      inside ``lax.scan`` run ~10x slower (docs/design.md, "Measured facts about XLA:CPU").
  """

  def __init__(self, traced: Callable[..., Any], host: Callable[..., Any]):
    self.traced = traced
    self.host = host

  def __call__(self, *args, **kwargs):
    return self.traced(*args, **kwargs)

  def map(self, wrap: Callable[[Callable[..., Any]], Callable[..., Any]]) -> TwoForms:
    """``wrap`` applied to both forms (e.g. extra metrics around a server update)."""
    return TwoForms(wrap(self.traced), wrap(self.host))


def host_form(fn: Callable[..., Any]) -> Callable[..., Any] | None:
  """The host-loop form of ``fn`` when it is a :class:`TwoForms`, else None."""
  return fn.host if isinstance(fn, TwoForms) else None


class ClientEngine:
  """Runs a :class:`ClientProgram` over the sampled clients with a fixed strategy.

  Jitted pieces are built once per engine, so later rounds never recompile (as long as shapes stay
  fixed, which the data layout guarantees); the host-looped strategies build one step per
  combination of the program's :attr:`ClientProgram.static_shared` values, on first use.

  Args:
    program: the per-client program.
    batch_fn: builds a :class:`Batch` from device-resident data and one step's indices.
    strategy: one of :data:`STRATEGIES` except ``auto`` (resolve it first with
      :func:`choose_strategy`).
    unroll: ``lax.scan`` unroll factor for ``vmap_scan``.
  """

  def __init__(self, program: ClientProgram, batch_fn: BatchFn, strategy: str, unroll: int = 1):
    validate_strategy(strategy)
    if strategy == "auto":
      raise ValueError("Resolve strategy='auto' with choose_strategy() before building an engine.")
    self.program = program
    self.batch_fn = batch_fn
    self.strategy = strategy
    self.unroll = unroll
    self.traceable = one_program(strategy)
    # One jitted step per combination of the program's static_shared values (host-looped only).
    self._steps: dict[tuple, Callable[..., PyTree]] = {}
    # Jitted: traced eagerly under vmap it took about 7 ms of host time per run, as much as the
    # rest of a run's host loop over one client of a few steps.
    self._split_keys = jax.jit(jax.vmap(_split_client_key))
    p = program
    if strategy == "vmap_stepwise":
      self._init = jax.jit(
        jax.vmap(lambda sh, ci, k, m: _init_client(p, sh, ci, k, m), in_axes=(None, 0, 0, 0))
      )
      self._final = jax.jit(jax.vmap(p.final))
    elif strategy == "sequential":
      self._init = jax.jit(lambda sh, ci, k, m: _init_client(p, sh, ci, k, m))
      self._final = jax.jit(p.final)
      # One jitted call picks a client's inputs, keys and mask: indexing device arrays eagerly
      # dispatched four ops per client (exact either way: indexing does no arithmetic).
      self._pick = jax.jit(
        lambda ci, ik, sk, m, c: (tree_lib.index_clients(ci, c), ik[c], sk[c], m[c])
      )

  def _jit_step(self, program: ClientProgram) -> Callable[..., PyTree]:
    batch_fn = self.batch_fn
    step = lambda sh, st, im, lb, i, m, s, k: _masked_step(  # noqa: E731
      program, batch_fn, sh, st, im, lb, i, m, s, k
    )
    if self.strategy == "vmap_stepwise":
      step = jax.vmap(step, in_axes=(None, 0, None, None, 0, 0, None, 0))
    return jax.jit(step, donate_argnums=1)

  def step_for(self, shared: PyTree) -> Callable[..., PyTree]:
    """The jitted step a host-looped strategy runs for this round's ``shared``: the one of its
    :attr:`ClientProgram.static_shared` values, built on first use and cached."""
    if self.traceable:
      raise ValueError(f"strategy {self.strategy!r} runs one traced program, not jitted steps.")
    values = static_values(self.program, shared)
    # Keyed by type too: True == 1 in Python, and a step specialised on one is not the other's.
    key = tuple((type(v).__name__, v) for v in values)
    if key not in self._steps:
      self._steps[key] = self._jit_step(specialize(self.program, values))
    return self._steps[key]

  @property
  def step_variants(self) -> dict[tuple, Callable[..., PyTree]]:
    """The jitted steps built so far, by their ``static_shared`` values (host-looped only)."""
    return {tuple(v for _, v in key): step for key, step in self._steps.items()}

  def run(self, shared, client_inputs, images, labels, idx, mask, keys) -> PyTree:
    """Runs every sampled client; returns outputs stacked over the client axis."""
    if self.strategy == "vmap_scan":
      return run_vmap_scan(
        self.program,
        self.batch_fn,
        shared,
        client_inputs,
        images,
        labels,
        idx,
        mask,
        keys,
        unroll=self.unroll,
      )
    step = self.step_for(shared)
    host_mask = np.asarray(mask)
    active = host_mask.any(axis=-1)  # [C, S]
    init_keys, step_keys = self._split_keys(keys)
    if self.strategy == "vmap_stepwise":
      state = self._init(shared, client_inputs, init_keys, mask)
      for s in np.flatnonzero(active.any(axis=0)):
        state = step(shared, state, images, labels, idx[:, s], mask[:, s], int(s), step_keys)
      return self._final(state)
    outputs = []

    def keep(acc, state, c):
      del c
      acc.append(self._final(state))
      return acc

    outputs = self._run_sequential(
      step, keep, outputs, shared, client_inputs, images, labels, idx, mask, init_keys, step_keys
    )
    return tree_lib.stack_clients(outputs)

  def run_folded(self, shared, client_inputs, images, labels, idx, mask, keys, fold, acc):
    """Runs every sampled client one at a time (``sequential``), folding each into ``acc``.

    Instead of keeping every client's output and stacking them (memory growing with the cohort),
    ``acc = fold(acc, client_state, c)`` runs as each client ``c`` finishes, with the client
    program's last state (before ``final``: the fold applies it, so it can fuse ``final`` with its
    reduction into one jitted call). Streaming aggregation uses it
    (:func:`fedjax_proj.core.rounds.make_parallel_round`). Clients run in order 0..C-1.

    Returns:
      The last ``acc``.
    """
    if self.strategy != "sequential":
      raise ValueError(f"run_folded runs the sequential strategy, not {self.strategy!r}.")
    step = self.step_for(shared)
    init_keys, step_keys = self._split_keys(keys)
    return self._run_sequential(
      step,
      fold,
      acc,
      shared,
      client_inputs,
      images,
      labels,
      idx,
      mask,
      init_keys,
      step_keys,
      trim=self.program.trim_padding,
    )

  def _run_sequential(
    self,
    step,
    fold,
    acc,
    shared,
    client_inputs,
    images,
    labels,
    idx,
    mask,
    init_keys,
    step_keys,
    trim=False,
  ):
    host_mask = np.asarray(mask)
    active = host_mask.any(axis=-1)  # [C, S]
    host_idx = np.asarray(idx)
    batch = host_mask.shape[-1]
    # Rows a trimmed step keeps: the last valid row's position, rounded up to the granule.
    last = batch - np.argmax(host_mask[..., ::-1], axis=-1)  # [C, S]
    keep = np.minimum(batch, -(-last // TRIM_GRANULE) * TRIM_GRANULE) if trim else None
    for c in range(host_idx.shape[0]):
      c_input, init_key, step_key, c_mask = self._pick(client_inputs, init_keys, step_keys, mask, c)
      state = self._init(shared, c_input, init_key, c_mask)
      for s in np.flatnonzero(active[c]):
        rows = batch if keep is None else int(keep[c, s])
        state = step(
          shared,
          state,
          images,
          labels,
          host_idx[c, s, :rows],
          host_mask[c, s, :rows],
          int(s),
          step_key,
        )
      acc = fold(acc, state, c)
    return acc
