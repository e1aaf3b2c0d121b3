"""The parity suite's shared harness: references, identical inputs, comparison, results.

docs/parity.md describes the suite and holds its table. Every parity benchmark runs a reference
implementation beside ours on identical inputs and reports the largest relative difference
against a tolerance argued from float32 (:func:`float32_tolerance`). This module needs no torch:
the pieces that build our side's inputs and read our side's numbers are tested in
tests/benchmarks/parity/test_parity_common.py; the benchmarks that run a reference (torch, a
checkout of the authors' repository) are benchmarks, not tests.

Pieces:

* :data:`REFERENCES`: each reference repository and the commit the suite pins, checked by
  :func:`reference_checkout` (a git checkout's HEAD, or the ``.parity_commit`` file a
  ``git archive`` extraction writes).
* :func:`load_definitions`: executes only the named top-level functions/classes of a reference
  file, so a module whose imports cannot be met (torchvision, wandb, torch.distributed setups)
  still lends its loss or optimiser to the comparison unchanged.
* :func:`tiny_inputs`: the shared inputs of the loss-level rows, made on our side: initial
  weights of our ``mlp`` (and of the other models a method reads: global, previous, teachers) as
  numpy, a batch, a public set and a client sample.
* :func:`torch_linear_state`: our Flax Dense parameters as torch ``nn.Linear`` state (numpy).
* :func:`client_step`: one local step of our ClientProgram on that batch, returning the loss and
  the gradient the optimiser received (:func:`grad_stash` as the optimiser).
* :func:`compare`, :func:`float32_tolerance`, :func:`markdown`: the verdict and the files
  under ``results/parity/``.
* :data:`SUITE`: every parity benchmark with its result file, the older ones included.
"""

from __future__ import annotations

import ast
import functools
import subprocess
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from benchmarks.results_io import REPO_ROOT, RESULTS_DIR, write_results

ROOT = REPO_ROOT

RESULTS = RESULTS_DIR / "parity"

# float32 machine epsilon, 2^-23 (the spacing of floats in [1, 2)).
EPS32 = float(np.finfo(np.float32).eps)
# Chained float32 operations on the longest path of a loss-level row (forward layers, softmax,
# log-softmax, the loss's own arithmetic, and their backward): each adds at most one rounding of
# the running magnitude. 32 is a generous count for the tiny models the rows use.
CHAIN_ULPS = 32


class Reference(NamedTuple):
  """A reference implementation: GitHub repository, pinned commit, a file that must exist."""

  repo: str
  commit: str
  marker: str


