"""Text runs: the tokenizer a run uses and a dataset loader that tokenises (docs/nlp.md).

A config with a ``text`` block (``experiments/nlp.py``) reads its private, test and public splits
through :func:`text_loader` instead of ``load_dataset``: each split becomes int32 token ids and
types [N, 2, max_len] (``data/sources/text.py``), which the normaliser :func:`token_ids` passes
through, so the rest of the run is the image run unchanged.
"""

from __future__ import annotations

from collections.abc import Callable

import ml_collections

from fedjax_proj.data.sources import text
from fedjax_proj.data.sources.common import ArrayDataset, looks_like_path
from fedjax_proj.models.bert import resolve_config


def is_text_run(c: ml_collections.ConfigDict) -> bool:
  """Whether ``c`` describes a text run (a ``text`` block and a text dataset)."""
  return c.get("text") is not None and c.dataset in text.TEXT_DATASETS


def token_ids(x):
  """The text runs' normaliser: token ids and types reach the model unchanged."""
  return x


def run_tokenizer(c: ml_collections.ConfigDict):
  """The checkpoint's tokenizer (``model_kwargs.checkpoint``), else a WordPiece vocabulary of the
  model's ``vocab_size`` trained on the private training texts (random-init encoders)."""
  kwargs = dict(c.get("model_kwargs", {}))
  checkpoint = kwargs.pop("checkpoint", None)
  if checkpoint:
    from fedjax_proj.models.hf_checkpoint import load_tokenizer  # noqa: PLC0415

    return load_tokenizer(checkpoint)
  config = resolve_config(kwargs.pop("size", "tinybert_4l_312"), **kwargs)
  texts, _ = text.read_texts(c.dataset, "train", data_dir=c.data_dir or None)
  return text.train_wordpiece(texts, vocab_size=config.vocab_size)


def text_loader(c: ml_collections.ConfigDict) -> Callable[..., ArrayDataset]:
  """``load(name, split, data_dir=None, labelled=None) -> ArrayDataset`` for the run's text sets.

  By default the private set (``c.dataset``) is read with labels and any other name (the public
  set) without them, as the papers' public sets are used (001 Sec. 6.1). A public set given as a
  file path is read with ``c.text.public_fields``.
  """
  tokenizer = run_tokenizer(c)
  max_len = int(c.text.max_len)
  cache_dir = c.text.get("cache_dir") or None

  def load(name: str, split: str, data_dir=None, labelled: bool | None = None) -> ArrayDataset:
    if looks_like_path(name) or name.endswith(text.TEXT_SUFFIXES):
      return text.load_text_file(
        name, tokenizer, max_len, name="public", text_fields=tuple(c.text.public_fields),
        labelled=False, cache_dir=cache_dir,
      )  # fmt: skip
    if labelled is None:
      labelled = name == c.dataset
    return text.load_text(
      name, split, tokenizer, max_len, labelled=labelled, data_dir=data_dir, cache_dir=cache_dir
    )

  return load
