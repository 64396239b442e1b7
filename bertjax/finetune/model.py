"""The fine-tuning models (bertjax's Embeddings + Encoder and a task head: BERT's, ELECTRA's or DistilBERT's
sentence classifier, the per-token tagger, multiple choice), their initialization from pretrained weights, and
ELECTRA's layer-wise learning-rate decay."""

import functools
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import linen as nn

from bertjax.core import sharding as sh
from bertjax.core.errors import UserError
from bertjax.model.dropout import token_dropout
from bertjax.model.embeddings import Embeddings
from bertjax.model.encoder import Encoder
from bertjax.model.hparams import EncoderConfig
from bertjax.model.layers import activation, dense, layer_norm


HEADS = ("pooler", "electra", "roberta", "modernbert", "distilbert")
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
           dropout, linear classifier (BertForSequenceClassification, AlbertForSequenceClassification).
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
  def __call__(self, input_ids, type_ids, groups, head_gates=None, position_ids=None, cls_positions=None):
    """head_gates: optional [layers, heads] multipliers of the attention heads (bertjax.compress.prune).
    Packed rows (bertjax.finetune.batches.packed): `position_ids` [B, S] restart at each example, `groups` tell
    the examples apart, and `cls_positions` [B, K] name each example's [CLS]: outputs are then [B, K, outputs]."""
    c = self.cfg
    x = Embeddings(c, name="embeddings")(input_ids, type_ids, self.deterministic, position_ids)
    encoder = Encoder(c, self.deterministic, name="encoder")
    if self.head == "modernbert" and self.pooling == "mean":
      hidden = encoder(x, groups, head_gates, position_ids)
    else:  # only the [CLS] hidden states are used: the last layer computes nothing else
      at = jnp.zeros((x.shape[0], 1), jnp.int32) if cls_positions is None else cls_positions
      cls = encoder(x, groups, head_gates, position_ids, outputs_at=at)
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
    else:
      pooled = drop(jnp.tanh(dense(c, c.hidden_size, c.hidden_size, (sh.EMBED, None), "pooler")(cls)))
    return dense(c, c.hidden_size, self.num_outputs, (sh.EMBED, None), "classifier")(pooled).astype(jnp.float32)


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


class MultipleChoice(Classifier):
  """BertForMultipleChoice: inputs [B, choices, S] flattened to pairs, the one-output pooler classifier
  on each, scores [B, choices] (the same parameters as Classifier(num_outputs=1))."""

  tokenizer: str = ""  # the checkpoint tokenizer's spec, kept with the model so that a saved one reads back

  def __call__(self, input_ids, type_ids, groups, head_gates=None):
    shape = input_ids.shape
    flat = lambda x: x.reshape(-1, shape[-1])
    return super().__call__(flat(input_ids), flat(type_ids), flat(groups), head_gates).reshape(shape[:-1])


@functools.lru_cache(maxsize=4)
def _init_fn(model: Classifier):
  ids = jnp.zeros((1, 8), jnp.int32)
  return jax.jit(lambda r: model.init({"params": r}, ids, ids, jnp.ones_like(ids))["params"])


def init_params(model: Classifier, rng, pretrained: dict, pooler: dict | None) -> tuple[dict, list]:
  """(params, names of the freshly initialized parts): embeddings and encoder from `pretrained` (a
  Pretrainer params tree), the pooler from `pooler` when given, the classifier always fresh."""
  fresh = _init_fn(model)(rng)
  params = dict(sh.strip_boxes(fresh))
  for name in ("embeddings", "encoder"):
    want = jax.tree.map(np.shape, params[name])
    have = jax.tree.map(np.shape, pretrained[name])
    if want != have:
      raise UserError(f"the checkpoint's {name} do not fit the model built from its config; is config.json "
                      "the checkpoint's own?")
    params[name] = jax.tree.map(jnp.asarray, pretrained[name])
  new = [name for name in params if name not in ("embeddings", "encoder")]
  fits = lambda a, b: jax.tree.structure(jax.tree.map(np.shape, a)) == jax.tree.structure(jax.tree.map(np.shape, b))
  if pooler is not None and "pooler" in params and fits(pooler, params["pooler"]):  # (a BERT pooler is no ModernBERT head)
    params["pooler"] = jax.tree.map(jnp.asarray, pooler)
    new.remove("pooler")
  return params, sorted(new)


MODEL_DIR = "model"  # a seed's fine-tuned model, under workdir/seed_S/ (finetune's save_model)


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


def restore_params(directory: str, model: nn.Module) -> dict:
  """The params of a fine-tuned `model` (any head model applied as (input_ids, type_ids, groups)) from the
  checkpoint in `directory`: shapes from an abstract init, no host-side init of real weights."""
  from bertjax.train import checkpoint

  ids = jax.ShapeDtypeStruct((1, 8), jnp.int32)
  shapes = sh.strip_boxes(jax.eval_shape(lambda r, i: model.init({"params": r}, i, i, i)["params"],
                                         jax.random.key(0), ids))
  return jax.tree.map(jnp.asarray, checkpoint.restore_params(directory, shapes))


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


def layer_multipliers(params: dict, cfg: EncoderConfig, decay: float) -> dict:
  """Learning-rate multipliers (ELECTRA's layer-wise decay): decay^(L + 2 - depth) with depth 0 for the
  embeddings (and E->H projection), i + 1 for layer i, L + 1 for a pretrained-style pooler and L + 2 for
  the task-specific head (classifier, ELECTRA's transform): google-research/electra _get_layer_lrs.
  Stacked layers get one multiplier per layer along their leading axis; ALBERT's shared groups take
  their deepest layer's."""
  n = cfg.num_layers
  per_layer = decay ** (n + 1 - np.arange(n, dtype=np.float64))  # layer i at depth i + 1
  groups = np.arange(1, cfg.num_groups + 1) * n // cfg.num_groups  # deepest layer of each group, + 1
  per_group = decay ** (n + 2 - groups.astype(np.float64))

  def mult(path, leaf):
    keys = [getattr(k, "key", None) for k in path]
    top = keys[0]
    if top == "embeddings" or keys[:2] == ["encoder", "embedding_projection"]:
      return jnp.float32(decay ** (n + 2))
    if top == "pooler":
      return jnp.float32(decay)
    if top == "encoder":
      m = per_layer if keys[1] == "layers" else per_group
      return jnp.asarray(m.reshape((-1,) + (1,) * (np.ndim(leaf) - 1)), jnp.float32)
    return jnp.float32(1.0)

  return jax.tree_util.tree_map_with_path(mult, params)


def scale_by_tree(multipliers) -> optax.GradientTransformation:
  """Multiplies each update by its entry of `multipliers` (a tree of scalars or broadcastable arrays)."""

  def init(params):
    del params
    return optax.EmptyState()

  def update(updates, state, params=None):
    del params
    return jax.tree.map(lambda u, m: u * m.astype(u.dtype), updates, multipliers), state

  return optax.GradientTransformation(init, update)
