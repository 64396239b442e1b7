"""transformers' ModernBERT (ModernBertModel, ModernBertForMaskedLM, ModernBertForSequenceClassification) <->
bertjax's encoder with the ModernBERT options (model.position=rope, ffn=geglu, norm=pre, use_bias=False, local
windows): the config.json keys, the weight names, and the configs bertjax refuses rather than approximates.

The layout differs from BERT's in three ways that the maps below absorb:
- HF fuses q, k, v into one `attn.Wqkv` [3H, H]: import splits it into three virtual tensors (`...Wqkv.weight:q`)
  that map like BERT's query/key/value; export joins them back.
- HF's first layer has no `attn_norm`, and a `final_norm` follows the last layer: bertjax's layer i owns the
  norm of its own output (`encoder/layers/out_ln`), i.e. HF's attn_norm of layer i + 1, and for the last layer
  final_norm (bertjax.model.encoder.Layer).
- GeGLU's `mlp.Wi` [2I, H] is bertjax's `ffn/intermediate` kernel [H, 2, I] (input half first, then the gate).
"""

import numpy as np

from bertjax.core.errors import UserError
from bertjax.hf import weights as W

PREFIX = "model."  # the base model inside *ForMaskedLM / *ForSequenceClassification
QKV = ("q", "k", "v")
KNOWN_LAYER_TYPES = {"full_attention": "global", "sliding_attention": "local"}
HF_LAYER_TYPE = {v: k for k, v in KNOWN_LAYER_TYPES.items()}
ACTIVATIONS = {"gelu": "gelu", "gelu_new": "gelu_new", "gelu_pytorch_tanh": "gelu_new", "gelu_fast": "gelu_new"}
HF_ACTIVATION = {"gelu": "gelu", "gelu_new": "gelu_new"}
DEFAULT_THETA = {"full_attention": 160_000.0, "sliding_attention": 10_000.0}  # ModernBertConfig.default_theta
BIAS_KEYS = ("attention_bias", "mlp_bias", "norm_bias", "classifier_bias")


def _refuse(key: str, value, why: str):
  raise UserError(f"config.json has {key}={value!r}, which bertjax cannot represent: {why}")


def _rope_thetas(hf: dict) -> dict:
  """layer type -> RoPE theta, from rope_parameters (transformers 5) or the older global/local_rope_theta
  keys; any rope_type but default, or any scaling, is refused."""
  if hf.get("rope_scaling"):
    _refuse("rope_scaling", hf["rope_scaling"], "bertjax has plain RoPE only")
  params = hf.get("rope_parameters") or {}
  old = {"full_attention": hf.get("global_rope_theta"), "sliding_attention": hf.get("local_rope_theta")}
  out = {}
  for kind, default in DEFAULT_THETA.items():
    p = params.get(kind) or {}
    if p.get("rope_type", "default") != "default":
      _refuse(f"rope_parameters.{kind}.rope_type", p["rope_type"], "bertjax has the default rotary embedding only")
    extra = sorted(set(p) - {"rope_type", "rope_theta"})
    if extra:
      _refuse(f"rope_parameters.{kind}.{extra[0]}", p[extra[0]], "bertjax has no RoPE scaling or partial rotation")
    out[kind] = float(p.get("rope_theta") or old[kind] or default)
  return out


def _layer_kinds(hf: dict) -> list:
  types = hf.get("layer_types")
  if types is None:
    every = hf.get("global_attn_every_n_layers", 3)
    return ["local" if i % every else "global" for i in range(hf["num_hidden_layers"])]
  for t in types:
    if t not in KNOWN_LAYER_TYPES:
      _refuse("layer_types", t, f"bertjax knows the layer types {', '.join(KNOWN_LAYER_TYPES)}")
  if len(types) != hf["num_hidden_layers"]:
    _refuse("layer_types", types, f"it names {len(types)} layers for num_hidden_layers={hf['num_hidden_layers']}")
  return [KNOWN_LAYER_TYPES[t] for t in types]


