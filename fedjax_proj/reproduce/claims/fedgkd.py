"""FedGKD's claims (paper 002): CIFAR-10 at alpha = 0.1 and AG News."""

from __future__ import annotations

from fedjax_proj.reproduce.claims.common import Budget, Claim, Ordering, Replication
from fedjax_proj.reproduce.claims.fedproj import FEDPROJ_SD, FEDPROJ_SD_SOURCE
from fedjax_proj.reproduce.claims.presets import CIFAR_CPU, IMAGE_METHOD_KW, NLP_SMOKE

# --- FedGKD (paper 002: CIFAR-10, alpha = 0.1) --------------------------------------------------

FEDGKD_METHODS = ("fedavg", "fedgkd", "fedgkd_vote")
# The cpu budget on FedGKD's preset: the FedProj cpu budget's CNN and schedule at the paper's
# Dir(0.1), on the paper's 90% training split (VOTE's server validation uses the other 10%).
FEDGKD_CPU = {
  **{k: v for k, v in CIFAR_CPU.items() if k not in ("public_data", "public_size", "memory_size")},
  "partition": "dirichlet:0.1",
  "train_subset": 45_000,
  "model_kwargs": {},
  "eval_every": 1,  # the best accuracy over the rounds (002 Table 3) needs every round
}
# Both FedGKD CIFAR-10 claims' wiring check: the cpu budget on 10 clients, 2 per round, 2 rounds.
FEDGKD_SMOKE = {
  **FEDGKD_CPU,
  "num_clients": 10,
  "clients_per_round": 2,
  "rounds": 2,
  "train_subset": 2000,
  "test_subset": 500,
}


def _paper_budget(why_borrowed: str) -> Budget:
  """A FedGKD CIFAR-10 claim's ``paper`` budget: the fedgkd_paper preset (002 Sec. 5) on the shared
  data, evaluated every round (Table 3 is the best accuracy over the rounds), its 10 v1 seeds from
  the FedProj cpu results' sd, borrowed (``why_borrowed``)."""
  return Budget(
    {"data_dir": "{data}/cifar10", "eval_every": 1},
    seeds=10,
    power_sd={m: FEDPROJ_SD["test_accuracy"] for m in ("best_test_accuracy", "test_accuracy")},
    power_source=f"{FEDPROJ_SD_SOURCE}, borrowed ({why_borrowed})",
  )


FEDGKD = Claim(
  name="fedgkd-cifar10",
  reference="002 Table 3 (tbl:table_compare, best accuracy over rounds) and Table 6 "
  "(tbl:acc_straggler, round 100), CIFAR-10 alpha=0.1, 20 clients C=0.2",
  preset="fedgkd_paper",
  entry="experiments/cifar10.py",
  kind="image",
  methods=FEDGKD_METHODS,
  headline="fedgkd",
  metrics=("best_test_accuracy", "test_accuracy"),
  # Table 3 is the best accuracy over the rounds (its α = 0.5 row equals Table 5's "Best" column);
  # Table 6 gives the final (round 100) accuracy at α = 0.1.
  paper={
    "fedavg": {"best_test_accuracy": 69.22, "test_accuracy": 40.09},
    "fedgkd": {"best_test_accuracy": 72.27, "test_accuracy": 64.84},
    "fedgkd_vote": {"best_test_accuracy": 72.99, "test_accuracy": 64.87},
  },
  orderings=(
    Ordering("fedgkd", "fedavg", "best_test_accuracy"),
    Ordering("fedgkd_vote", "fedavg", "best_test_accuracy"),
    Ordering("fedgkd", "fedavg", "test_accuracy"),
    Ordering("fedgkd_vote", "fedavg", "test_accuracy"),
  ),
  budgets={
    # The fedgkd_paper preset (002 Sec. 5): ResNet-8 with GroupNorm (16 channels per group), 45k
    # training images, 20 clients C = 0.2, 100 rounds x 20 local epochs, SGD 0.05; buffer M = 5
    # (002 Table 7: M = 5 gives Table 3's 72.27 at α = 0.1), VOTE's server-side validation.
    # Evaluated every round: Table 3 is the best accuracy over the rounds.
    "paper": _paper_budget("no FedGKD run exists"),
    "cpu": Budget(
      FEDGKD_CPU,
      IMAGE_METHOD_KW,
      "the fedproj-cifar10 cpu budget (CNN, 8 rounds x 1 local epoch, Adam) at the paper's "
      "stronger skew Dir(0.1) on the paper's 45k training split",
      seeds=10,
      power_sd={m: FEDPROJ_SD["test_accuracy"] for m in ("best_test_accuracy", "test_accuracy")},
      power_source=FEDPROJ_SD_SOURCE + ", borrowed (no FedGKD run exists)",
      # Protocol v2: one metric for both of the paper's tables (Table 6's final accuracy, Table 3's
      # best over rounds), with Table 3's smaller gaps as the effects.
      v2=Replication(
        7,
        1.83,
        "fedgkd-cifar10 cpu v1 results, seeds 0-9 (commits 942681b, 0f1cb09)",
        effect_metric="best_test_accuracy",
      ),
    ),
    "smoke": Budget(FEDGKD_SMOKE, IMAGE_METHOD_KW, "wiring only"),
  },
)


