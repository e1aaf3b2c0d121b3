"""The records a claim is made of (:class:`Claim`, :class:`Budget`, :class:`Replication`,
:class:`Ordering`, :class:`Ablation`) and how a budget's overrides resolve for one method.

docs/reproduction.md, "Results".
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

# Every budget a claim may declare, with what it is for: the one list the --budget help, the
# module docstrings, README.md and docs/reproduction.md take their budgets from (the docs are
# checked against it by tests/reproduce/test_surface.py). In the order docs tables and reports
# show them.
BUDGET_TABLE = (
  ("paper", "the paper's setting"),
  ("cpu", "pinned, hours on a CPU"),
  ("drift", "the paper's forgetting mechanism in play on a CPU, where a claim has it"),
  ("gpu", "the drift budget three times as long, protocol v2 on a GPU, where a claim has it"),
  ("mnist", "SFedKD's on MNIST, the offline analogue of Fashion-MNIST"),
  ("smoke", "wiring"),
)
BUDGETS = tuple(name for name, _ in BUDGET_TABLE)
# How commands and docs write the choice of a budget: the names joined by "|".
BUDGET_CHOICES = "|".join(BUDGETS)
# The papers a claim's ``reference`` cites by the number of its file in the papers folder the
# project was given (docs/reproduction.md's opening), with the title each file carries; 004's
# text starts at its authors, so its name is the one its abstract gives the method.
PAPERS = {
  "000": 'FedProj (first version), "Avoid Forgetting by Preserving Global Knowledge Gradients in '
  'Federated Learning with Non-IID Data"',
  "001": 'FedProj (revised), "Towards Preventing Global Knowledge Forgetting in Federated Learning '
  'with Non-IID Data"',
  "002": 'FedGKD, "Local-Global Knowledge Distillation in Heterogeneous Federated Learning with '
  'Non-IID Data"',
  "003": 'FOT, "Federated Orthogonal Training: Mitigating Global Catastrophic Forgetting in '
  'Continual Federated Learning"',
  "004": "SFedKD, Sequential Federated learning with discrepancy-aware multi-teacher Knowledge "
  "Distillation",
}
# Metrics where lower is better (FOT's forgetting); every other metric is higher-is-better.
LOWER_IS_BETTER = frozenset({"fgt"})


class Budget(NamedTuple):
  """Config overrides of one budget.

  Attributes:
    shared: config fields set for every method (``method_kwargs`` here merges into each method's).
    per_method: method -> config fields; its ``method_kwargs`` are the method's hyperparameters,
      its ``model_options`` model options merged over the method's registry ``model_kwargs``.
    note: why this budget puts the paper's mechanism in play, and its measured cost.
    preset: the entry point's preset the budget starts from (None: the claim's ``preset``).
    seeds: the pre-registered seed count n; the verdict uses seeds 0..n-1 (more are exploratory).
      0: no protocol v1 seeds, a budget declared for its protocol v2 replication only (``v2``).
    power_sd: metric -> the paired sd (percentage points) the power calculation that chose
      ``seeds`` used (None: not measured; the seed count is then the minimum).
    power_source: where ``power_sd`` was measured.
    methods: the claim's methods this budget compares (None: all of them); the budget's verdicts
      are the orderings between these (:meth:`Claim.at`), so its Holm family is theirs.
    first_seed: the first pre-registered seed (0 in v1; a protocol v2 view starts at
      ``protocol.V2_FIRST_SEED``).
    v2: the budget's protocol v2 replication, declared before any of its runs (None: none).
  """

  shared: Mapping[str, Any]
  per_method: Mapping[str, Mapping[str, Any]] = {}
  note: str = ""
  preset: str | None = None
  seeds: int = 3
  power_sd: Mapping[str, float] | None = None
  power_source: str = "not measured"
  methods: tuple[str, ...] | None = None
  first_seed: int = 0
  v2: Replication | None = None

  @property
  def declared(self) -> range:
    """The pre-registered seeds: ``seeds`` of them from ``first_seed``."""
    return range(self.first_seed, self.first_seed + self.seeds)


class Replication(NamedTuple):
  """A budget's protocol v2 confirmatory replication (protocol.py; docs/reproduction.md,
  "Protocol v2"), declared before any of its runs.

  Attributes:
    seeds: the seed count from the power calculation (``protocol.plan`` of ``protocol.v2_view``);
      the seeds are ``protocol.V2_FIRST_SEED`` on.
    power_sd: the largest paired sd (points) of v1's results at this budget under
      ``protocol.V2_METRIC``, or metric -> that sd where ``metrics`` names several.
    power_source: the v1 results it was measured on.
    effect_metric: the paper's metric whose gaps are the power calculation's effects.
    metrics: the metrics the replication scores; None: ``protocol.V2_METRIC``, every ordering
      once on it. A continual claim's ACC and FGT are means over all tasks' accuracies at the end
      of training, not one evaluation of a curve that swings, so its replication scores its own
      orderings on them, as v1 (docs/reproduction.md, "Protocol v2").
    device: the JAX backend all its runs are declared to run on ("gpu": one kind of NVIDIA GPU,
      through ``benchmarks/device/claims_on_device.sh``), a run on any other refused before it runs;
      None: any (the report refuses to pair runs of different machine kinds).
  """

  seeds: int
  power_sd: float | Mapping[str, float]
  power_source: str
  effect_metric: str = "test_accuracy"
  metrics: tuple[str, ...] | None = None
  device: str | None = None

  def command(self, claim: str, budget: str) -> str:
    """The command that runs the replication's missing runs where they are declared to run."""
    if self.device == "gpu":  # one call of a device lease; docs/reproduction.md, "Protocol v2"
      return (
        f"EXTRA_ARGS=--protocol=v2 bash benchmarks/device/claims_on_device.sh 480 {claim}:{budget}"
      )
    return f"python -m fedjax_proj.reproduce {claim} --budget={budget} --protocol=v2"