def model_section(hf: dict) -> dict:
  """bertjax `model` keys of a ModernBertConfig config.json; a UserError naming the key that bertjax cannot
  represent (another rope_type or scaling, a softcap, an unknown layer type, mixed biases, ...)."""
  for key, value in hf.items():
    if "softcap" in key and value:
      _refuse(key, value, "bertjax's attention and logits have no soft-capping")
  act = hf.get("hidden_activation", "gelu")
  if act not in ACTIVATIONS:
    _refuse("hidden_activation", act, f"bertjax supports {', '.join(ACTIVATIONS)}")
  cls_act = hf.get("classifier_activation", "gelu")
  if ACTIVATIONS.get(cls_act) != ACTIVATIONS[act]:
    _refuse("classifier_activation", cls_act, f"bertjax's heads use the encoder's activation ({act})")
  biases = {k: bool(hf.get(k, False)) for k in BIAS_KEYS}
  for k in BIAS_KEYS[1:]:
    if biases[k] != biases[BIAS_KEYS[0]]:
      _refuse(k, hf.get(k), f"bertjax's model.use_bias sets every bias alike (attention_bias={biases[BIAS_KEYS[0]]})")
  if not hf.get("decoder_bias", True):
    _refuse("decoder_bias", False, "bertjax's MLM decoder always has its output bias")
  if not hf.get("tie_word_embeddings", True):
    _refuse("tie_word_embeddings", False, "bertjax's MLM decoder is tied to the word embeddings")
  drops = {k: float(hf.get(k, 0.0)) for k in ("mlp_dropout", "embedding_dropout", "attention_dropout")}
  for k, v in drops.items():  # bertjax drops embeddings and block outputs at one rate (HF: Wo's at attention_dropout)
    if v != drops["mlp_dropout"]:
      _refuse(k, v, f"bertjax applies one dropout rate to the embeddings and every block (mlp_dropout={drops['mlp_dropout']})")
  hidden, heads = hf["hidden_size"], hf["num_attention_heads"]
  if hf.get("head_dim") not in (None, hidden // heads):
    _refuse("head_dim", hf["head_dim"], f"bertjax's heads are hidden_size / num_attention_heads = {hidden // heads} wide")
  thetas = _rope_thetas(hf)
  kinds = _layer_kinds(hf)
  every = 3
  pattern = ["local" if i % every else "global" for i in range(len(kinds))]
  local = "local" in kinds
  return dict(
      vocab_size=hf["vocab_size"], hidden_size=hidden, num_layers=hf["num_hidden_layers"], num_heads=heads,
      intermediate_size=hf["intermediate_size"], embedding_size=0, max_positions=hf.get("max_position_embeddings", 8192),
      type_vocab_size=0, dropout=drops["mlp_dropout"], attention_dropout=drops["attention_dropout"],
      layer_norm_eps=hf.get("norm_eps", 1e-5), init_std=hf.get("initializer_range", 0.02), activation=ACTIVATIONS[act],
      position_offset=0, position="rope", rope_theta=thetas["full_attention"],
      local_rope_theta=thetas["sliding_attention"], ffn="geglu", norm="pre", use_bias=biases["attention_bias"],
      local_window=int(hf.get("local_attention", 128)) if local else 0, global_every=every,
      layer_types="" if kinds == pattern or not local else ",".join(kinds), init="modernbert",
  )


def check_exportable(config, enc):
  """A bertjax model that ModernBertConfig can describe, or a UserError naming the key that differs."""
  m = config.model
  wants = dict(position="rope", norm="pre", ffn="geglu", type_vocab_size=0, sharing="none", position_offset=0)
  for key, want in wants.items():
    if m[key] != want:
      raise UserError(f"model.{key}={m[key]!r}: a ModernBERT export needs {want!r} (set model.position=rope, "
                      "ffn=geglu, norm=pre, type_vocab_size=0 together, as configs/modernbert.py does)")
  if enc.embedding_size != enc.hidden_size or enc.head_dim * enc.num_heads != enc.hidden_size:
    raise UserError("ModernBERT has no factorized embeddings or pruned heads; export the model without them")
  if enc.activation not in HF_ACTIVATION:
    raise UserError(f"model.activation={enc.activation!r} has no HF name")


def to_hf(config, enc, architecture: str, special) -> dict:
  """config.json of a ModernBERT export (ModernBertConfig's keys, every one bertjax's model section sets)."""
  check_exportable(config, enc)
  local = enc.local_layers or (False,) * enc.num_layers
  act = HF_ACTIVATION[enc.activation]
  return dict(
      architectures=[architecture], model_type="modernbert", vocab_size=enc.vocab_size, hidden_size=enc.hidden_size,
      intermediate_size=enc.intermediate_size, num_hidden_layers=enc.num_layers,
      num_attention_heads=enc.num_heads, hidden_activation=act, classifier_activation=act,
      max_position_embeddings=enc.max_positions, initializer_range=enc.init_std, norm_eps=enc.layer_norm_eps,
      attention_bias=enc.use_bias, mlp_bias=enc.use_bias, norm_bias=enc.use_bias, classifier_bias=enc.use_bias,
      decoder_bias=True, tie_word_embeddings=True,
      layer_types=[HF_LAYER_TYPE["local" if x else "global"] for x in local],
      local_attention=enc.local_window or 128,  # unused when every layer is global
      rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": enc.rope_theta},
                       "sliding_attention": {"rope_type": "default", "rope_theta": enc.local_rope_theta}},
      embedding_dropout=enc.dropout, mlp_dropout=enc.dropout, attention_dropout=enc.attention_dropout,
      pad_token_id=special.pad, bos_token_id=special.cls, eos_token_id=special.sep, cls_token_id=special.cls,
      sep_token_id=special.sep, torch_dtype="float32",
  )


