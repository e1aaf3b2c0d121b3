r"""What the server's ensemble distillation does to the global model, round by round.

FedDF (Lin et al., 2020) and FedProj's server (paper 001, Algorithm 1, lines 31-42) average the
clients' models, then distil the clients' ensemble into that average on public data. The method
helps only if (a) the ensemble is a better model than the average, and (b) distillation moves
the average towards it. Our claims found FedDF *below* FedAvg (docs/reproduction.md), so this
diagnostic measures both, on the test set, every round of a claim's own run:

* ``before``: the FedAvg average θ_avg, before distillation;
* ``after``: the distilled model, the new global model (what the run evaluates);
* ``teacher``: the ensemble the server distils from (the method's combination of the sampled
  clients' logits), evaluated on the test images, which is the accuracy distillation aims at;
* ``clients``: the mean accuracy of the sampled clients' own models.

``after - before`` is the round's distillation gain. The run is the claim's resolved config
(``python -m fedjax_proj.reproduce CLAIM --budget=B --dry_run`` prints it) through the library's
own experiment driver: the diagnostic only wraps the host-loop form of the server step to
evaluate what passes through it, and checks that its last ``after`` is the run's final accuracy.

  python -m studies.distillation_effect.study --claim=fedproj-cifar10-dir0.3 --budget=drift \
      --method=feddf --seeds=0,1,2
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path
from unittest import mock

import jax.numpy as jnp
import ml_collections
import numpy as np

from benchmarks.results_io import RESULTS_DIR, write_results
from fedjax_proj.algorithms import registry
from fedjax_proj.algorithms.distillation import distill
from fedjax_proj.core import tree as tree_lib
from fedjax_proj.core.engine import TwoForms
from fedjax_proj.reproduce.claims.common import BUDGETS
from fedjax_proj.training.evaluate import make_evaluator
from fedjax_proj.training.loop import to_device

RESULTS = RESULTS_DIR

# The server's teacher per method (fedjax_proj/algorithms/distillation: FedET weighs by certainty).
TEACHERS = {"feddf": "mean", "fedproj": "mean", "fedet": "uncertainty"}


def instrument(algorithm, model, normalize, test, teacher: str, batch_size: int, rows: list):
  """``algorithm`` with its server step's host form wrapped to append one row per round to
  ``rows``; the step's inputs and outputs pass through unchanged."""
  if not isinstance(algorithm.aggregate, TwoForms):
    raise ValueError(
      f"{algorithm.name} has no host-loop server step: the diagnostic applies to the "
      "distillation family (feddf, fedet, fedproj)."
    )
  evaluate = make_evaluator(model, normalize, batch_size)
  logits = distill.HostClientLogits(model, normalize, batch_size)  # the server's own forward
  combine = distill.TEACHER_COMBINERS[teacher]
  images, labels = test
  original = algorithm.aggregate.host

  def accuracy(pred_logits):
    return float(jnp.mean(jnp.argmax(pred_logits, -1) == labels))

  def host(state, rd, outputs, key):
    stacked = outputs["variables"]
    averaged = tree_lib.weighted_mean(stacked, rd.num_examples)  # the server's own first step
    before = evaluate(averaged, images, labels)["accuracy"]
    client_logits = logits(stacked, images)  # [C, N, K]
    row = {
      "before": before,
      "teacher": accuracy(combine(client_logits)),
      "clients": float(np.mean([accuracy(z) for z in client_logits])),
    }
    new_state, metrics = original(state, rd, outputs, key)
    row["after"] = evaluate(new_state.variables, images, labels)["accuracy"]
    row["gain"] = row["after"] - row["before"]
    rows.append({"round": len(rows) + 1, **row})
    return new_state, metrics

  return algorithm._replace(aggregate=TwoForms(algorithm.aggregate.traced, host))


def diagnose(config: dict, log=print) -> dict:
  """Runs one resolved image-claim config with the server step instrumented.

  Returns:
    ``{"rounds": [...], "final_test_accuracy": ..., "summary": {...}}``; raises if the run did not
    go through the host-loop server step or its last ``after`` is not the run's final accuracy.
  """
  from fedjax_proj.data.sources import load_dataset
  from fedjax_proj.training import experiment
  from fedjax_proj.training.inputs import subset

  c = ml_collections.ConfigDict({**config, "method_kwargs": config.get("method_kwargs", {})})
  teacher = TEACHERS.get(c.method)
  if teacher is None:
    raise ValueError(f"--method={c.method}: choose one of {sorted(TEACHERS)}.")
  test_ds = load_dataset(c.dataset, "test", c.data_dir or None)
  test = to_device(subset(test_ds, c.test_subset, c.seed + 1))
  rows: list[dict] = []
  build = registry.build_algorithm

  def build_instrumented(method, ctx, **hparams):
    algorithm = build(method, ctx, **hparams)
    return instrument(algorithm, ctx.model, ctx.normalize, test, teacher, c.eval_batch_size, rows)

  with tempfile.TemporaryDirectory() as work:
    c.output_dir, c.progress, c.checkpoint_every = work, False, 0
    with mock.patch.object(registry, "build_algorithm", build_instrumented):
      summary = experiment.run_experiment(c, log=log)
  if len(rows) != c.rounds:
    raise RuntimeError(
      f"the instrumented server step ran {len(rows)} of {c.rounds} rounds: the run's strategy "
      "does not use the host-loop server form; rerun with a host-looped strategy."
    )
  final = summary["final_test_accuracy"]
  if rows[-1]["after"] != final:
    raise RuntimeError(f"last 'after' {rows[-1]['after']} is not the run's final accuracy {final}")
  return {"rounds": rows, "final_test_accuracy": final, "summary": summarize(rows)}


