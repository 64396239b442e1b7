"""transformers' Reformer (ReformerForMaskedLM, ReformerModelWithLMHead) <-> bertjax's Reformer encoder
(model.layer=reformer, norm=reversible, position=axial or learned, attention_kind=per_layer over local and lsh,
mlm_decoder=untied): the config.json keys, and the weights both ways as numpy trees.

Weight names, transformers -> bertjax (per layer i; q/k/v and the output projection have no bias):
- reformer.embeddings.word_embeddings.weight [V, H] -> embeddings/word
- reformer.embeddings.position_embeddings.weights.{0,1} [d1, 1, e1], [1, d2, e2] -> embeddings/axial_{0,1}
  [d1, e1], [d2, e2] (or position_embeddings.embedding.weight -> embeddings/position without axial positions)
- ...layers.{i}.attention.layer_norm -> encoder/layers/layer_{i}/attention/ln
- ...attention.self_attention.{query_key | query, key}, value [nh dh, H] -> .../attention/self/<same> [H, nh, dh]
- ...attention.output.dense [H, nh dh] -> .../attention/self/output [nh, dh, H]
- ...feed_forward.{layer_norm, dense.dense, output.dense} -> .../ffn/chunk/{ln, intermediate, output}
- reformer.encoder.layer_norm [2H] -> encoder/layers/ln; lm_head.decoder [V, 2H] -> mlm/decoder; lm_head.bias ->
  mlm/bias (transformers' forward pass does not read it).
"""

import numpy as np

from bertjax.core.errors import UserError

BASE = "reformer."
ARCHITECTURES = {False: "ReformerForMaskedLM", True: "ReformerModelWithLMHead"}  # by is_decoder (causal)


def model_section(hf: dict) -> dict:
  """bertjax `model` keys of a ReformerConfig config.json; a UserError for what bertjax cannot represent."""
  layers = list(hf.get("attn_layers") or ["local", "lsh", "local", "lsh", "local", "lsh"])
  if hf.get("num_hidden_layers", len(layers)) != len(layers):
    raise UserError(f"config.json has num_hidden_layers={hf['num_hidden_layers']} but {len(layers)} attn_layers")
  if hf.get("chunk_size_lm_head", 0):
    raise UserError("config.json has chunk_size_lm_head; bertjax decodes only the MLM positions, unchunked")
  buckets = hf.get("num_buckets")
  axial = bool(hf.get("axial_pos_embds", True))
  return dict(
      vocab_size=hf["vocab_size"], hidden_size=hf["hidden_size"], num_layers=len(layers),
      num_heads=hf["num_attention_heads"], head_size=hf["attention_head_size"],
      intermediate_size=hf["feed_forward_size"], embedding_size=0, activation=hf.get("hidden_act", "relu"),
      max_positions=hf["max_position_embeddings"], type_vocab_size=0, dropout=hf["hidden_dropout_prob"],
      attention_dropout=hf["lsh_attention_probs_dropout_prob"],
      local_attention_dropout=hf["local_attention_probs_dropout_prob"], layer_norm_eps=hf["layer_norm_eps"],
      init_std=hf["initializer_range"], use_bias=False, layer="reformer", norm="reversible", mlm_decoder="untied",
      attention="xla", attention_kind="per_layer", attn_layers=",".join(layers), causal=bool(hf.get("is_decoder")),
      local_attn_chunk_length=hf["local_attn_chunk_length"], lsh_attn_chunk_length=hf["lsh_attn_chunk_length"],
      local_num_chunks_before=hf["local_num_chunks_before"], local_num_chunks_after=hf["local_num_chunks_after"],
      lsh_num_chunks_before=hf["lsh_num_chunks_before"], lsh_num_chunks_after=hf["lsh_num_chunks_after"],
      num_hashes=hf["num_hashes"], num_buckets="" if buckets is None else ",".join(map(str, np.atleast_1d(buckets))),
      hash_seed=-1 if hf.get("hash_seed") is None else hf["hash_seed"],
      chunk_size_feed_forward=hf.get("chunk_size_feed_forward", 0),
      position="axial" if axial else "learned",
      axial_pos_shape=tuple(hf["axial_pos_shape"]) if axial else (),
      axial_pos_embds_dim=tuple(hf["axial_pos_embds_dim"]) if axial else (),
      axial_norm_std=hf.get("axial_norm_std", 1.0))


def to_hf(enc, pad_id: int = 0) -> dict:
  """config.json (ReformerConfig's keys) of a bertjax Reformer's EncoderConfig."""
  buckets = list(enc.num_buckets)
  return dict(
      architectures=[ARCHITECTURES[enc.causal]], model_type="reformer", vocab_size=enc.vocab_size,
      hidden_size=enc.hidden_size, num_attention_heads=enc.num_heads, attention_head_size=enc.head_dim,
      num_hidden_layers=enc.num_layers, attn_layers=[pattern_of(enc)[i] for i in range(enc.num_layers)],
      feed_forward_size=enc.intermediate_size, hidden_act=enc.activation, max_position_embeddings=enc.max_positions,
      hidden_dropout_prob=enc.dropout, lsh_attention_probs_dropout_prob=enc.attention_dropout,
      local_attention_probs_dropout_prob=(enc.local_attention_dropout if enc.local_attention_dropout >= 0
                                          else enc.attention_dropout),
      layer_norm_eps=enc.layer_norm_eps, initializer_range=enc.init_std, is_decoder=enc.causal,
      local_attn_chunk_length=enc.local_attn_chunk_length, lsh_attn_chunk_length=enc.lsh_attn_chunk_length,
      local_num_chunks_before=enc.local_num_chunks_before, local_num_chunks_after=enc.local_num_chunks_after,
      lsh_num_chunks_before=enc.lsh_num_chunks_before, lsh_num_chunks_after=enc.lsh_num_chunks_after,
      num_hashes=enc.num_hashes, num_buckets=(buckets[0] if len(buckets) == 1 else buckets) or None,
      hash_seed=None if enc.hash_seed < 0 else enc.hash_seed, chunk_size_feed_forward=enc.chunk_size_feed_forward,
      chunk_size_lm_head=0, axial_pos_embds=enc.position == "axial",
      axial_pos_shape=list(enc.axial_pos_shape), axial_pos_embds_dim=list(enc.axial_pos_embds_dim),
      axial_norm_std=enc.axial_norm_std, pad_token_id=pad_id, tie_word_embeddings=False, torch_dtype="float32")


