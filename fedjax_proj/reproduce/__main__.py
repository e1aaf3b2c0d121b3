"""``python -m fedjax_proj.reproduce CLAIM --budget=paper|cpu|drift|gpu|mnist|smoke``: run, report.

    python -m fedjax_proj.reproduce fedproj-cifar10-dir0.3 --budget=cpu --power    # seed count
    python -m fedjax_proj.reproduce fedgkd-cifar10 --budget=paper --dry_run        # the configs
    python -m fedjax_proj.reproduce fedproj-cifar10-dir0.3 --budget=cpu \\
        --methods=fedavg,feddf,fedproj --report
    python -m fedjax_proj.reproduce fedproj-iris-pilot --sweep --report   # the pilot's regimes
    python -m fedjax_proj.reproduce fedproj-cifar10-dir0.3 --budget=drift --jobs=2  # 2 cores
    python -m fedjax_proj.reproduce --update_docs                         # docs/reproduction.md
    python -m fedjax_proj.reproduce --list

Runs go seed by seed (seed 0 of every method, then seed 1, ...), so an interrupted claim still has
comparable pairs. ``--seeds`` defaults to the budget's pre-registered seeds 0..n-1 (claims/,
chosen by the power calculation ``--power`` prints); more seeds are exploratory. A run whose
result file exists with the same resolved config is skipped; one from another config is reported
as stale and rerun only with ``--rerun_stale``; a corrupt one is reported as corrupt, kept aside
and rerun. The queue is printed first with its time at the wall times this budget's results
recorded (``--no_run``: only that), and what is left after each run. ``--jobs=N`` runs the
queue in N worker processes pinned to disjoint cores (:mod:`.jobs`). A run holds a lock, so two
processes never run (or delete) the same one. Every input
is checked (claim, budget, methods, seeds, data folder, each run's config) before anything runs
(docs/design.md, "Input rules"). A failed run prints its error in one line and keeps its traceback
in ``<method>-seed<k>.traceback`` beside its result (``--debug`` prints it too). See
docs/reproduction.md, "Results".
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from pathlib import Path

from fedjax_proj.configs import common
from fedjax_proj.reproduce import (
  availability,
  docs_tables,
  jobs,
  protocol,
  provenance,
  resolve,
  run,
  sweep,
)
from fedjax_proj.reproduce import claims as claims_lib
from fedjax_proj.reproduce.claim_queue import RunsFailed, current_fingerprints, run_claim
from fedjax_proj.reproduce.claims import common as claims_common
from fedjax_proj.reproduce.claims import pilot as pilot_claims
from fedjax_proj.reproduce.claims import presets as claims_presets
from fedjax_proj.reproduce.options import RunOptions
from fedjax_proj.reproduce.report import results as report_results
from fedjax_proj.reproduce.report import verdicts as report_verdicts
from fedjax_proj.reproduce.report import writer as report_writer
from fedjax_proj.reproduce.runners import STEP_TIMERS
from fedjax_proj.training import compilation_cache
from fedjax_proj.training.rundir import check_writable
from fedjax_proj.training.signals import TrainingInterrupted


def _csv(text: str) -> list[str]:
  return [t.strip() for t in text.split(",") if t.strip()]


def parse_args(argv) -> argparse.Namespace:
  p = argparse.ArgumentParser(
    prog="python -m fedjax_proj.reproduce", description=__doc__.split("\n")[0]
  )
  p.add_argument("claim", nargs="?", help=f"one of: {', '.join(claims_lib.CLAIMS)}")
  p.add_argument(
    "--budget",
    default="cpu",
    help="one of the claim's budgets (--list shows the claims; a claim without it lists its "
    "own): "
    + ", ".join(f"{name} ({what})" for name, what in claims_common.BUDGET_TABLE)
    + " (default: cpu)",
  )
  p.add_argument(
    "--seeds",
    default=None,
    help="comma-separated integers (default: the budget's pre-registered seeds 0..n-1, "
    "see --power; others are exploratory)",
  )
  p.add_argument(
    "--protocol",
    default="v1",
    choices=("v1", "v2"),
    help=f"v2: the budget's confirmatory replication, its declared seeds from "
    f"{protocol.V2_FIRST_SEED} scored on {protocol.V2_METRIC} (continual claims: ACC and FGT) "
    '(docs/reproduction.md, "Protocol v2"); with --power, its plan (default: v1)',
  )
  p.add_argument(
    "--dry_run", action="store_true", help="print every method's resolved config; run nothing"
  )
  p.add_argument(
    "--power", action="store_true", help="print the power calculation behind the seed count"
  )
  p.add_argument(
    "--methods", default=None, help="comma-separated subset (default: the budget's methods)"
  )
  p.add_argument("--report", action="store_true", help="write report.md and figures")
  p.add_argument("--no_run", action="store_true", help="only list statuses / report")
  p.add_argument(
    "--time_step",
    action="store_true",
    help="with --no_run: estimate the runs of methods with no recorded time from one local step "
    "of each, timed now (loads the data and compiles the step: 10-40 s for the first method on "
    "a 2-core CPU, seconds for each further one; image and text claims)",
  )
  p.add_argument("--rerun_stale", action="store_true", help="rerun results of another config")
  p.add_argument(
    "--debug",
    action="store_true",
    help="also print a failed run's traceback (always kept in <method>-seed<k>.traceback beside "
    "its result)",
  )
  p.add_argument("--sweep", action="store_true", help="fedproj-iris-pilot: run the regime grid")
  p.add_argument("--update_docs", action="store_true", help="regenerate docs' results section")
  p.add_argument("--list", action="store_true", help="list the claims")
  p.add_argument(
    "--results",
    default=str(run.DEFAULT_RESULTS),
    help="results folder (default: a source checkout's results/reproduce, which holds "
    "its committed results; an installed package's is ./fedjax_proj_results; now: "
    f"{run.DEFAULT_RESULTS})",
  )
  p.add_argument("--data", default="", help="shared data folder (default: ../shared/data)")
  p.add_argument(
    "--jobs",
    type=int,
    default=1,
    help="run the queue in N processes, each pinned to its share of the cores (default: 1)",
  )
  p.add_argument(
    "--compilation_cache",
    default=None,
    help="folder of JAX's persistent compilation cache shared by the runs, or off (default: "
    "$FEDJAX_PROJ_COMPILATION_CACHE, else $XDG_CACHE_HOME/fedjax_proj/jax, else "
    "~/.cache/fedjax_proj/jax): every seed after the first loads its programs instead of "
    "compiling them",
  )
  p.add_argument("--job_worker", action="store_true", help=argparse.SUPPRESS)
  # The parent's name for this command, shared by its workers (run.run_one's ``attempt``).
  p.add_argument("--job_attempt", default="", help=argparse.SUPPRESS)
  args = p.parse_args(argv)
  common.keep_step_memory()  # before anything computes (the claim runs' steps)
  try:
    # Before anything compiles; the workers of --jobs get the folder resolved here.
    cache = compilation_cache.enable(args.compilation_cache)
  except ValueError as e:
    p.error(str(e))
  args.compilation_cache = str(cache) if cache is not None else compilation_cache.OFF
  # --power and --dry_run print and run nothing, so a flag about running or reporting beside them
  # (or the other of the two) would be dropped without a word: refused, naming each.
  flags = ("power", "dry_run", "report", "no_run", "sweep", "rerun_stale")
  modes = [f for f in flags if getattr(args, f)] + (["jobs"] if args.jobs != 1 else [])
  only = [f for f in modes if f in ("power", "dry_run")]
  if only and len(modes) > 1:
    others = ", ".join(f"--{f}" for f in modes if f != only[0])
    p.error(
      f"--{only[0]} only prints (it runs and reports nothing), so {others} would be ignored; "
      f"pass --{only[0]} alone, or leave it out"
    )
  if args.jobs != 1:
    try:
      jobs.check_jobs(args.jobs)
    except ValueError as e:
      p.error(str(e))
    if args.sweep:
      p.error("--jobs does not apply to --sweep; run the sweep in one process")
  if not (args.claim or args.update_docs or args.list):
    p.error("give a CLAIM (or --list / --update_docs); claims: " + ", ".join(claims_lib.CLAIMS))
  if not args.claim and args.budget not in claims_common.BUDGETS:
    p.error(f"unknown --budget={args.budget}; choose from {', '.join(claims_common.BUDGETS)}")
  if args.claim:
    try:
      claim = claims_lib.get_claim(args.claim)
    except ValueError as e:
      p.error(str(e))
    if args.budget not in claim.budgets:  # an unknown name or another claim's budget
      p.error(
        f"claim {claim.name} has no budget {args.budget!r}; its budgets: {', '.join(claim.budgets)}"
      )
    if args.methods is not None and not _csv(args.methods):  # given but empty: not the default
      p.error(
        f"--methods={args.methods} lists no method; list them, e.g. --methods="
        f"{','.join(claim.at(args.budget).methods[:2])}, or leave the flag out for the budget's "
        f"methods ({', '.join(claim.at(args.budget).methods)})"
      )
    args.method_list = _csv(args.methods) if args.methods else list(claim.at(args.budget).methods)
    bad = [m for m in args.method_list if m not in claim.runnable]
    if bad:
      p.error(
        f"--methods: {bad} not in claim {claim.name}; choose from {', '.join(claim.runnable)}"
      )
    twice = [m for m in dict.fromkeys(args.method_list) if args.method_list.count(m) > 1]
    if twice:  # each would queue the same run twice, the second finding the first's lock
      p.error(f"--methods lists {', '.join(twice)} more than once; list each method once")
    b = claim.budgets[args.budget]
    if args.protocol == "v2" and b.v2 is None:
      with_v2 = [
        f"{c.name} --budget={k}"
        for c in claims_lib.CLAIMS.values()
        for k, x in c.budgets.items()
        if x.v2 is not None
      ]
      p.error(
        f"claim {claim.name} budget {args.budget} declares no protocol v2 replication; those "
        f"that do: {', '.join(with_v2)}"
      )
    if args.protocol == "v1" and b.seeds == 0:  # declared for its v2 replication only
      p.error(
        f"claim {claim.name} budget {args.budget} pre-registers no protocol v1 seeds; it is "
        "declared for protocol v2 only: add --protocol=v2"
      )
    runs = not (args.no_run or args.dry_run or args.power)
    device = b.v2.device if args.protocol == "v2" and b.v2 is not None else None
    if runs and device is not None and provenance.local_backend() != device:
      # All of a replication's runs on the machine kind it declared (docs/reproduction.md,
      # "Protocol v2"): a run here would be one the report refuses to pair, its time lost.
      p.error(
        f"claim {claim.name} budget {args.budget}: its protocol v2 runs are declared to run on "
        f'a {device} (docs/reproduction.md, "Protocol v2"), and this machine has none; run '
        f"them on one with `{b.v2.command(claim.name, args.budget)}`, or add --no_run to see "
        "what is left"
      )
    try:
      declared = (
        protocol.v2_view(claim, args.budget).budgets[args.budget].declared
        if args.protocol == "v2"
        else b.declared
      )
    except ValueError as e:  # a replication declared with an unusable seed count
      p.error(f"{e} (fedjax_proj/reproduce/claims/)")
    if args.seeds is not None and not _csv(args.seeds):  # given but empty: not the default
      p.error(
        f"--seeds={args.seeds} lists no seed; list them, e.g. --seeds=0,1,2, or leave the flag "
        f"out for the budget's pre-registered seeds {declared[0]}..{declared[-1]}"
      )
    try:
      args.seed_list = [int(s) for s in _csv(args.seeds)] if args.seeds else list(declared)
    except ValueError:
      p.error(f"--seeds must be comma-separated integers, e.g. 0,1,2; got {args.seeds!r}")
    if min(args.seed_list) < 0:
      p.error(f"--seeds must list non-negative integers, e.g. 0,1,2; got {args.seeds!r}")
    twice = sorted({s for s in args.seed_list if args.seed_list.count(s) > 1})
    if twice:  # each would queue the same run twice
      p.error(f"--seeds lists {', '.join(map(str, twice))} more than once; list each seed once")
    # Seeds from V2_FIRST_SEED on are protocol v2's: a v1 command never runs them, nor v2 others.
    v2_seeds = [s for s in args.seed_list if s >= protocol.V2_FIRST_SEED]
    if args.protocol == "v1" and v2_seeds:
      p.error(
        f"--seeds {v2_seeds} are protocol v2's (seeds from {protocol.V2_FIRST_SEED} on): add "
        "--protocol=v2, or choose seeds below it"
      )
    if args.protocol == "v2" and len(v2_seeds) < len(args.seed_list):
      p.error(
        f"--protocol=v2 runs seeds from {protocol.V2_FIRST_SEED} on (declared: "
        f"{declared[0]}..{declared[-1]}); got {args.seeds!r}"
      )
    if args.sweep and claim.name != pilot_claims.PILOT.name:
      p.error(f"--sweep applies to {pilot_claims.PILOT.name} only")
    if args.time_step and not args.no_run:
      p.error(
        "--time_step estimates a queue without running it: add --no_run (a run times its own "
        "step before round 1)"
      )
    if args.time_step and claim.kind not in STEP_TIMERS:
      p.error(
        f"--time_step: {claim.name} is a {claim.kind} claim, whose runs have no step timer (a "
        "continual run's cost is in its end-of-task passes); run one seed (--seeds=N) to record "
        "a time"
      )
    if args.time_step and args.sweep:
      p.error("--time_step does not apply to --sweep")
  return args


def run_options(args: argparse.Namespace) -> RunOptions:
  """The frozen options of a claim command, from its parsed (and checked) command line."""
  return RunOptions(
    methods=tuple(args.method_list),
    seeds=tuple(args.seed_list),
    protocol=args.protocol,
    rerun_stale=args.rerun_stale,
    no_run=args.no_run,
    time_step=args.time_step,
    jobs=args.jobs,
    debug=args.debug,
    report=args.report,
    worker=args.job_worker,
    attempt=args.job_attempt or None,
    compilation_cache=args.compilation_cache,
  )


def data_root(args, claim: claims_common.Claim) -> Path:
  """The shared data folder; a claim that needs data and finds none is an error with the fix."""
  from fedjax_proj.data.sources import find_shared_data
  from fedjax_proj.training.rundir import check_folder

  # A --data given is used or refused by name, never replaced by the default folder.
  root = check_folder(args.data, "--data") if args.data else find_shared_data()
  if claim.kind != "pilot" and (root is None or not root.is_dir()):
    raise FileNotFoundError(
      "The shared data folder was not found (looked for <repo>/../shared/data and "
      "$FEDJAX_PROJ_SHARED_DATA); pass --data=/path/to/shared/data."
    )
  return root or Path(".")


def dry_run(claim: claims_common.Claim, budget: str, methods, root: Path) -> str:
  """Every method's resolved config at ``budget`` (fields shared by all methods once, then each
  method's own fields and its full hyperparameters), without running anything."""
  configs = {m: resolve.resolve_config(claim, budget, m, 0, root) for m in methods}
  first = next(iter(configs.values()))
  skip = ("method", "method_kwargs", "method_defaults")
  shared = {
    k: v for k, v in first.items() if k not in skip and all(c.get(k) == v for c in configs.values())
  }
  b = claim.budgets[budget]
  lines = [
    f"{claim.name} --budget={budget}: {claim.entry} --preset={claim.preset_of(budget)} + the "
    f"claim's overrides, through the entry point's resolve/prepare. Seeds: 0..{b.seeds - 1} "
    f"(pre-registered). {{data}} = {root}.",
    "",
    "shared fields:",
  ]
  lines += [f"  {k} = {shared[k]!r}" for k in sorted(shared)]
  for m, c in configs.items():
    own = {k: v for k, v in c.items() if k not in skip and k not in shared}
    lines += ["", f"{m} (method={c['method']}):"]
    lines += [f"  {k} = {own[k]!r}" for k in sorted(own)]
    lines += [
      f"  {c['method']}.{k} = {v!r}" for k, v in sorted(resolve.effective_hparams(c).items())
    ]
  # The public set is shared by every method, so is its deviation on this machine.
  _, notes = availability.public_fallback(first, root, claims_presets.PUBLIC)
  lines += ["", *(f"deviation on this machine: {n}" for n in notes)] if notes else []
  return "\n".join(lines)