class Ordering(NamedTuple):
  """A claimed ordering: ``better`` beats ``worse`` on ``metric`` (direction from the metric)."""

  better: str
  worse: str
  metric: str


class Ablation(NamedTuple):
  """A method run with some of its hyperparameters changed, to locate where an effect comes from.

  Attributes:
    base: the registry method it runs (its budget overrides apply first).
    method_kwargs: the hyperparameters changed, merged over the base method's.
    note: what the change switches off.
  """

  base: str
  method_kwargs: Mapping[str, Any]
  note: str


class Claim(NamedTuple):
  """One paper claim.

  Attributes:
    name: the CLI name.
    reference: paper, table/figure.
    preset: the entry point's preset the claim's ``paper`` budget starts from.
    entry: the entry point, relative to the repository root (``experiments/*.py``).
    kind: ``image`` (training.experiment.run_experiment, also the sequential methods),
      ``continual`` (experiments/pmnist.py), ``pilot`` (experiments/pilot_iris.py) or ``nlp``
      (experiments/nlp.py: the image runner on token ids).
    methods: the methods compared (registry names).
    headline: the paper's method; the report pairs it against every other method.
    metrics: the reported metrics; the first is the headline metric.
    paper: method -> metric -> the paper's number (percent); a method the paper does not report
      has no entry.
    orderings: the orderings the paper claims.
    budgets: budget name -> :class:`Budget`.
    entry_kwargs: extra arguments of the entry point's ``get_config`` (e.g. the dataset).
    ablations: name -> :class:`Ablation`; run like methods (``--methods=<name>``), reported
      beside them and paired against the headline, but never part of a claimed ordering.
    readings: extra (a, b) pairs whose curves the report compares (no verdict), for readings
      the docs state beyond the claimed orderings.
  """

  name: str
  reference: str
  preset: str
  entry: str
  kind: str
  methods: tuple[str, ...]
  headline: str
  metrics: tuple[str, ...]
  paper: Mapping[str, Mapping[str, float]]
  orderings: tuple[Ordering, ...]
  budgets: Mapping[str, Budget]
  entry_kwargs: Mapping[str, Any] = {}
  ablations: Mapping[str, Ablation] = {}
  readings: tuple[tuple[str, str], ...] = ()

  def preset_of(self, budget: str) -> str:
    """The preset ``budget`` starts from."""
    return self.budgets[budget].preset or self.preset

  def at(self, budget: str) -> Claim:
    """The claim as ``budget`` tests it: only the budget's methods (``Budget.methods``), the
    orderings between them and their paper numbers; ablations stay runnable."""
    keep = self.budgets[budget].methods
    if keep is None:
      return self
    return self._replace(
      methods=tuple(m for m in self.methods if m in keep),
      orderings=tuple(o for o in self.orderings if o.better in keep and o.worse in keep),
      paper={m: v for m, v in self.paper.items() if m in keep},
    )

  @property
  def paper_title(self) -> str:
    """The cited paper's number and title (:data:`PAPERS`), from ``reference``'s first word."""
    number = self.reference.split()[0]
    return f"{number} = {PAPERS[number]}"

  @property
  def runnable(self) -> tuple[str, ...]:
    """The methods, then the ablations: every name ``--methods`` accepts."""
    return (*self.methods, *self.ablations)


def beats(headline: str, others, metrics=("test_accuracy",)) -> tuple[Ordering, ...]:
  return tuple(Ordering(headline, o, m) for m in metrics for o in others)


def budget_overrides(claim: Claim, budget: str, method: str) -> dict[str, Any]:
  """The config overrides of ``method`` at ``budget``: shared fields, then the method's own
  (``method_kwargs`` merged key by key)."""
  if budget not in claim.budgets:
    raise ValueError(
      f"Claim {claim.name!r} has no budget {budget!r}; choose one of {', '.join(claim.budgets)}."
    )
  b = claim.budgets[budget]
  ablation = claim.ablations.get(method)
  own = dict(b.per_method.get(ablation.base if ablation else method, {}))
  kwargs = {**dict(b.shared.get("method_kwargs", {})), **dict(own.pop("method_kwargs", {}))}
  if ablation:
    kwargs.update(ablation.method_kwargs)
  out = {k: v for k, v in b.shared.items() if k != "method_kwargs"}
  out.update(own)
  if kwargs:
    out["method_kwargs"] = kwargs
  return out
