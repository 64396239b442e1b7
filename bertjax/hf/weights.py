"""Name maps between HF transformers' BERT/RoBERTa/ALBERT/ELECTRA/DistilBERT weights and bertjax's parameter tree.

A map is a list of `Entry(path, hf_names, kind)`: one bertjax leaf ("encoder/layers/attention/query/kernel")
and the HF tensor(s) it is made of. Per-layer HF tensors are stacked on the leading axis that bertjax's
scanned layers (or ALBERT's shared groups) carry. torch Linear weights are [out, in]; bertjax kernels are
[in..., out...] (q/k/v [H, heads, head_dim], attention output [heads, head_dim, H]), hence `kind`.
The same map is read one way to import and the other way to export.
"""

import dataclasses

import numpy as np

from bertjax.core.errors import UserError

# Sub-modules of one transformer layer: (bertjax path inside a layer, HF name inside a BERT layer,
# HF name inside an ALBERT layer).
LAYER = (
    ("attention/query", "attention.self.query", "attention.query"),
    ("attention/key", "attention.self.key", "attention.key"),
    ("attention/value", "attention.self.value", "attention.value"),
    ("attention/output", "attention.output.dense", "attention.dense"),
    ("attention/ln", "attention.output.LayerNorm", "attention.LayerNorm"),
    ("ffn/intermediate", "intermediate.dense", "ffn"),
    ("ffn/output", "output.dense", "ffn_output"),
    ("ffn/ln", "output.LayerNorm", "full_layer_layer_norm"),
)
# DistilBERT's layer: bertjax path inside a layer -> HF name inside `transformer.layer.{i}`.
DISTILBERT_LAYER = (
    ("attention/query", "attention.q_lin"), ("attention/key", "attention.k_lin"),
    ("attention/value", "attention.v_lin"), ("attention/output", "attention.out_lin"),
    ("attention/ln", "sa_layer_norm"), ("ffn/intermediate", "ffn.lin1"), ("ffn/output", "ffn.lin2"),
    ("ffn/ln", "output_layer_norm"),
)
# Heads per family: (bertjax module, HF module); a name ending in "ln" is a LayerNorm, else a Linear.
MLM_HEADS = {
    "bert": (("mlm/transform", "cls.predictions.transform.dense"), ("mlm/ln", "cls.predictions.transform.LayerNorm")),
    "roberta": (("mlm/transform", "lm_head.dense"), ("mlm/ln", "lm_head.layer_norm")),
    "albert": (("mlm/transform", "predictions.dense"), ("mlm/ln", "predictions.LayerNorm")),
    "electra": (("mlm/transform", "generator_predictions.dense"), ("mlm/ln", "generator_predictions.LayerNorm")),
}
MLM_HEADS["distilbert"] = (("mlm/transform", "vocab_transform"), ("mlm/ln", "vocab_layer_norm"))
MLM_BIAS = {"bert": "cls.predictions.bias", "roberta": "lm_head.bias", "albert": "predictions.bias",
            "electra": "generator_lm_head.bias", "distilbert": "vocab_projector.bias", "modernbert": "decoder.bias",
            "mobilebert": "cls.predictions.bias", "reformer": "lm_head.bias"}
SENTENCE_CLASSIFIER = {"bert": "cls.seq_relationship", "albert": "sop_classifier.classifier",
                       "mobilebert": "cls.seq_relationship"}
RTD_HEAD = (("rtd/transform", "discriminator_predictions.dense"), ("rtd/logit", "discriminator_predictions.dense_prediction"))
PREFIX = {"bert": "bert.", "roberta": "roberta.", "albert": "albert.", "electra": "electra.",
          "distilbert": "distilbert.", "modernbert": "model.",
          "mobilebert": "mobilebert.", "reformer": "reformer."}  # own maps: bertjax.hf.modernbert, .mobilebert, .reformer


@dataclasses.dataclass(frozen=True)
class Entry:
  """One bertjax leaf and its HF tensors (several when stacked over layers or groups)."""

  path: str  # "/"-joined bertjax parameter path
  hf: tuple  # HF tensor names; one unless stacked
  kind: str  # "kernel" (torch Linear weight), "kernel2" (two input axes), "vector" (reshaped), "raw"
  stacked: bool = False


def entries_of(path: str, hf: str, stack=None, two_in: bool = False) -> list:
  """Entries of a Linear (kernel, bias) or LayerNorm (scale, bias) at bertjax `path`, HF name `hf`
  (a template with {i} when stacked over `stack` indices)."""
  names = lambda suffix: tuple(hf.format(i=i) + suffix for i in stack) if stack else (hf + suffix,)
  st = stack is not None
  if path.endswith("ln"):
    return [Entry(path + "/scale", names(".weight"), "vector", st), Entry(path + "/bias", names(".bias"), "vector", st)]
  return [Entry(path + "/kernel", names(".weight"), "kernel2" if two_in else "kernel", st),
          Entry(path + "/bias", names(".bias"), "vector", st)]


def embeddings(prefix: str) -> list:
  """The embedding table entries (word, position, type, LayerNorm)."""
  p = prefix + "embeddings."
  return [Entry("embeddings/word", (p + "word_embeddings.weight",), "raw"),
          Entry("embeddings/position", (p + "position_embeddings.weight",), "raw"),
          Entry("embeddings/type", (p + "token_type_embeddings.weight",), "raw"),
          *entries_of("embeddings/ln", p + "LayerNorm")]


