"""SQuAD v1.1 / v2.0 questions from the official JSON files (`json:DIR`) or tfds (`tfds:squad/v1.1`,
`tfds:squad/v2.0`), checked as they are read: a malformed file names the file and the question id."""

import dataclasses
import json
import os

from bertjax.data import sources
from bertjax.core.errors import UserError

# The official file names of each version (task.train_file / task.eval_file default to these).
FILES = {"squad1": ("train-v1.1.json", "dev-v1.1.json"), "squad2": ("train-v2.0.json", "dev-v2.0.json")}


@dataclasses.dataclass(frozen=True)
class Question:
  """One question over one paragraph. `answers` are all gold texts (several on dev sets, none when
  impossible); `answer_start` is the character offset of the first one (what training uses), -1 if none."""

  qid: str
  question: str
  context: str
  answers: tuple
  answer_start: int
  is_impossible: bool


def _bad(path: str, qid: str, what: str) -> UserError:
  return UserError(f"{path}: question {qid}: {what}")


def _answers(path: str, qid: str, context: str, answers) -> tuple[tuple, int]:
  """(texts, first start) of a question's answers, each checked to sit where its answer_start says."""
  if not isinstance(answers, list):
    raise _bad(path, qid, "'answers' is not a list")
  texts = []
  for a in answers:
    if not isinstance(a, dict) or not isinstance(a.get("text"), str) or not isinstance(a.get("answer_start"), int):
      raise _bad(path, qid, "an answer lacks 'text' (string) or 'answer_start' (integer)")
    start, text = a["answer_start"], a["text"]
    if context[start:start + len(text)] != text or start < 0:
      raise _bad(path, qid, f"answer_start {start} does not point at the answer text {text!r}")
    texts.append(text)
  return tuple(texts), answers[0]["answer_start"] if answers else -1


def parse(data, path: str, labeled: bool = True) -> list:
  """The questions of a parsed SQuAD file (its top-level object), in file order; `labeled` False (questions to
  answer): a question may lack 'answers'."""
  if not isinstance(data, dict) or not isinstance(data.get("data"), list):
    raise UserError(f"{path}: no top-level 'data' list; is it a SQuAD file?")
  out = []
  for article in data["data"]:
    if not isinstance(article, dict) or not isinstance(article.get("paragraphs"), list):
      raise UserError(f"{path}: an article has no 'paragraphs' list (title {article.get('title', '?')!r})"
                      if isinstance(article, dict) else f"{path}: an article is not an object")
    for p in article["paragraphs"]:
      qas = p.get("qas") if isinstance(p, dict) else None
      if not isinstance(qas, list) or not isinstance(p.get("context"), str):
        raise UserError(f"{path}: a paragraph of article {article.get('title', '?')!r} lacks 'context' or 'qas'")
      for qa in qas:
        qid = qa.get("id", "?") if isinstance(qa, dict) else "?"
        for key in ("id", "question", "answers") if labeled else ("id", "question"):
          if not isinstance(qa, dict) or key not in qa:
            raise _bad(path, qid, f"missing key {key!r}")
        impossible = bool(qa.get("is_impossible", False))
        texts, start = _answers(path, qid, p["context"], qa.get("answers", []))
        if impossible and texts:
          raise _bad(path, qid, "is_impossible is true but it has answers")
        out.append(Question(str(qa["id"]), qa["question"], p["context"], texts, start, impossible or not texts))
  return out


def read_json(path: str, labeled: bool = True) -> tuple[list, list]:
  """(questions, the file's `data` list as read) of one SQuAD JSON file; UserError on any defect (`labeled`:
  as `parse`)."""
  if not os.path.isfile(path):
    raise UserError(f"no SQuAD file at {path}; point --config.task.source=json:DIR at a directory holding it "
                    "(or set --config.task.train_file / eval_file)")
  try:
    with open(path, encoding="utf-8") as f:
      data = json.load(f)
  except (json.JSONDecodeError, UnicodeDecodeError) as e:
    raise UserError(f"{path}: not valid JSON ({e})") from None
  return parse(data, path, labeled), data["data"]


def _text(x) -> str:
  return x.decode("utf-8") if isinstance(x, bytes) else str(x)


def read_tfds(name: str, split: str) -> tuple[list, list]:
  """(questions, an equivalent SQuAD `data` list for the scorer) of a tfds split (squad/v1.1, squad/v2.0),
  read as GLUE's and pretraining's tfds sources are (no TensorFlow for ArrayRecord datasets)."""
  paragraphs = {}  # context -> paragraph dict, so the rebuilt `data` groups questions as the JSON does
  for ex in sources.tfds_examples(sources.import_tfds(), name, split, ""):
    context = _text(ex["context"])
    texts = [_text(t) for t in ex["answers"]["text"]]
    starts = [int(s) for s in ex["answers"]["answer_start"]]
    qa = {"id": _text(ex["id"]), "question": _text(ex["question"]),
          "answers": [{"text": t, "answer_start": s} for t, s in zip(texts, starts)]}
    if "is_impossible" in ex:
      qa["is_impossible"] = bool(ex["is_impossible"])
    paragraphs.setdefault((_text(ex.get("title", b"")), context), {"context": context, "qas": []})["qas"].append(qa)
  data = [{"title": title, "paragraphs": [p]} for (title, _), p in paragraphs.items()]
  return parse({"data": data}, f"tfds:{name}:{split}"), data


def read_split(task, train: bool) -> tuple[list, list]:
  """(questions, SQuAD `data` list) of the training or evaluation split of task.source."""
  kind, _, arg = task.source.partition(":")
  if kind == "json" and arg:
    return read_json(os.path.join(arg, task.train_file if train else task.eval_file))
  if kind == "tfds" and arg:
    return read_tfds(arg, "train" if train else task.eval_split)
  raise UserError(f"unknown task source {task.source!r}; use --config.task.source=json:DIR or tfds:squad/v1.1 "
                  "(tfds:squad/v2.0)")


def restrict(data: list, questions: list) -> list:
  """A SQuAD `data` list cut to `questions` (so the scorer counts exactly the questions predicted)."""
  wanted = {q.qid for q in questions}
  cut = []
  for article in data:
    paras = [dict(p, qas=[qa for qa in p["qas"] if qa["id"] in wanted]) for p in article["paragraphs"]]
    paras = [p for p in paras if p["qas"]]
    if paras:
      cut.append(dict(article, paragraphs=paras))
  return cut


def subsample(questions: list, data: list, n: int, seed: int) -> tuple[list, list]:
  """A fixed random subset of n questions (all when n is 0 or too large), with `data` cut to just them."""
  if not n or n >= len(questions):
    return questions, data
  import numpy as np

  idx = np.sort(np.random.default_rng(seed).choice(len(questions), n, replace=False))
  keep = [questions[i] for i in idx]
  return keep, restrict(data, keep)
