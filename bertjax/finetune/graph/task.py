"""The graph task family (Transformer-XH: graphs of linked passages, bertjax.model.xh) as a task module of the
fine-tuning trainer: graph classification (FEVER's form, this module) and span extraction over a graph (HotpotQA's
form, `span`, which shares everything here but the loss and the evaluation). One example is one graph: its rows
are its passages, [G, N, S] with N = task.max_nodes (padding nodes masked), its links [G, N, N].

Classification, as the authors' code (transformer-xh/Trainer.py train_fever, Evaluator.py evaluation_fever): node
scores s_n and per-node class probabilities softmax(z_n); the graph's class probabilities are
p(y) = sum_n softmax_n(s)_n softmax(z_n)_y. The code feeds p to CrossEntropyLoss as if it were logits (loss =
-log softmax(p)_y, `task.graph_loss=code`, the default); `nll` takes -log p_y instead. Passages labeled
`relevant` add the node loss, BCE-with-logits of s_n (the code's node_loss, over every labeled node).
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax

from bertjax.core.errors import UserError
from bertjax.finetune import model as task_model, task_models
from bertjax.finetune.graph import data as graph_data
from bertjax.finetune.graph.model import GraphModel
from bertjax.finetune.tasks import TaskData
from bertjax.model import config as model_config, xh

OUTPUT_POSITION_AXIS = None  # outputs are per node: [G, N, 1 + classes]
TARGETS = ("classification", "span")
GRAPH_LOSSES = ("code", "nll")
MASKED = -1e9  # the node score of a padding node: no probability


def _check(ok: bool, message: str):
  if not ok:
    raise UserError(message)


def hop_config(config) -> xh.HopConfig:
  """The extra hop's settings from config.xh."""
  return xh.HopConfig(from_layer=config.xh.from_layer, form=config.xh.form, heads=config.xh.heads,
                      isolated=config.xh.isolated)


def validate(config):
  """One-line errors for a graph config that cannot run (the hop against the encoder is checked once the
  checkpoint is loaded: model)."""
  t = config.task
  _check(bool(t.source), "set --config.task.source to jsonl:DIR (one graph a line: passages, links, label or answer)")
  _check(t.target in TARGETS, f"task.target={t.target!r}; use classification or span")
  _check(t.target != "classification" or len([x for x in t.labels.split(",") if x]) >= 2,
         "task.labels must name at least 2 classes, comma-separated (graph classification)")
  _check(t.graph_loss in GRAPH_LOSSES, f"task.graph_loss={t.graph_loss!r}; use code or nll")
  _check(t.max_nodes >= 0, f"task.max_nodes={t.max_nodes} must be >= 0 (0: the widest graph)")
  _check(not config.model.get("quantize", ""), "model.quantize is not supported for graph tasks; leave it empty")
  _check(config.seq_len >= 8, f"seq_len={config.seq_len} is too short for [CLS] question [SEP] passage [SEP]")


def read(config) -> tuple:
  """(training graphs, evaluation graphs), read and checked before the trainer loads the checkpoint."""
  t = config.task
  train, dev = (graph_data.subsample(graph_data.read_split(t, s), n, config.seed)
                for s, n in ((True, t.max_train_examples), (False, t.max_eval_examples)))
  width = graph_data.widest(train, dev)
  _check(not t.max_nodes or width <= t.max_nodes,
         f"a graph of {t.source} has {width} passages, more than task.max_nodes={t.max_nodes}; raise it "
         "(0: the widest)")
  return train, dev


