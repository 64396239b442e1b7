"""The graph family's data: graphs of linked passages in JSONL (`jsonl:DIR`, one graph a line), read and checked,
and encoded to one row per passage, `[CLS] question [SEP] passage [SEP]`, padded to a fixed number of nodes.

One graph a line:

  {"id": "g1", "question": "Where was the author of X born?",
   "passages": [{"id": "X", "text": "...", "relevant": 1}, {"id": "Y", "text": "..."}],
   "links": [["X", "Y"]],
   "label": "SUPPORTS"}                                    (graph classification), or
   "answer": {"passage": "Y", "text": "Paris", "start": 17}  (span extraction; start: a character offset,
                                                             optional: the first occurrence)

A link [u, v] is a hyperlink in passage u to passage v: v's [CLS] hears from u's (the edge u -> v of the
authors' graphs, data/hotpotqa.py). `relevant` (0/1, optional) labels a passage for the node loss, as the code's
per-node labels do (FEVER's evidence, HotpotQA's answer passage); span extraction labels the answer's passage 1
and the others 0. `question` may be empty (rows are then `[CLS] passage [SEP]`).
"""

import dataclasses
import os

import numpy as np

from bertjax.core.errors import UserError
from bertjax.finetune import tasks
from bertjax.finetune.squad.features import answer_tokens, template

NO_LABEL = -1


@dataclasses.dataclass
class Graph:
  """One graph: its passages (ids, texts), links as (from, to) passage indexes, and its targets."""

  gid: str
  question: str
  ids: list
  texts: list
  links: list
  label: int = NO_LABEL  # classification: the label's index
  relevant: list = dataclasses.field(default_factory=list)  # per passage: 1, 0 or NO_LABEL
  answer: tuple | None = None  # span: (passage index, answer text, character start)


def _text(value, where: str, what: str) -> str:
  if not isinstance(value, str):
    raise UserError(f"{where}: {what} must be a string, not {type(value).__name__}")
  return value


def _passages(row: dict, where: str) -> tuple[list, list, list]:
  passages = row.get("passages")
  if not isinstance(passages, list) or not passages:
    raise UserError(f'{where}: expected "passages": [{{"id", "text"}}, ...] (at least one)')
  ids, texts, relevant = [], [], []
  for p in passages:
    if not isinstance(p, dict) or "id" not in p or "text" not in p:
      raise UserError(f'{where}: every passage needs an "id" and a "text"')
    pid = str(p["id"])
    if pid in ids:
      raise UserError(f"{where}: passage id {pid!r} appears twice")
    ids.append(pid)
    texts.append(_text(p["text"], where, f"passage {pid!r}'s text"))
    flag = p.get("relevant")
    relevant.append(NO_LABEL if flag is None else int(bool(flag)))
  return ids, texts, relevant


def _links(row: dict, ids: list, where: str) -> list:
  links, index = [], {pid: i for i, pid in enumerate(ids)}
  for link in row.get("links", []):
    if not isinstance(link, (list, tuple)) or len(link) != 2:
      raise UserError(f'{where}: a link is ["from passage id", "to passage id"], not {link!r}')
    for pid in link:
      if str(pid) not in index:
        raise UserError(f"{where}: link {list(link)} names passage {str(pid)!r}, which this graph does not have "
                        f"(its passages: {', '.join(ids)})")
    u, v = index[str(link[0])], index[str(link[1])]
    if u != v:  # the code's graphs have no self-loops; a passage's own [CLS] reaches it through the merge
      links.append((u, v))
  return sorted(set(links))


def _answer(row: dict, ids: list, texts: list, where: str) -> tuple:
  answer = row.get("answer")
  if not isinstance(answer, dict) or "passage" not in answer or "text" not in answer:
    raise UserError(f'{where}: expected "answer": {{"passage": id, "text": ...}} (span extraction)')
  pid, text = str(answer["passage"]), _text(answer["text"], where, "the answer")
  if pid not in ids:
    raise UserError(f"{where}: the answer names passage {pid!r}, which this graph does not have "
                    f"(its passages: {', '.join(ids)})")
  k = ids.index(pid)
  start = answer.get("start", texts[k].find(text))
  if not text or not isinstance(start, int) or start < 0 or texts[k][start:start + len(text)] != text:
    raise UserError(f"{where}: the answer {text!r} is not in passage {pid!r} at character {start}")
  return k, text, start


def read_jsonl(path: str, target: str, labels: tuple, labeled: bool = True) -> list:
  """The graphs of a JSONL file. `target`: classification (a "label" among `labels`) or span (an "answer");
  `labeled` False: targets may be absent (NO_LABEL / None)."""
  graphs = []
  for number, where, row in tasks.jsonl_objects(path, "passages and links"):
    ids, texts, relevant = _passages(row, where)
    g = Graph(str(row.get("id", number)), _text(row.get("question", ""), where, "question"), ids, texts,
              _links(row, ids, where), relevant=relevant)
    if target == "classification" and (labeled or row.get("label") is not None):
      if str(row.get("label")) not in labels:
        raise UserError(f"{where}: label {row.get('label')!r} is not one of task.labels ({', '.join(labels)})")
      g.label = labels.index(str(row["label"]))
    elif target == "span" and (labeled or row.get("answer") is not None):
      g.answer = _answer(row, ids, texts, where)
      g.relevant = [int(i == g.answer[0]) for i in range(len(ids))]  # HotpotQA: the answer passage is the node label
    graphs.append(g)
  if not graphs:
    raise UserError(f"{path}:1: no graphs in the file")
  return graphs