def _linear(path: str, hf: str, stack, bias: bool, two_in: bool = False) -> list:
  return [e for e in W.entries_of(path, hf, stack, two_in) if bias or not e.path.endswith("/bias")]


def body(prefix: str, num_layers: int, bias: bool) -> list:
  """Entries of the embeddings and the layers (final norm included) under HF's `prefix` ("model." or "")."""
  layers = range(num_layers)
  lp = prefix + "layers.{i}."
  out = [W.Entry("embeddings/word", (prefix + "embeddings.tok_embeddings.weight",), "raw")]
  out += _linear("embeddings/ln", prefix + "embeddings.norm", None, bias)
  for name, q in zip(("query", "key", "value"), QKV):
    out += [W.Entry(f"encoder/layers/attention/{name}/kernel", tuple(lp.format(i=i) + f"attn.Wqkv.weight:{q}"
                                                                    for i in layers), "kernel", True)]
    if bias:
      out += [W.Entry(f"encoder/layers/attention/{name}/bias", tuple(lp.format(i=i) + f"attn.Wqkv.bias:{q}"
                                                                    for i in layers), "vector", True)]
  out += _linear("encoder/layers/attention/output", lp + "attn.Wo", layers, bias, two_in=True)
  out += _linear("encoder/layers/ffn/ln", lp + "mlp_norm", layers, bias)
  out += _linear("encoder/layers/ffn/intermediate", lp + "mlp.Wi", layers, bias)
  out += _linear("encoder/layers/ffn/output", lp + "mlp.Wo", layers, bias)
  norms = [lp.format(i=i + 1) + "attn_norm" for i in range(num_layers - 1)] + [prefix + "final_norm"]
  out += [W.Entry("encoder/layers/out_ln/scale", tuple(n + ".weight" for n in norms), "vector", True)]
  if bias:
    out += [W.Entry("encoder/layers/out_ln/bias", tuple(n + ".bias" for n in norms), "vector", True)]
  return out


def mlm_head(bias: bool) -> list:
  """ModernBertForMaskedLM's head (dense, act, norm) and decoder bias; the decoder weight is the tied table."""
  return (_linear("mlm/transform", "head.dense", None, bias) + _linear("mlm/ln", "head.norm", None, bias)
          + [W.Entry("mlm/bias", ("decoder.bias",), "vector")])


def classifier_head(bias: bool) -> list:
  """ModernBertForSequenceClassification's head (dense, act, norm: bertjax's `pooler`) and classifier (with bias)."""
  return (_linear("pooler/dense", "head.dense", None, bias) + _linear("pooler/ln", "head.norm", None, bias)
          + W.entries_of("classifier", "classifier"))


def split_qkv(tensors: dict) -> dict:
  """The checkpoint's tensors with every fused attn.Wqkv weight (and bias) also as its q, k, v thirds."""
  out = dict(tensors)
  for name, value in tensors.items():
    if ".attn.Wqkv." in name:
      for q, part in zip(QKV, np.split(np.asarray(value), 3, axis=0)):
        out[f"{name}:{q}"] = part
  return out


def join_qkv(tensors: dict) -> dict:
  """Exported tensors with the q, k, v thirds fused back into attn.Wqkv."""
  out = {k: v for k, v in tensors.items() if ":" not in k}
  for name in {k.rsplit(":", 1)[0] for k in tensors if ":" in k}:
    out[name] = np.concatenate([tensors[f"{name}:{q}"] for q in QKV], axis=0)
  return out


def heads_of(tensors: dict) -> set:
  """"mlm" for a ModernBertForMaskedLM, "classifier" for a ModernBertForSequenceClassification, none for a
  bare ModernBertModel."""
  if "decoder.bias" in tensors:
    return {"mlm"}
  if "classifier.weight" in tensors:
    return {"classifier"}
  return set()


def prefix_of(tensors: dict) -> str:
  return PREFIX if any(k.startswith(PREFIX) for k in tensors) else ""
