"""Token classification (NER, chunking, POS): the per-token head over the pretrained encoder, its loss,
windowed prediction back to words, and the evaluation that writes conlleval's input and entity metrics.

The head is BertForTokenClassification's (and RoBERTa's, ALBERT's, ELECTRA's): dropout on every final
hidden state, then one linear layer to the tag logits. Data and features are in `tag_data`, metrics in
`tag_metrics`.
"""

import functools
import os

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import linen as nn

from bertjax import sharding as sh
from bertjax.data import pipeline
from bertjax.finetune import tag_data, tag_metrics
from bertjax.model.encoder import Embeddings, Encoder, EncoderConfig, dense

PREDICTIONS_FILE = "predictions.conll"  # under workdir/seed_S/: token, gold, predicted per line


class TokenClassifier(nn.Module):
  """Tag logits [batch, seq, num_labels] for every position: encoder, dropout, linear (no pooler)."""

  cfg: EncoderConfig
  num_labels: int
  classifier_dropout: float = 0.1
  deterministic: bool = True

  @nn.compact
  def __call__(self, input_ids, type_ids, groups, head_gates=None):
    """head_gates: optional [layers, heads] multipliers of the attention heads (bertjax.heads)."""
    c = self.cfg
    x = Embeddings(c, name="embeddings")(input_ids, type_ids, self.deterministic)
    hidden = Encoder(c, self.deterministic, name="encoder")(x, groups, head_gates)
    hidden = nn.Dropout(self.classifier_dropout)(hidden, deterministic=self.deterministic)
    return dense(c, c.hidden_size, self.num_labels, (sh.EMBED, None), "classifier")(hidden).astype(jnp.float32)


def token_loss(params, batch, rng, model, head_gates=None):
  """Mean cross-entropy over the weighted positions of the batch (tag_weight x the row's example_weight),
  as BertForTokenClassification's loss with label -100 on every position that is not weighted."""
  logits = model.apply({"params": params}, batch["input_ids"], batch["type_ids"], batch["groups"], head_gates,
                       rngs={"dropout": rng} if rng is not None else {})
  w = batch["tag_weight"] * batch["example_weight"][:, None]
  per = optax.softmax_cross_entropy_with_integer_labels(logits, batch["tag"])
  return (per * w).sum() / jnp.maximum(w.sum(), 1.0)


@functools.lru_cache(maxsize=4)
def _predict_fn(model):
  return jax.jit(lambda p, b: model.apply({"params": p}, b["input_ids"], b["type_ids"], b["groups"]).argmax(-1))


def predict(params, arrays: dict, model, batch_size: int) -> np.ndarray:
  """The predicted label id of every position of every window [windows, seq_len]."""
  apply = _predict_fn(model)
  outs = []
  for b in pipeline.eval_batches(pipeline.ArrayRows(arrays), batch_size):
    out = np.asarray(apply(params, {k: b[k] for k in ("input_ids", "type_ids", "groups")}))
    outs.append(out[b["example_weight"] > 0])
  return np.concatenate(outs)


def evaluate(sentences: tag_data.Sentences, arrays: dict, predicted: np.ndarray, labels: list, scheme: str,
             seed_dir: str | None = None) -> dict:
  """Entity metrics (f1, precision, recall; per_type) and token accuracy of window predictions read back
  to words; with `seed_dir`, writes seed_dir/predictions.conll (token, gold, predicted per word), whose
  seqeval/conlleval scores are these."""
  ids = tag_data.word_predictions(arrays, predicted, sentences)
  pred = [[labels[i] for i in s] for s in ids]
  if seed_dir is not None:
    tag_metrics.write_conll(os.path.join(seed_dir, PREDICTIONS_FILE), sentences.words, sentences.tags, pred)
  return tag_metrics.score(sentences.tags, pred, scheme)


def tag_words(words: list, tok, model, params, labels: list, seq_len: int, stride: int) -> list:
  """Tags of one pre-split sentence from a fine-tuned model (windowed as in training, each word read
  from its max-context window)."""
  s = tag_data.Sentences([list(words)], [["O"] * len(words)], [], "input")
  arrays = tag_data.encode(s, tok, ["O"], seq_len, stride, "none")
  ids = tag_data.word_predictions(arrays, predict(params, arrays, model, 8), s)[0]
  return [labels[i] for i in ids]