def summarize(rows: list[dict]) -> dict:
  """What the rounds say: the mean gain, how far the teacher is above the average, whether
  distillation closes the distance to the teacher, and whether the gain's sign is the teacher's
  lead's (rows from any number of rounds and seeds; accuracies as fractions)."""
  before, after, teacher = (np.array([r[k] for r in rows]) for k in ("before", "after", "teacher"))
  gain, lead = after - before, teacher - before
  signed = (gain != 0) & (lead != 0)
  return {
    "rounds": len(rows),
    "mean_gain": float(gain.mean()),
    "rounds_gain_positive": int((gain > 0).sum()),
    "mean_teacher_minus_before": float(lead.mean()),
    "rounds_teacher_above_before": int((lead > 0).sum()),
    "mean_distance_to_teacher_before": float(np.abs(lead).mean()),
    "mean_distance_to_teacher_after": float(np.abs(teacher - after).mean()),
    "rounds_gain_sign_is_teacher_lead_sign": int((np.sign(gain) == np.sign(lead))[signed].sum()),
    "rounds_with_both_signs": int(signed.sum()),
    "mean_clients": float(np.mean([r["clients"] for r in rows])),
  }


def _summary_line(what: str, s: dict) -> str:
  pct = lambda v: f"{100 * v:+.2f}"  # noqa: E731
  return (
    f"{what}: distillation gain {pct(s['mean_gain'])} per round ({s['rounds_gain_positive']}/"
    f"{s['rounds']} rounds up); teacher - average {pct(s['mean_teacher_minus_before'])} "
    f"({s['rounds_teacher_above_before']} above); distance to the teacher "
    f"{100 * s['mean_distance_to_teacher_before']:.2f} before, "
    f"{100 * s['mean_distance_to_teacher_after']:.2f} after; the gain has the teacher's lead's "
    f"sign in {s['rounds_gain_sign_is_teacher_lead_sign']}/{s['rounds_with_both_signs']} rounds"
  )


def _seed_lines(seed, result: dict) -> str:
  lines = [
    f"seed {seed}: final {100 * result['final_test_accuracy']:.2f}",
    _summary_line(f"seed {seed}", summarize(result["rounds"])),
  ]
  for r in result["rounds"]:
    lines.append(
      "  round {round:2d}: average {before:.4f}  distilled {after:.4f}  teacher {teacher:.4f}"
      "  clients {clients:.4f}".format(**r)
    )
  return "\n".join(lines)


def _pooled(out: dict) -> dict:
  """The summary of every seed's rounds together."""
  return summarize([r for res in out["seeds"].values() for r in res["rounds"]])


def _print(out: dict) -> None:
  """A stored result's per-seed tables and summaries (recomputed from its rows)."""
  for seed, result in out["seeds"].items():
    print(_seed_lines(seed, result))
  print(_summary_line("pooled", _pooled(out)))


def parse_args(argv=None) -> argparse.Namespace:
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
  p.add_argument("--claim", default="fedproj-cifar10-dir0.3")
  p.add_argument("--budget", default="drift", choices=BUDGETS)
  p.add_argument("--method", default="feddf", choices=sorted(TEACHERS))
  p.add_argument("--seeds", default="0", help="comma-separated")
  p.add_argument(
    "--tiny",
    action="store_true",
    help="the config shrunk to two rounds on small data (reproduce's tiny()): a wiring check",
  )
  p.add_argument(
    "--summarize", default="", help="a result JSON of this script: print its summaries, run nothing"
  )
  p.add_argument(
    "--out", default="", help="result JSON (default: results/distillation_effect-*.json)"
  )
  args = p.parse_args(argv)
  from benchmarks import flag_checks

  args.seeds = flag_checks.seeds(p, "--seeds", args.seeds)
  return args


def main(argv=None) -> dict:
  from fedjax_proj.reproduce import claims, provenance, resolve, runners

  args = parse_args(argv)
  if args.summarize:
    out = json.loads(Path(args.summarize).read_text())
    _print(out)
    return out
  claim = claims.CLAIMS.get(args.claim)
  if claim is None or claim.kind != "image":
    image = sorted(n for n, c in claims.CLAIMS.items() if c.kind == "image")
    raise SystemExit(f"--claim={args.claim}: choose an image claim: {', '.join(image)}.")
  data_root = resolve.default_data_root()
  name = f"{args.claim}-{args.budget}-{args.method}-seeds{'_'.join(map(str, args.seeds))}"
  path = Path(args.out) if args.out else RESULTS / f"distillation_effect-{name}.json"
  path.parent.mkdir(parents=True, exist_ok=True)
  out = {"claim": args.claim, "budget": args.budget, "method": args.method, "seeds": {}}
  out["git_commit"], out["machine"] = provenance.git_commit(), provenance.machine_info()
  out["tiny"] = args.tiny
  for seed in args.seeds:
    config = resolve.resolve_config(claim, args.budget, args.method, seed, data_root)
    if args.tiny:
      config = runners.tiny(claim, config)
    t0 = time.perf_counter()
    result = diagnose(resolve.substitute_data(config, data_root), log=lambda *a, **k: None)
    result["wall_seconds"] = time.perf_counter() - t0
    out["seeds"][str(seed)] = result
    print(_seed_lines(seed, result))
    out["pooled"] = _pooled(out)
    # After every seed, so a stopped or failed run keeps the seeds it finished.
    write_results(path, out)
  print(_summary_line("pooled", out["pooled"]))
  print(f"wrote {path}")
  return out


if __name__ == "__main__":
  main()
