"""XLNet's models with heads (transformers' XLNetLMHeadModel, XLNetForSequenceClassification,
XLNetForQuestionAnsweringSimple) and the `xlnet` layer kind that makes a config (`model.layer=xlnet`, the
options in `model.xlnet`) build them.

Every model holds the transformer as `transformer` (bertjax.model.xlnet.XLNet) and takes its inputs (see
XLNet's docstring); the LM head is the word embedding (tied) plus its own bias `lm_loss/bias`; the sequence summary
takes the last position's hidden state (XLNet puts <cls> last), or `cls_index`, through Linear-tanh-dropout,
then `logits_proj`; the simple span head is one Linear to (start, end).
"""

import jax.numpy as jnp
from flax import linen as nn

from bertjax.core import sharding as sh
from bertjax.model import kinds, memory as memory_lib
from bertjax.model.dropout import Dropout
from bertjax.model.hparams import EncoderConfig
from bertjax.model.layer_kinds import LayerKind
from bertjax.model.layers import dense, rows_at, zeros_init
from bertjax.model.memory import MemoryConfig
from bertjax.model.xlnet import XLNet, XLNetLayer


class LMBias(nn.Module):
  """The LM head's own bias (transformers' lm_loss.bias; named `bias` so weight decay skips it, as the
  reference's optimizer skips every bias)."""

  size: int

  @nn.compact
  def __call__(self, logits):
    return logits + self.param("bias", zeros_init((sh.VOCAB,)), (self.size,))


class XLNetLMHeadModel(nn.Module):
  """XLNet with its LM head: the pretraining model (`Pretrainer`'s place for model.layer=xlnet).

  __call__(batch, memory=None): batch holds `input_ids` [B, S] and as wanted `type_ids` [B, S] (segment ids
  0/1/2; absent: no segment term), `groups` [B, S] (> 0 real, 0 padding; absent: no padding), `perm_mask`
  [B, S, S], `target_mapping` [B, P, S]; `memory` is the state of bertjax.model.memory (None: empty). Returns
  {"logits": [B, P or S, V] float32, "memory": the next state or None, "cmem_loss": scalar float32}.
  `forward(...)` takes the same inputs as keywords (XLNet.__call__'s)."""

  cfg: EncoderConfig
  mc: MemoryConfig = MemoryConfig()
  deterministic: bool = True
  generator = None  # what summary and the factory ask a pretraining model (no ELECTRA generator)

  @property
  def networks(self) -> dict:
    """One network: what a checkpoint's manifest records."""
    return {"xlnet": ["transformer", "lm_loss"]}

  @staticmethod
  def base_model(params):
    """The parameters transformers' XLNetModel holds (the LM head's bias aside)."""
    return params["transformer"]

  def train_flops_per_token(self, seq_len: int, max_predictions: int, wso_positions: int = 0) -> float:
    """3x the forward matmul FLOPs per token (bertjax.model.flops' convention), memory keys included, the LM head
    on `max_predictions` predicted positions."""
    return 3.0 * (forward_flops(self.cfg, self.mc, seq_len, max_predictions)
                  + 2 * self.cfg.hidden_size * self.cfg.vocab_size * max_predictions / seq_len)

  def setup(self):
    self.transformer = XLNet(self.cfg, self.deterministic, self.mc)
    self.lm_loss = LMBias(self.cfg.vocab_size)

  def __call__(self, batch, memory=None):
    groups = batch.get("groups")  # bertjax's rows: example ids, 0 on padding (XLNet's streams are not packed)
    return self.forward(batch["input_ids"], batch.get("type_ids"), None if groups is None else groups > 0,
                        batch.get("perm_mask"), batch.get("target_mapping"), memory)

  def forward(self, input_ids, type_ids=None, attention_mask=None, perm_mask=None, target_mapping=None, memory=None):
    out = self.transformer(input_ids, type_ids, attention_mask, perm_mask, target_mapping, memory)
    logits = self.lm_loss(self.transformer.lm_logits(out["hidden"]))
    return dict(logits=logits, memory=out["memory"], cmem_loss=out["cmem_loss"])


