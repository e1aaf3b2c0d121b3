"""FOT's claims (paper 003, Table 1): permuted MNIST, non-IID and IID."""

from __future__ import annotations

from collections.abc import Mapping

from fedjax_proj.reproduce.claims.common import Ablation, Budget, Claim, Replication, beats

# --- FOT on permuted MNIST (paper 003, Table 1) -----------------------------------------------

FOT_METHODS = ("fl", "ewc", "er", "gpm", "fot")
FOT_METHOD_KW = {
  # 003 F.2/F.4: per-client Fishers, λ = 40 on PMNIST, the Fisher as F.2 describes it (not
  # rescaled; the max-normalised Fisher is the ``ewc-maxnorm`` ablation).
  "ewc": {"method_kwargs": {"lam": 40.0, "fisher": "client", "normalize": False}},
  # F.4: 125 stored examples among 125 clients, i.e. one per client per task.
  "er": {"method_kwargs": {"buffer_per_task": 1}},
  # F.4 gives no GPM threshold. 0.95 on every layer, pre-registered; GPM's own PMNIST code uses
  # 0.95 only for the first layer and 0.99 for the others (docs/fot.md, "GPM+FL").
  "gpm": {"method_kwargs": {"threshold": 0.95}},
}
# Measured on FOT at ε 0.90 (the ablation below) and EWC with its max-normalised Fisher against the
# others, the only FOT runs there were when the protocol was set.
FOT_SD = {"acc": 0.94, "fgt": 0.7}
FOT_SD_SOURCE = "fot-pmnist-noniid cpu results (1-5 seeds per method, commits up to c96894d)"
# 003 Table 9: FOT's ε, 0.96 non-IID and 0.94 IID (the headline uses the paper's).
FOT_EPS = {False: 0.96, True: 0.94}
FOT_ABLATIONS = {
  # Every FOT result before the threshold rule became a setting ran the authors' rule, which
  # fills the layers' input spaces (docs/fot.md, "The threshold rule"); the claim's FOT follows
  # the paper's text (the energy rule), and those results are this ablation's.
  "fot-authors-rule": Ablation(
    "fot",
    {"threshold_rule": "authors"},
    "the authors' code's threshold rule instead of the paper's text (docs/fot.md)",
  ),
  # Chosen after ε 0.96 lost to FL at the cpu budget, under the authors' rule: an ablation, never
  # the headline.
  "fot-eps0.90": Ablation(
    "fot",
    {"eps": 0.90, "threshold_rule": "authors"},
    "ε 0.90 instead of the paper's (chosen after seeing results), with the authors' rule",
  ),
  "ewc-maxnorm": Ablation(
    "ewc", {"normalize": True}, "EWC's Fisher scaled to max 1 (not in 003 F.2)"
  ),
}
PMNIST_CPU = dict(
  data_dir="{data}/mnist",
  num_clients=125,
  clients_per_round=16,
  rounds_per_task=20,
  local_epochs=3,
  batch_size=64,
  lr=0.05,
  momentum=0.0,
  num_tasks=10,
  train_per_task=30000,
  test_per_task=2000,
  weight_decay=1e-5,
  fl_later_rounds=0,
  ewc_normalize=False,
  # The paper's network (003 F.3), as experiments/pmnist.py's presets build it.
  hidden="400,400,400",
  dropout="0.2,0.5,0.5",
  heads="single",
  eval_every=0,
)


# Protocol v2 (docs/reproduction.md, "Protocol v2"): FOT under the paper's threshold rule on fresh
# seeds, all five methods at one commit, scored on ACC and FGT as v1. The sd is the largest paired
# sd of the claim's orderings on the six v1 seeds of the energy rule (the claim's FOT since the
# parity findings; fot-pmnist-noniid cpu, FOT at b76b9ab, the others at their v1 commits), per
# metric (benchmarks/pilots/protocol_v2.py); no IID run of the energy rule exists: IID borrows it.
FOT_V2_SD = {"acc": 1.08, "fgt": 0.89}
FOT_V2_SOURCE = "fot-pmnist-noniid cpu v1 results, seeds 0-5 (FOT's energy rule at b76b9ab)"
FOT_V2 = {
  False: Replication(7, FOT_V2_SD, FOT_V2_SOURCE, metrics=("acc", "fgt")),
  # Declared for a GPU on 2026-11-28, before any of its runs (docs/reproduction.md, "Protocol v2").
  True: Replication(
    9, FOT_V2_SD, FOT_V2_SOURCE + ", borrowed for IID", metrics=("acc", "fgt"), device="gpu"
  ),
}


