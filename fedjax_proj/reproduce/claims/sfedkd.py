"""SFedKD's claims (paper 004, Table 1): CIFAR-10 and Fashion-MNIST (MNIST offline) under
ExDir(2, 0.5).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fedjax_proj.reproduce.claims.common import Ablation, Budget, Claim, Replication, beats

# --- SFedKD (paper 004, Table 1: CIFAR-10 ExDir(2, 0.5)) --------------------------------------

SEQ_METHOD_KW = {
  "sfedkd": {
    "method_kwargs": dict(num_teachers=5, gamma=1.0, beta=3.0, temperature=4.0, metric="kl")
  },
  "cwc": {"method_kwargs": dict(lam=1.0, decay=0.5)},
}
# The paper's sequence shape (10 clients per round, each holding 2 classes under ExDir(2, 0.5),
# SGD 0.01, weight decay 1e-4, batch 64) on a 5,000-image training subset over 20 clients, so each
# client holds 250 images and runs 2 local epochs (8 steps each) per visit; 20 rounds. The CNN
# trains at ~300 images/s on one loaded core, so a FedSeq run is ~6 min and an SFedKD run (5
# teachers' forward passes per step) ~15 min.
SEQ_CPU = dict(
  dataset="cifar10",
  data_dir="{data}/cifar10",
  model="cnn",
  num_clients=20,
  clients_per_round=10,
  rounds=20,
  local_epochs=2,
  batch_size=64,
  partition="exdir:2:0.5",
  optimizer="sgd",
  lr=0.01,
  momentum=0.0,
  weight_decay=1e-4,
  train_subset=5000,
  test_subset=2000,
  eval_every=2,
  public_data="",
)
SFEDKD_METHODS = ("fedavg", "fedseq", "cwc", "sfedkd")


def _seq_smoke(base: Mapping[str, Any]) -> Budget:
  """The sequential claims' wiring check: ``base`` on 10 clients, 5 per round, for 2 rounds."""
  return Budget(
    {
      **base,
      "num_clients": 10,
      "clients_per_round": 5,
      "rounds": 2,
      "train_subset": 2000,
      "test_subset": 500,
    },
    {**SEQ_METHOD_KW, "sfedkd": {"method_kwargs": dict(num_teachers=2, temperature=4.0)}},
    "wiring only",
  )


SEQ_SD = {"test_accuracy": 2.34}
SEQ_SD_SOURCE = "sfedkd-cifar10-exdir cpu results (3 seeds per method, commits up to c96894d)"


def _sfedkd(
  name: str, reference: str, paper: Mapping[str, float], dataset: str, budgets: Mapping
) -> Claim:
  """An SFedKD claim on one column of 004 Table 1: its four methods' test accuracies (``paper``),
  SFedKD above each of the others, ``experiments/sequential.py --dataset=<dataset>``."""
  return Claim(
    name=name,
    reference=reference,
    preset="paper",
    entry="experiments/sequential.py",
    kind="image",
    methods=SFEDKD_METHODS,
    headline="sfedkd",
    metrics=("test_accuracy",),
    paper={m: {"test_accuracy": v} for m, v in paper.items()},
    orderings=beats("sfedkd", ("fedavg", "fedseq", "cwc")),
    budgets=budgets,
    entry_kwargs={"dataset": dataset},
    # The paper's family ordering: sequential FL above parallel FedAvg under ExDir (004 Table 1).
    readings=(("fedseq", "fedavg"), ("cwc", "fedavg")),
  )


SFEDKD = _sfedkd(
  "sfedkd-cifar10-exdir",
  "004 Table 1, CIFAR-10 ExDir(2, 0.5)",
  {"fedavg": 32.48, "fedseq": 54.66, "cwc": 55.16, "sfedkd": 61.56},
  "cifar10",
  {
    "paper": Budget(
      {"data_dir": "{data}/cifar10"},
      seeds=5,
      power_sd=SEQ_SD,
      power_source=SEQ_SD_SOURCE + ", borrowed (no paper-budget run exists)",
    ),
    "cpu": Budget(
      SEQ_CPU,
      SEQ_METHOD_KW,
      "the paper's chain (10 clients per round, 2 classes each, SGD 0.01, 5 teachers) on 5,000 "
      "CIFAR-10 images over 20 clients, 2 local epochs, 20 rounds",
      seeds=5,
      power_sd=SEQ_SD,
      power_source=SEQ_SD_SOURCE,
    ),
    "smoke": _seq_smoke(SEQ_CPU),
  },
)

