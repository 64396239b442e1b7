"""The extractive-QA model (bertjax's Embeddings + Encoder and a span head, optionally ELECTRA's answerable
classifier), its loss, and its parameter initialization from a pretrained encoder."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import linen as nn

from bertjax.core import sharding as sh
from bertjax.core.errors import UserError
from bertjax.model.embeddings import Embeddings
from bertjax.model.encoder import Encoder
from bertjax.model.hparams import EncoderConfig
from bertjax.model.layers import activation, dense
from bertjax.model.xlnet_models import XLNetSpanHead

ANSWERABLE_HIDDEN = 512  # google-research/electra qa_tasks.py: dense(512, gelu) before the answerable logit
ANSWERABLE_WEIGHT = 0.5  # electra configure_finetuning.py answerable_weight
# Span logits of padding positions. bertjax's encoder lets padding attend nowhere (its group mask) while
# transformers lets it attend to the real tokens, so padding logits would differ between the two for no
# reason; no answer can start or end there, so both are kept out of the softmax instead.
PADDING_LOGIT = -10000.0


class SpanQA(nn.Module):
  """Start and end logits per token (BertForQuestionAnswering's `qa_outputs`: one dense layer H -> 2 on
  every final hidden state, no dropout before it, no pooler; padding positions set to PADDING_LOGIT): outputs [B, S, 2], or [B, S, 3] with the
  answerable head, whose logit is repeated along the sequence in channel 2 (one array, so the trainer's
  batching and padding handle it like the span logits; read it at position 0).

  With answerable_head (ELECTRA's SQuAD 2.0 head, electra finetune/qa/qa_tasks.py): the [CLS] state and
  the start-probability-weighted sum of hidden states, dense(512) + GELU, dense -> 1: the logit that the
  window holds no answer.
  """

  cfg: EncoderConfig
  deterministic: bool = True
  answerable_head: bool = False
  settings: tuple = ()  # (key, value) pairs of the SQuAD settings it is trained with, saved with the model

  @nn.compact
  def __call__(self, input_ids, type_ids, groups) -> jax.Array:
    c = self.cfg
    x = Embeddings(c, name="embeddings")(input_ids, type_ids, self.deterministic)
    hidden = Encoder(c, self.deterministic, name="encoder")(x, groups)
    logits = dense(c, c.hidden_size, 2, (sh.EMBED, None), "qa_outputs")(hidden).astype(jnp.float32)
    logits = jnp.where(groups[..., None] > 0, logits, PADDING_LOGIT)
    if self.answerable_head:
      p = jax.nn.softmax(logits[..., 0], axis=-1)
      start_feature = jnp.einsum("bl,blh->bh", p.astype(hidden.dtype), hidden)
      h = jnp.concatenate([hidden[:, 0], start_feature], -1)
      h = activation(c, dense(c, 2 * c.hidden_size, ANSWERABLE_HIDDEN, (sh.EMBED, None), "answerable_dense")(h))
      logit = dense(c, ANSWERABLE_HIDDEN, 1, (None, None), "answerable")(h)
      logit = jnp.broadcast_to(logit.astype(jnp.float32)[:, None, :], logits.shape[:2] + (1,))
      logits = jnp.concatenate([logits, logit], -1)
    return logits


class XLNetSpanQA(XLNetSpanHead):
  """transformers' XLNetForQuestionAnsweringSimple (bertjax.model.xlnet_models: one Linear d -> 2 on every position)
  under the trainer's call, as SpanQA answers: outputs [B, S, 2], padding positions at PADDING_LOGIT. Its windows
  follow the tokenizer's pair template (XLNet's: question <sep> context <sep> <cls>); no memory, no answerable head."""

  answerable_head: bool = False  # what the task code asks a span model; XLNet's simple head has none
  settings: tuple = ()

  def __call__(self, input_ids, type_ids, groups) -> jax.Array:
    start, end = super().__call__(input_ids, type_ids, groups)
    return jnp.where(groups[..., None] > 0, jnp.stack([start, end], -1), PADDING_LOGIT)


def loss(outputs: jax.Array, batch: dict) -> jax.Array:
  """Per-row loss [B]: (start CE + end CE) / 2 (BertForQuestionAnswering's total_loss), plus 0.5 x the
  sigmoid CE of the answerable logit against is_impossible when that head is on (outputs [B, S, 3]).
  Padding positions are out of the softmax (PADDING_LOGIT); BERT and transformers leave them in."""
  ce = optax.softmax_cross_entropy_with_integer_labels
  per = (ce(outputs[..., 0], batch["start_position"]) + ce(outputs[..., 1], batch["end_position"])) / 2
  if outputs.shape[-1] == 3:
    per = per + ANSWERABLE_WEIGHT * optax.sigmoid_binary_cross_entropy(outputs[:, 0, 2], batch["is_impossible"])
  return per


@functools.lru_cache(maxsize=4)
def _init_fn(model: SpanQA):
  ids = jnp.zeros((1, 8), jnp.int32)
  return jax.jit(lambda r: model.init({"params": r}, ids, ids, jnp.ones_like(ids))["params"])


def init_params(model: SpanQA, rng, pretrained: dict, head: dict | None = None,
                parts: tuple = ("embeddings", "encoder")) -> tuple[dict, list]:
  """(params, names of the freshly initialized parts): `parts` (embeddings and encoder; XLNet's transformer) from
  `pretrained` (a Pretrainer params tree), `qa_outputs` (and the answerable head) from `head` when given (an
  imported ...ForQuestionAnswering checkpoint), else fresh from `rng`."""
  params = dict(sh.strip_boxes(_init_fn(model)(rng)))
  for name in parts:
    if jax.tree.map(np.shape, params[name]) != jax.tree.map(np.shape, pretrained[name]):
      raise UserError(f"the checkpoint's {name} do not fit the model built from its config; is config.json "
                      "the checkpoint's own?")
    params[name] = jax.tree.map(jnp.asarray, pretrained[name])
  for name, value in (head or {}).items():
    if name in params and jax.tree.map(np.shape, params[name]) == jax.tree.map(np.shape, value):
      params[name] = jax.tree.map(jnp.asarray, value)
  return params, sorted(n for n in params if n not in parts and n not in (head or {}))