def main(argv=None) -> int:
  argv = sys.argv[1:] if argv is None else argv
  args = parse_args(argv)
  results = Path(args.results)
  if results.exists() and not results.is_dir():  # read or written, never taken for an empty one
    print(f"error: --results={results} is a file, not a folder; pass a folder.", file=sys.stderr)
    return 1
  if args.list:
    for c in claims_lib.CLAIMS.values():  # a reference cites its paper by file number only
      print(f"{c.name:24s} {c.reference}  methods: {', '.join(c.methods)}")
      print(f"{'':24s} paper {c.paper_title}")
  if args.claim:
    claim = claims_lib.get_claim(args.claim)
    try:
      if args.power:
        directory = results / claim.name / args.budget
        found = report_results.load_results(directory)[0] if directory.is_dir() else {}
        if args.protocol == "v2":
          view = protocol.v2_view(claim, args.budget)
          v2 = report_results.split_protocols(found)[1]
          print(protocol.render_plan(view, args.budget, report_verdicts.measured_sd(view, v2)))
        else:
          v1 = report_results.split_protocols(found)[0]
          print(protocol.render_plan(claim, args.budget, report_verdicts.measured_sd(claim, v1)))
        return 0
      root = data_root(args, claim)
      if not args.dry_run and (args.report or not args.no_run):
        # Where results and reports go, checked before any run starts.
        check_writable(results / claim.name, "--results")
      if args.dry_run:
        print(dry_run(claim, args.budget, args.method_list, root))
        return 0
      if args.sweep:
        sweep.run_sweep(claim, root, results, run_options(args), run_claim)
      else:
        failed = None
        try:
          expected = run_claim(claim, args.budget, root, results, run_options(args))
        except RunsFailed as e:  # the finished runs still get their report
          failed, expected = e, e.expected
        if args.report:
          directory = results / claim.name / args.budget
          current = current_fingerprints(claim, args.budget, directory, root)
          expected = {**current, **expected}
          # The command as given (its --methods, --seeds, --data kept): pasted, it reruns this.
          command = f"python -m fedjax_proj.reproduce {shlex.join(argv)}"
          print(report_writer.write_report(claim, args.budget, directory, expected, command))
          if (directory / "report.md").is_file():
            print(f"wrote {directory / 'report.md'} (and its figures beside it)")
          else:
            print(f"note: {directory} holds no results, so no report.md was written")
        if failed is not None:
          raise failed
    except TrainingInterrupted as e:
      print(
        f"stopped: {e}; rerun the command to continue from the checkpoint and run what is left",
        file=sys.stderr,
      )
      return 128 + e.signum
    except (FileNotFoundError, ValueError, RuntimeError) as e:
      print(f"error: {e}", file=sys.stderr)
      return 1
  if args.update_docs:
    if not provenance.in_checkout():
      print(
        f"error: --update_docs rewrites docs/reproduction.md of a source checkout, and this "
        f"fedjax_proj is installed ({provenance.REPO_ROOT}); run it in a clone of the repository "
        "(pip install -e . there)",
        file=sys.stderr,
      )
      return 2
    doc = provenance.REPO_ROOT / "docs" / "reproduction.md"
    report_writer.update_docs(doc, results)
    docs_tables.update(doc)
    print(f"updated {os.path.relpath(doc)}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
