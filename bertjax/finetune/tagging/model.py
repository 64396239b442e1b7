"""The tagging family's model: BertForTokenClassification's head (dropout and a linear layer on every
final hidden state) over the pretrained encoder."""

import jax.numpy as jnp
from flax import linen as nn

from bertjax.core import sharding as sh
from bertjax.model.dropout import token_dropout
from bertjax.model.embeddings import Embeddings
from bertjax.model.encoder import Encoder
from bertjax.model.hparams import EncoderConfig
from bertjax.model.layers import dense


class TokenClassifier(nn.Module):
  """Tag logits [batch, seq, num_labels] at every position: encoder, dropout, linear; no pooler
  (BertForTokenClassification, and RoBERTa's, ALBERT's and ELECTRA's, which are the same)."""

  cfg: EncoderConfig
  num_labels: int
  classifier_dropout: float = 0.1
  deterministic: bool = True
  labels: tuple = ()  # tag names in id order, their scheme and the tokenizer's spec: kept with the model so
  scheme: str = ""  # that a saved one reads back
  tokenizer: str = ""

  @nn.compact
  def __call__(self, input_ids, type_ids, groups, head_gates=None):
    """head_gates: optional [layers, heads] multipliers of the attention heads (compress.prune)."""
    c = self.cfg
    x = Embeddings(c, name="embeddings")(input_ids, type_ids, self.deterministic)
    hidden = Encoder(c, self.deterministic, name="encoder")(x, groups, head_gates)
    hidden = token_dropout(c, self.classifier_dropout)(hidden, deterministic=self.deterministic)
    return dense(c, c.hidden_size, self.num_labels, (sh.EMBED, None), "classifier")(hidden).astype(jnp.float32)