def pattern_of(enc) -> list:
  """Every layer's attention kind (local or lsh)."""
  if enc.attention_kind == "per_layer":
    names = list(enc.attn_layers)
    return names * (enc.num_layers // len(names))
  return [enc.attention_kind] * enc.num_layers


def _linear(t, prefix, shape_in=None, shape_out=None, bias=True):
  """{kernel[, bias]} of a torch Linear `prefix` (weight [out, in]) as bertjax's kernel [*in, *out]."""
  w = np.asarray(t[prefix + ".weight"]).T
  kernel = w.reshape((shape_in or (w.shape[0],)) + (shape_out or (w.shape[1],)))
  out = {"kernel": kernel}
  if bias:
    out["bias"] = np.asarray(t[prefix + ".bias"])
  return out


def _norm(t, prefix):
  return {"scale": np.asarray(t[prefix + ".weight"]), "bias": np.asarray(t[prefix + ".bias"])}


def params_from_hf(tensors: dict, enc) -> dict:
  """bertjax parameters (numpy) of a ReformerForMaskedLM / ReformerModelWithLMHead state dict."""
  t, nh, dh = tensors, enc.num_heads, enc.head_dim
  emb = {"word": np.asarray(t[BASE + "embeddings.word_embeddings.weight"])}
  if enc.position == "axial":
    for j in range(2):
      w = np.asarray(t[BASE + f"embeddings.position_embeddings.weights.{j}"])
      emb[f"axial_{j}"] = w.reshape(-1, w.shape[-1])
  else:
    emb["position"] = np.asarray(t[BASE + "embeddings.position_embeddings.embedding.weight"])
  layers = {}
  for i, kind in enumerate(pattern_of(enc)):
    p = BASE + f"encoder.layers.{i}."
    sa = p + "attention.self_attention."
    names = ("query_key", "value") if kind == "lsh" else ("query", "key", "value")
    attention = {n: _linear(t, sa + n, None, (nh, dh), bias=False) for n in names}
    attention["output"] = _linear(t, p + "attention.output.dense", (nh, dh), None, bias=False)
    ffn = {"ln": _norm(t, p + "feed_forward.layer_norm"),
           "intermediate": _linear(t, p + "feed_forward.dense.dense"), "output": _linear(t, p + "feed_forward.output.dense")}
    layers[f"layer_{i}"] = {"attention": {"ln": _norm(t, p + "attention.layer_norm"), "self": attention},
                            "ffn": {"chunk": ffn}}
  layers["ln"] = _norm(t, BASE + "encoder.layer_norm")
  return {"embeddings": emb, "encoder": {"layers": layers},
          "mlm": {"decoder": _linear(t, "lm_head.decoder"), "bias": np.asarray(t["lm_head.bias"])}}


def params_to_hf(params: dict, enc) -> dict:
  """The state dict (numpy) of a ReformerForMaskedLM / ReformerModelWithLMHead from bertjax parameters."""
  out = {BASE + "embeddings.word_embeddings.weight": np.asarray(params["embeddings"]["word"])}
  if enc.position == "axial":
    (d1, d2) = enc.axial_pos_shape
    for j, shape in enumerate(((d1, 1), (1, d2))):
      w = np.asarray(params["embeddings"][f"axial_{j}"])
      out[BASE + f"embeddings.position_embeddings.weights.{j}"] = w.reshape(shape + (w.shape[-1],))
  else:
    out[BASE + "embeddings.position_embeddings.embedding.weight"] = np.asarray(params["embeddings"]["position"])

  def linear(prefix, p, n_in):
    k = np.asarray(p["kernel"])
    out[prefix + ".weight"] = k.reshape(int(np.prod(k.shape[:n_in])), -1).T
    if "bias" in p:
      out[prefix + ".bias"] = np.asarray(p["bias"])

  def norm(prefix, p):
    out[prefix + ".weight"], out[prefix + ".bias"] = np.asarray(p["scale"]), np.asarray(p["bias"])

  layers = params["encoder"]["layers"]
  for i in range(enc.num_layers):
    p, ours = BASE + f"encoder.layers.{i}.", layers[f"layer_{i}"]
    norm(p + "attention.layer_norm", ours["attention"]["ln"])
    for name, value in ours["attention"]["self"].items():
      if name == "output":
        linear(p + "attention.output.dense", value, 2)
      else:
        linear(p + "attention.self_attention." + name, value, 1)
    ffn = ours["ffn"]["chunk"]
    norm(p + "feed_forward.layer_norm", ffn["ln"])
    linear(p + "feed_forward.dense.dense", ffn["intermediate"], 1)
    linear(p + "feed_forward.output.dense", ffn["output"], 1)
  norm(BASE + "encoder.layer_norm", layers["ln"])
  linear("lm_head.decoder", params["mlm"]["decoder"], 1)
  out["lm_head.bias"] = np.asarray(params["mlm"]["bias"])
  return out
