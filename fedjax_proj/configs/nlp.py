"""Text classification with pretrained encoders as clients: FedProj's Table 2 and FedGKD's AG News.

    python experiments/nlp.py --task=sst2 --method=fedproj --preset=paper
    python experiments/nlp.py --task=ag_news --method=fedgkd --preset=fedgkd_paper

``--task`` (given before or among the other flags) picks the private set and its public set:
mnli (public snli), sst2 (sentiment140), marc (yelp; MARC itself is a local file: --data_dir with
train.csv and test.csv), ag_news (no public set). Presets (every field and its source:
docs/nlp.md, "Presets"):

- ``paper``: FedProj's NLP setting (001 Sec. 6.1, Table 2): TinyBERT General 4L-312 from the hub,
  15 clients, 30% sampled, 15 rounds, 1 local epoch, Adam 3e-5, Dirichlet 0.3
  (``--partition=dirichlet:0.5`` for the other column), server distillation T = 3 for 1 epoch
  at batch 128; the public set unlabelled.
- ``fedgkd_paper``: FedGKD's AG News setting (002 Sec. 5): DistilBERT, 20 clients, 4 per round,
  10 rounds, 1 local epoch, Adam 1e-5, batch 64, Dirichlet 0.1, 60,000 training examples.
- ``cpu``: a random-init ``tiny`` encoder with its own WordPiece vocabulary on 4,000 examples;
  ``smoke``: the same on 800 examples, 2 rounds, IID, batch 8, Adam 1e-4 (which a pretrained
  ``--checkpoint`` learns at too).

``--checkpoint`` is a Hugging Face model folder or hub id (``--checkpoint=`` with a ``tiny``
model: random init); ``--max_len`` the tokens per example.
"""

from __future__ import annotations

import argparse

import ml_collections

from fedjax_proj.configs import common
from fedjax_proj.core import ranges
from fedjax_proj.core.engine import STRATEGIES
from fedjax_proj.training import fields
from fedjax_proj.training.config import base_config
from fedjax_proj.training.fields import Field

PRESETS = ("paper", "fedgkd_paper", "cpu", "smoke")
# task -> (private set, public set): 001 Sec. 6.1 pairs; AG News (002) has none.
TASKS = {
  "mnli": ("mnli", "snli"),
  "sst2": ("sst2", "sentiment140"),
  "marc": ("marc", "yelp"),
  "ag_news": ("ag_news", ""),
}
TINYBERT = "huawei-noah/TinyBERT_General_4L_312D"  # Jiao et al. 2020, the 4L-312 general model
DISTILBERT = "distilbert-base-uncased"  # Sanh et al. 2019
# Tokens per example: [CLS] and [SEP] take two, so fewer leaves no room for any text.
MAX_LEN = ranges.Interval(3, integer=True)
DISTILL = {"distill_epochs": 1, "distill_batch_size": 128, "distill_temperature": 3.0}

# The text entry point's own fields, besides base_config's (fedjax_proj/training/fields.py).
OWN_FIELDS = fields.table(
  Field(
    "task",
    "sst2",
    "private/public pair: "
    + ", ".join(f"{k} (public: {v[1] or 'none'})" for k, v in TASKS.items()),
    choices=tuple(TASKS),
  ),
  Field(
    "checkpoint",
    TINYBERT,
    "Hugging Face model folder or hub id ('' = random init of --model_kwargs size)",
  ),
  Field(
    "bert_size",
    "tinybert_4l_312",
    "encoder shape without a checkpoint: tinybert_4l_312, distilbert or tiny",
    choices=("tinybert_4l_312", "distilbert", "tiny"),
  ),
  # Not in the papers: 128 tokens holds nearly every SST-2/MNLI example (our choice). Checked
  # before any data is read: --max_len=0 failed deep in tokenisation.
  Field(
    "max_len",
    128,
    "tokens per example, [CLS] and [SEP] included (longer texts are truncated)",
    MAX_LEN,
    fix="[CLS] and [SEP] take two; e.g. 128.",
  ),
)
FIELDS = fields.table(fields.FIELDS, OWN_FIELDS)


