"""The classification family's model: the sentence(-pair) Classifier with BERT's, ELECTRA's, RoBERTa's,
ModernBERT's or DistilBERT's head, and the fine-tuned classifier's directory (classifier.json), which
bertjax.compress.prune reads too."""

import json
import os

import jax.numpy as jnp
from flax import linen as nn

from bertjax.core import sharding as sh
from bertjax.core.errors import UserError
from bertjax.finetune.model import restore_params
from bertjax.model.embeddings import Embeddings
from bertjax.model.encoder import Encoder
from bertjax.model.hparams import EncoderConfig
from bertjax.model.layers import activation, dense, layer_norm
from bertjax.model.mha import encoder_groups
from bertjax.model.xlnet_models import XLNetSequenceClassifier

HEADS = ("pooler", "electra", "roberta", "modernbert", "distilbert", "xlnet")
POOLINGS = ("cls", "mean")


class PredictionHead(nn.Module):
  """ModernBertPredictionHead: dense (bias as the encoder's use_bias), the activation, LayerNorm."""

  cfg: EncoderConfig

  @nn.compact
  def __call__(self, x):
    c = self.cfg
    x = dense(c, c.hidden_size, c.hidden_size, (sh.EMBED, None), "dense", c.use_bias)(x)
    return layer_norm(c, "ln")(activation(c, x)).astype(c.dtype)


class Classifier(nn.Module):
  """Sentence(-pair) classifier or regressor (num_outputs 1) over the pretrained encoder, with one of two heads:

  pooler   BERT's: tanh(dense([CLS])) (starting from the pretrained NSP/SOP pooler where there is one),
           dropout, linear classifier (BertForSequenceClassification, AlbertForSequenceClassification,
           MobileBertForSequenceClassification; without model.pooler_activation, MobileBERT's released
           classifier_activation false, [CLS]'s state goes to the dropout as it is).
  electra  ElectraForSequenceClassification's: dropout, dense, GELU, dropout, linear on [CLS]; all fresh
           (task-specific), no tanh pooler.
  roberta  RobertaForSequenceClassification's RobertaClassificationHead: dropout, dense, tanh, dropout,
           linear (its out_proj) on <s>; all fresh, no pooler (RoBERTa's pooler is never used there).
  modernbert  ModernBertForSequenceClassification's: [CLS] or the mean of the real tokens (`pooling`), then
           dense, GELU, LayerNorm (`pooler`, pretrained when the checkpoint has it), dropout, linear.
  distilbert  DistilBertForSequenceClassification's: dense (`pre_classifier`), ReLU, dropout, linear on [CLS];
           fresh, no pooler (transformers' seq_classif_dropout is 0.2; here classifier_dropout).
  """

  cfg: EncoderConfig
  num_outputs: int
  classifier_dropout: float = 0.1
  deterministic: bool = True
  head: str = "pooler"
  pooling: str = "cls"  # modernbert head: cls | mean

  @nn.compact
  def __call__(self, input_ids, type_ids, groups, head_gates=None, position_ids=None, cls_positions=None,
               inputs=None):
    """head_gates: optional [layers, heads] multipliers of the attention heads (bertjax.compress.prune).
    Packed rows (bertjax.finetune.batches.packed): `position_ids` [B, S] restart at each example, `groups` tell
    the examples apart, and `cls_positions` [B, K] name each example's [CLS]: outputs are then [B, K, outputs].
    `inputs`: the row arrays the attention kind reads besides the groups (tree nodes' spans; mha.encoder_groups)."""
    c = self.cfg
    x = Embeddings(c, name="embeddings")(input_ids, type_ids, self.deterministic, position_ids)
    encoder = Encoder(c, self.deterministic, name="encoder")
    rows = encoder_groups(c, groups, inputs)
    if self.head == "modernbert" and self.pooling == "mean":
      hidden = encoder(x, rows, head_gates, position_ids)
    else:  # only the [CLS] hidden states are used: the last layer computes nothing else
      at = jnp.zeros((x.shape[0], 1), jnp.int32) if cls_positions is None else cls_positions
      cls = encoder(x, rows, head_gates, position_ids, outputs_at=at)
      cls = cls[:, 0] if cls_positions is None else cls
    drop = lambda h: nn.Dropout(self.classifier_dropout)(h, deterministic=self.deterministic)
    if self.head == "modernbert":
      if self.pooling == "mean" and cls_positions is None:  # over the real tokens (HF: attention_mask)
        w = (groups > 0).astype(jnp.float32)[..., None]
        pooled = ((hidden.astype(jnp.float32) * w).sum(1) / w.sum(1)).astype(c.dtype)
      elif self.pooling == "mean":  # packed: over each example's tokens (slot k holds group k + 1)
        slots = jnp.arange(cls_positions.shape[1])[None, :, None] + 1
        w = (groups[:, None, :] == slots).astype(jnp.float32)  # [B, K, S]
        total = jnp.einsum("bks,bsh->bkh", w, hidden.astype(jnp.float32))
        pooled = (total / jnp.maximum(w.sum(-1, keepdims=True), 1.0)).astype(c.dtype)
      else:
        pooled = cls
      pooled = drop(PredictionHead(c, name="pooler")(pooled))
    elif self.head in ("electra", "roberta"):  # their dense is "transform", their out_proj "classifier"
      h = dense(c, c.hidden_size, c.hidden_size, (sh.EMBED, None), "transform")(drop(cls))
      pooled = drop(jnp.tanh(h) if self.head == "roberta" else activation(c, h))
    elif self.head == "distilbert":
      pooled = drop(nn.relu(dense(c, c.hidden_size, c.hidden_size, (sh.EMBED, None), "pre_classifier")(cls)))
    elif c.pooler_activation:
      pooled = drop(jnp.tanh(dense(c, c.hidden_size, c.hidden_size, (sh.EMBED, None), "pooler")(cls)))
    else:  # MobileBERT's classifier_activation false: the pooler is [CLS]'s state itself
      pooled = drop(cls)
    return dense(c, c.hidden_size, self.num_outputs, (sh.EMBED, None), "classifier")(pooled).astype(jnp.float32)