# --- SFedKD on Fashion-MNIST (paper 004, Table 1: ExDir(2, 0.5)) and its MNIST analogue -------

# 004 Table 1, Fashion-MNIST ExDir(2, 0.5) column (mean of 5 trials; LeNet-5).
FMNIST_TABLE1 = {"fedavg": 76.00, "fedseq": 81.81, "cwc": 81.85, "sfedkd": 83.66}
# The mnist budget (docs/reproduction.md, "SFedKD budget on MNIST"): the CIFAR-10 cpu budget ends
# at 23-25% for every method, where the forgetting SFedKD counters (004 Sect. 1, Figure 1) is not in
# play. benchmarks/pilots/sfedkd_pilot.py (FedAvg and FedSeq, seed 200) measured FedSeq's
# forgetting along the chain on MNIST with LeNet-5 (004's Fashion-MNIST network; MNIST is the
# offline stand-in).
# At this shape, late in training, each client moves the per-class test accuracies by 10.2 points
# on average and the within-round Forgetting Measure is 10.2, against 1.5 and 1.8 for an i.i.d.
# chain, with FedSeq at 87% and FedAvg at 56%: the cheapest candidate that met the rule committed
# before the pilot ran (5 local epochs x 10 rounds, with 3x the forgetting, also met it at 2.5x
# the local steps). The rest is the CIFAR-10 cpu budget's chain and the paper's client recipe: 10
# clients per round, 2 classes each, SGD 0.01, weight decay 1e-4, batch 64, 5 teachers.
SEQ_MNIST = {
  **SEQ_CPU,
  "dataset": "mnist",
  "data_dir": "{data}/mnist",
  "model": "lenet5",
  "local_epochs": 1,
  "train_subset": 10000,
  "test_subset": 0,
}
SFEDKD_FMNIST = _sfedkd(
  "sfedkd-fmnist-exdir",
  "004 Table 1, Fashion-MNIST ExDir(2, 0.5) (budget mnist: MNIST, its offline analogue)",
  FMNIST_TABLE1,
  "fashion_mnist",
  {
    # The paper preset for Fashion-MNIST: LeNet-5, 100 clients, 10 per round, 1000 rounds of 5
    # local epochs; the data is not offline (TFDS cannot download here): put train.npz and
    # test.npz under <data>/fashion_mnist.
    "paper": Budget(
      {"data_dir": "{data}/fashion_mnist"},
      seeds=10,
      power_sd=SEQ_SD,
      power_source=SEQ_SD_SOURCE + ", borrowed (no Fashion-MNIST run exists)",
    ),
    "mnist": Budget(
      SEQ_MNIST,
      SEQ_METHOD_KW,
      "MNIST (the offline analogue of the paper's Fashion-MNIST) with LeNet-5, 10,000 training "
      "images over 20 clients ExDir(2, 0.5), 10 per round, 1 local epoch, 20 rounds, SGD 0.01; "
      'FedSeq forgets along the chain here (docs/reproduction.md, "SFedKD budget on MNIST")',
      seeds=10,
      power_sd=SEQ_SD,
      power_source=SEQ_SD_SOURCE + ", borrowed (the pilot ran one seed, no paired sd)",
      # Protocol v2: the largest paired sd of the three orderings under the late mean on the v1
      # seeds 0-9 (benchmarks/pilots/protocol_v2.py); FedSeq's and CWC's 1.8-point gaps ask for more
      # than the cap, so the replication is declared underpowered for them.
      v2=Replication(20, 5.36, "sfedkd-fmnist-exdir mnist v1 results, seeds 0-9 (commit 796cd89)"),
    ),
    "smoke": _seq_smoke(SEQ_MNIST),
  },
)


# --- 004 Tables 1-3: the PFL baselines, and the KD variants as ablations -----------------------