FEDGKD_AGNEWS = Claim(
  name="fedgkd-agnews",
  reference="002 NLP table (DistilBERT, 4 participants a round, 10 rounds), AG News alpha=0.1",
  preset="fedgkd_paper",
  entry="experiments/nlp.py",
  kind="nlp",
  methods=("fedavg", "fedgkd"),
  headline="fedgkd",
  metrics=("test_accuracy",),
  paper={"fedavg": {"test_accuracy": 89.19}, "fedgkd": {"test_accuracy": 89.60}},
  orderings=(Ordering("fedgkd", "fedavg", "test_accuracy"),),
  budgets={
    # The fedgkd_paper preset's fields (002 Sec. 5), pinned.
    "paper": Budget(
      dict(
        checkpoint="distilbert-base-uncased",
        bert_size="distilbert",
        num_clients=20,
        clients_per_round=4,
        rounds=10,
        local_epochs=1,
        optimizer="adam",
        lr=1e-5,
        weight_decay=0.0,
        batch_size=64,
        partition="dirichlet:0.1",
        train_subset=60_000,
        public_data="",
        public_size=0,
      ),  # fmt: skip
      {"fedgkd": {"method_kwargs": {"buffer_size": 5, "gamma": 0.2, "temperature": 1.0}}},
    ),
    "smoke": Budget(
      {**NLP_SMOKE, "partition": "dirichlet:0.1", "public_data": "", "public_size": 0},
      note="wiring only",
    ),
  },
  entry_kwargs={"task": "ag_news"},
)


# --- 002 Tables 3 and 6: the other baselines (CIFAR-10, alpha = 0.1) ------------------------------