REFERENCES: dict[str, Reference] = {
  "fedntd": Reference(
    "Lee-Gihun/FedNTD", "be00ee598139654abe650c446a7ba3bc4e340233", "algorithms/fedntd/criterion.py"
  ),
  "fedgkd": Reference(
    "CGCL-codes/FedGKD",
    "72e7bac970228a3a5999e7fdd87e60fda6a3bc6e",
    "pcode/workers/worker_fedgkd.py",
  ),
  "moon": Reference("QinbinLi/MOON", "8fcba3c4efc9a47eb24687a91ba94cfb2005103f", "main.py"),
  "fedrcl": Reference("skynbe/FedRCL", "378beb409add17838567ea25238afadb3258514f", "utils/loss.py"),
  "feddyn": Reference(
    "alpemreacar/FedDyn", "48a19fac440ef079ce563da8e0c2896f8256fef9", "utils_general.py"
  ),
  "fednova": Reference(
    "JYWa/FedNova", "47b4e096dfb19dc43c728896fff335a5befb645d", "distoptim/FedNova.py"
  ),
  "feddf": Reference(
    "epfml/federated-learning-public-code",
    "44dd5551071969eb354ee2ed091a9ba36c1d5b08",
    "codes/FedDF-code/pcode/aggregation/noise_knowledge_transfer.py",
  ),
  # The continual baselines (benchmarks/parity/continual.py). The FOT code holds no EWC or ER
  # (docs/parity.md, "EWC and ER"): it is checked for that, and the rows run the closest public
  # code: the EWC its MLP derives from, and mammoth's ER. Its HEAD (f343e36) differs from 6adce7c
  # only in README.md; 6adce7c is the commit benchmarks/parity/fot_basis.py read.
  "fot": Reference(
    "duygunuryldz/Federated_Orthogonal_Training",
    "6adce7c78d8d8ccf182a53730d9ba6962e427821",
    "trainer/mnist_trainer.py",
  ),
  # The FedProj authors' code, read by benchmarks/parity/fedproj.py and benchmarks/perf/cpu_step.py
  # through --authors_repo (a folder anywhere, so its commit is checked, not its location).
  "fedproj": Reference(
    "Abhijit4-debug/FedProj_Neurips",
    "93d98175ae97fecc0fc74b6eb41b2a8cb3561848",
    "src/client/client_fedproj.py",
  ),
  "ewc": Reference("kuc2477/pytorch-ewc", "4afaa6666d6b4f1a91a110caf69e7b77f049dc08", "model.py"),
  "er": Reference("aimagelab/mammoth", "e75a491c69fd729edeb01431afb753d9157d9a81", "models/er.py"),
  # benchmarks/parity/mkd.py: CA-MKD's authors' code holds AVER, EBKD and CA-MKD (004 Table 2's
  # KD ablations on FedSeq); FedCurv's paper links no code, OpenFL's is the public one; GLFC's
  # authors' code for GLFC+FL (003 F.2).
  "mtkd": Reference(
    "Rorozhl/CA-MKD", "c2f39a9f13c1998e9971815760364587222581ce", "helper/loops.py"
  ),
  "fedcurv": Reference(
    "securefederatedai/openfl",
    "6aac83ae52f628e3dd81806d5a5f962d1099d161",
    "openfl/utilities/fedcurv/torch/fedcurv.py",
  ),
  "glfc": Reference(
    "conditionWang/FCIL", "11e161a9d57ecd14126201b7bd9a424137749ee5", "src/GLFC.py"
  ),
  # 002's baselines with public code (benchmarks/parity/fedgen.py). FedDistill+ has two: 002's
  # authors' (the FedGKD repository) and FedGen's `FedDistill` with `share_model`; FedGKD+ is the
  # FedGKD repository's worker on its --projection model.
  "feddistill_plus": Reference(
    "CGCL-codes/FedGKD",
    "72e7bac970228a3a5999e7fdd87e60fda6a3bc6e",
    "pcode/workers/worker_feddistill.py",
  ),
  "feddistill_fedgen": Reference(
    "zhuangdizhu/FedGen",
    "dd5807c5625404e99035d97e2ef8c712c2e007a6",
    "FLAlgorithms/users/userFedDistill.py",
  ),
  "fedgen": Reference(
    "zhuangdizhu/FedGen",
    "dd5807c5625404e99035d97e2ef8c712c2e007a6",
    "FLAlgorithms/servers/serverpFedGen.py",
  ),
  "fedgkd_plus": Reference(
    "CGCL-codes/FedGKD", "72e7bac970228a3a5999e7fdd87e60fda6a3bc6e", "pcode/models/resnet.py"
  ),
}

# References whose rows benchmarks/parity/continual.py runs ("fot" is read by both).
CONTINUAL = ("ewc", "er")
# References whose rows benchmarks/parity/mkd.py runs.
MKD = ("mtkd", "fedcurv", "glfc")
# References whose rows benchmarks/parity/fedgen.py runs.
GENERATIVE = ("feddistill_plus", "feddistill_fedgen", "fedgen", "fedgkd_plus")

COMMIT_FILE = ".parity_commit"


def checkout_instructions(key: str, path: Path) -> str:
  ref = REFERENCES[key]
  return (
    f"git clone https://github.com/{ref.repo} {path} && git -C {path} checkout {ref.commit} "
    f"(or extract `git archive {ref.commit}` there and write the commit to {path}/{COMMIT_FILE})"
  )


