"""The extractive-QA model (bertjax's Embeddings + Encoder and a span head, optionally ELECTRA's answerable
classifier), its loss, and its parameter initialization from a pretrained encoder."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import linen as nn

from bertjax import sharding as sh
from bertjax.errors import UserError
from bertjax.model.encoder import Embeddings, Encoder, EncoderConfig, activation, dense

ANSWERABLE_HIDDEN = 512  # google-research/electra qa_tasks.py: dense(512, gelu) before the answerable logit
ANSWERABLE_WEIGHT = 0.5  # electra configure_finetuning.py answerable_weight


class SpanQA(nn.Module):
  """Start and end logits per token (BertForQuestionAnswering's `qa_outputs`: one dense layer H -> 2 on
  every final hidden state, no dropout before it, no pooler).

  With answerable_head (ELECTRA's SQuAD 2.0 head, electra finetune/qa/qa_tasks.py): the [CLS] state and
  the start-probability-weighted sum of hidden states, dense(512) + GELU, dense -> 1: the logit that the
  window holds no answer.
  """

  cfg: EncoderConfig
  deterministic: bool = True
  answerable_head: bool = False

  @nn.compact
  def __call__(self, input_ids, type_ids, groups) -> dict:
    c = self.cfg
    x = Embeddings(c, name="embeddings")(input_ids, type_ids, self.deterministic)
    hidden = Encoder(c, self.deterministic, name="encoder")(x, groups)
    logits = dense(c, c.hidden_size, 2, (sh.EMBED, None), "qa_outputs")(hidden).astype(jnp.float32)
    out = dict(start_logits=logits[..., 0], end_logits=logits[..., 1])
    if self.answerable_head:
      p = jax.nn.softmax(out["start_logits"], axis=-1)
      start_feature = jnp.einsum("bl,blh->bh", p.astype(hidden.dtype), hidden)
      h = jnp.concatenate([hidden[:, 0], start_feature], -1)
      h = activation(c, dense(c, 2 * c.hidden_size, ANSWERABLE_HIDDEN, (sh.EMBED, None), "answerable_dense")(h))
      logit = dense(c, ANSWERABLE_HIDDEN, 1, (None, None), "answerable")(h)
      out["answerable_logit"] = logit[:, 0].astype(jnp.float32)
    return out


def loss(out: dict, batch: dict) -> jax.Array:
  """Mean over weighted rows of (start CE + end CE) / 2 (BertForQuestionAnswering's total_loss), plus
  0.5 x the sigmoid CE of the answerable logit against is_impossible when that head is on."""
  ce = optax.softmax_cross_entropy_with_integer_labels
  per = (ce(out["start_logits"], batch["start_position"]) + ce(out["end_logits"], batch["end_position"])) / 2
  if "answerable_logit" in out:
    per = per + ANSWERABLE_WEIGHT * optax.sigmoid_binary_cross_entropy(out["answerable_logit"],
                                                                         batch["is_impossible"])
  w = batch.get("example_weight", jnp.ones_like(per))
  return (per * w).sum() / jnp.maximum(w.sum(), 1.0)


@functools.lru_cache(maxsize=4)
def _init_fn(model: SpanQA):
  ids = jnp.zeros((1, 8), jnp.int32)
  return jax.jit(lambda r: model.init({"params": r}, ids, ids, jnp.ones_like(ids))["params"])


def init_params(model: SpanQA, rng, pretrained: dict, head: dict | None = None) -> tuple[dict, list]:
  """(params, names of the freshly initialized parts): embeddings and encoder from `pretrained` (a
  Pretrainer params tree), `qa_outputs` (and the answerable head) from `head` when given (an imported
  ...ForQuestionAnswering checkpoint), else fresh from `rng`."""
  params = dict(sh.strip_boxes(_init_fn(model)(rng)))
  for name in ("embeddings", "encoder"):
    if jax.tree.map(np.shape, params[name]) != jax.tree.map(np.shape, pretrained[name]):
      raise UserError(f"the checkpoint's {name} do not fit the model built from its config; is config.json "
                      "the checkpoint's own?")
    params[name] = jax.tree.map(jnp.asarray, pretrained[name])
  for name, value in (head or {}).items():
    if name in params and jax.tree.map(np.shape, params[name]) == jax.tree.map(np.shape, value):
      params[name] = jax.tree.map(jnp.asarray, value)
  return params, sorted(n for n in params if n not in ("embeddings", "encoder") and n not in (head or {}))
