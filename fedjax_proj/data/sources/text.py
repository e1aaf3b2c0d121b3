"""Text classification sources: TFDS text sets and local CSV/JSONL files, tokenised and cached.

A text split becomes the same :class:`~fedjax_proj.data.sources.common.ArrayDataset` as an image
split, with ``images`` holding int32 token ids and token types [N, 2, L] (docs/nlp.md, "Text
data"), so partitions, round layouts and every method see nothing new. Tokenising is done once with
the checkpoint's own tokenizer (a ``tokenizers.Tokenizer``, padded and truncated to ``max_len``)
and cached as an npz keyed by the tokenizer, ``max_len``, the source and the label mode.

The TFDS sets of the papers' NLP experiments (001 Sec. 6.1: MNLI/SNLI, SST-2/Sentiment140,
MARC/Yelp; 002 Sec. 5: AG News) are in :data:`TEXT_DATASETS`; MARC is no longer distributed by
TFDS or Amazon's bucket, so it is a local file (:func:`load_text_file`).
"""

from __future__ import annotations

import csv
import dataclasses
import hashlib
import importlib
import json
import os
import pathlib
from collections.abc import Callable, Sequence

import numpy as np

from fedjax_proj.data.sources.common import ArrayDataset, DataNotFoundError, PathLike
from fedjax_proj.data.sources.image_folder import default_cache_dir
from fedjax_proj.data.sources.tfds_source import NETWORK_PROBE, network_available

Text = str | tuple[str, str]


@dataclasses.dataclass(frozen=True)
class TextSpec:
  """Where a text set's examples and labels are.

  Attributes:
    tfds_name: TFDS name ("glue/sst2"), or "" for local files only.
    fields: feature names holding the text; two fields are a sentence pair (NLI) unless ``join``.
    label: feature name of the label.
    num_classes: classes of the (mapped) labels.
    splits: our split name -> the TFDS split holding it (labelled test sets of GLUE are its
      validation splits).
    join: join ``fields`` with a space into one text (AG News: title and description).
    label_map: raw label -> class; raw labels not in it (SNLI's -1 "no gold label",
      Sentiment140's neutral 2) drop the example from a labelled load.
    builder_module: module that registers the TFDS builder (TFDS's legacy text builders).
  """

  tfds_name: str
  fields: tuple[str, ...]
  label: str
  num_classes: int
  splits: dict[str, str] = dataclasses.field(default_factory=lambda: {"train": "train"})
  join: bool = False
  label_map: dict[int, int] | None = None
  builder_module: str = ""


_GLUE = "tensorflow_datasets.text.glue"
TEXT_DATASETS: dict[str, TextSpec] = {
  "mnli": TextSpec("glue/mnli", ("premise", "hypothesis"), "label", 3,
                   {"train": "train", "test": "validation_matched"}, builder_module=_GLUE),
  "snli": TextSpec("snli", ("premise", "hypothesis"), "label", 3,
                   {"train": "train", "test": "test"}, label_map={0: 0, 1: 1, 2: 2}),
  "sst2": TextSpec("glue/sst2", ("sentence",), "label", 2,
                   {"train": "train", "test": "validation"}, builder_module=_GLUE),
  "sentiment140": TextSpec("sentiment140", ("text",), "polarity", 2,
                           {"train": "train", "test": "test"}, label_map={0: 0, 4: 1}),
  "yelp": TextSpec("yelp_polarity_reviews", ("text",), "label", 2,
                   {"train": "train", "test": "test"},
                   builder_module="tensorflow_datasets.text.yelp_polarity"),
  "ag_news": TextSpec("ag_news_subset", ("title", "description"), "label", 4,
                      {"train": "train", "test": "test"}, join=True),
  # Multilingual Amazon Reviews Corpus (Keung et al., 2020), English: 1-5 stars -> 0-4.
  "marc": TextSpec("", ("review_body",), "stars", 5, label_map={s: s - 1 for s in range(1, 6)}),
}  # fmt: skip


def _decode(value) -> str:
  if isinstance(value, bytes):
    return value.decode("utf-8")
  if isinstance(value, np.ndarray):
    value = value.item()
    return value.decode("utf-8") if isinstance(value, bytes) else str(value)
  return str(value)