def checkout_commit(path: Path) -> str | None:
  """The commit of a reference folder: a git checkout's HEAD, else an extracted archive's
  ``.parity_commit``, else None (unknown)."""
  if (path / ".git").exists():
    return subprocess.run(
      ["git", "-C", str(path), "rev-parse", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
  if (path / COMMIT_FILE).is_file():
    return (path / COMMIT_FILE).read_text().strip()
  return None


def reference_checkout(key: str, refs_dir: str | Path) -> Path:
  """The checkout of reference ``key`` under ``refs_dir``, checked against the pinned commit.

  The folder is ``refs_dir/<repository name>``. A git checkout must be at the pinned commit; an
  extracted archive must carry the commit in ``.parity_commit``.

  Raises:
    ValueError: unknown key, missing checkout or marker file, or another commit.
  """
  if key not in REFERENCES:
    raise ValueError(f"no reference {key!r}; known: {', '.join(sorted(REFERENCES))}")
  ref = REFERENCES[key]
  path = Path(refs_dir) / ref.repo.split("/")[1]
  if not (path / ref.marker).is_file():
    raise ValueError(
      f"{path} has no {ref.marker}: get {ref.repo} at {ref.commit[:12]} with "
      + checkout_instructions(key, path)
    )
  commit = checkout_commit(path)
  if commit != ref.commit:
    raise ValueError(
      f"{path} is at commit {commit or 'unknown'}, the suite pins {ref.commit}: "
      + checkout_instructions(key, path)
    )
  return path


def load_definitions(path: Path, names: tuple[str, ...], namespace: dict) -> dict:
  """Executes only the named top-level functions/classes of ``path`` in ``namespace``.

  The reference's own text runs unchanged; ``namespace`` supplies the names it reads at module
  level (torch, F, a base class, ...) in place of its imports.
  """
  tree = ast.parse(Path(path).read_text())
  keep = [n for n in tree.body if getattr(n, "name", None) in names]
  missing = set(names) - {n.name for n in keep}
  if missing:
    raise ValueError(f"{path} defines no {sorted(missing)}: another version of the reference?")
  exec(compile(ast.Module(keep, []), str(path), "exec"), namespace)
  return namespace


# ---------------------------------------------------------------------------------------------
# Identical inputs, made on our side


class TinyInputs(NamedTuple):
  """The inputs of a loss-level row (numpy float32 / int32 unless said).

  Attributes:
    model: our Model (``mlp``).
    variables: the local model's initial variables (numpy).
    others: further variables of the same model, e.g. ``"global"``, ``"prev"`` (numpy).
    x: [B, D] the batch's inputs; y: [B] its labels.
    public: [P, D] a public set.
    sampled: [C] the clients sampled this round (of ``num_clients``).
    num_examples: [C] their dataset sizes.
  """

  model: Any
  variables: dict
  others: dict
  x: np.ndarray
  y: np.ndarray
  public: np.ndarray
  sampled: np.ndarray
  num_examples: np.ndarray


def to_numpy(tree):
  import jax

  return jax.tree.map(lambda a: np.array(a, np.float32), tree)


def tiny_inputs(
  seed: int = 0,
  *,
  batch: int = 16,
  in_dim: int = 12,
  hidden: tuple[int, ...] = (16,),
  classes: int = 5,
  others: tuple[str, ...] = ("global",),
  public: int = 32,
  num_clients: int = 10,
  clients: int = 4,
  scale: float = 1.0,
  model_kwargs: dict | None = None,
) -> TinyInputs:
  """Our ``mlp`` at its initial weights (one init per entry of ``others``, seeds seed+1, ...) and
  a Gaussian batch with labels covering every class; ``scale`` multiplies the inputs (larger
  logits make the losses less flat)."""
  import jax
  import jax.numpy as jnp

  from fedjax_proj.models import mlp

  model = mlp(classes, hidden=hidden, **(model_kwargs or {}))
  rng = np.random.default_rng(seed)
  x = (scale * rng.standard_normal((batch, in_dim))).astype(np.float32)
  y = (np.arange(batch) % classes).astype(np.int32)
  rng.shuffle(y)
  init = lambda s: to_numpy(model.init(jax.random.key(s), jnp.asarray(x[:2])))
  sampled = np.sort(rng.choice(num_clients, clients, replace=False)).astype(np.int32)
  return TinyInputs(
    model=model,
    variables=init(seed),
    others={name: init(seed + 1 + i) for i, name in enumerate(others)},
    x=x,
    y=y,
    public=(scale * rng.standard_normal((public, in_dim))).astype(np.float32),
    sampled=sampled,
    num_examples=rng.integers(batch, 4 * batch, clients).astype(np.float32),
  )


def dense_layers(params: dict) -> list[str]:
  """Our MLP's Dense layers in forward order: dense_0.., proj_hidden, proj_out, head."""
  hidden = sorted((k for k in params if k.startswith("dense_")), key=lambda k: int(k[6:]))
  tail = [k for k in ("proj_hidden", "proj_out", "head") if k in params]
  return hidden + tail


def torch_linear_state(params: dict, names: dict[str, str]) -> dict[str, np.ndarray]:
  """Flax Dense parameters as torch ``nn.Linear`` state: ``{torch_name.weight: kernelᵀ, .bias}``.

  ``names`` maps our layer name to the torch module's name.
  """
  out = {}
  for ours, theirs in names.items():
    out[f"{theirs}.weight"] = np.ascontiguousarray(np.asarray(params[ours]["kernel"]).T)
    out[f"{theirs}.bias"] = np.asarray(params[ours]["bias"])
  return out


def grad_stash():
  """An optax transformation that applies no update and keeps the gradient it received as its
  state: after one client step, ``state.opt_state`` is exactly the gradient the optimiser saw
  (after the method's ``transform_grads``)."""
  import jax
  import jax.numpy as jnp
  import optax

  def init(params):
    return jax.tree.map(jnp.zeros_like, params)

  def update(updates, state, params=None):
    del state, params
    return jax.tree.map(jnp.zeros_like, updates), updates

  return optax.GradientTransformation(init, update)


@functools.lru_cache(maxsize=16)
def _jitted(program):
  """``program``'s init and step, jitted once per program (a ClientProgram is hashable)."""
  import jax

  return jax.jit(program.init, static_argnums=3), jax.jit(program.step)


def client_step(
  program, shared: dict, client_input: dict, x, y, mask=None, seed: int = 0, params=None
):
  """One local step of ``program`` (built with :func:`grad_stash` as its optimiser) on (x, y).

  ``params``: the local parameters the step starts from (None: the received global model, as at
  a round's first step). Later steps of a round start away from the global model, where every
  regulariser towards it has a nonzero gradient, so the rows pass other weights here.

  Returns:
    (loss, gradient pytree as numpy) exactly as the program's step computed them.
  """
  import jax
  import jax.numpy as jnp

  from fedjax_proj.core.types import Batch

  mask = np.ones(len(y), np.float32) if mask is None else mask
  batch = Batch(jnp.asarray(x), jnp.asarray(y, jnp.int32), jnp.asarray(mask, jnp.float32))
  key = jax.random.key(seed)
  init, step = _jitted(program)
  state = init(shared, client_input, key, 1)
  if params is not None:
    state = state._replace(params=jax.tree.map(jnp.asarray, params))
  state = step(shared, state, batch, key)
  return float(state.loss_sum), to_numpy(state.opt_state)


# ---------------------------------------------------------------------------------------------
# Comparison


def float32_tolerance(reduction_length: int, ulps: int = CHAIN_ULPS) -> float:
  """Largest relative difference two float32 computations of the same maths may show.

  The argument: both sides round in float32 (ε = 2^-23) but sum in different orders. A sum of n
  terms computed in any order is within n·ε·Σ|x_i| of the exact sum (Higham, "Accuracy and
  Stability of Numerical Algorithms", Thm 4.4, γ_n ≤ n·u/(1 − n·u) with u = ε/2, for both sides
  together), and the compared quantity's largest magnitude is at least of the order of the terms
  it sums. Every one of the ``ulps`` chained operations on the path (forward, softmax, loss,
  backward) can repeat that, so the difference relative to the largest magnitude is at most
  ``ulps · n · ε``, n the longest reduction on the path (batch size, fan-in or class count).
  A difference in the maths itself (a dropped term, a missing T², another normalisation) shows
  at 1e-2 or more, well above it for the tiny models of the rows.
  """
  if reduction_length < 1:
    raise ValueError(f"reduction_length must be >= 1, got {reduction_length}")
  return ulps * reduction_length * EPS32


def relative_difference(ours, reference) -> float:
  """max |ours − reference| / max |reference| (0 when both are all zero)."""
  a = np.asarray(ours, np.float64)
  b = np.asarray(reference, np.float64)
  if a.shape != b.shape:
    raise ValueError(f"shapes differ: ours {a.shape}, reference {b.shape}")
  diff = float(np.max(np.abs(a - b), initial=0.0))
  scale = float(np.max(np.abs(b), initial=0.0))
  if scale == 0.0:
    return 0.0 if diff == 0.0 else float("inf")
  return diff / scale


def compare(ours: dict, reference: dict, tolerance: float) -> dict:
  """Per-entry relative differences of two flat dicts of arrays and the verdict.

  Each entry is scaled by its own largest reference magnitude (a gradient of 1e-3 is compared
  with 1e-3, not with the largest gradient elsewhere).

  Raises:
    ValueError: the two dicts name different entries (a mapping error, not a difference).
  """
  if set(ours) != set(reference):
    raise ValueError(
      f"the compared entries differ: only ours {sorted(set(ours) - set(reference))}, "
      f"only the reference's {sorted(set(reference) - set(ours))}"
    )
  per = {k: relative_difference(ours[k], reference[k]) for k in sorted(ours)}
  worst = max(per.values(), default=0.0)
  return {
    "max_rel": worst,
    "worst_entry": max(per, key=per.get) if per else None,
    "tolerance": tolerance,
    "verdict": "match" if worst <= tolerance else "differ",
    "per_entry": per,
  }


def flatten(tree: dict, prefix: str = "") -> dict[str, np.ndarray]:
  """A nested dict of arrays as ``{"a/b/c": array}``."""
  out = {}
  for k, v in tree.items():
    name = f"{prefix}/{k}" if prefix else str(k)
    if isinstance(v, dict):
      out.update(flatten(v, name))
    else:
      out[name] = np.asarray(v)
  return out


# ---------------------------------------------------------------------------------------------
# Results


def our_commit() -> str:
  """Short HEAD of this repository, ``+dirty`` with uncommitted tracked changes outside
  ``results/`` (which a run rewrites itself)."""
  try:
    sha = subprocess.run(
      ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
    ).stdout.strip()
    dirty = subprocess.run(
      ["git", "status", "--porcelain", "--untracked-files=no"],
      cwd=ROOT,
      capture_output=True,
      text=True,
    ).stdout.splitlines()
    dirty = [line for line in dirty if "results/" not in line]
    return sha + ("+dirty" if dirty else "")
  except OSError:
    return "unknown"


def markdown(result: dict) -> str:
  """One method's result as Markdown: its comparisons, then its findings."""
  ref = result["reference"]
  lines = [
    f"# {result['method']} parity with {ref['repo']}@{ref['commit'][:7]}",
    "",
    f"Generated by `{result['command']}` at commit {result['commit']} (torch {result['torch']}).",
    "",
    result.get("setup", ""),
    "",
    "Largest rel. diff: max over the compared entries of max|ours − reference| / "
    "max|reference|; tolerance: parity.common.float32_tolerance; method term's effect: the same "
    "measure between our result and our plain-CE result (how much the method's own term moves "
    "what is compared).",
    "",
    "| compared | reference call path | largest rel. diff | (entry) | tolerance | verdict "
    "| method term's effect | note |",
    "|---|---|---|---|---|---|---|---|",
  ]
  for row in result["rows"]:
    effect = row.get("method_term_effect")
    lines.append(
      f"| {row['compared']} | {row['call_path']} | {row['max_rel']:.2e} | {row['worst_entry']} | "
      f"{row['tolerance']:.1e} | {row['verdict']} | "
      f"{'' if effect is None else f'{effect:.2f}'} | {row.get('note', '')} |"
    )
  if result.get("findings"):
    lines += ["", "| finding | classification | action |", "|---|---|---|"]
    for f in result["findings"]:
      lines.append(f"| {f['what']} | {f['classification']} | {f['action']} |")
  return "\n".join(line for line in lines) + "\n"


def rows_main(
  module: str,
  description: str,
  rows: dict,
  argv=None,
  *,
  add_args=None,
  extra_refs: tuple[str, ...] = (),
  finish=None,
  check=None,
) -> None:
  """The command line of a rows benchmark (parity/methods.py, parity/continual.py, parity/mkd.py,
  parity/fedgen.py).

  Parses ``--refs_dir``, ``--methods`` (of ``rows``), ``--seed``, ``--classes``, ``--out`` and what
  ``add_args(parser)`` adds; ``check(parser, args, methods)`` may refuse a flag combination
  (``parser.error``); checks torch and every checkout (``extra_refs`` too) before anything runs;
  then per method runs ``rows[m](checkout, args)``, lets ``finish(m, result, checkouts)`` amend
  the result, and writes ``<method>.json`` and its table ``<method>.md`` under ``--out``.
  ``module`` is the script's module (``benchmarks.parity.methods``): each result records the
  command as ``python -m <module> <flags>``.
  """
  import argparse
  import sys

  ap = argparse.ArgumentParser(description=description, allow_abbrev=False)
  ap.add_argument("--refs_dir", required=True, help="folder holding the reference checkouts")
  ap.add_argument("--methods", default=",".join(rows))
  ap.add_argument("--seed", type=int, default=0)
  ap.add_argument("--classes", type=int, default=5)
  if add_args is not None:
    add_args(ap)
  ap.add_argument("--out", default=str(RESULTS))
  args = ap.parse_args(argv)
  from benchmarks import flag_checks

  methods = flag_checks.names(ap, "--methods", args.methods, tuple(rows))
  if check is not None:
    check(ap, args, methods)
  torch = flag_checks.require_torch(ap, "parity")
  torch.set_num_threads(1)
  # All checked first.
  repos = {m: reference_checkout(m, args.refs_dir) for m in (*extra_refs, *methods)}
  command = f"python -m {module} " + " ".join(argv if argv is not None else sys.argv[1:])
  for m in methods:
    torch.manual_seed(args.seed)
    result = rows[m](repos[m], args)
    ref = REFERENCES[m]
    result = {
      "method": m,
      "reference": {"repo": ref.repo, "commit": ref.commit},
      "command": command,
      "commit": our_commit(),
      "torch": torch.__version__,
      **result,
    }
    if finish is not None:
      result = finish(m, result, repos)
    out = Path(args.out) / f"{m}.json"
    write_results(out, result, default=float, markdown=markdown(result))
    print(markdown(result))


class SuiteEntry(NamedTuple):
  """A parity benchmark of the suite and the result file docs/parity.md reads."""

  method: str
  script: str
  result: str


SUITE = (
  SuiteEntry("fedproj", "benchmarks/parity/fedproj.py", "parity_code.json"),
  SuiteEntry("fot", "benchmarks/parity/fot_basis.py", "fot_basis.json"),
  SuiteEntry("gpm", "benchmarks/parity/gpm_basis.py", "gpm_basis.json"),
  *(
    SuiteEntry(m, "benchmarks/parity/methods.py", f"{m}.json")
    for m in REFERENCES
    if m not in ("fedproj", "fot", *CONTINUAL, *MKD, *GENERATIVE)
  ),
  *(SuiteEntry(m, "benchmarks/parity/continual.py", f"{m}.json") for m in CONTINUAL),
  *(SuiteEntry(m, "benchmarks/parity/mkd.py", f"{m}.json") for m in MKD),
  *(SuiteEntry(m, "benchmarks/parity/fedgen.py", f"{m}.json") for m in GENERATIVE),
)
