"""Hugging Face BERT-family checkpoints as :mod:`~fedjax_proj.models.bert` parameters.

A checkpoint is a folder holding ``config.json`` and the weights (``model.safetensors``, read with
the ``safetensors`` library's NumPy API, or the PyTorch ``pytorch_model.bin``, read with torch when
it is installed), or a hub model id, fetched with ``huggingface_hub.snapshot_download`` when the
machine is online. The tokenizer comes from the same folder through the ``tokenizers`` library
(``tokenizer.json``, or ``vocab.txt`` as a WordPiece tokenizer). These are the ``nlp`` extra's
packages (``pip install fedjax_proj[nlp]``); this module imports them only when called.

:func:`pretrained_model` is the :class:`~fedjax_proj.core.types.Model` whose ``init`` returns the
checkpoint's encoder (and pooler) weights with a freshly initialised classifier, drawn from
``init``'s key: the classifier of a fine-tuning checkpoint belongs to another task. BERT
(``model_type: bert``: TinyBERT, MiniLM, BERT) and DistilBERT (``distilbert``) checkpoints are
mapped (docs/nlp.md, "Checkpoints").
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
import re
from typing import Any

import jax
import numpy as np

from fedjax_proj.core.types import Model, Variables
from fedjax_proj.models.base import from_flax
from fedjax_proj.models.bert import BertConfig, bert_module

NLP_EXTRA_HINT = "install the NLP extra: pip install 'fedjax_proj[nlp]' (tokenizers, safetensors)"
HUB_FILES = ["config.json", "*.safetensors", "pytorch_model.bin", "tokenizer.json", "vocab.txt"]
HUB_FILES += ["tokenizer_config.json", "special_tokens_map.json"]


class CheckpointUnavailableError(FileNotFoundError):
  """A hub checkpoint that could not be downloaded (offline, unknown or gated id)."""


def resolve_checkpoint(checkpoint: str | pathlib.Path) -> pathlib.Path:
  """A local checkpoint folder: ``checkpoint`` itself, or the hub snapshot of a model id.

  Raises:
    FileNotFoundError: a path that does not exist, or a folder without ``config.json``.
    CheckpointUnavailableError: a model id that cannot be downloaded (offline, unknown id), with
      how to use a local copy instead.
  """
  path = pathlib.Path(checkpoint).expanduser()
  if path.is_dir():
    if not (path / "config.json").is_file():
      raise FileNotFoundError(
        f"checkpoint folder {path} has no config.json; point at a Hugging Face model folder "
        "(config.json + model.safetensors or pytorch_model.bin)."
      )
    return path
  name = str(checkpoint)
  if path.exists() or name.startswith((".", "/", "~")) or name.count("/") > 1:
    raise FileNotFoundError(
      f"checkpoint {name!r} is not a folder; pass a model folder or a hub id."
    )
  try:
    import huggingface_hub  # noqa: PLC0415
  except ImportError as e:
    raise ImportError(
      f"loading {name!r} from the hub needs huggingface_hub: {NLP_EXTRA_HINT}"
    ) from e
  try:
    return pathlib.Path(huggingface_hub.snapshot_download(name, allow_patterns=HUB_FILES))
  except Exception as e:  # noqa: BLE001  (offline, unknown id, gated repo: all mean "not here")
    raise CheckpointUnavailableError(
      f"could not download checkpoint {name!r} from the Hugging Face hub ({type(e).__name__}: "
      f"{str(e).strip()[:300]}). Offline, download it elsewhere (huggingface-cli download {name}) "
      "and pass the folder instead."
    ) from e


def config_from_hf(hf: dict[str, Any], **overrides: Any) -> BertConfig:
  """A :class:`BertConfig` from a checkpoint's ``config.json`` (``bert`` or ``distilbert``)."""
  kind = hf.get("model_type", "bert")
  if kind == "distilbert":
    fields = dict(
      vocab_size=hf["vocab_size"],
      hidden_size=hf["dim"],
      num_hidden_layers=hf["n_layers"],
      num_attention_heads=hf["n_heads"],
      intermediate_size=hf["hidden_dim"],
      max_position_embeddings=hf["max_position_embeddings"],
      type_vocab_size=0,
      hidden_act=hf.get("activation", "gelu"),
      pooler_act="relu",
      hidden_dropout_prob=hf.get("dropout", 0.1),
      attention_probs_dropout_prob=hf.get("attention_dropout", 0.1),
      classifier_dropout=hf.get("seq_classif_dropout", 0.2),
      pad_token_id=hf.get("pad_token_id", 0) or 0,
    )
    if hf.get("sinusoidal_pos_embds"):
      raise ValueError("DistilBERT with sinusoidal position embeddings is not supported.")
  elif kind == "bert":
    if hf.get("position_embedding_type", "absolute") != "absolute":
      raise ValueError(f"position_embedding_type={hf['position_embedding_type']!r} is unsupported.")
    fields = dict(
      vocab_size=hf["vocab_size"],
      hidden_size=hf["hidden_size"],
      num_hidden_layers=hf["num_hidden_layers"],
      num_attention_heads=hf["num_attention_heads"],
      intermediate_size=hf["intermediate_size"],
      max_position_embeddings=hf["max_position_embeddings"],
      type_vocab_size=hf.get("type_vocab_size", 2),
      hidden_act=hf.get("hidden_act", "gelu"),
      layer_norm_eps=hf.get("layer_norm_eps", 1e-12),
      hidden_dropout_prob=hf.get("hidden_dropout_prob", 0.1),
      attention_probs_dropout_prob=hf.get("attention_probs_dropout_prob", 0.1),
      classifier_dropout=hf.get("classifier_dropout"),
      pad_token_id=hf.get("pad_token_id", 0) or 0,
    )
  else:
    raise ValueError(
      f"checkpoint model_type {kind!r} is not supported; supported: bert (BERT, TinyBERT, "
      "MiniLM) and distilbert."
    )
  return BertConfig(**{**fields, **overrides})