def _texts_and_labels(
  rows: Sequence[dict], spec: TextSpec, labelled: bool, source: str
) -> tuple[list[Text], np.ndarray]:
  """The text (or pair) and mapped label of each row; unmapped labels drop labelled rows."""
  missing = [f for f in (*spec.fields, spec.label if labelled else None) if f and f not in rows[0]]
  if missing:
    raise ValueError(
      f"{source} has no field(s) {missing}; its fields are {sorted(rows[0])}. Pass the right "
      "text_fields/label_field."
    )
  texts, labels = [], []
  for i, row in enumerate(rows):
    label = 0
    if labelled:
      raw = row[spec.label]
      try:
        label = int(np.asarray(raw).item() if not isinstance(raw, str) else raw)
      except (TypeError, ValueError):
        # Row numbers count examples from 1 (a CSV's header line is not one).
        expected = f" ({', '.join(map(str, spec.label_map))})" if spec.label_map else ""
        raise ValueError(
          f"{source}: label column {spec.label!r}, row {i + 1}: {raw!r} is not an integer; the "
          f"labels must be integers{expected}: fix that row or pass the right label_field."
        ) from None
      if spec.label_map is not None:
        if label not in spec.label_map:
          continue
        label = spec.label_map[label]
    parts = [_decode(row[f]) for f in spec.fields]
    texts.append(" ".join(parts) if spec.join or len(parts) == 1 else tuple(parts[:2]))
    labels.append(label)
  labels = np.asarray(labels, np.int32)
  if labelled and labels.size and (labels.min() < 0 or labels.max() >= spec.num_classes):
    raise ValueError(
      f"{source}: labels span [{labels.min()}, {labels.max()}], outside 0..{spec.num_classes - 1}."
    )
  return texts, labels


def tokenize(texts: Sequence[Text], tokenizer, max_len: int) -> np.ndarray:
  """Token ids and token types, int32 [N, 2, max_len], padded with the tokenizer's [PAD] id."""
  tokenizer = _plain_copy(tokenizer)  # padding and truncation settings are the caller's own
  tokenizer.enable_truncation(max_len)
  pad_id = tokenizer.token_to_id("[PAD]")
  tokenizer.enable_padding(length=max_len, pad_id=0 if pad_id is None else pad_id)
  encodings = tokenizer.encode_batch(list(texts))
  return np.stack([np.stack([e.ids, e.type_ids]) for e in encodings]).astype(np.int32)


def _plain_copy(tokenizer):
  """A copy of a ``tokenizers.Tokenizer`` without padding or truncation settings."""
  copy = type(tokenizer).from_str(tokenizer.to_str())
  copy.no_padding()
  copy.no_truncation()
  return copy


def _tokenizer_digest(tokenizer) -> str:
  """Identifies the vocabulary and rules, not the padding/truncation settings."""
  return hashlib.sha256(_plain_copy(tokenizer).to_str().encode()).hexdigest()[:16]


def _cached(key: dict, build: Callable[[], tuple[np.ndarray, np.ndarray]], cache_dir) -> tuple:
  """``build()``'s (tokens, labels), stored as an npz named by the hash of ``key``."""
  digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:20]
  root = pathlib.Path(cache_dir) if cache_dir is not None else default_cache_dir() / "text"
  path = root / f"{key['name']}-{key['split']}-{digest}.npz"
  if path.is_file():
    with np.load(path) as npz:
      return npz["tokens"], npz["labels"]
  tokens, labels = build()
  path.parent.mkdir(parents=True, exist_ok=True)
  tmp = path.with_suffix(f".{os.getpid()}.tmp.npz")
  np.savez(tmp, tokens=tokens, labels=labels)
  os.replace(tmp, path)
  return tokens, labels


def _tfds_rows(spec: TextSpec, split: str, data_dir, download: bool) -> list[dict]:
  try:
    import tensorflow_datasets as tfds  # noqa: PLC0415

    if spec.builder_module:
      importlib.import_module(spec.builder_module)  # registers a legacy builder
  except ImportError as e:
    raise DataNotFoundError(f"TFDS {spec.tfds_name}: cannot import its builder ({e}).") from e
  data_dir = os.fspath(data_dir) if data_dir is not None else None
  try:
    source = tfds.data_source(spec.tfds_name, split=split, data_dir=data_dir, download=False)
  except Exception as first:  # noqa: BLE001  (TFDS's many "not prepared" exceptions)
    if not download or not network_available():
      raise DataNotFoundError(
        f"TFDS {spec.tfds_name!r} split {split!r} is not prepared and "
        + ("download=False" if not download else f"there is no network ({NETWORK_PROBE[0]})")
        + f": {type(first).__name__}: {str(first)[:300]}. Prepare it on a machine with internet "
        f"(python -c \"import tensorflow_datasets as tfds; tfds.data_source('{spec.tfds_name}', "
        f"split='{split}')\") and point $TFDS_DATA_DIR at it."
      ) from first
    source = tfds.data_source(spec.tfds_name, split=split, data_dir=data_dir, download=True)
  # Item-by-item: tfds.testing.mock_data implements no batched access.
  return [source[i] for i in range(len(source))]


