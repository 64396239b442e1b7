"""transformers' XLNet (XLNetModel, XLNetLMHeadModel, XLNetForSequenceClassification,
XLNetForQuestionAnsweringSimple) <-> bertjax's XLNet (bertjax.model.xlnet, xlnet_models): config.json keys,
weight names, and the configs bertjax refuses rather than approximates.

The weights map one to one: transformers keeps q, k, v, o, r as [d_model, n_head, d_head] parameters (so do we),
the three relative biases and seg_embed per layer (`untie_r` true, the only form transformers has), and Linear
weights [out, in] (ours [in, out]). bertjax stacks the layers on a leading axis (`transformer/layer/...`).
mask_emb is [1, 1, d] there and [d] here. The LM weight is tied to the word embedding; its bias is `lm_loss/bias`.
"""

import numpy as np

from bertjax.core import config as config_lib
from bertjax.core.errors import UserError
from bertjax.model import config as model_config, memory, xlnet_models

ARCHITECTURES = {"lm": "XLNetLMHeadModel", "base": "XLNetModel", "classifier": "XLNetForSequenceClassification",
                 "span": "XLNetForQuestionAnsweringSimple"}
KIND_OF = {v: k for k, v in ARCHITECTURES.items()}
ACTIVATIONS = {"gelu": "gelu", "relu": "relu", "gelu_new": "gelu_new"}
ATTENTION = ("q", "k", "v", "o", "r", "r_w_bias", "r_r_bias", "r_s_bias", "seg_embed")
# (bertjax path under a layer, transformers name under `layer.{i}.`, Linear: transposed)
LAYER = [(f"rel_attn/{n}", f"rel_attn.{n}", False) for n in ATTENTION] + [
    ("rel_attn/layer_norm/scale", "rel_attn.layer_norm.weight", False),
    ("rel_attn/layer_norm/bias", "rel_attn.layer_norm.bias", False),
    ("ff/layer_norm/scale", "ff.layer_norm.weight", False), ("ff/layer_norm/bias", "ff.layer_norm.bias", False),
    ("ff/layer_1/kernel", "ff.layer_1.weight", True), ("ff/layer_1/bias", "ff.layer_1.bias", False),
    ("ff/layer_2/kernel", "ff.layer_2.weight", True), ("ff/layer_2/bias", "ff.layer_2.bias", False)]
HEADS = {  # per model kind: (bertjax path, transformers name, transposed)
    "lm": [("lm_loss/bias", "lm_loss.bias", False)],
    "base": [],
    "classifier": [("summary/kernel", "sequence_summary.summary.weight", True),
                   ("summary/bias", "sequence_summary.summary.bias", False),
                   ("logits_proj/kernel", "logits_proj.weight", True), ("logits_proj/bias", "logits_proj.bias", False)],
    "span": [("qa_outputs/kernel", "qa_outputs.weight", True), ("qa_outputs/bias", "qa_outputs.bias", False)],
}


def _refuse(key: str, value, why: str):
  raise UserError(f"config.json has {key}={value!r}, which bertjax cannot represent: {why}")