def load_state_dict(folder: pathlib.Path) -> dict[str, np.ndarray]:
  """The checkpoint's tensors by name: ``model.safetensors``, else ``pytorch_model.bin``."""
  safetensors_file = folder / "model.safetensors"
  if safetensors_file.is_file():
    try:
      from safetensors.numpy import load_file  # noqa: PLC0415
    except ImportError as e:
      raise ImportError(f"reading {safetensors_file} needs safetensors: {NLP_EXTRA_HINT}") from e
    try:
      return load_file(str(safetensors_file))
    except Exception as e:  # noqa: BLE001  (safetensors' own SafetensorError: a torn file)
      raise _unreadable(safetensors_file, e) from None
  bin_file = folder / "pytorch_model.bin"
  if bin_file.is_file():
    try:
      import torch  # noqa: PLC0415
    except ImportError as e:
      raise ImportError(
        f"{folder} holds only the PyTorch weights pytorch_model.bin, which need torch to read: "
        "pip install torch (the CPU build is enough), or convert the checkpoint to "
        "model.safetensors."
      ) from e
    try:
      state = torch.load(bin_file, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001  (torch's RuntimeError / UnpicklingError: a torn file)
      raise _unreadable(bin_file, e) from None
    return {k: v.float().numpy() for k, v in state.items()}
  raise FileNotFoundError(f"{folder} has neither model.safetensors nor pytorch_model.bin.")


def _unreadable(path: pathlib.Path, e: Exception) -> ValueError:
  """The error for a checkpoint file its reader cannot parse (cut short by a download, edited)."""
  return ValueError(
    f"checkpoint file {path} cannot be read ({type(e).__name__}: {str(e).strip()[:200]}): it is "
    "truncated or corrupt. Download the checkpoint again, or pass another checkpoint folder."
  )


def read_config(folder: pathlib.Path) -> dict[str, Any]:
  """A checkpoint folder's ``config.json``; a file that is not JSON is an error naming it."""
  path = folder / "config.json"
  try:
    return json.loads(path.read_text())
  except ValueError as e:
    raise _unreadable(path, e) from None


def describe(checkpoint: str | pathlib.Path) -> str:
  """Which weights a checkpoint resolves to and their shape, in one line (a run logs it, so the
  checkpoint a run loaded is on record)."""
  folder = resolve_checkpoint(checkpoint)
  hf = read_config(folder)
  c = config_from_hf(hf)
  weights = next(
    (folder / f for f in ("model.safetensors", "pytorch_model.bin") if (folder / f).is_file()),
    folder,
  )
  return (
    f"{weights} ({hf.get('model_type', 'bert')}: {c.num_hidden_layers} layers, width "
    f"{c.hidden_size}, vocabulary {c.vocab_size}; the classifier is new)"
  )


# Checkpoint name (after the model prefix) -> our path; "{i}" is the layer index.
_LINEAR = ("kernel", "bias")
_NORM = ("scale", "bias")
_BERT_NAMES = {
  "embeddings.word_embeddings": ("word", ("embedding",)),
  "embeddings.position_embeddings": ("position", ("embedding",)),
  "embeddings.token_type_embeddings": ("token_type", ("embedding",)),
  "embeddings.LayerNorm": ("embed_ln", _NORM),
  "encoder.layer.{i}.attention.self.query": ("layer_{i}/query", _LINEAR),
  "encoder.layer.{i}.attention.self.key": ("layer_{i}/key", _LINEAR),
  "encoder.layer.{i}.attention.self.value": ("layer_{i}/value", _LINEAR),
  "encoder.layer.{i}.attention.output.dense": ("layer_{i}/attn_out", _LINEAR),
  "encoder.layer.{i}.attention.output.LayerNorm": ("layer_{i}/attn_ln", _NORM),
  "encoder.layer.{i}.intermediate.dense": ("layer_{i}/ffn_in", _LINEAR),
  "encoder.layer.{i}.output.dense": ("layer_{i}/ffn_out", _LINEAR),
  "encoder.layer.{i}.output.LayerNorm": ("layer_{i}/ffn_ln", _NORM),
  "pooler.dense": ("pooler", _LINEAR),
}
_DISTILBERT_NAMES = {
  "embeddings.word_embeddings": ("word", ("embedding",)),
  "embeddings.position_embeddings": ("position", ("embedding",)),
  "embeddings.LayerNorm": ("embed_ln", _NORM),
  "transformer.layer.{i}.attention.q_lin": ("layer_{i}/query", _LINEAR),
  "transformer.layer.{i}.attention.k_lin": ("layer_{i}/key", _LINEAR),
  "transformer.layer.{i}.attention.v_lin": ("layer_{i}/value", _LINEAR),
  "transformer.layer.{i}.attention.out_lin": ("layer_{i}/attn_out", _LINEAR),
  "transformer.layer.{i}.sa_layer_norm": ("layer_{i}/attn_ln", _NORM),
  "transformer.layer.{i}.ffn.lin1": ("layer_{i}/ffn_in", _LINEAR),
  "transformer.layer.{i}.ffn.lin2": ("layer_{i}/ffn_out", _LINEAR),
  "transformer.layer.{i}.output_layer_norm": ("layer_{i}/ffn_ln", _NORM),
  "pre_classifier": ("pooler", _LINEAR),  # only in *ForSequenceClassification checkpoints
}
# Torch parameter suffix -> role; old BERT checkpoints name LayerNorm's parameters gamma/beta.
_SUFFIX = {"weight": 0, "gamma": 0, "bias": 1, "beta": 1}


def convert_state_dict(
  state: dict[str, np.ndarray], config: BertConfig, model_type: str = "bert"
) -> dict[str, np.ndarray]:
  """Maps checkpoint tensors to our parameter paths ("layer_0/query/kernel" -> array).

  Model prefixes (``bert.``, ``distilbert.``) are dropped; tensors that are not part of the
  encoder (masked-LM heads, old classifiers, ``position_ids``) are ignored. Linear weights are
  transposed (torch stores [out, in], Flax [in, out]).
  """
  names = _DISTILBERT_NAMES if model_type == "distilbert" else _BERT_NAMES
  patterns = []
  for hf_name, (ours, roles) in names.items():
    regex = re.escape(hf_name).replace(re.escape("{i}"), r"(?P<i>\d+)")
    patterns.append((re.compile(rf"^(?:bert\.|distilbert\.)?{regex}\.(\w+)$"), ours, roles))
  out = {}
  for key, value in state.items():
    for regex, ours, roles in patterns:
      match = regex.match(key)
      if match is None or match.group(match.lastindex) not in _SUFFIX:
        continue
      role = roles[_SUFFIX[match.group(match.lastindex)]]
      path = ours.format(i=match.groupdict().get("i"))
      array = np.asarray(value, np.float32)
      out[f"{path}/{role}"] = array.T if role == "kernel" else array
      break
  if not out:
    raise ValueError(
      f"no {model_type} encoder weights found among the checkpoint's {len(state)} tensors (e.g. "
      f"{sorted(state)[:3]}); is it a BERT/DistilBERT checkpoint?"
    )
  return out


def merge_params(params: dict, loaded: dict[str, np.ndarray], source: str) -> dict:
  """``params`` with every leaf named in ``loaded`` replaced; checks names and shapes.

  Every encoder leaf must be present in ``loaded``; only the classifier (``head``) and, for a
  DistilBERT base model, the ``pooler`` (its ``pre_classifier``) may stay freshly initialised.
  """
  flat = {
    "/".join(k.key for k in path): leaf
    for path, leaf in jax.tree_util.tree_leaves_with_path(params)
  }
  missing = [k for k in flat if k not in loaded and not k.startswith(("head/", "pooler/"))]
  unknown = [k for k in loaded if k not in flat]
  if missing or unknown:
    raise ValueError(
      f"{source} does not match the encoder its config.json describes: missing {missing[:5]}, "
      f"unexpected {unknown[:5]}."
    )
  for k, array in loaded.items():
    if tuple(array.shape) != tuple(flat[k].shape):
      raise ValueError(f"{source}: {k} has shape {array.shape}, the model expects {flat[k].shape}.")
  new_flat = {k: jax.numpy.asarray(loaded[k]) if k in loaded else v for k, v in flat.items()}
  leaves = [
    new_flat["/".join(k.key for k in path)]
    for path, _ in jax.tree_util.tree_leaves_with_path(params)
  ]
  return jax.tree_util.tree_unflatten(jax.tree_util.tree_structure(params), leaves)


@dataclasses.dataclass(frozen=True)
class Checkpoint:
  """A loaded checkpoint: its folder, encoder config, ``model_type`` and converted weights."""

  folder: pathlib.Path
  config: BertConfig
  model_type: str
  params: dict[str, np.ndarray]


def load_checkpoint(checkpoint: str | pathlib.Path, **overrides: Any) -> Checkpoint:
  """Reads a checkpoint folder or hub id (see :func:`resolve_checkpoint`)."""
  folder = resolve_checkpoint(checkpoint)
  hf = read_config(folder)
  config = config_from_hf(hf, **overrides)
  model_type = hf.get("model_type", "bert")
  params = convert_state_dict(load_state_dict(folder), config, model_type)
  return Checkpoint(folder, config, model_type, params)


def pretrained_model(
  checkpoint: str | pathlib.Path | Checkpoint, num_classes: int, **overrides
) -> Model:
  """The ``bert`` Model initialised from a checkpoint, with a fresh classifier.

  Args:
    checkpoint: a folder, a hub id, or a :class:`Checkpoint` already loaded.
    num_classes: classifier width.
    **overrides: :class:`BertConfig` fields to change (dropout rates; shapes must match).

  Returns:
    The Model; ``init(key, sample_x)`` is the checkpoint's weights plus a classifier (and, for a
    DistilBERT base model, a pre-classifier) drawn from ``key``.
  """
  ckpt = (
    checkpoint if isinstance(checkpoint, Checkpoint) else load_checkpoint(checkpoint, **overrides)
  )
  base = from_flax("bert", bert_module(num_classes, size=ckpt.config), num_classes)
  source = f"checkpoint {ckpt.folder}"

  def init(key: jax.Array, sample_x: jax.Array) -> Variables:
    variables = base.init(key, sample_x)
    return {**variables, "params": merge_params(variables["params"], ckpt.params, source)}

  return base._replace(init=init)


def load_tokenizer(checkpoint: str | pathlib.Path):
  """The checkpoint's tokenizer (a ``tokenizers.Tokenizer``): ``tokenizer.json``, else
  ``vocab.txt`` as BERT WordPiece (lower-casing as ``tokenizer_config.json`` says, default on)."""
  folder = (
    resolve_checkpoint(checkpoint)
    if not pathlib.Path(checkpoint).is_dir()
    else pathlib.Path(checkpoint)
  )
  try:
    import tokenizers  # noqa: PLC0415
  except ImportError as e:
    raise ImportError(f"tokenising text needs the tokenizers library: {NLP_EXTRA_HINT}") from e
  if (folder / "tokenizer.json").is_file():
    return tokenizers.Tokenizer.from_file(str(folder / "tokenizer.json"))
  if (folder / "vocab.txt").is_file():
    settings_file = folder / "tokenizer_config.json"
    settings = json.loads(settings_file.read_text()) if settings_file.is_file() else {}
    wordpiece = tokenizers.BertWordPieceTokenizer(
      str(folder / "vocab.txt"), lowercase=settings.get("do_lower_case", True)
    )
    return wordpiece._tokenizer  # the underlying tokenizers.Tokenizer
  raise FileNotFoundError(f"{folder} has neither tokenizer.json nor vocab.txt.")