def encoder(prefix: str, num_layers: int, scope: str = "encoder", projection: bool = False) -> list:
  """BERT-layout layers (BERT, RoBERTa, ELECTRA), stacked under `scope`/layers."""
  out = entries_of(f"{scope}/embedding_projection", prefix + "embeddings_project") if projection else []
  for sub, hf, _ in LAYER:
    out += entries_of(f"{scope}/layers/{sub}", prefix + "encoder.layer.{i}." + hf, range(num_layers),
                   two_in=sub == "attention/output")
  return out


def distilbert_encoder(prefix: str, num_layers: int) -> list:
  """DistilBERT's layers (`transformer.layer.{i}`), stacked under encoder/layers."""
  out = []
  for sub, hf in DISTILBERT_LAYER:
    out += entries_of(f"encoder/layers/{sub}", prefix + "transformer.layer.{i}." + hf, range(num_layers),
                      two_in=sub == "attention/output")
  return out


def albert_encoder(prefix: str, num_groups: int, shared: bool) -> list:
  """ALBERT layout: one HF layer group per bertjax shared group (sharing "all"), or per layer (sharing
  "none", which HF expresses as num_hidden_groups = num_layers)."""
  out = entries_of("encoder/embedding_projection", prefix + "encoder.embedding_hidden_mapping_in")
  where = "encoder" if shared else "encoder/layers"
  for sub, _, hf in LAYER:
    out += entries_of(f"{where}/{sub}", prefix + "encoder.albert_layer_groups.{i}.albert_layers.0." + hf,
                   range(num_groups), two_in=sub == "attention/output")
  return out


def mlm_head(family: str, scope: str = "mlm") -> list:
  out = [e for bjx, hf in MLM_HEADS[family] for e in entries_of(bjx.replace("mlm", scope), hf)]
  return out + [Entry(f"{scope}/bias", (MLM_BIAS[family],), "vector")]


def sentence_head(family: str, prefix: str) -> list:
  return entries_of("sentence/pooler", prefix + "pooler.dense" if family != "albert" else prefix + "pooler") + \
      entries_of("sentence/classifier", SENTENCE_CLASSIFIER[family])


def rtd_head() -> list:
  return [e for bjx, hf in RTD_HEAD for e in entries_of(bjx, hf)]


# ---------------------------------------------------------------- conversion of single tensors


def to_bertjax(array: np.ndarray, kind: str, shape: tuple) -> np.ndarray:
  """One HF tensor (one layer's) in the layout of a bertjax leaf of `shape`."""
  array = np.asarray(array, np.float32)
  if kind in ("kernel", "kernel2"):
    array = array.T
  if int(np.prod(array.shape)) != int(np.prod(shape)):
    raise UserError(f"tensor of shape {tuple(array.shape)} cannot fill a parameter of shape {tuple(shape)}; "
                    "the checkpoint does not match its config.json")
  return array.reshape(shape)


def to_hf(array: np.ndarray, kind: str) -> np.ndarray:
  """One bertjax leaf (one layer's) in HF's layout."""
  array = np.asarray(array, np.float32)
  if kind == "raw":
    return array
  if kind == "vector":
    return array.reshape(-1)
  n_in = 2 if kind == "kernel2" else 1
  return array.reshape(int(np.prod(array.shape[:n_in])), -1).T.copy()


def get(tree, path: str):
  """The leaf at a "/"-joined path."""
  for key in path.split("/"):
    tree = tree[key]
  return tree


def has(tree, path: str) -> bool:
  try:
    get(tree, path)
    return True
  except (KeyError, TypeError):
    return False


def put(tree, path: str, value):
  """Sets the leaf at a "/"-joined path, making the dicts on the way."""
  *parents, leaf = path.split("/")
  for key in parents:
    tree = tree.setdefault(key, {})
  tree[leaf] = value


def import_tensors(entries, tensors: dict, shapes) -> tuple[dict, list]:
  """(params, missing HF names): the bertjax leaves of `entries` filled from HF `tensors`; `shapes` is the
  target tree (anything with .shape). An entry any of whose tensors is absent is left out."""
  params, missing = {}, []
  for e in entries:
    absent = [n for n in e.hf if n not in tensors]
    if absent:
      missing += absent
      continue
    shape = tuple(get(shapes, e.path).shape)
    if e.stacked:
      value = np.stack([to_bertjax(tensors[n], e.kind, shape[1:]) for n in e.hf])
    else:
      value = to_bertjax(tensors[e.hf[0]], e.kind, shape)
    put(params, e.path, value)
  return params, missing


def export_tensors(entries, params) -> dict:
  """HF name -> np.ndarray for every entry, from a bertjax params tree."""
  out = {}
  for e in entries:
    value = np.asarray(get(params, e.path), np.float32)
    if e.stacked:
      if value.shape[0] != len(e.hf):
        raise ValueError(f"{e.path} stacks {value.shape[0]} copies but the map names {len(e.hf)}")
      out.update({n: to_hf(value[i], e.kind) for i, n in enumerate(e.hf)})
    else:
      out[e.hf[0]] = to_hf(value, e.kind)
  return out
