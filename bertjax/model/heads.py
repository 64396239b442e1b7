"""Pretraining heads: MLM over gathered positions (tied decoder + bias), pooler + sentence head, RTD head,
SpanBERT's span-boundary head, WKLM's entity-replacement head."""

import jax.numpy as jnp
from flax import linen as nn

from bertjax.core import sharding as sh
from bertjax.model.hparams import EncoderConfig
from bertjax.model.layers import activation, dense, kernel_init, layer_norm, tokens_matmul, zeros_init

# SpanBERT's SBO head (facebookresearch/SpanBERT pretraining/fairseq/models/pair_bert.py,
# BertPairTargetPredictionHead(max_targets=args.max_pair_targets, position_embedding_size=200)): a
# relative-position table of max_pair_targets rows of width 200. The published run (pretraining/README.md)
# passes --max-pair-targets 15 (the flag's default is 20): 15 rows; masking.py's pad_to_len keeps the first 15
# tokens of a span as SBO targets, so tokens further than 15 into a span have none.
SBO_MAX_TARGETS = 15
SBO_POSITION_SIZE = 200


def gather_positions(hidden, positions):
  """hidden [B, S, H] at positions [B, P] -> [B, P, H]; MLM only decodes the masked slots."""
  return jnp.take_along_axis(hidden, positions[..., None], axis=1)


class MLMHead(nn.Module):
  """BERT's MLM transform (dense H->E, GELU, LayerNorm in E; ModernBertPredictionHead is the same, without
  biases), decoded through the tied word embeddings plus an output bias. With mlm_extra_output (MobileBERT's
  head) the transform keeps width H (LayerNorm in H, a true LayerNorm whatever the encoder's norm kind) and the
  decoder is [word embeddings^T; extra_output], extra_output [H - E, V] (HF cls.predictions.dense.weight).
  With mlm_decoder=untied (the Reformer's ReformerOnlyLMHead) there is no transform: an untied `decoder` (with its
  bias) reads the encoder's output as it is (2H wide after a reversible stack), and `bias` is transformers'
  lm_head.bias, which its forward pass does not read (kept so that counts and exports match)."""

  cfg: EncoderConfig

  @nn.compact
  def __call__(self, hidden, positions, embeddings):
    c = self.cfg
    x = gather_positions(hidden, positions)
    if c.mlm_decoder == "untied":
      self.param("bias", zeros_init((sh.VOCAB,)), (c.vocab_size,))
      return dense(c, x.shape[-1], c.vocab_size, (sh.EMBED, sh.VOCAB), "decoder")(x).astype(jnp.float32)
    width = c.hidden_size if c.mlm_extra_output else c.embedding_size
    x = dense(c, c.hidden_size, width, (sh.EMBED, None), "transform", c.use_bias, out=True)(x)
    x = layer_norm(c, "ln", names=(None,))(activation(c, x)).astype(c.dtype)
    bias = self.param("bias", zeros_init((sh.VOCAB,)), (c.vocab_size,))  # kept without use_bias (ModernBERT's decoder_bias)
    # Decoder in the compute dtype, logits and loss in float32.
    if not c.mlm_extra_output:
      return embeddings.attend(x).astype(jnp.float32) + bias
    e = c.embedding_size
    extra = self.param("extra_output", kernel_init(c, (None, sh.VOCAB)), (c.hidden_size - e, c.vocab_size))
    logits = embeddings.attend(x[..., :e]) + tokens_matmul(x[..., e:], extra.astype(c.dtype), 1, grad=c.dense_grad)
    return logits.astype(jnp.float32) + bias


class SentenceHead(nn.Module):
  """Tanh pooler over [CLS] and a classifier: 2-way for NSP and SOP, 3-way for StructBERT's SSO. Without
  pooler_activation (the released MobileBERT's classifier_activation false) the pooler is [CLS]'s state itself."""

  cfg: EncoderConfig
  classes: int = 2

  @nn.compact
  def __call__(self, hidden):
    c = self.cfg
    pooled = hidden[:, 0]
    if c.pooler_activation:
      pooled = jnp.tanh(dense(c, c.hidden_size, c.hidden_size, (sh.EMBED, None), "pooler")(pooled))
    return dense(c, c.hidden_size, self.classes, (sh.EMBED, None), "classifier")(pooled).astype(jnp.float32)


class SBOHead(nn.Module):
  """SpanBERT's span-boundary objective head (Joshi et al. 2020, §3.2): each masked token of a span is
  predicted from the encoder outputs at the two tokens just outside the span and an embedding of its
  position in the span, through a 2-layer feed-forward network with GELU and LayerNorm
  (pair_bert.py's MLPWithLayerNorm), decoded through the tied word embeddings plus its own output bias.
  The second layer maps to E, so a factorized model decodes in E as its MLM head does (SpanBERT: E = H)."""

  cfg: EncoderConfig

  @nn.compact
  def __call__(self, hidden, left, right, offset, embeddings):
    """hidden [B, S, H]; left, right [B, P] boundary positions; offset [B, P] the 0-based position of the
    target in its span (clipped to the table). Returns float32 logits [B, P, V]."""
    c = self.cfg
    table = self.param("position", kernel_init(c, (None, None)), (SBO_MAX_TARGETS, SBO_POSITION_SIZE))
    pos = jnp.take(table, jnp.clip(offset, 0, SBO_MAX_TARGETS - 1), axis=0).astype(c.dtype)
    x = jnp.concatenate([gather_positions(hidden, left), gather_positions(hidden, right), pos], axis=-1)
    x = dense(c, 2 * c.hidden_size + SBO_POSITION_SIZE, c.hidden_size, (None, sh.EMBED), "dense1")(x)
    x = layer_norm(c, "ln1")(activation(c, x))
    x = dense(c, c.hidden_size, c.embedding_size, (sh.EMBED, None), "dense2")(x)
    x = layer_norm(c, "ln2", names=(None,))(activation(c, x))
    bias = self.param("bias", zeros_init((sh.VOCAB,)), (c.vocab_size,))
    return embeddings.attend(x.astype(c.dtype)).astype(jnp.float32) + bias


class RTDHead(nn.Module):
  """ELECTRA's discriminator head: dense-GELU then one logit per token ("replaced")."""

  cfg: EncoderConfig

  @nn.compact
  def __call__(self, hidden):
    c = self.cfg
    x = activation(c, dense(c, c.hidden_size, c.hidden_size, (sh.EMBED, None), "transform")(hidden))
    return dense(c, c.hidden_size, 1, (sh.EMBED, None), "logit")(x)[..., 0].astype(jnp.float32)


class WKLMHead(nn.Module):
  """WKLM's entity-replacement head (Xiong et al. 2020, §2.1): sigma(w . [h_first; h_last] + b), one logit per
  mention from the encoder outputs at its first and last token ("original entity")."""

  cfg: EncoderConfig

  @nn.compact
  def __call__(self, hidden, first, last):
    """hidden [B, S, H]; first, last [B, E] token positions. Returns float32 logits [B, E]."""
    c = self.cfg
    x = jnp.concatenate([gather_positions(hidden, first), gather_positions(hidden, last)], axis=-1)
    return dense(c, 2 * c.hidden_size, 1, (None, None), "logit")(x)[..., 0].astype(jnp.float32)
