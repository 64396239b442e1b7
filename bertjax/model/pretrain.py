"""The pretraining model: embeddings + encoder + the heads the configured objectives need.

BERT/RoBERTa/ALBERT: one encoder with an MLM head (and a sentence head for NSP/SOP). ELECTRA: a small
generator encoder with the MLM head and the main (discriminator) encoder with the RTD head, sharing one
embedding table; the generator's samples replace the masked tokens under stop-gradient.
"""

from typing import Optional

import jax
import jax.numpy as jnp
from flax import linen as nn

from bertjax.model.encoder import Embeddings, Encoder, EncoderConfig
from bertjax.model.heads import MLMHead, RTDHead, SentenceHead


def sample_tokens(rng, logits, temperature: float):
  """Gumbel-max sample of token ids from logits [..., V] at a temperature (ELECTRA uses 1.0)."""
  gumbel = jax.random.gumbel(rng, logits.shape, jnp.float32)
  return jnp.argmax(logits / temperature + gumbel, axis=-1).astype(jnp.int32)


def replace_at(input_ids, positions, weights, values):
  """input_ids with values [B, P] written at positions [B, P] where weights > 0 (padded slots skipped)."""
  current = jnp.take_along_axis(input_ids, positions, axis=1)
  values = jnp.where(weights > 0, values, current)
  return jax.vmap(lambda ids, p, v: ids.at[p].set(v))(input_ids, positions, values)


class Pretrainer(nn.Module):
  """Pretraining forward pass; returns the tensors the objectives score (logits, labels)."""

  cfg: EncoderConfig  # the main encoder (the discriminator for ELECTRA)
  generator: Optional[EncoderConfig] = None  # set for RTD
  sentence_head: bool = False  # NSP or SOP
  sample_temperature: float = 1.0
  deterministic: bool = True

  def setup(self):
    self.embeddings = Embeddings(self.cfg)
    self.encoder = Encoder(self.cfg, self.deterministic)
    if self.generator is not None:
      self.generator_encoder = Encoder(self.generator, self.deterministic)
      self.generator_mlm = MLMHead(self.generator)
      self.rtd = RTDHead(self.cfg)
    else:
      self.mlm = MLMHead(self.cfg)
    if self.sentence_head:
      self.sentence = SentenceHead(self.cfg)

  def encode(self, input_ids, type_ids, groups, position_ids=None):
    """Final hidden states [B, S, H] of the main encoder."""
    return self.encoder(self.embeddings(input_ids, type_ids, self.deterministic, position_ids), groups)

  def score(self, input_ids, type_ids):
    """Every head's logits at every position of unpadded inputs (inference): `mlm` [B, S, V] (ELECTRA: the
    generator's), and as the model has them `rtd` [B, S] and `sentence` [B, 2]."""
    groups = jnp.ones_like(input_ids)
    positions = jnp.broadcast_to(jnp.arange(input_ids.shape[1]), input_ids.shape)
    hidden = self.encode(input_ids, type_ids, groups)
    out = {}
    if self.generator is None:
      out["mlm"] = self.mlm(hidden, positions, self.embeddings)
    else:
      gen_hidden = self.generator_encoder(self.embeddings(input_ids, type_ids, True), groups)
      out["mlm"] = self.generator_mlm(gen_hidden, positions, self.embeddings)
      out["rtd"] = self.rtd(hidden)
    if self.sentence_head:
      out["sentence"] = self.sentence(hidden)
    return out

  def __call__(self, batch):
    """batch: masked `input_ids`, `type_ids`, `groups`, `mlm_positions`, `mlm_weights`, `original_ids`,
    optionally `position_ids` (packed examples).

    Returns mlm_logits [B, P, V] (the generator's under RTD), and as configured sentence_logits [B, 2],
    rtd_logits [B, S] with rtd_labels [B, S] (1 where the corrupted token differs from the original) and
    rtd_input_ids [B, S], the corrupted input the discriminator saw (unused outputs cost nothing under jit).
    """
    ids, types, groups = batch["input_ids"], batch["type_ids"], batch["groups"]
    positions = batch.get("position_ids")  # packed inputs restart positions per example
    out = {}
    if self.generator is None:
      hidden = self.encode(ids, types, groups, positions)
      out["mlm_logits"] = self.mlm(hidden, batch["mlm_positions"], self.embeddings)
    else:
      emb = self.embeddings(ids, types, self.deterministic, positions)
      gen_hidden = self.generator_encoder(emb, groups)
      out["mlm_logits"] = logits = self.generator_mlm(gen_hidden, batch["mlm_positions"], self.embeddings)
      sampled = sample_tokens(self.make_rng("sample"), jax.lax.stop_gradient(logits), self.sample_temperature)
      corrupted = replace_at(ids, batch["mlm_positions"], batch["mlm_weights"], sampled)
      # "Replaced" only where the sample differs from the original: a generator that guesses the
      # original token has produced a real token, and the discriminator must call it original.
      out["rtd_labels"] = (corrupted != batch["original_ids"]).astype(jnp.int32)
      out["rtd_input_ids"] = corrupted
      hidden = self.encode(corrupted, types, groups, positions)
      out["rtd_logits"] = self.rtd(hidden)
    if self.sentence_head:
      out["sentence_logits"] = self.sentence(hidden)
    return out