def prepare(config, loaded, raw: tuple | None = None) -> TaskData:
  """Both splits encoded to [G, N, seq_len] passage rows (N: task.max_nodes, or the widest graph), once the hop
  settings are checked against the checkpoint's encoder."""
  train_g, eval_g = raw if raw is not None else read(config)
  t, tok = config.task, loaded.tokenizer
  xh.check(model_config.encoder_config(loaded.config.model), hop_config(config))  # before any work: the hop fits
  nodes = t.max_nodes or graph_data.widest(train_g, eval_g)
  train, _ = graph_data.encode(train_g, tok, config.seq_len, nodes, t.max_query_length)
  dev, offsets = graph_data.encode(eval_g, tok, config.seq_len, nodes, t.max_query_length)
  outside = int(sum(g.answer is not None for g in train_g) - train["span_weight"].sum())
  return TaskData(
      train=train, eval=dev,
      info=dict(train_examples=len(train_g), eval_examples=len(eval_g), skipped_rows=0, nodes=nodes,
                links=int(train["links"].sum()), answers_cut_off=outside, hop=dataclasses.asdict(hop_config(config))),
      model=dict(num_outputs=len([x for x in t.labels.split(",") if x]) if t.target == "classification" else 0,
                 tokenizer=tok.spec()),
      extra=dict(graphs=eval_g, offsets=offsets))


def model(config, cfg, data: TaskData, deterministic: bool) -> GraphModel:
  """Transformer-XH with the task's heads over the encoder `cfg`."""
  hop = hop_config(config)
  xh.check(cfg, hop)
  return GraphModel(cfg, hop, data.model["num_outputs"], config.model.classifier_dropout,
                    deterministic=deterministic, tokenizer=data.model.get("tokenizer", ""))


def init_params(model, rng, loaded) -> tuple[dict, list]:
  """(params, fresh names): embeddings, encoder and pooler from the checkpoint; the hops and heads from `rng`."""
  pooler = loaded.params.get("sentence", {}).get("pooler", loaded.pooler)
  return task_model.init_params(model, rng, loaded.params, pooler)


def node_loss(scores, batch):
  """The code's node loss per graph [G]: BCE-with-logits of the node scores against the labeled nodes (mean over
  them; 0 for a graph without labeled nodes)."""
  labeled = (batch["node_label"] >= 0) & (batch["node_mask"] > 0)
  bce = optax.sigmoid_binary_cross_entropy(scores, jnp.maximum(batch["node_label"], 0.0))
  count = labeled.sum(-1)
  return jnp.where(labeled, bce, 0.0).sum(-1) / jnp.maximum(count, 1)


def graph_probs(outputs, node_mask):
  """p(y | graph) [G, C] = sum_n softmax_n(score)_n softmax(class logits_n) (Evaluator.py evaluation_fever)."""
  node = jax.nn.softmax(jnp.where(node_mask > 0, outputs[..., 0], MASKED), -1)
  return jnp.einsum("gn,gnc->gc", node, jax.nn.softmax(outputs[..., 1:], -1))


def make_loss(graph_loss: str):
  """The per-graph loss [G] of classification: the class loss (code | nll) plus the node loss."""

  def loss(outputs, batch):
    p = graph_probs(outputs, batch["node_mask"])
    if graph_loss == "code":  # CrossEntropyLoss(final_score, label) on probabilities, as Trainer.py train_fever
      cls = optax.softmax_cross_entropy_with_integer_labels(p, batch["label"])
    else:
      cls = -jnp.log(jnp.take_along_axis(p, batch["label"][:, None], -1)[:, 0] + 1e-12)
    return cls + node_loss(outputs[..., 0], batch)

  return loss


def loss(outputs, batch):
  """The code's loss (task.graph_loss=code); `stages` gives the configured one."""
  return make_loss("code")(outputs, batch)


def stages(config) -> list:
  """One stage of the configured graph loss over every parameter."""
  from bertjax.finetune.tasks import Stage

  return [Stage(make_loss(config.task.graph_loss))]


def evaluate(outputs, data: TaskData, config, seed_dir) -> dict:
  """{"accuracy"}: the argmax of p(y | graph) against the label."""
  del config, seed_dir
  p = np.asarray(graph_probs(jnp.asarray(outputs), jnp.asarray(data.eval["node_mask"])))
  return {"accuracy": float(np.mean(p.argmax(-1) == data.eval["label"]))}


def save_model(directory: str, run_config, model, params) -> None:
  """A seed's fine-tuned graph model as a bertjax task model (task_models.load reads it)."""
  info = dict(classifier_dropout=model.classifier_dropout, tokenizer=model.tokenizer, num_outputs=model.num_outputs,
              hop=dataclasses.asdict(model.hop))
  task_models.save(directory, "graph", run_config, params, info)