# The systems 002 compares FedGKD with beyond FedAvg (Tables 3 and 6), as a claim of their own: the
# fedgkd-cifar10 replications are finished and never extended, so these orderings are a new
# replication, declared here before any of its runs, every method at one commit (docs/
# reproduction.md, "fedgkd-cifar10-table3").
TABLE3_METHODS = ("fedavg", "fedprox", "moon", "feddistill_plus", "fedgen", "fedgkd", "fedgkd_plus")
# Every hyperparameter the new methods depend on, pinned at their 002 settings or, where 002 gives
# none, the library's defaults when the claim was declared (FedGKD+ is FedGKD's γ, M and T on
# MOON's head; FedDistill+'s β = 0.1 is 002 "Parameter Setting"; FedGen's generator is a 2-layer
# MLP of hidden width 512, its local coefficients "tuned from {0.1, 1, 10}" without the value kept).
TABLE3_METHOD_KW = {
  **IMAGE_METHOD_KW,
  "fedgkd_plus": {"method_kwargs": dict(buffer_size=5, gamma=0.2, temperature=1.0)},
  "feddistill_plus": {"method_kwargs": dict(beta=0.1, temperature=1.0)},
  "fedgen": {
    "method_kwargs": dict(
      alpha=1.0,
      beta=1.0,
      hidden_dim=512,
      noise_dim=64,
      gen_batch_size=32,
      generator_batch_size=32,
      generator_steps=50,
      generator_lr=3e-4,
    )
  },
}
# 002 Table 3 (best accuracy over 100 rounds) and Table 6 (round 100), CIFAR-10 alpha = 0.1.
TABLE3_PAPER = {
  "fedavg": {"best_test_accuracy": 69.22, "test_accuracy": 40.09},
  "fedprox": {"best_test_accuracy": 68.79, "test_accuracy": 63.45},
  "moon": {"best_test_accuracy": 71.12, "test_accuracy": 44.57},
  "feddistill_plus": {"best_test_accuracy": 67.23, "test_accuracy": 43.76},
  "fedgen": {"best_test_accuracy": 69.24, "test_accuracy": 45.25},
  "fedgkd": {"best_test_accuracy": 72.27, "test_accuracy": 64.84},
  "fedgkd_plus": {"best_test_accuracy": 73.06, "test_accuracy": 62.51},
}
# The paired sd of the power calculation: no run of the new methods exists, so it borrows the
# largest paired sd measured at this budget (fedgkd-cifar10 cpu v1, under protocol.V2_METRIC), as
# the gpu budget of the FedProj claims borrowed its drift results'. A new method whose own spread
# is larger shows it in the report's measured sd (`--power`), which never changes the declaration.
TABLE3_SD_SOURCE = (
  "fedgkd-cifar10 cpu v1 results, seeds 0-9 (commits 942681b, 0f1cb09), borrowed: no run of "
  "FedProx, MOON, FedDistill+, FedGen or FedGKD+ at this budget existed when it was declared"
)
FEDGKD_TABLE3 = Claim(
  name="fedgkd-cifar10-table3",
  reference="002 Table 3 (tbl:table_compare, best accuracy over rounds) and Table 6 "
  "(tbl:acc_straggler, round 100), CIFAR-10 alpha=0.1: FedProx, MOON, FedDistill+, FedGen, FedGKD+",
  preset="fedgkd_paper",
  entry="experiments/cifar10.py",
  kind="image",
  methods=TABLE3_METHODS,
  headline="fedgkd",
  metrics=("best_test_accuracy", "test_accuracy"),
  paper=TABLE3_PAPER,
  # 002 Sec. 5.2: FedGKD "outperforms previous state-of-the-art methods"; FedGKD+ "still
  # outperforms MOON by 1.9%" at alpha = 0.1 and beats FedAvg.
  orderings=tuple(
    Ordering(better, worse, metric)
    for metric in ("best_test_accuracy", "test_accuracy")
    for better, worse in (
      ("fedgkd", "fedprox"),
      ("fedgkd", "moon"),
      ("fedgkd", "feddistill_plus"),
      ("fedgkd", "fedgen"),
      ("fedgkd_plus", "moon"),
      ("fedgkd_plus", "fedavg"),
    )
  ),
  budgets={
    # The fedgkd_paper preset (002 Sec. 5), its method defaults for the new columns cited there
    # (docs/reproduction.md, "FedGKD (paper 002)"); as fedgkd-cifar10's paper budget.
    "paper": _paper_budget("no run of these methods exists"),
    # fedgkd-cifar10's cpu budget, declared for protocol v2 only (no v1 seeds): the seed count is
    # the power calculation's (`--protocol=v2 --power`): FedGKD > MOON's +1.15 needs more than the
    # cap at the borrowed sd, so it is capped and that ordering declared underpowered.
    "cpu": Budget(
      FEDGKD_CPU,
      TABLE3_METHOD_KW,
      "fedgkd-cifar10's cpu budget (CNN, 8 rounds x 1 local epoch, Adam, Dir(0.1), 45k training "
      "images) for 002's other baselines",
      seeds=0,
      v2=Replication(20, 1.83, TABLE3_SD_SOURCE, effect_metric="best_test_accuracy"),
    ),
    "smoke": Budget(FEDGKD_SMOKE, TABLE3_METHOD_KW, "wiring only"),
  },
)

# This paper's claims; the registry (claims.CLAIMS) concatenates every paper module's.
CLAIMS = (FEDGKD, FEDGKD_TABLE3, FEDGKD_AGNEWS)