def load_text(
  name: str,
  split: str,
  tokenizer,
  max_len: int,
  *,
  labelled: bool = True,
  data_dir: PathLike | None = None,
  cache_dir: PathLike | None = None,
  download: bool = True,
) -> ArrayDataset:
  """A text split (:data:`TEXT_DATASETS`) from a local file or TFDS, tokenised and cached.

  Args:
    name: a key of :data:`TEXT_DATASETS` ("mnli", "snli", "sst2", "sentiment140", "yelp",
      "ag_news" from TFDS; "marc" only from a local file).
    split: "train" or "test" (mapped to the TFDS split that has labels), or a TFDS split string.
    tokenizer: a ``tokenizers.Tokenizer`` (models/hf_checkpoint.load_tokenizer).
    max_len: tokens per example, [CLS] and [SEP] included.
    labelled: False reads no labels (all 0): a public set used without labels (001 Sec. 6.1).
    data_dir: a local folder (or file) holding the split as ``<split>.csv|tsv|jsonl`` or
      ``<name>/<split>.*`` (:func:`find_text_file`); None reads TFDS (its data dir is
      ``$TFDS_DATA_DIR`` or TFDS's default).
    cache_dir: where tokenised splits are cached (default: ``<cache>/text``).
    download: let TFDS download a missing split when the network answers.

  Returns:
    ArrayDataset with ``images`` int32 [N, 2, max_len] (ids, token types), labels int32 [N].
  """
  if name not in TEXT_DATASETS:
    raise ValueError(f"unknown text dataset {name!r}; known: {sorted(TEXT_DATASETS)}.")
  if data_dir is not None:
    path = find_text_file(data_dir, name, split)
    if path is None:
      raise DataNotFoundError(
        f"--data_dir={data_dir} holds no {split}{'|'.join(TEXT_SUFFIXES)} for {name!r} (looked in "
        f"it and in {name}/); TFDS is not tried when a data_dir is given."
      )
    return load_text_file(
      path, tokenizer, max_len, name=name, labelled=labelled, cache_dir=cache_dir
    )
  if not TEXT_DATASETS[name].tfds_name:
    raise DataNotFoundError(
      f"{name!r} is not in TFDS: pass its local copy as --data_dir=<folder with train.csv and "
      'test.csv (or .jsonl)> (docs/nlp.md, "Text data").'
    )
  spec = TEXT_DATASETS[name]
  tfds_split = spec.splits.get(split, split)
  key = dict(name=name, split=tfds_split, tfds=spec.tfds_name, max_len=max_len, labelled=labelled,
             tokenizer=_tokenizer_digest(tokenizer))  # fmt: skip

  def build():
    rows = _tfds_rows(spec, tfds_split, None, download)
    texts, labels = _texts_and_labels(rows, spec, labelled, f"TFDS {spec.tfds_name}:{tfds_split}")
    return tokenize(texts, tokenizer, max_len), labels

  tokens, labels = _cached(key, build, cache_dir)
  return ArrayDataset(tokens, labels, spec.num_classes, name)


def _read_rows(path: pathlib.Path) -> list[dict]:
  if path.suffix.lower() in (".jsonl", ".json"):
    with path.open(encoding="utf-8") as f:
      return [json.loads(line) for line in f if line.strip()]
  if path.suffix.lower() in (".csv", ".tsv"):
    with path.open(encoding="utf-8", newline="") as f:
      return list(csv.DictReader(f, delimiter="\t" if path.suffix.lower() == ".tsv" else ","))
  raise ValueError(f"{path}: text files must be .csv, .tsv or .jsonl (one JSON object a line).")