def _fot(iid: bool, paper: Mapping[str, tuple[float, float]], seeds: int) -> Claim:
  split = "iid" if iid else "noniid"
  method_kw = {
    **FOT_METHOD_KW,
    "fot": {
      "method_kwargs": {
        "eps": FOT_EPS[iid],
        "eps_inc": 0.0,
        "sketch_multiplier": 1.0,
        "threshold_rule": "energy",  # the paper's text (docs/fot.md, "The threshold rule")
      }
    },
  }
  smoke = {
    **PMNIST_CPU,
    "iid": iid,
    "num_clients": 10,
    "clients_per_round": 5,
    "rounds_per_task": 2,
    "local_epochs": 1,
    "num_tasks": 3,
    "train_per_task": 1000,
    "test_per_task": 300,
    "hidden": "64,64",
    "dropout": "0.2,0.5",
  }
  return Claim(
    name=f"fot-pmnist-{split}",
    reference=f"003 Table 1, PMNIST {'IID' if iid else 'non-IID'} (ACC and FGT, %)",
    preset="paper",
    entry="experiments/pmnist.py",
    kind="continual",
    methods=FOT_METHODS,
    headline="fot",
    metrics=("acc", "fgt"),
    paper={m: {"acc": a, "fgt": f} for m, (a, f) in paper.items()},
    orderings=beats("fot", FOT_METHODS[:-1], ("acc", "fgt")),
    budgets={
      "paper": Budget(
        {"iid": iid, "data_dir": "{data}/mnist"},
        power_sd=FOT_SD,
        seeds=seeds,
        power_source=FOT_SD_SOURCE + ", borrowed (no paper-budget run exists)",
      ),
      "cpu": Budget(
        {**PMNIST_CPU, "iid": iid},
        method_kw,
        "experiments/pmnist.py's measured cpu budget (docs/fot.md), pinned: 10 tasks, 20 rounds "
        "per task of 3 local epochs, so the shared network drifts to each new permutation",
        seeds=seeds,
        power_sd=FOT_SD,
        power_source=FOT_SD_SOURCE + ("" if not iid else ", borrowed for IID"),
        v2=FOT_V2[iid],
      ),
      "smoke": Budget(smoke, method_kw, "wiring only"),
    },
    ablations=FOT_ABLATIONS,
  )


FOT_NONIID = _fot(
  False,
  {
    "fl": (80.06, 9.21),
    "ewc": (81.14, 10.78),
    "er": (82.77, 9.32),
    "gpm": (72.17, 22.6),
    "fot": (85.21, 1.97),
  },
  seeds=6,
)
FOT_IID = _fot(
  True,
  {
    "fl": (85.68, 8.29),
    "ewc": (86.74, 8.84),
    "er": (88.61, 6.62),
    "gpm": (88.27, 6.88),
    "fot": (90.35, 1.75),
  },
  seeds=8,
)


# --- 003 Table 1's other rows: RGO+FL, GLFC and FedCIL -----------------------------------------


def _table1_rows(
  iid: bool,
  name: str,
  rows: str,
  paper: Mapping[str, tuple[float, float]],
  method_kw: Mapping[str, dict],
  *,
  seeds: int,
  none_before: str,
  paper_seeds: int,
  device: str | None = None,
) -> Claim:
  """A claim of its own for 003 Table 1 rows added after a fot-pmnist replication began (whose
  runs are never extended): FOT's claim on the same budgets with ``paper``'s methods (FOT last),
  their hyperparameters pinned, and a cpu budget for protocol v2 only: ``seeds`` declared before
  any of its runs (docs/reproduction.md, "Protocol v2") at fot-pmnist-noniid's v2 sd, borrowed
  because no run of ``none_before`` existed, on ``device`` (None: any)."""
  base = _fot(iid, paper, seeds=paper_seeds)
  borrowed = (
    f", borrowed{' for IID' if iid else ''}: no {none_before} run existed when it was declared"
  )
  v2 = Replication(
    seeds, FOT_V2_SD, FOT_V2_SOURCE + borrowed, metrics=("acc", "fgt"), device=device
  )
  methods = tuple(paper)
  split = "IID" if iid else "non-IID"
  cpu, smoke = base.budgets["cpu"], base.budgets["smoke"]
  return base._replace(
    name=name,
    reference=f"003 Table 1, PMNIST {split} (ACC and FGT, %): {rows}",
    methods=methods,
    orderings=beats("fot", methods[:-1], ("acc", "fgt")),
    ablations={},
    budgets={
      "paper": base.budgets["paper"],
      # FOT as fot-pmnist's claim runs it; no v1 seeds, so the sd is v2's, borrowed.
      "cpu": cpu._replace(
        per_method={**cpu.per_method, **method_kw},
        note=f"fot-pmnist-{split.lower().replace('-', '')}'s cpu budget for 003 Table 1's {rows}",
        seeds=0,
        power_sd=None,
        power_source="not measured",
        v2=v2,
      ),
      "smoke": smoke._replace(per_method={**smoke.per_method, **method_kw}),
    },
  )