# 004 Table 1 also compares SFedKD with FedProx, FedCurv and FedNTD (parallel FL), and Tables 2-3
# replace parts of SFedKD. sfedkd-fmnist-exdir's replication is finished and never extended, so
# these are a claim of their own on the same mnist budget, declared before any of its runs
# (docs/reproduction.md, "sfedkd-fmnist-exdir-baselines"). 004 gives no hyperparameters for the
# three baselines: the library's defaults when the claim was declared, pinned.
BASELINES_METHOD_KW = {
  **SEQ_METHOD_KW,
  "fedprox": {"method_kwargs": dict(mu=0.01)},
  "fedcurv": {"method_kwargs": dict(lam=1.0)},
  "fedntd": {"method_kwargs": dict(beta=1.0, temperature=1.0)},
  **{
    m: {
      "method_kwargs": dict(
        num_teachers=5, kd_weight=1.0, temperature=4.0, temperature_squared=True, metric="kl"
      )
    }
    for m in ("fedseq_aver", "fedseq_ebkd", "fedseq_camkd")
  },
}
# 004 Table 2 (CIFAR-10 ExDir(2, 0.5)): the multi-teacher KD methods on FedSeq in place of SFedKD's
# KD, and SFedKD with either teacher weight replaced by the average; Table 3: random teachers in
# place of the greedy complementary selection. Ablations: run beside the methods, never a verdict.
SFEDKD_ABLATIONS = {
  "fedseq+aver": Ablation("fedseq_aver", {}, "004 Table 2: AVER's averaged teachers on FedSeq"),
  "fedseq+ebkd": Ablation("fedseq_ebkd", {}, "004 Table 2: EBKD's entropy-weighted teachers"),
  "fedseq+camkd": Ablation("fedseq_camkd", {}, "004 Table 2: CA-MKD's confidence weights"),
  "sfedkd-uniform_g": Ablation("sfedkd", {"uniform_g": True}, "004 Table 2: g_k averaged"),
  "sfedkd-uniform_h": Ablation("sfedkd", {"uniform_h": True}, "004 Table 2: h_k averaged"),
  "sfedkd-uniform_gh": Ablation(
    "sfedkd", {"uniform_g": True, "uniform_h": True}, "004 Table 2: both weights averaged"
  ),
  "sfedkd-random": Ablation(
    "sfedkd", {"selection": "random"}, "004 Table 3: random teachers, not the greedy selection"
  ),
}
# 004 Table 1, Fashion-MNIST ExDir(2, 0.5) column (mean of 5 trials).
BASELINES_PAPER = {"fedprox": 76.13, "fedcurv": 75.73, "fedntd": 76.18, "sfedkd": 83.66}
SFEDKD_FMNIST_BASELINES = Claim(
  name="sfedkd-fmnist-exdir-baselines",
  reference="004 Table 1, Fashion-MNIST ExDir(2, 0.5): FedProx, FedCurv, FedNTD (budget mnist: "
  "MNIST, its offline analogue); Tables 2-3's variants as ablations",
  preset="paper",
  entry="experiments/sequential.py",
  kind="image",
  methods=("fedprox", "fedcurv", "fedntd", "sfedkd"),
  headline="sfedkd",
  metrics=("test_accuracy",),
  paper={m: {"test_accuracy": v} for m, v in BASELINES_PAPER.items()},
  orderings=beats("sfedkd", ("fedprox", "fedcurv", "fedntd")),
  budgets={
    "paper": Budget(
      {"data_dir": "{data}/fashion_mnist"},
      seeds=4,  # the power calculation's count at the borrowed sd (`--power`)
      power_sd=SEQ_SD,
      power_source=SEQ_SD_SOURCE + ", borrowed (no Fashion-MNIST run exists)",
    ),
    # sfedkd-fmnist-exdir's mnist budget, declared for protocol v2 only: its paired sd (the
    # largest of that claim's v2 orderings' v1 sd, 5.36) borrowed, no run of the baselines
    # existing; the seed count is the power calculation's (`--protocol=v2 --power`).
    "mnist": Budget(
      SEQ_MNIST,
      BASELINES_METHOD_KW,
      "sfedkd-fmnist-exdir's mnist budget for 004 Table 1's parallel-FL baselines",
      seeds=0,
      v2=Replication(
        9,
        5.36,
        "sfedkd-fmnist-exdir mnist v1 results, seeds 0-9 (commit 796cd89), borrowed: no run of "
        "FedProx, FedCurv or FedNTD at this budget existed when it was declared",
      ),
    ),
    "smoke": Budget(
      {**_seq_smoke(SEQ_MNIST).shared},
      {**BASELINES_METHOD_KW, **_seq_smoke(SEQ_MNIST).per_method},
      "wiring only",
    ),
  },
  entry_kwargs={"dataset": "fashion_mnist"},
  ablations=SFEDKD_ABLATIONS,
)

# This paper's claims; the registry (claims.CLAIMS) concatenates every paper module's.
CLAIMS = (SFEDKD, SFEDKD_FMNIST, SFEDKD_FMNIST_BASELINES)