class XLNetClassifier(XLNetSequenceClassifier):
  """transformers' XLNetForSequenceClassification (bertjax.model.xlnet_models) under the trainer's call: its
  summary reads <cls>, which XLNet's tokenizer puts last (A <sep> B <sep> <cls>, segment id 2), at each row's last
  real token, so right-padded rows and their length buckets give what transformers gives the left-padded ones.
  No memory (transformers' use_mems_train=False for fine-tuning)."""

  def __call__(self, input_ids, type_ids, groups, head_gates=None, position_ids=None, cls_positions=None):
    if head_gates is not None or position_ids is not None or cls_positions is not None:
      raise UserError("XLNet's classifier takes neither head gates nor packed rows; set --config.pack_train=False")
    last = jnp.maximum(groups.shape[1] - 1 - jnp.argmax(groups[:, ::-1] > 0, axis=1), 0)  # the last real token
    return super().__call__(input_ids, type_ids, groups, cls_index=last)


def save_model(directory: str, run_config, model: Classifier, params) -> None:
  """Writes a fine-tuned classifier: `config.json` (its encoder's run config, as a pretraining workdir
  has), `classifier.json` (head and outputs) and an orbax checkpoint of its params (bertjax.compress.prune reads it;
  a head-pruned model is written the same way with fewer heads in its config)."""
  from bertjax.hf import workdir as wd

  head = dict(head=model.head, num_outputs=model.num_outputs, classifier_dropout=model.classifier_dropout,
              pooling=model.pooling)
  wd.write(directory, run_config, params, head)
  with open(os.path.join(directory, "classifier.json"), "w") as f:
    json.dump(head, f, indent=2)


def load_model(directory: str, cfg: EncoderConfig | None = None) -> tuple:
  """(run config, deterministic Classifier, params) of a model written by `save_model`; `cfg` replaces the
  encoder config derived from its config.json (e.g. to change the compute dtype)."""
  from bertjax.hf import workdir as wd
  from bertjax.model import config as model_config

  path = os.path.join(directory, "classifier.json")
  if not os.path.isfile(path):
    raise UserError(f"no fine-tuned model at {directory!r} (no classifier.json); fine-tune with "
                    "--config.save_model=True, which writes WORKDIR/seed_S/model")
  with open(path) as f:
    head = json.load(f)
  run_config = wd.load_config(directory)
  model = Classifier(cfg or model_config.encoder_config(run_config.model), head["num_outputs"],
                     head["classifier_dropout"], deterministic=True, head=head["head"],
                     pooling=head.get("pooling", "cls"))
  return run_config, model, restore_params(directory, model)


