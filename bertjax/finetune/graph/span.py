"""Span extraction over a graph (HotpotQA's form in Transformer-XH): the graph task module with the span loss and
evaluation; reading, encoding, the model and its initialization are the graph task's (bertjax.finetune.graph.task).

Loss, as the authors' code (transformer-xh/Trainer.py train_hotpot): the node loss (BCE-with-logits of every
passage's score, the answer's passage labeled 1 and the others 0) plus (CE(start) + CE(end)) / 2 over the tokens
of the answer's passage; a graph whose answer the row cut off adds no span loss (the code's ignored index).
Evaluation (Evaluator.py evaluation_hotpot): the passage with the highest score, then the best span in it (the
SQuAD n-best search over that one row: start <= end, at most task.max_answer_length tokens; the code takes the
end within 10 tokens of the best start); exact match and F1 with SQuAD's official definitions, and how often the
chosen passage is the answer's (node_accuracy). Predictions go to seed_S/predictions.json.
"""

import json
import os

import jax.numpy as jnp
import numpy as np
import optax

from bertjax.finetune.graph.task import (  # noqa: F401  (the trainer's calls this module shares)
    MASKED, hop_config, init_params, model, node_loss, prepare, read, save_model, validate)
from bertjax.finetune.squad import evaluate as squad_eval, post as squad_post
from bertjax.finetune.tasks import TaskData

OUTPUT_POSITION_AXIS = 2  # outputs are [G, N, S, 3]: span logits along the sequence


def loss(outputs, batch):
  """Per-graph loss [G]: the node loss plus the span loss in the answer's passage."""
  node = jnp.take_along_axis(outputs, batch["answer_node"][:, None, None, None], 1)[:, 0]  # [G, S, 3]
  ce = lambda logits, at: optax.softmax_cross_entropy_with_integer_labels(logits, at)
  span = (ce(node[..., 0], batch["start_position"]) + ce(node[..., 1], batch["end_position"])) / 2
  return span * batch["span_weight"] + node_loss(outputs[:, :, 0, 2], batch)


def answers(outputs: np.ndarray, data: TaskData, n_best: int, max_answer_length: int) -> list:
  """(chosen passage index, answer text) of every eval graph: the top-scoring real passage, its best span."""
  out = []
  scores = np.where(data.eval["node_mask"] > 0, outputs[:, :, 0, 2], MASKED)
  for i, g in enumerate(data.extra["graphs"]):
    k = int(scores[i].argmax())
    rows = lambda x: x[i, k][None]
    entries, _ = squad_post.question_nbest(g.texts[k], rows(outputs[..., 0]), rows(outputs[..., 1]),
                                           rows(data.extra["offsets"]), np.ones_like(rows(outputs[..., 0]), bool),
                                           n_best, max_answer_length, v2=False)
    out.append((k, entries[0]["text"]))
  return out


def evaluate(outputs, data: TaskData, config, seed_dir) -> dict:
  """{"exact_match", "f1", "node_accuracy"} over the eval graphs (SQuAD's definitions, x100 as its scripts)."""
  found = answers(np.asarray(outputs), data, config.task.n_best_size, config.task.max_answer_length)
  graphs = data.extra["graphs"]
  em = [squad_eval.exact(g.answer[1], text) for g, (_, text) in zip(graphs, found)]
  f1 = [squad_eval.f1(g.answer[1], text) for g, (_, text) in zip(graphs, found)]
  if seed_dir:
    with open(os.path.join(seed_dir, "predictions.json"), "w", encoding="utf-8") as f:
      json.dump({g.gid: dict(passage=g.ids[k], answer=text) for g, (k, text) in zip(graphs, found)}, f, indent=2,
                ensure_ascii=False)
  return {"exact_match": 100.0 * float(np.mean(em)), "f1": 100.0 * float(np.mean(f1)),
          "node_accuracy": float(np.mean([k == g.answer[0] for g, (k, _) in zip(graphs, found)]))}