def get_config(preset: str = "paper", task: str = "sst2"):
  if task not in TASKS:
    raise ValueError(f"Unknown task {task!r}; choose one of {tuple(TASKS)}.")
  c = fields.config(OWN_FIELDS, base_config())
  c.task = task
  c.dataset, c.public_data = TASKS[task]
  c.model = "bert"
  c.augment = False
  c.eval_batch_size = 256
  if preset == "paper":
    c.method = "fedproj"
    c.num_clients = 15
    c.clients_per_round = 4  # 30% of 15, rounded down as FL codes do (max(int(0.3 * 15), 1))
    c.rounds = 15
    c.local_epochs = 1
    c.optimizer, c.lr = "adam", 3e-5
    c.batch_size = 32  # the client batch is not given for NLP (our choice)
    c.partition = "dirichlet:0.3"
    # |M| and the public subset are not given for NLP; 50k as the CV memory (001 Table 5).
    c.public_size = c.memory_size = 50_000
    c.eval_every = 1
    fedproj = {"memory_batch_size": 128, "temperature": 1.0, "round0": "skip", **DISTILL}
    c.method_defaults = ml_collections.ConfigDict(
      {"fedproj": fedproj, "feddf": dict(DISTILL), "fedet": dict(DISTILL)}
    )
    return c
  if preset == "fedgkd_paper":
    c.method = "fedgkd"
    c.checkpoint, c.bert_size = DISTILBERT, "distilbert"
    c.num_clients, c.clients_per_round, c.rounds, c.local_epochs = 20, 4, 10, 1
    c.optimizer, c.lr, c.weight_decay, c.batch_size = "adam", 1e-5, 0.0, 64
    c.partition = "dirichlet:0.1"
    c.train_subset = 60_000  # 002's data table: 60,000 AG News training examples
    c.eval_every = 1
    c.method_defaults = ml_collections.ConfigDict(
      {"fedgkd": {"buffer_size": 5, "gamma": 0.2, "temperature": 1.0}}
    )
    return c
  if preset in ("cpu", "smoke"):
    c.checkpoint, c.bert_size, c.max_len = "", "tiny", 64
    c.optimizer, c.lr, c.batch_size = "adam", 1e-3, 32
    c.num_clients, c.clients_per_round, c.local_epochs = 10, 3, 1
    c.partition = "dirichlet:0.5"
    c.rounds, c.train_subset, c.test_subset = (
      (2, 800, 400) if preset == "smoke" else (10, 4000, 1000)
    )
    c.update(common.SMALL_PUBLIC, eval_every=1)
    c.method_defaults = ml_collections.ConfigDict(
      {m: {**DISTILL, "distill_lr": 1e-3} for m in ("fedproj", "feddf", "fedet")}
    )
    c.method_defaults.fedproj.memory_batch_size = 64
    if preset == "smoke":
      # Smoke is also the quick check of a pretrained --checkpoint (docs/nlp.md, "Presets", has
      # the measurements): a fine-tuning rate, 1e-4 (1e-3 stayed near chance); IID, because after
      # two rounds of three Dirichlet-skewed clients the model predicted one label; a batch of 8,
      # so the clients of a small local file still take steps.
      c.lr, c.batch_size, c.partition = 1e-4, 8, "iid"
    return c
  raise ValueError(f"Unknown preset {preset!r}; choose one of {PRESETS}.")


def prepare(c):
  """Moves the flat text flags into the blocks the runner reads (model_kwargs, text)."""
  common.refuse_sequential(c)
  if c.dataset == "marc" and not c.data_dir:
    raise ValueError(
      "MARC is not distributed by TFDS: pass --data_dir=<folder with train.csv and test.csv "
      "(or .jsonl) of the English reviews, fields review_body and stars> (docs/nlp.md)."
    )
  kwargs = dict(c.get("model_kwargs", {}))
  if c.checkpoint:
    kwargs["checkpoint"] = c.checkpoint
  else:
    kwargs["size"] = c.bert_size
  c.model_kwargs = ml_collections.ConfigDict(kwargs)
  c.text = ml_collections.ConfigDict(
    {"max_len": c.max_len, "public_fields": ["text"], "cache_dir": ""}
  )
  return c


def resolve(preset: str, fields=None, method_kwargs=None, task: str = "sst2"):
  """The config ``--task=<task> --preset=<preset>`` with these flags runs (common.resolve, then
  prepare); the claim runner (fedjax_proj/reproduce/resolve.py) resolves through it too."""
  return common.resolve(
    lambda p: get_config(p, task), preset, fields, method_kwargs, prepare, FIELDS
  )


def task_from(argv) -> tuple[str, list[str]]:
  """``--task`` is read first: the presets depend on it."""
  pre = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
  task = OWN_FIELDS["task"]
  pre.add_argument("--task", default=task.default, choices=task.choices)
  args, rest = pre.parse_known_args(argv)
  return args.task, rest


DESCRIPTION = (
  "Text classification with pretrained encoders as clients (docs/nlp.md). --task picks the "
  "private set and its unlabelled public set: mnli (snli), sst2 (sentiment140), marc (yelp; "
  "--data_dir with train.csv/test.csv), ag_news (none). Presets: paper (FedProj, 001 Table 2: "
  "TinyBERT 4L-312 from the hub), fedgkd_paper (FedGKD's DistilBERT AG News, 002), cpu and smoke "
  "(a random-init tiny encoder). Example: python experiments/nlp.py --task=sst2 --method=fedproj"
)


def main(argv) -> int:
  task, rest = task_from(argv)
  choices = {"method": common.parallel_methods(), "strategy": STRATEGIES}
  choices.update({k: FIELDS[k].choices for k in ("bert_size", "task")})
  return common.main(
    [*rest, f"--task={task}"],
    DESCRIPTION,
    lambda preset: get_config(preset, task),
    choices,
    prepare=prepare,
    presets=PRESETS,
    table=FIELDS,
  )
