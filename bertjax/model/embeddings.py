"""The input embeddings: word + position (as the position kind adds it) + segment tables, the norm kind's norm
and dropout, at width E (ALBERT's factorized E; the encoder projects to H). With `embedding_transformation`
(MobileBERT) the word embeddings (or their trigram, bertjax.model.trigram) are projected to H first, and the
position and segment tables are H wide."""

import dataclasses

import jax.numpy as jnp
from flax import linen as nn

from bertjax.core import sharding as sh
from bertjax.model import kinds, trigram
from bertjax.model.dropout import token_dropout
from bertjax.model.hparams import EncoderConfig
from bertjax.model.layers import dense, kernel_init, tokens_matmul


class Embeddings(nn.Module):
  """Token + position (the position kind's table, if any) + segment embeddings, norm and dropout, width E
  (H with embedding_transformation)."""

  cfg: EncoderConfig

  def setup(self):
    c = self.cfg
    width = c.hidden_size if c.embedding_transformation else c.embedding_size  # of the tables added to words
    self.word = self.param("word", kernel_init(c, (sh.VOCAB, sh.EMBED)), (c.vocab_size, c.embedding_size))
    # None: positions enter the attention layers
    self.position = kinds.of(c, "position").table(self, dataclasses.replace(c, embedding_size=width))
    if c.type_vocab_size:  # 0: no segment embeddings (DistilBERT)
      self.type = self.param("type", kernel_init(c, (None, sh.EMBED)), (c.type_vocab_size, width))
    if c.embedding_transformation:
      fan_in = c.embedding_size * (3 if c.trigram_input else 1)
      self.transformation = dense(c, fan_in, c.hidden_size, (None, sh.EMBED), "transformation")
    self.ln = kinds.of(c, "norm").norm(c, "ln")
    self.drop = token_dropout(c, c.dropout)

  def __call__(self, input_ids, type_ids, deterministic: bool, position_ids=None, groups=None):
    """position_ids [B, S] restart the positions of packed examples; default 0..S-1 (+ offset). groups [B, S]
    (the encoder's) keep trigram inputs inside packed examples; default one example a row."""
    word, position, type_table = self.tables()
    x = jnp.take(word, input_ids, axis=0)
    if self.cfg.trigram_input:
      x = trigram.trigram(x, groups)
    if self.cfg.embedding_transformation:
      x = self.transformation(x)
    x = kinds.of(self.cfg, "position").add(self.cfg, position, x, input_ids, position_ids)
    x = x + (jnp.take(type_table, type_ids, axis=0) if self.cfg.type_vocab_size else 0)
    x = self.drop(self.ln(x), deterministic=deterministic)
    return x.astype(self.cfg.dtype)

  def tables(self):
    """(word, position or None, segment or None) tables as the lookups read them: a method of its own so that a
    quantizer can intercept it (flax nn.intercept_methods; bertjax.compress.q8bert)."""
    return self.word, self.position, (self.type if self.cfg.type_vocab_size else None)

  def attend(self, x):
    """Logits against the word embeddings: the MLM decoder tied to the input embeddings."""
    return tokens_matmul(x, self.word.astype(x.dtype).T, 1, grad=self.cfg.dense_grad)
