"""transformers' MobileBERT (MobileBertModel, MobileBertForPreTraining, MobileBertForMaskedLM,
MobileBertForSequenceClassification) <-> bertjax's encoder with model.layer=mobilebert (bertjax.model.mobilebert):
the config.json keys, the weight names, and the configs bertjax refuses rather than approximates.

The layout differs from BERT's in the layer: each HF `encoder.layer.{i}` holds `bottleneck.{input,attention}`,
`attention.{self,output}`, num_feedforward_networks - 1 `ffn.{j}` and a last FFN as `intermediate`/`output`,
then `output.bottleneck`; bertjax's layer holds the FFNs as `ffn_0` ... `ffn_{F-1}` (the last is HF's
intermediate/output). NoNorm's weight and bias map as a LayerNorm's. The MLM head's extra output weights
(`cls.predictions.dense.weight`, stored [H - E, V] though declared as a Linear(V, H - E)) are bertjax's
`mlm/extra_output` as they are. The pooler is there only with classifier_activation, read from the config (the
released config has none; the class default has one).
"""

from bertjax.core.errors import UserError
from bertjax.hf import weights as W

PREFIX = "mobilebert."
ACTIVATIONS = {"relu": "relu", "gelu": "gelu", "gelu_new": "gelu_new", "gelu_pytorch_tanh": "gelu_new"}
# MobileBertConfig's class defaults, for keys a config.json leaves out.
DEFAULTS = dict(vocab_size=30522, hidden_size=512, num_hidden_layers=24, num_attention_heads=4, intermediate_size=512,
                hidden_act="relu", hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.1,
                max_position_embeddings=512, type_vocab_size=2, initializer_range=0.02, layer_norm_eps=1e-12,
                embedding_size=128, trigram_input=True, use_bottleneck=True, intra_bottleneck_size=128,
                use_bottleneck_attention=False, key_query_shared_bottleneck=True, num_feedforward_networks=4,
                normalization_type="no_norm", classifier_activation=True)


def _refuse(key: str, value, why: str):
  raise UserError(f"config.json has {key}={value!r}, which bertjax cannot represent: {why}")


def model_section(hf: dict) -> dict:
  """bertjax `model` keys of a MobileBertConfig config.json; a UserError naming the key bertjax cannot represent."""
  g = lambda k: hf.get(k, DEFAULTS[k])
  if not g("use_bottleneck"):
    _refuse("use_bottleneck", False, "bertjax's MobileBERT layer always has its bottleneck")
  if g("normalization_type") != "no_norm":
    _refuse("normalization_type", g("normalization_type"), "bertjax imports MobileBERT with NoNorm (transformers' "
            "layer_norm variant gives two of its LayerNorms eps 1e-5 and the rest layer_norm_eps)")
  if g("hidden_act") not in ACTIVATIONS:
    _refuse("hidden_act", g("hidden_act"), f"bertjax supports {', '.join(ACTIVATIONS)}")
  if not hf.get("tie_word_embeddings", True):
    _refuse("tie_word_embeddings", False, "bertjax's MLM decoder is tied to the word embeddings")
  hidden, embedding, trigram = g("hidden_size"), g("embedding_size"), bool(g("trigram_input"))
  return dict(
      vocab_size=g("vocab_size"), hidden_size=hidden, num_layers=g("num_hidden_layers"),
      num_heads=g("num_attention_heads"), intermediate_size=g("intermediate_size"), embedding_size=embedding,
      max_positions=g("max_position_embeddings"), type_vocab_size=g("type_vocab_size"),
      dropout=g("hidden_dropout_prob"), attention_dropout=g("attention_probs_dropout_prob"),
      layer_norm_eps=g("layer_norm_eps"), init_std=g("initializer_range"), activation=ACTIVATIONS[g("hidden_act")],
      position_offset=0, layer="mobilebert", norm="nonorm", bottleneck_size=g("intra_bottleneck_size"),
      bottleneck_qk_shared=bool(g("key_query_shared_bottleneck")),
      bottleneck_attention=bool(g("use_bottleneck_attention")), num_ffn=g("num_feedforward_networks"),
      trigram_input=trigram, embedding_transformation=trigram or embedding != hidden, mlm_extra_output=True,
      pooler_activation=bool(g("classifier_activation")),
  )


def check_exportable(config, enc):
  """A bertjax model that MobileBertConfig describes and transformers builds, or a UserError naming the key."""
  m = config.model
  wants = dict(layer="mobilebert", norm="nonorm", position="learned", position_offset=0, mlm_extra_output=True)
  for key, want in wants.items():
    if m[key] != want:
      raise UserError(f"model.{key}={m[key]!r}: a MobileBERT export needs {want!r} (as configs/mobilebert.py:"
                      "mobilebert sets it)")
  if enc.embedding_transformation != (enc.trigram_input or enc.embedding_size != enc.hidden_size):
    raise UserError("transformers' MobileBertEmbeddings projects exactly when trigram_input is set or "
                    "embedding_size != hidden_size; set model.embedding_transformation accordingly")
  if not (enc.bottleneck_qk_shared or enc.bottleneck_attention) and enc.bottleneck_size != enc.hidden_size:
    raise UserError("queries and keys that read the H-wide layer input (no shared or attention bottleneck, as "
                    "IB-BERT) do not fit transformers' MobileBertSelfAttention, sized for the bottleneck width")


