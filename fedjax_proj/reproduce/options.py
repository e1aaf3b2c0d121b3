"""What one claim command runs and how: :class:`RunOptions`, built once from the command line by
:mod:`.__main__` (or directly, to run a claim from Python), then read by the queue
(:mod:`.claim_queue`), its workers (:mod:`.jobs`) and the pilot's sweep (:mod:`.sweep`).

    from fedjax_proj.reproduce.claim_queue import run_claim
    from fedjax_proj.reproduce.claims import get_claim
    from fedjax_proj.reproduce.options import RunOptions

    claim = get_claim("fedproj-iris-pilot")
    options = RunOptions(methods=("fedavg", "fedproj"), seeds=(0, 1))
    expected = run_claim(claim, "smoke", root, results, options)  # {stem: fingerprint}
"""

from __future__ import annotations

from typing import NamedTuple


class RunOptions(NamedTuple):
  """A claim command's choices, frozen (docs/reproduction.md, "Results").

  Attributes:
    methods: the methods to run, each once (``--methods``; the budget's by default on the
      command line).
    seeds: the seeds to run, each once, non-negative (``--seeds``).
    protocol: ``v1`` or ``v2`` (``--protocol``); the workers of ``jobs`` run the same.
    rerun_stale: rerun results from another config (``--rerun_stale``).
    no_run: only print each run's status and the queue's estimate (``--no_run``).
    time_step: with ``no_run``, time one local step of each method without a recorded time
      (``--time_step``).
    jobs: worker processes, each pinned to its share of the cores (``--jobs``; 1: this process).
    debug: also print a failed run's traceback (``--debug``).
    report: write each sweep regime's report (``--report``; a single claim's report is the
      caller's, after the queue).
    worker: this process is one of a ``jobs`` parent's workers (the parent prints the queue).
    attempt: the name of the command the runs belong to, shared by its workers (a run failed in
      one worker is not retried by another: ``run.run_one``); None outside ``jobs``.
    compilation_cache: the folder of JAX's persistent compilation cache the workers of ``jobs``
      use, or ``off``; None: the workers resolve their own default.
  """

  methods: tuple[str, ...]
  seeds: tuple[int, ...]
  protocol: str = "v1"
  rerun_stale: bool = False
  no_run: bool = False
  time_step: bool = False
  jobs: int = 1
  debug: bool = False
  report: bool = False
  worker: bool = False
  attempt: str | None = None
  compilation_cache: str | None = None