def load_text_file(
  path: PathLike,
  tokenizer,
  max_len: int,
  *,
  name: str = "marc",
  text_fields: Sequence[str] | None = None,
  label_field: str | None = None,
  labelled: bool = True,
  cache_dir: PathLike | None = None,
) -> ArrayDataset:
  """A local CSV/TSV/JSONL split, tokenised and cached (keyed by the file's size and mtime).

  Args:
    path: the file; one example a row, with a header (CSV/TSV) or one JSON object a line.
    tokenizer: a ``tokenizers.Tokenizer``.
    max_len: tokens per example.
    name: a :data:`TEXT_DATASETS` key giving the default fields and label map ("marc":
      ``review_body`` and ``stars`` 1-5), or any name when ``text_fields`` and ``label_field`` are
      given (labels must then be 0..K-1).
    text_fields: one field, or two for sentence pairs (default: the spec's).
    label_field: the label's field (default: the spec's).
    labelled: False reads no labels.
    cache_dir: see :func:`load_text`.

  Returns:
    ArrayDataset as :func:`load_text`.
  """
  path = pathlib.Path(path).expanduser()
  if not path.is_file():
    raise DataNotFoundError(f"text file {path} does not exist (a .csv, .tsv or .jsonl split).")
  spec = TEXT_DATASETS.get(name)
  if spec is None and (not text_fields or (labelled and not label_field)):
    raise ValueError(
      f"{name!r} is not a known text set ({sorted(TEXT_DATASETS)}): pass text_fields and "
      "label_field."
    )
  spec = dataclasses.replace(
    spec or TextSpec("", tuple(text_fields), label_field or "", 0),
    **({"fields": tuple(text_fields)} if text_fields else {}),
    **({"label": label_field} if label_field else {}),
  )
  stat = path.stat()
  key = dict(name=name, split=path.stem, path=str(path.resolve()), size=stat.st_size,
             mtime=stat.st_mtime_ns, fields=spec.fields, label=spec.label, labelled=labelled,
             max_len=max_len, tokenizer=_tokenizer_digest(tokenizer))  # fmt: skip

  def build():
    rows = _read_rows(path)
    if not rows:
      raise ValueError(f"{path} holds no examples.")
    texts, labels = _texts_and_labels(rows, spec, labelled, f"text file {path}")
    return tokenize(texts, tokenizer, max_len), labels

  tokens, labels = _cached(key, build, cache_dir)
  num_classes = spec.num_classes or (int(labels.max()) + 1 if labels.size else 0)
  return ArrayDataset(tokens, labels, num_classes, name)


TEXT_SUFFIXES = (".csv", ".tsv", ".jsonl")


def find_text_file(root: PathLike, name: str, split: str) -> pathlib.Path | None:
  """The local file of (name, split) under ``root``: ``root`` itself when it is a file, else the
  first of ``<split>.csv|tsv|jsonl`` and ``<name>/<split>.csv|tsv|jsonl``; None if none exists."""
  root = pathlib.Path(root).expanduser()
  if root.is_file():
    return root
  for folder in (root, root / name):
    for suffix in TEXT_SUFFIXES:
      if (folder / f"{split}{suffix}").is_file():
        return folder / f"{split}{suffix}"
  return None


def read_texts(
  name: str, split: str, *, labelled: bool = True, data_dir: PathLike | None = None,
  download: bool = True,
) -> tuple[list[Text], np.ndarray]:  # fmt: skip
  """The raw texts and labels of a split (no tokenising, no cache): a local file under
  ``data_dir`` (:func:`find_text_file`) when given, else TFDS."""
  if data_dir is not None:
    path = find_text_file(data_dir, name, split)
    if path is None:
      raise DataNotFoundError(
        f"no {split}{'|'.join(TEXT_SUFFIXES)} for {name!r} under {data_dir} (nor in {name}/)."
      )
    spec = TEXT_DATASETS.get(name)
    if spec is None:
      raise ValueError(f"local text set {name!r} is not in TEXT_DATASETS; use load_text_file.")
    return _texts_and_labels(_read_rows(path), spec, labelled, f"text file {path}")
  spec = TEXT_DATASETS[name]
  tfds_split = spec.splits.get(split, split)
  rows = _tfds_rows(spec, tfds_split, None, download)
  return _texts_and_labels(rows, spec, labelled, f"TFDS {spec.tfds_name}:{tfds_split}")


def train_wordpiece(texts: Sequence[Text], vocab_size: int = 1000):
  """A BERT WordPiece tokenizer trained on ``texts`` (``tokenizers`` library): for random-init
  encoders on data without a checkpoint (smoke runs, tests)."""
  import tokenizers  # noqa: PLC0415

  wordpiece = tokenizers.BertWordPieceTokenizer(lowercase=True)
  flat = [t for text in texts for t in ((text,) if isinstance(text, str) else text)]
  wordpiece.train_from_iterator(flat, vocab_size=vocab_size, min_frequency=1, show_progress=False)
  tokenizer = wordpiece._tokenizer
  cls, sep = tokenizer.token_to_id("[CLS]"), tokenizer.token_to_id("[SEP]")
  tokenizer.post_processor = tokenizers.processors.BertProcessing(("[SEP]", sep), ("[CLS]", cls))
  return tokenizer