def to_hf(config, enc, architecture: str, special) -> dict:
  """config.json of a MobileBERT export (every MobileBertConfig key bertjax's model section sets)."""
  check_exportable(config, enc)
  act = {"relu": "relu", "gelu": "gelu", "gelu_new": "gelu_new"}[enc.activation]
  return dict(
      architectures=[architecture], model_type="mobilebert", vocab_size=enc.vocab_size, hidden_size=enc.hidden_size,
      embedding_size=enc.embedding_size, num_hidden_layers=enc.num_layers, num_attention_heads=enc.num_heads,
      intermediate_size=enc.intermediate_size, hidden_act=act, hidden_dropout_prob=enc.dropout,
      attention_probs_dropout_prob=enc.attention_dropout, max_position_embeddings=enc.max_positions,
      type_vocab_size=enc.type_vocab_size, initializer_range=enc.init_std, layer_norm_eps=enc.layer_norm_eps,
      pad_token_id=special.pad, trigram_input=enc.trigram_input, use_bottleneck=True,
      intra_bottleneck_size=enc.bottleneck_size, use_bottleneck_attention=enc.bottleneck_attention,
      key_query_shared_bottleneck=enc.bottleneck_qk_shared, num_feedforward_networks=enc.num_ffn,
      normalization_type="no_norm", classifier_activation=enc.pooler_activation, tie_word_embeddings=True,
      torch_dtype="float32",
  )


def layer_names(enc) -> list:
  """(bertjax path inside a layer, HF name inside `encoder.layer.{i}`) of every Linear and norm of a layer."""
  out = [("bottleneck_input", "bottleneck.input.dense"), ("bottleneck_input_ln", "bottleneck.input.LayerNorm")]
  if enc.bottleneck_qk_shared and not enc.bottleneck_attention:
    out += [("bottleneck_attention", "bottleneck.attention.dense"),
            ("bottleneck_attention_ln", "bottleneck.attention.LayerNorm")]
  out += [(f"attention/{n}", f"attention.self.{n}") for n in ("query", "key", "value")]
  out += [("attention/output", "attention.output.dense"), ("attention/ln", "attention.output.LayerNorm")]
  for j in range(enc.num_ffn):
    last = j == enc.num_ffn - 1
    out += [(f"ffn_{j}/intermediate", "intermediate.dense" if last else f"ffn.{j}.intermediate.dense"),
            (f"ffn_{j}/output", "output.dense" if last else f"ffn.{j}.output.dense"),
            (f"ffn_{j}/ln", "output.LayerNorm" if last else f"ffn.{j}.output.LayerNorm")]
  return out + [("bottleneck_output", "output.bottleneck.dense"), ("bottleneck_output_ln", "output.bottleneck.LayerNorm")]


def body(prefix: str, enc) -> list:
  """Entries of the embeddings and the layers under HF's `prefix` ("mobilebert." or "")."""
  p = prefix + "embeddings."
  out = [W.Entry("embeddings/word", (p + "word_embeddings.weight",), "raw"),
         W.Entry("embeddings/position", (p + "position_embeddings.weight",), "raw"),
         W.Entry("embeddings/type", (p + "token_type_embeddings.weight",), "raw")]
  if enc.embedding_transformation:
    out += W.entries_of("embeddings/transformation", p + "embedding_transformation")
  out += W.entries_of("embeddings/ln", p + "LayerNorm")
  for sub, hf in layer_names(enc):
    out += W.entries_of(f"encoder/layers/{sub}", prefix + "encoder.layer.{i}." + hf, range(enc.num_layers),
                        two_in=sub == "attention/output")
  return out


def heads(enc, prefix: str, mlm: bool, sentence: bool) -> list:
  """Entries of MobileBertForPreTraining's / ForMaskedLM's heads (`cls.`): the MLM transform, its true LayerNorm,
  the extra output weights and bias; the pooler (with classifier_activation) and NSP classifier."""
  out = []
  if mlm:
    out += W.entries_of("mlm/transform", "cls.predictions.transform.dense")
    out += W.entries_of("mlm/ln", "cls.predictions.transform.LayerNorm")
    out += [W.Entry("mlm/extra_output", ("cls.predictions.dense.weight",), "raw"),
            W.Entry("mlm/bias", ("cls.predictions.bias",), "vector")]
  if sentence:
    if enc.pooler_activation:
      out += W.entries_of("sentence/pooler", prefix + "pooler.dense")
    out += W.entries_of("sentence/classifier", "cls.seq_relationship")
  return out