def read_split(task, train: bool) -> list:
  """The training or evaluation graphs of task.source (jsonl:DIR)."""
  kind, _, arg = task.source.partition(":")
  if kind != "jsonl" or not arg:
    raise UserError(f"unknown graph source {task.source!r}; use --config.task.source=jsonl:DIR")
  labels = tuple(x for x in task.labels.split(",") if x)
  return read_jsonl(os.path.join(arg, task.train_file if train else task.eval_file), task.target, labels)


def subsample(graphs: list, n: int, seed: int) -> list:
  """A fixed random subset of n graphs in file order (all when n is 0 or at least the split)."""
  if not n or n >= len(graphs):
    return graphs
  return [graphs[i] for i in np.sort(np.random.default_rng(seed).choice(len(graphs), n, replace=False))]


def _row(tokenizer, tmpl: dict, question_ids: list, text: str, seq_len: int) -> tuple:
  """(ids, type ids, character offsets [seq_len, 2] of the passage's tokens (-1 elsewhere)) of one passage row."""
  (pre, pre_t), (mid, mid_t), (suf, suf_t) = tmpl["prefix"], tmpl["middle"], tmpl["suffix"]
  ids, offsets = tokenizer.encode_offsets(text)
  a, b = tmpl["a_type"], tmpl["b_type"]
  if question_ids:
    head, head_t = list(pre) + question_ids + list(mid), list(pre_t) + [a] * len(question_ids) + list(mid_t)
    body_t, tail_t = b, list(suf_t)
  else:  # one segment: [CLS] passage [SEP]
    head, head_t, body_t, tail_t = list(pre), list(pre_t), a, [a] * len(suf)
  room = seq_len - len(head) - len(suf)
  n = max(0, min(len(ids), room))
  off = np.full((seq_len, 2), -1, np.int32)
  off[len(head):len(head) + n] = np.asarray(offsets[:n]).reshape(n, 2)
  return head + list(ids[:n]) + list(suf), head_t + [body_t] * n + tail_t, off, len(head)


def encode(graphs: list, tokenizer, seq_len: int, max_nodes: int, max_query_length: int) -> tuple[dict, np.ndarray]:
  """(arrays, offsets): [G, N, seq_len] input_ids, type_ids, groups (one passage a row, N = max_nodes; padding
  nodes a lone [CLS]), node_mask [G, N], links [G, N(to), N(from)], node_label [G, N] (NO_LABEL: none), label [G],
  answer_node, start_position, end_position [G] and span_weight [G] (0 when the answer is cut off the row);
  offsets [G, N, seq_len, 2], each passage token's characters in its passage."""
  tmpl = template(tokenizer)
  g_count = len(graphs)
  shape = (g_count, max_nodes, seq_len)
  arrays = dict(input_ids=np.full(shape, tokenizer.special.pad, np.int32), type_ids=np.zeros(shape, np.int32),
                groups=np.zeros(shape, np.int32), node_mask=np.zeros(shape[:2], np.float32),
                links=np.zeros((g_count, max_nodes, max_nodes), np.float32),
                node_label=np.full(shape[:2], NO_LABEL, np.float32), label=np.zeros(g_count, np.int32),
                answer_node=np.zeros(g_count, np.int32), start_position=np.zeros(g_count, np.int32),
                end_position=np.zeros(g_count, np.int32), span_weight=np.zeros(g_count, np.float32))
  offsets = np.full(shape + (2,), -1, np.int32)
  for i, g in enumerate(graphs):
    q = list(tokenizer.encode_offsets(g.question.strip())[0][:max_query_length]) if g.question.strip() else []
    for k, text in enumerate(g.texts):
      ids, types, off, head = _row(tokenizer, tmpl, q, text, seq_len)
      arrays["input_ids"][i, k, :len(ids)], arrays["type_ids"][i, k, :len(ids)] = ids, types
      arrays["groups"][i, k, :len(ids)], offsets[i, k] = 1, off
      if g.answer is not None and g.answer[0] == k:
        end = g.answer[2] + len(g.answer[1])
        kept = off[head:][off[head:, 0] >= 0]  # the passage's tokens this row holds
        first, last = answer_tokens(kept, g.answer[2], end)
        if first <= last and kept[last, 1] >= end:  # the whole answer is in the row
          arrays["start_position"][i], arrays["end_position"][i] = first + head, last + head
          arrays["span_weight"][i] = 1.0
    n = len(g.texts)
    arrays["node_mask"][i, :n] = 1.0
    arrays["node_label"][i, :n] = g.relevant
    arrays["input_ids"][i, n:, 0], arrays["groups"][i, n:, 0] = tokenizer.special.cls, 1  # padding nodes
    for u, v in g.links:
      arrays["links"][i, v, u] = 1.0
    arrays["label"][i] = max(g.label, 0)
    arrays["answer_node"][i] = g.answer[0] if g.answer is not None else 0
  return arrays, offsets


def widest(*splits) -> int:
  """The most passages of any graph of the splits."""
  return max(len(g.texts) for graphs in splits for g in graphs)