# The continual baselines 003 Table 1 adds beyond fot-pmnist-noniid's (whose replications are
# finished and never extended): a claim of their own on the same cpu budget, declared before any
# of its runs (docs/reproduction.md, "fot-pmnist-noniid-table1"). FedCIL, implemented after that
# replication's runs began, has a claim of its own below.
TABLE1_METHOD_KW = {
  # 003 F.2/F.4: each client's own projector, 40% of the clients storing per task; α and the trace
  # normalisation are the library's choices (docs/fot.md, "RGO+FL").
  "rgo": {"method_kwargs": {"store_fraction": 0.4, "alpha": 1.0, "trace_norm": True}},
  # F.4: ER's buffer (one example per client per task) under GLFC's gradient compensation.
  "glfc": {"method_kwargs": {"buffer_per_task": 1}},
}
FOT_NONIID_TABLE1 = _table1_rows(
  False,
  "fot-pmnist-noniid-table1",
  "RGO+FL and GLFC",
  {"rgo": (79.31, 15.72), "glfc": (84.06, 12.13), "fot": (85.21, 1.97)},
  TABLE1_METHOD_KW,
  seeds=14,
  none_before="RGO or GLFC",
  paper_seeds=10,  # the paper budget's v1 count from the power calculation (`--power`)
)

# FedCIL (Qi et al., ICLR 2023) as its authors' code runs it, adapted to task-incremental learning
# (docs/fot.md, "FedCIL+FL"): added after fot-pmnist-noniid-table1's runs began at one commit, so a
# claim of its own on the same cpu budget, declared before any of its runs (docs/reproduction.md,
# "fot-pmnist-noniid-fedcil"), FOT run again beside it. Every FedCIL hyperparameter pinned at the
# library's defaults, which are its code's (docs/fot.md, "FedCIL+FL").
FEDCIL_METHOD_KW = {
  "fedcil": {
    "method_kwargs": {
      "md_iter": 100,
      "gen_batch_size": 32,
      "new_task_weight": 0.5,
      "consistency": 0.0,
      "gen_lr": 1e-4,
    }
  },
}
# `--power` at the borrowed sd: FOT > FedCIL on ACC (+1.98) needs 6 seeds, on FGT (+6.68) 3.
SEEDS_FEDCIL = 6
FOT_NONIID_FEDCIL = _table1_rows(
  False,
  "fot-pmnist-noniid-fedcil",
  "FedCIL",
  {"fedcil": (83.23, 8.65), "fot": (85.21, 1.97)},
  FEDCIL_METHOD_KW,
  # Revised on 2026-12-06 before any run finished: for a GPU, the generator's cost
  # (docs/reproduction.md, "fot-pmnist-noniid-fedcil").
  seeds=SEEDS_FEDCIL,
  none_before="FedCIL",
  paper_seeds=5,
  device="gpu",
)

# The IID column of the same rows, declared for a GPU as fot-pmnist-iid's replication is (on
# 2026-12-06, before any of its runs; docs/reproduction.md, "fot-pmnist-iid-table1"): 20 seeds,
# the v2 cap, where `--power` at the borrowed sd asks for more than 20 for FOT > RGO on ACC
# (+0.54, underpowered, stated in the plan) and at most 6 for the others.
SEEDS_IID_TABLE1 = 20
FOT_IID_TABLE1 = _table1_rows(
  True,
  "fot-pmnist-iid-table1",
  "RGO+FL, GLFC and FedCIL",
  {
    "rgo": (89.81, 4.84),
    "glfc": (83.76, 14.70),
    "fedcil": (87.43, 10.01),
    "fot": (90.35, 1.75),
  },
  {**TABLE1_METHOD_KW, **FEDCIL_METHOD_KW},
  seeds=SEEDS_IID_TABLE1,
  none_before="RGO, GLFC or FedCIL",
  paper_seeds=10,
  device="gpu",
)

# This paper's claims; the registry (claims.CLAIMS) concatenates every paper module's.
CLAIMS = (FOT_NONIID, FOT_IID, FOT_NONIID_TABLE1, FOT_NONIID_FEDCIL, FOT_IID_TABLE1)
