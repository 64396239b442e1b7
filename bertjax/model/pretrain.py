"""The pretraining model: embeddings + encoder + the heads the configured objectives need.

BERT/RoBERTa/ALBERT: one encoder with an MLM head (and a sentence head for NSP/SOP). ELECTRA: a small
generator encoder with the MLM head and the main (discriminator) encoder with the RTD head, sharing one
embedding table; the generator's samples replace the masked tokens under stop-gradient. SpanBERT adds the
span-boundary head; StructBERT's word-structural objective decodes its shuffled positions through the MLM
head, and its sentence-structural objective is a 3-way sentence head. WKLM adds a logit per entity mention.
"""

from typing import Optional

import jax
import jax.numpy as jnp
from flax import linen as nn

from bertjax.model import flops
from bertjax.model.embeddings import Embeddings
from bertjax.model.encoder import Encoder
from bertjax.model.hparams import EncoderConfig
from bertjax.model.mha import encoder_groups
from bertjax.model.heads import MLMHead, RTDHead, SBOHead, SentenceHead, WKLMHead


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
  sentence_head: bool = False  # NSP, SOP or SSO
  sentence_classes: int = 2  # 3 for StructBERT's SSO
  sbo: bool = False  # SpanBERT's span-boundary head
  wso: bool = False  # StructBERT's shuffled trigrams, decoded by the MLM head
  wklm_mentions: int = 0  # WKLM's mention slots per example (0: no entity-replacement head)
  sample_temperature: float = 1.0
  deterministic: bool = True

  @property
  def networks(self) -> dict:
    """Which top-level parameter groups form which network (ELECTRA holds two): what a checkpoint's manifest
    records, so that an export knows what to write."""
    if self.generator is not None:
      return {"discriminator": ["embeddings", "encoder", "rtd"] + (["sentence"] if self.sentence_head else []),
              "generator": ["embeddings", "generator_encoder", "generator_mlm"]}
    return {"encoder": ["embeddings", "encoder", "mlm"] + (["sentence"] if self.sentence_head else [])
            + (["sbo_head"] if self.sbo else []) + (["wklm_head"] if self.wklm_mentions else [])}

  def train_flops_per_token(self, seq_len: int, max_predictions: int, wso_positions: int = 0) -> float:
    """Analytic training FLOPs per token of this model, its heads as it has them (bertjax.model.flops)."""
    # WKLM's head: one 2H -> 1 product per mention slot, forward and backward (3 x 2 FLOPs a multiply-add).
    wklm = 6 * 2 * self.cfg.hidden_size * self.wklm_mentions / seq_len
    return flops.train_flops_per_token(self.cfg, seq_len, max_predictions, self.generator, self.sentence_head,
                                       sentence_classes=self.sentence_classes, sbo=self.sbo,
                                       wso_positions=wso_positions if self.wso else 0) + wklm

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
      self.sentence = SentenceHead(self.cfg, self.sentence_classes)
    if self.sbo:
      self.sbo_head = SBOHead(self.cfg)
    if self.wklm_mentions:
      self.wklm_head = WKLMHead(self.cfg)

  def encode(self, input_ids, type_ids, groups, position_ids=None, inputs=None):
    """Final hidden states [B, S, H] of the main encoder; `inputs` (the batch) holds the row arrays the attention
    kind reads besides the groups (mha.encoder_groups: the tree kind's node spans)."""
    emb = self.embeddings(input_ids, type_ids, self.deterministic, position_ids, groups)
    # rotary positions restart per packed example
    return self.encoder(emb, encoder_groups(self.cfg, groups, inputs), position_ids=position_ids)

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

    Returns mlm_logits [B, P, V] (the generator's under RTD), and as configured sentence_logits [B, 2 or 3],
    rtd_logits [B, S] with rtd_labels [B, S] (1 where the corrupted token differs from the original) and
    rtd_input_ids [B, S], the corrupted input the discriminator saw (unused outputs cost nothing under jit),
    sbo_logits [B, P, V] (from the slots' `span_left`, `span_right`), wso_logits [B, Q, V] (at
    `wso_positions`), wklm_logits [B, E] (at `wklm_first`, `wklm_last`).
    """
    ids, types, groups = batch["input_ids"], batch["type_ids"], batch["groups"]
    positions = batch.get("position_ids")  # packed inputs restart positions per example
    out = {}
    if self.generator is None:
      hidden = self.encode(ids, types, groups, positions, batch)
      slots = batch["mlm_positions"]
      if self.wso:  # one decoder pass over the MLM and the shuffled positions
        slots = jnp.concatenate([slots, batch["wso_positions"]], axis=1)
      logits = self.mlm(hidden, slots, self.embeddings)
      p = batch["mlm_positions"].shape[1]
      out["mlm_logits"] = logits[:, :p]
      if self.wso:
        out["wso_logits"] = logits[:, p:]
      if self.sbo:
        left, right = batch["span_left"], batch["span_right"]
        out["sbo_logits"] = self.sbo_head(hidden, left, right, batch["mlm_positions"] - left - 1, self.embeddings)
      if self.wklm_mentions:
        out["wklm_logits"] = self.wklm_head(hidden, batch["wklm_first"], batch["wklm_last"])
    else:
      emb = self.embeddings(ids, types, self.deterministic, positions, groups)
      gen_hidden = self.generator_encoder(emb, encoder_groups(self.generator, groups, batch), position_ids=positions)
      out["mlm_logits"] = logits = self.generator_mlm(gen_hidden, batch["mlm_positions"], self.embeddings)
      sampled = sample_tokens(self.make_rng("sample"), jax.lax.stop_gradient(logits), self.sample_temperature)
      corrupted = replace_at(ids, batch["mlm_positions"], batch["mlm_weights"], sampled)
      # "Replaced" only where the sample differs from the original: a generator that guesses the
      # original token has produced a real token, and the discriminator must call it original.
      out["rtd_labels"] = (corrupted != batch["original_ids"]).astype(jnp.int32)
      out["rtd_input_ids"] = corrupted
      hidden = self.encode(corrupted, types, groups, positions, batch)
      out["rtd_logits"] = self.rtd(hidden)
    if self.sentence_head:
      out["sentence_logits"] = self.sentence(hidden)
    return out
