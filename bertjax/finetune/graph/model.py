"""The graph family's model: Transformer-XH (bertjax.model.xh's extra hop in the encoder) over the passages of each
graph, with the authors' task heads (transformer-xh/model/model_fever.py, model_hotpotqa.py): a node score from
every passage's pooled [CLS] (`final_layer`), and per node either class logits (`pred_final_layer`, FEVER) or start
and end logits over its tokens (`mrc_final_layer`, HotpotQA)."""

import typing

import jax.numpy as jnp
from flax import linen as nn

from bertjax.core import sharding as sh
from bertjax.finetune.squad.model import PADDING_LOGIT
from bertjax.model import xh
from bertjax.model.embeddings import Embeddings
from bertjax.model.hparams import EncoderConfig
from bertjax.model.layers import dense


class GraphModel(nn.Module):
  """Transformer-XH over graphs of G x N passages. Inputs [G, N, S] (a [B, S] input is read as one-node graphs:
  init) and links [G, N(to), N(from)]. Outputs: classification (num_outputs classes) [G, N, 1 + C], the node
  score then the node's class logits; span (num_outputs 0) [G, N, S, 3], start and end logits per token (padding
  at PADDING_LOGIT) and the node score repeated along the sequence (one array, so the trainer's length buckets
  handle it as span logits). The pooled [CLS] is BERT's pooler (pretrained where the checkpoint has one) with the
  code's node dropout (hidden_dropout_prob there; classifier_dropout here)."""

  cfg: EncoderConfig
  hop: xh.HopConfig
  num_outputs: int
  classifier_dropout: float = 0.1
  deterministic: bool = True
  tokenizer: str = ""  # the checkpoint tokenizer's spec, kept with the model so that a saved one reads back
  batch_inputs: typing.ClassVar[tuple] = ("links",)  # batch fields the trainer passes by name

  @nn.compact
  def __call__(self, input_ids, type_ids, groups, links=None):
    c = self.cfg
    if input_ids.ndim == 2:
      input_ids, type_ids, groups = input_ids[:, None], type_ids[:, None], groups[:, None]
    g, n, s = input_ids.shape
    links = jnp.zeros((g, n, n), jnp.float32) if links is None else links
    flat = lambda x: x.reshape(g * n, x.shape[-1])
    x = Embeddings(c, name="embeddings")(flat(input_ids), flat(type_ids), self.deterministic)
    hops = xh.Hops(c, self.hop, name="hops")()
    hidden = xh.HopEncoder(c, self.deterministic, hop=self.hop, name="encoder")(x, flat(groups), links, hops)
    pooled = jnp.tanh(dense(c, c.hidden_size, c.hidden_size, (sh.EMBED, None), "pooler")(hidden[:, 0]))
    pooled = nn.Dropout(self.classifier_dropout)(pooled, deterministic=self.deterministic)
    score = dense(c, c.hidden_size, 1, (sh.EMBED, None), "node_score")(pooled).astype(jnp.float32)
    if self.num_outputs:
      logits = dense(c, c.hidden_size, self.num_outputs, (sh.EMBED, None), "classifier")(pooled)
      return jnp.concatenate([score, logits.astype(jnp.float32)], -1).reshape(g, n, 1 + self.num_outputs)
    span = dense(c, c.hidden_size, 2, (sh.EMBED, None), "qa_outputs")(hidden).astype(jnp.float32)
    span = jnp.where(flat(groups)[..., None] > 0, span, PADDING_LOGIT)
    out = jnp.concatenate([span, jnp.broadcast_to(score[:, None], (g * n, s, 1))], -1)
    return out.reshape(g, n, s, 3)
