"""A BERT-family Transformer encoder for sequence classification, written in Flax.

Devlin et al., "BERT: Pre-training of Deep Bidirectional Transformers for Language Understanding"
(NAACL 2019), with the shapes of the two encoders the papers fine-tune: TinyBERT 4L-312 (Jiao et
al., "TinyBERT", Findings of EMNLP 2020; FedProj's NLP model, 001 Sec. 6.1) and DistilBERT (Sanh
et al., 2019; FedGKD's, 002 Sec. 5). docs/nlp.md describes the model and its checkpoints.

The forward pass, for token ids t [B, L] (and token types s [B, L]):

* embeddings: h⁰ = LN(E_word[t] + E_pos[0..L-1] + E_type[s]), then dropout (no E_type when
  ``type_vocab_size == 0``, as in DistilBERT);
* N post-LN layers: a = LN(h + Drop(W_o·MHA(h))), h' = LN(a + Drop(W_2·act(W_1·a))), where MHA is
  softmax(QKᵀ/√d_head + m)·V per head, m = 0 on real tokens and a large negative number on
  padding (id ``pad_token_id``), with dropout on the attention probabilities;
* head: p = act_pool(W_p·h_[CLS]) (BERT's pooler: tanh; DistilBERT's pre-classifier: ReLU), then
  dropout and the classifier W_c·p. ``features`` are p.

An example is int token ids [L], or [2, L] holding ids and token types; float arrays are accepted
and cast (the experiment runner builds its sample input as float32; ids below 2²⁴ are exact).
``mask`` (the example mask of the contract) is unused: no layer depends on the batch.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from fedjax_proj.core.types import Model
from fedjax_proj.models.base import from_flax

ACTIVATIONS = {
  # BERT's "gelu" is the exact (erf) GELU; "gelu_new" is the tanh approximation.
  "gelu": lambda x: jax.nn.gelu(x, approximate=False),
  "gelu_new": lambda x: jax.nn.gelu(x, approximate=True),
  "gelu_pytorch_tanh": lambda x: jax.nn.gelu(x, approximate=True),
  "relu": jax.nn.relu,
  "tanh": jnp.tanh,
}


@dataclasses.dataclass(frozen=True)
class BertConfig:
  """Shape and regularisation of the encoder (field names follow BERT's ``config.json``).

  Attributes:
    vocab_size: word-embedding rows.
    hidden_size: model width d.
    num_hidden_layers: N.
    num_attention_heads: heads (must divide ``hidden_size``).
    intermediate_size: feed-forward width.
    max_position_embeddings: longest sequence.
    type_vocab_size: token-type rows; 0 builds no token-type embedding (DistilBERT).
    hidden_act: feed-forward activation (a key of :data:`ACTIVATIONS`).
    pooler_act: activation of the [CLS] projection: "tanh" (BERT's pooler) or "relu"
      (DistilBERT's ``pre_classifier``).
    layer_norm_eps: LayerNorm epsilon.
    hidden_dropout_prob: dropout on embeddings, sub-layer outputs.
    attention_probs_dropout_prob: dropout on attention probabilities.
    classifier_dropout: dropout before the classifier (None: ``hidden_dropout_prob``).
    pad_token_id: token id that is padding (masked out of attention).
  """

  vocab_size: int = 30522
  hidden_size: int = 312
  num_hidden_layers: int = 4
  num_attention_heads: int = 12
  intermediate_size: int = 1200
  max_position_embeddings: int = 512
  type_vocab_size: int = 2
  hidden_act: str = "gelu"
  pooler_act: str = "tanh"
  layer_norm_eps: float = 1e-12
  hidden_dropout_prob: float = 0.1
  attention_probs_dropout_prob: float = 0.1
  classifier_dropout: float | None = None
  pad_token_id: int = 0

  def __post_init__(self):
    if self.hidden_size % self.num_attention_heads:
      raise ValueError(
        f"hidden_size={self.hidden_size} is not divisible by num_attention_heads="
        f"{self.num_attention_heads}; pick a head count that divides the width."
      )
    for field, value in (("hidden_act", self.hidden_act), ("pooler_act", self.pooler_act)):
      if value not in ACTIVATIONS:
        raise ValueError(f"{field}={value!r} is not supported; valid: {sorted(ACTIVATIONS)}.")


# TinyBERT General 4L-312 (huawei-noah/TinyBERT_General_4L_312D's config.json).
TINYBERT_4L_312 = BertConfig()
# DistilBERT base uncased (distilbert-base-uncased): no token types, ReLU pre-classifier, and
# seq_classif_dropout 0.2 before the classifier.
DISTILBERT = BertConfig(
  hidden_size=768,
  num_hidden_layers=6,
  num_attention_heads=12,
  intermediate_size=3072,
  type_vocab_size=0,
  pooler_act="relu",
  classifier_dropout=0.2,
)
# A random-init encoder small enough for CPU tests and smoke runs.
TINY = BertConfig(
  vocab_size=1000,
  hidden_size=32,
  num_hidden_layers=2,
  num_attention_heads=2,
  intermediate_size=64,
  max_position_embeddings=128,
)
SIZES: dict[str, BertConfig] = {
  "tinybert_4l_312": TINYBERT_4L_312,
  "distilbert": DISTILBERT,
  "tiny": TINY,
}


def split_tokens(x: jax.Array) -> tuple[jax.Array, jax.Array | None]:
  """[B, L] ids, or [B, 2, L] ids and token types -> (ids, types or None), as int32."""
  x = jnp.asarray(x)
  if x.ndim == 3 and x.shape[1] == 2:
    ids, types = x[:, 0], x[:, 1]
  elif x.ndim == 2:
    ids, types = x, None
  else:
    raise ValueError(
      f"text inputs have shape {x.shape}; expected token ids [B, L] or ids and token types "
      "stacked as [B, 2, L]."
    )
  ids = ids.astype(jnp.int32)
  return ids, None if types is None else types.astype(jnp.int32)


class BertLayer(nn.Module):
  """One post-LN Transformer layer (self-attention, then feed-forward)."""

  config: BertConfig

  @nn.compact
  def __call__(self, h: jax.Array, bias: jax.Array, train: bool) -> jax.Array:
    c = self.config
    b, length, d = h.shape
    heads = c.num_attention_heads
    dense = lambda n, name: nn.Dense(n, name=name)

    def split(t):
      return t.reshape(b, length, heads, d // heads)

    q, k, v = (split(dense(d, n)(h)) for n in ("query", "key", "value"))
    scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) / jnp.sqrt(jnp.float32(d // heads)) + bias
    probs = jax.nn.softmax(scores, axis=-1)
    probs = nn.Dropout(c.attention_probs_dropout_prob, deterministic=not train)(probs)
    context = jnp.einsum("bhqk,bkhd->bqhd", probs, v).reshape(b, length, d)
    attn = nn.Dropout(c.hidden_dropout_prob, deterministic=not train)(dense(d, "attn_out")(context))
    h = nn.LayerNorm(epsilon=c.layer_norm_eps, name="attn_ln")(h + attn)
    ffn = dense(d, "ffn_out")(ACTIVATIONS[c.hidden_act](dense(c.intermediate_size, "ffn_in")(h)))
    ffn = nn.Dropout(c.hidden_dropout_prob, deterministic=not train)(ffn)
    return nn.LayerNorm(epsilon=c.layer_norm_eps, name="ffn_ln")(h + ffn)


class BertClassifier(nn.Module):
  """Embeddings, ``num_hidden_layers`` :class:`BertLayer`, [CLS] projection and classifier.

  Attributes:
    config: the encoder's :class:`BertConfig`.
    num_classes: classifier width (None: no classifier, for multi-head wrappers).
  """

  config: BertConfig = TINYBERT_4L_312
  num_classes: int | None = 2

  def setup(self):
    c = self.config
    self.word = nn.Embed(c.vocab_size, c.hidden_size, name="word")
    self.position = nn.Embed(c.max_position_embeddings, c.hidden_size, name="position")
    if c.type_vocab_size:
      self.token_type = nn.Embed(c.type_vocab_size, c.hidden_size, name="token_type")
    self.embed_ln = nn.LayerNorm(epsilon=c.layer_norm_eps, name="embed_ln")
    self.layers = [BertLayer(c, name=f"layer_{i}") for i in range(c.num_hidden_layers)]
    self.pooler = nn.Dense(c.hidden_size, name="pooler")
    if self.num_classes is not None:
      self.head = nn.Dense(self.num_classes, name="head")
    self.embed_dropout = nn.Dropout(c.hidden_dropout_prob)
    rate = c.hidden_dropout_prob if c.classifier_dropout is None else c.classifier_dropout
    self.head_dropout = nn.Dropout(rate)

  def encode(self, x: jax.Array, train: bool = False) -> tuple[jax.Array, jax.Array]:
    """(sequence output [B, L, d], pooled [CLS] projection [B, d])."""
    c = self.config
    ids, types = split_tokens(x)
    length = ids.shape[1]
    if length > c.max_position_embeddings:
      raise ValueError(
        f"sequences of {length} tokens exceed max_position_embeddings="
        f"{c.max_position_embeddings}; tokenise with a max_len of at most that."
      )
    h = self.word(ids) + self.position(jnp.arange(length))[None]
    if c.type_vocab_size:
      h = h + self.token_type(jnp.zeros_like(ids) if types is None else types)
    h = self.embed_dropout(self.embed_ln(h), deterministic=not train)
    # Additive attention mask [B, 1, 1, L]: finite (the dtype's minimum) so an all-padding row
    # (the evaluator's padded examples) attends uniformly instead of producing NaN.
    bias = jnp.where(ids == c.pad_token_id, jnp.finfo(h.dtype).min, 0.0)[:, None, None, :]
    for layer in self.layers:
      h = layer(h, bias.astype(h.dtype), train)
    pooled = ACTIVATIONS[c.pooler_act](self.pooler(h[:, 0]))
    return h, pooled

  def __call__(self, x: jax.Array, train: bool, mask: jax.Array | None = None):
    del mask  # no layer depends on the batch
    _, pooled = self.encode(x, train)
    if self.num_classes is None:
      return None, pooled
    logits = self.head(self.head_dropout(pooled, deterministic=not train))
    return logits, pooled


def resolve_config(size: str | BertConfig | dict, **overrides: Any) -> BertConfig:
  """A :class:`BertConfig` from a size name (:data:`SIZES`), a config or a dict of fields."""
  if isinstance(size, str):
    if size not in SIZES:
      raise ValueError(f"unknown bert size {size!r}; valid: {sorted(SIZES)} (or a BertConfig).")
    config = SIZES[size]
  elif isinstance(size, BertConfig):
    config = size
  else:
    config = BertConfig(**dict(size))
  return dataclasses.replace(config, **overrides) if overrides else config


def bert_module(
  num_classes: int | None = 2, *, size: str | BertConfig | dict = "tinybert_4l_312", **overrides
) -> BertClassifier:
  """The bare linen module (see :func:`bert`)."""
  return BertClassifier(resolve_config(size, **overrides), num_classes)


def bert(
  num_classes: int = 2, *, size: str | BertConfig | dict = "tinybert_4l_312", **overrides: Any
) -> Model:
  """The encoder classifier as a :class:`Model`; features are the pooled [CLS] vector [B, d].

  A Hugging Face checkpoint's weights come from
  :func:`fedjax_proj.models.hf_checkpoint.pretrained_model` (``get_model("bert", n,
  checkpoint=...)`` picks it), which builds this same module from the checkpoint's config.

  Args:
    num_classes: classifier width.
    size: "tinybert_4l_312" (default), "distilbert", "tiny", a :class:`BertConfig` or a dict of
      its fields.
    **overrides: :class:`BertConfig` fields to change (e.g. ``hidden_dropout_prob=0.0``).

  Returns:
    The Model.
  """
  return from_flax("bert", bert_module(num_classes, size=size, **overrides), num_classes)
