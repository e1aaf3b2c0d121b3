"""Text sources: TFDS text sets through tfds.testing.mock_data, a local CSV/JSONL (MARC), the
token cache, and the same Dirichlet partition as images."""

import csv
import json

import numpy as np
import pytest

pytest.importorskip("tokenizers", reason="the text sources need the tokenizers library (nlp extra)")

from fedjax_proj.data import partition  # noqa: E402
from fedjax_proj.data.sources import text  # noqa: E402

WORDS = "the a movie film was is good great bad awful plot acting we saw it".split()  # noqa: SIM905


@pytest.fixture
def mock_tfds(monkeypatch):
  """tfds.testing.mock_data for the text sets: TFDS ships no metadata for them, so the mock serves
  only the download path, which the loader takes when the network answers."""
  tfds = pytest.importorskip("tensorflow_datasets")
  monkeypatch.setattr(text, "network_available", lambda: True)
  return tfds.testing.mock_data


@pytest.fixture(scope="module")
def tokenizer():
  rng = np.random.default_rng(0)
  corpus = [" ".join(rng.choice(WORDS, 6)) for _ in range(50)]
  return text.train_wordpiece(corpus, vocab_size=200)


def test_tokenize_single_and_pairs(tokenizer):
  out = text.tokenize(["the movie was good", ("a film", "it was bad")], tokenizer, 12)
  assert out.shape == (2, 2, 12) and out.dtype == np.int32
  cls, sep, pad = (tokenizer.token_to_id(t) for t in ("[CLS]", "[SEP]", "[PAD]"))
  assert out[0, 0, 0] == cls and out[0, 0, 5] == sep and (out[0, 0, 6:] == pad).all()
  # The pair's second sentence has token type 1 (through its [SEP]); padding stays type 0.
  assert list(out[1, 1, :8]) == [0, 0, 0, 0, 1, 1, 1, 1] and (out[1, 1, 8:] == 0).all()
  assert text.tokenize(["word " * 40], tokenizer, 8).shape == (1, 2, 8)  # truncated


@pytest.mark.parametrize(
  ("name", "pair", "classes"),
  [("sst2", False, 2), ("mnli", True, 3), ("ag_news", False, 4), ("yelp", False, 2)],
)
def test_tfds_text_sets(name, pair, classes, tokenizer, tmp_path, mock_tfds, monkeypatch):
  with mock_tfds(num_examples=8):
    ds = text.load_text(name, "test", tokenizer, 16, cache_dir=tmp_path)
  assert ds.images.shape == (8, 2, 16) and ds.num_classes == classes and ds.name == name
  assert ds.labels.min() >= 0 and ds.labels.max() < classes
  # Pairs carry type-1 tokens; single sentences (and AG News' joined title + description) don't.
  assert (ds.images[:, 1] == 1).any() == pair
  # Cached: a second load reads the npz without TFDS (no mock_data here: TFDS would fail).
  monkeypatch.setattr(text, "_tfds_rows", None)
  again = text.load_text(name, "test", tokenizer, 16, cache_dir=tmp_path)
  np.testing.assert_array_equal(again.images, ds.images)
  assert len(list(tmp_path.glob(f"{name}-*.npz"))) == 1


def test_unlabelled_public_set(tokenizer, tmp_path, mock_tfds):
  with mock_tfds(num_examples=5):
    # Sentiment140's mock polarity is random, so a labelled load keeps only its 0/4 rows; the
    # public set is read without labels (001 Sec. 6.1) and keeps every row.
    public = text.load_text(
      "sentiment140", "train", tokenizer, 16, labelled=False, cache_dir=tmp_path
    )
    snli = text.load_text("snli", "train", tokenizer, 16, labelled=False, cache_dir=tmp_path)
  assert len(public.labels) == 5 and (public.labels == 0).all()
  assert len(snli.labels) == 5 and (snli.images[:, 1] == 1).any()


def _write_marc(path, rows, fmt):
  if fmt == "csv":
    with path.open("w", newline="") as f:
      writer = csv.DictWriter(f, ["review_title", "review_body", "stars"])
      writer.writeheader()
      writer.writerows(rows)
  else:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


@pytest.mark.parametrize("fmt", ["csv", "jsonl"])
def test_local_marc_file_and_partition(fmt, tokenizer, tmp_path):
  rng = np.random.default_rng(1)
  rows = [
    {"review_title": "t", "review_body": " ".join(rng.choice(WORDS, 5)), "stars": int(s)}
    for s in rng.integers(1, 6, 60)
  ]
  folder = tmp_path / "marc"
  folder.mkdir()
  _write_marc(folder / f"train.{fmt}", rows, fmt)
  ds = text.load_text("marc", "train", tokenizer, 10, data_dir=folder, cache_dir=tmp_path / "c")
  assert ds.images.shape == (60, 2, 10) and ds.num_classes == 5
  np.testing.assert_array_equal(ds.labels, [r["stars"] - 1 for r in rows])
  # The same partitioners as images: Dirichlet over the labels, every example once.
  parts = partition.partition(ds.labels, "dirichlet:0.5:2", 4, seed=0)
  assert sorted(np.concatenate(parts).tolist()) == list(range(60))
  # A changed file is a new cache entry, not a stale read.
  _write_marc(folder / f"train.{fmt}", rows[:30], fmt)
  assert len(text.load_text("marc", "train", tokenizer, 10, data_dir=folder,
                            cache_dir=tmp_path / "c").labels) == 30  # fmt: skip


def test_clear_errors(tokenizer, tmp_path):
  with pytest.raises(text.DataNotFoundError, match="not in TFDS: pass its local copy"):
    text.load_text("marc", "train", tokenizer, 8, cache_dir=tmp_path)
  with pytest.raises(text.DataNotFoundError, match="holds no train"):
    text.load_text("marc", "train", tokenizer, 8, data_dir=tmp_path, cache_dir=tmp_path)
  with pytest.raises(ValueError, match="unknown text dataset 'imdb'"):
    text.load_text("imdb", "train", tokenizer, 8)
  bad = tmp_path / "train.csv"
  bad.write_text("body,stars\nnice,5\n")
  with pytest.raises(ValueError, match=r"no field\(s\) \['review_body'\]"):
    text.load_text("marc", "train", tokenizer, 8, data_dir=tmp_path, cache_dir=tmp_path)
  bad.write_text("review_body,stars\nnice,5\nfine,five\n")
  where = f"text file {bad}: label column 'stars', row 2: 'five' is not an integer"
  with pytest.raises(ValueError, match=where + r"; the labels must be integers \(1, 2, 3, 4, 5\)"):
    text.load_text("marc", "train", tokenizer, 8, data_dir=tmp_path, cache_dir=tmp_path)