class XLNetBase(nn.Module):
  """transformers' XLNetModel with `transformer` at the top of its params, as every XLNet model here has it:
  __call__ takes XLNet.__call__'s inputs and returns its dict."""

  cfg: EncoderConfig
  mc: MemoryConfig = MemoryConfig()
  deterministic: bool = True

  @nn.compact
  def __call__(self, input_ids, type_ids=None, attention_mask=None, perm_mask=None, target_mapping=None, memory=None):
    return XLNet(self.cfg, self.deterministic, self.mc, name="transformer")(
        input_ids, type_ids, attention_mask, perm_mask, target_mapping, memory)


class XLNetSequenceClassifier(nn.Module):
  """transformers' XLNetForSequenceClassification (summary_type last, summary_use_proj, tanh, last dropout).
  __call__(input_ids, type_ids, attention_mask, cls_index=None, memory=None) -> logits [B, num_labels]; with
  `cls_index` [B] the summary reads that position instead of the last (right-padded rows)."""

  cfg: EncoderConfig
  num_labels: int = 2
  mc: MemoryConfig = MemoryConfig()
  summary_dropout: float = 0.1  # transformers' summary_last_dropout
  deterministic: bool = True

  @nn.compact
  def __call__(self, input_ids, type_ids=None, attention_mask=None, cls_index=None, memory=None):
    c = self.cfg
    hidden = XLNet(c, self.deterministic, self.mc, name="transformer")(
        input_ids, type_ids, attention_mask, memory=memory)["hidden"]
    last = hidden[:, -1] if cls_index is None else rows_at(hidden, cls_index[:, None])[:, 0]
    pooled = jnp.tanh(dense(c, c.hidden_size, c.hidden_size, (sh.EMBED, None), "summary")(last))
    pooled = Dropout(self.summary_dropout, generator=c.dropout_rng)(pooled, deterministic=self.deterministic)
    return dense(c, c.hidden_size, self.num_labels, (sh.EMBED, None), "logits_proj")(pooled).astype(jnp.float32)


class XLNetSpanHead(nn.Module):
  """transformers' XLNetForQuestionAnsweringSimple: one Linear d -> 2 on every position.
  __call__(input_ids, type_ids, attention_mask, memory=None) -> (start_logits, end_logits), each [B, S]."""

  cfg: EncoderConfig
  mc: MemoryConfig = MemoryConfig()
  deterministic: bool = True

  @nn.compact
  def __call__(self, input_ids, type_ids=None, attention_mask=None, memory=None):
    c = self.cfg
    hidden = XLNet(c, self.deterministic, self.mc, name="transformer")(
        input_ids, type_ids, attention_mask, memory=memory)["hidden"]
    logits = dense(c, c.hidden_size, 2, (sh.EMBED, None), "qa_outputs")(hidden).astype(jnp.float32)
    return logits[..., 0], logits[..., 1]


def forward_flops(c: EncoderConfig, mc: MemoryConfig, seq_len: int, predictions: int) -> float:
  """Forward matmul FLOPs per token of the transformer: per layer the q and o projections, k and v over memory
  and input, r over the klen + seq_len distances, the three score terms and the weighted sum over klen keys, the
  FFN; the query stream's attention, projections and FFN on the predicted positions only."""
  d, s, klen = c.hidden_size, seq_len, mc.slots + seq_len
  proj = 2 * d * d * (2 + 2 * klen / s + (klen + s) / s)
  core = 2 * d * (2 * klen + (klen + s))  # ac and the weighted sum over klen keys, bd over klen + s distances
  ffn = 4 * d * c.intermediate_size
  stream_g = (core + 4 * d * d + ffn) * predictions / s
  return c.num_layers * (proj + core + ffn + stream_g)


@kinds.register("layer", "xlnet")
class XLNetKind(LayerKind):
  """`model.layer=xlnet`: the whole model is XLNet's (its own embeddings, relative attention, two streams,
  memory); the other kind keys are not read."""

  module = XLNetLayer
  hf_family = "xlnet"

  def check(self, m):
    memory_lib.validate(m.xlnet)

  def forward_flops(self, c, seq_len, index):
    return forward_flops(c, MemoryConfig(), seq_len, 0) / c.num_layers

  def pretrainer(self, config, cfg: EncoderConfig):
    return XLNetLMHeadModel(cfg, memory_lib.memory_config(config.model.xlnet))