def model_section(hf: dict) -> dict:
  """bertjax `model` keys (with the `xlnet` section) of an XLNetConfig config.json; a one-line UserError naming
  a key bertjax cannot represent (untie_r false, same_length true, another summary, ...)."""
  if not hf.get("untie_r", True):
    _refuse("untie_r", hf["untie_r"], "bertjax's XLNet has r_w/r_r/r_s biases per layer (untie_r true, as "
            "transformers and the released checkpoints)")
  if hf.get("same_length", False):
    _refuse("same_length", True, "bertjax's causal mask is transformers' default (same_length false)")
  act = hf.get("ff_activation", "gelu")
  if act not in ACTIVATIONS:
    _refuse("ff_activation", act, f"bertjax supports {', '.join(ACTIVATIONS)}")
  if hf.get("attn_type", "bi") not in ("bi", "uni"):
    _refuse("attn_type", hf["attn_type"], "use bi or uni")
  if hf.get("summary_type", "last") != "last" or not hf.get("summary_use_proj", True) or \
     hf.get("summary_activation", "tanh") != "tanh" or hf.get("summary_proj_to_labels", False) or \
     hf.get("summary_first_dropout", 0.0):
    _refuse("summary_type", hf.get("summary_type"), "bertjax's summary is the last position, Linear d->d, tanh, "
            "then dropout (summary_use_proj true, summary_activation tanh, no first dropout)")
  d, n = hf.get("d_model", 1024), hf.get("n_head", 16)
  if d % n or hf.get("d_head", d // n) != d // n:
    _refuse("d_head", hf.get("d_head"), f"it must be d_model / n_head = {d // n}")
  return dict(
      vocab_size=hf.get("vocab_size", 32000), hidden_size=d, num_layers=hf.get("n_layer", 24), num_heads=n,
      intermediate_size=hf.get("d_inner", 4096), embedding_size=0, dropout=hf.get("dropout", 0.1),
      attention_dropout=hf.get("dropout", 0.1), layer_norm_eps=hf.get("layer_norm_eps", 1e-12),
      init_std=hf.get("initializer_range", 0.02), activation=ACTIVATIONS[act], layer="xlnet", type_vocab_size=3,
      # transformers' mem_len null (the hub's) keeps every past row; under jit memory has a fixed size, so 0
      # (no memory) unless the run sets model.xlnet.mem_len.
      xlnet=dict(mem_len=hf.get("mem_len") or 0, reuse_len=hf.get("reuse_len") or 0,
                 clamp_len=hf.get("clamp_len", -1), bi_data=bool(hf.get("bi_data", False)),
                 attn_type=hf.get("attn_type", "bi")))


def to_hf(config, kind: str, special=None, num_labels: int = 2) -> dict:
  """config.json of an exported XLNet `kind` (lm, base, classifier, span)."""
  m, x = config.model, config.model.xlnet
  if x.cmem_len:
    raise UserError(f"model.xlnet.cmem_len={x.cmem_len}: transformers' XLNet has no compressed memory, so this "
                    "model has no HF export; set cmem_len 0")
  hf = dict(architectures=[ARCHITECTURES[kind]], model_type="xlnet", vocab_size=m.vocab_size, d_model=m.hidden_size,
            n_layer=m.num_layers, n_head=m.num_heads, d_head=m.hidden_size // m.num_heads, d_inner=m.intermediate_size,
            ff_activation=m.activation, untie_r=True, attn_type=x.attn_type, initializer_range=m.init_std,
            layer_norm_eps=m.layer_norm_eps, dropout=m.dropout, mem_len=x.mem_len or None,
            reuse_len=x.reuse_len or None, bi_data=x.bi_data, clamp_len=x.clamp_len, same_length=False,
            summary_type="last", summary_use_proj=True, summary_activation="tanh", summary_last_dropout=0.1,
            tie_word_embeddings=True, torch_dtype="float32")
  if kind in ("classifier", "span"):
    hf["num_labels"] = num_labels if kind == "classifier" else 2
  if special is not None:
    hf.update(pad_token_id=special.pad, bos_token_id=1, eos_token_id=2)
  return hf


def config_from_hf(hf: dict):
  """A bertjax run config for an imported XLNet (configs/xlnet.py's sections, the checkpoint's model)."""
  c = config_lib.defaults()
  section = model_section(hf)
  x = section.pop("xlnet")
  c.model.update(section)
  c.model.xlnet = memory.section(**x)
  return c


def _prefix(tensors: dict) -> str:
  return "transformer." if any(k.startswith("transformer.") for k in tensors) else ""


def _put(tree: dict, path: str, value):
  *scopes, leaf = path.split("/")
  for s in scopes:
    tree = tree.setdefault(s, {})
  tree[leaf] = value


def _get(tree: dict, path: str):
  for s in path.split("/"):
    tree = tree[s]
  return tree


def params_from_hf(tensors: dict, num_layers: int, kind: str) -> dict:
  """bertjax params of the model `kind` from transformers' state dict (numpy): {"transformer": ..., heads}."""
  p = _prefix(tensors)
  need = lambda name: tensors[name] if name in tensors else _missing(name)
  body = {"word_embedding": need(p + "word_embedding.weight"), "mask_emb": need(p + "mask_emb").reshape(-1)}
  for path, name, transposed in LAYER:
    stack = [need(f"{p}layer.{i}.{name}") for i in range(num_layers)]
    _put(body, "layer/" + path, np.stack([s.T if transposed else s for s in stack]))
  params = {"transformer": body}
  for path, name, transposed in HEADS[kind]:
    _put(params, path, need(name).T if transposed else need(name))
  return params


def _missing(name):
  raise UserError(f"the checkpoint lacks {name}; is it an XLNet checkpoint matching its config.json?")


def params_to_hf(params: dict, num_layers: int, kind: str) -> dict:
  """transformers' state dict (numpy float32) of the model `kind` from bertjax params."""
  p = "" if kind == "base" else "transformer."
  body = params["transformer"]
  out = {p + "word_embedding.weight": body["word_embedding"], p + "mask_emb": body["mask_emb"].reshape(1, 1, -1)}
  for path, name, transposed in LAYER:
    stack = _get(body, "layer/" + path)
    for i in range(num_layers):
      out[f"{p}layer.{i}.{name}"] = stack[i].T if transposed else stack[i]
  for path, name, transposed in HEADS[kind]:
    out[name] = _get(params, path).T if transposed else _get(params, path)
  if kind == "lm":
    out["lm_loss.weight"] = body["word_embedding"]
  return {k: np.ascontiguousarray(np.asarray(v, np.float32)) for k, v in out.items()}


def kind_of(hf: dict, tensors: dict) -> str:
  """Which model a checkpoint holds: its architectures entry, else what its head tensors say."""
  for arch in hf.get("architectures") or []:
    if arch in KIND_OF:
      return KIND_OF[arch]
  if "lm_loss.bias" in tensors:
    return "lm"
  if "logits_proj.weight" in tensors:
    return "classifier"
  if "qa_outputs.weight" in tensors:
    return "span"
  return "base"


def model_for(config, kind: str, num_labels: int = 2, deterministic: bool = True):
  """The flax model of an XLNet `kind` (lm, base, classifier, span) for a bertjax config."""
  cfg, mc = model_config.encoder_config(config.model), memory.memory_config(config.model.xlnet)
  if kind == "lm":
    return xlnet_models.XLNetLMHeadModel(cfg, mc, deterministic)
  if kind == "classifier":
    return xlnet_models.XLNetSequenceClassifier(cfg, num_labels, mc, deterministic=deterministic)
  if kind == "span":
    return xlnet_models.XLNetSpanHead(cfg, mc, deterministic)
  return xlnet_models.XLNetBase(cfg, mc, deterministic)


def read(hf: dict, tensors: dict):
  """(bertjax config, kind, params of that kind's model with `transformer` at the top, num_labels, unused
  tensors) of an XLNet checkpoint's config.json and state dict."""
  config = config_from_hf(hf)
  kind = kind_of(hf, tensors)
  params = params_from_hf(tensors, config.model.num_layers, kind)
  p = _prefix(tensors)
  used = {p + "word_embedding.weight", p + "mask_emb", "lm_loss.weight"}
  used |= {f"{p}layer.{i}.{name}" for i in range(config.model.num_layers) for _, name, _ in LAYER}
  used |= {name for _, name, _ in HEADS[kind]}
  num_labels = int(params["logits_proj"]["bias"].shape[0]) if kind == "classifier" else 2
  return config, kind, params, num_labels, sorted(set(tensors) - used)


def lm_params(params: dict, vocab_size: int) -> dict:
  """XLNetLMHeadModel params from any kind's (the LM bias zero where the checkpoint has none)."""
  bias = params.get("lm_loss", {}).get("bias")
  return {"transformer": params["transformer"],
          "lm_loss": {"bias": np.zeros(vocab_size, np.float32) if bias is None else bias}}


def export(config, params, kind: str, special=None, num_labels: int = 2):
  """(config.json, state dict) of an XLNet `kind` from bertjax params ({"transformer": ..., heads})."""
  params = {k: v for k, v in params.items()}
  if kind == "classifier":
    num_labels = int(np.asarray(params["logits_proj"]["bias"]).shape[0])
  hf = to_hf(config, kind, special, num_labels)
  return hf, params_to_hf(params, config.model.num_layers, kind)
