"""The tagging family's part of `python -m bertjax.finetune.predict`: tags of the sentences of a CoNLL column file
(words in the first column, or the fine-tuning run's token column; a last column, when there are several, is
kept as gold), of a file of one sentence a line, or of --text; each word read from its max-context window, as
fine-tuning scores."""

import os
import re

import ml_collections

from bertjax.core.errors import UserError
from bertjax.finetune import predict as cli
from bertjax.finetune.tagging import data as tag_data, metrics as tag_metrics
from bertjax.finetune.tasks import TOKEN_FIELDS

DEFAULT_SEQ_LEN = 128
PREDICTIONS_FILE = "predictions.conll"
_WORDS = re.compile(r"\w+(?:[-'.]\w+)*|[^\w\s]")  # words and punctuation, as CoNLL files split them


def words_of(text: str) -> list:
  """The words of a sentence, punctuation split off (CoNLL's tokenization, roughly)."""
  return _WORDS.findall(text)


def _columns(path: str) -> int:
  """The column count of a CoNLL file's first word line (0 when it has none)."""
  with open(path, encoding="utf-8") as f:
    for line in f:
      cols = line.replace("\ufeff", "").split()
      if cols and cols[0] != tag_data.DOCSTART:
        return len(cols)
  return 0


def read_inputs(args, ft_config) -> tuple:
  """(sentences, gold tags or None), read and checked before the model is loaded."""
  cli.only_flags(args, ("input", "lines", "text"), "tagging")
  if args.input:
    task = dict(token_column=0, tag_column=-1, strip_token_prefix="")
    if ft_config is not None:
      task.update(token_column=ft_config.task.token_column, strip_token_prefix=ft_config.task.get("strip_token_prefix", ""))
    s = tag_data.read_conll(args.input, ml_collections.ConfigDict(task))
    gold = s.tags if _columns(args.input) > 1 else None
    return tag_data.Sentences(s.words, [["O"] * len(w) for w in s.words], s.lines, s.path), gold
  if args.lines:
    rows = [(n, words_of(line)) for n, line in cli.read_lines(args.lines)]
    bad = next((n for n, w in rows if not w), None)
    if bad is not None:
      raise UserError(f"{args.lines}:{bad}: no words on the line")
    words = [w for _, w in rows]
    return tag_data.Sentences(words, [["O"] * len(w) for w in words], [], args.lines), None
  words = words_of(args.text)
  if not words:
    raise UserError("--text has no words")
  return tag_data.Sentences([words], [["O"] * len(words)], [], "--text"), None


def tag_sentences(s: tag_data.Sentences, tok, model, params, seq_len: int = DEFAULT_SEQ_LEN, stride: int = 0,
                  batch_size: int = 32) -> list:
  """Tags of every sentence from a fine-tuned TokenClassifier (windowed as in training, each word read from its
  max-context window)."""
  from bertjax.finetune import batches, train

  s = tag_data.Sentences(s.words, [["O"] * len(w) for w in s.words], s.lines, s.path)
  arrays = tag_data.encode(s, tok, ["O"], seq_len, stride or max(1, (seq_len - 2) // 2), "none")
  tokens = {k: arrays[k] for k in TOKEN_FIELDS}
  outputs = train.predict(params, tokens, model, batch_size, batches.prediction_layout(tokens, batch_size), 1)
  return [[model.labels[i] for i in ids] for ids in tag_data.word_predictions(arrays, outputs.argmax(-1), s)]


def tag_words(words: list, tok, model, params, seq_len: int = DEFAULT_SEQ_LEN, stride: int = 0) -> list:
  """Tags of one pre-split sentence (`tag_sentences` of one)."""
  s = tag_data.Sentences([list(words)], [["O"] * len(words)], [], "input")
  return tag_sentences(s, tok, model, params, seq_len, stride, 8)[0]


def predict(tm, inputs: tuple, args, ft_config) -> dict:
  """Tags of every sentence, windowed as the fine-tuning run windowed (its window_stride when it fits)."""
  s, gold = inputs
  seq_len = args.seq_len or (ft_config.seq_len if ft_config is not None else DEFAULT_SEQ_LEN)
  stride = ft_config.task.get("window_stride", 0) if ft_config is not None else 0
  stride = stride if 0 < stride <= seq_len - 2 else 0
  tags = tag_sentences(s, tm.tokenizer, tm.model, tm.params, seq_len, stride, args.batch_size)
  return dict(words=s.words, tags=tags, gold=gold)


def records(result: dict) -> list:
  """One object per sentence: its words and predicted tags (and the input's gold tags, when it had them)."""
  rows = []
  for i, (words, tags) in enumerate(zip(result["words"], result["tags"])):
    rows.append(dict(words=words, tags=tags, **({"gold": result["gold"][i]} if result["gold"] else {})))
  return rows


def write(directory: str, result: dict) -> list:
  """predictions.conll: `word gold predicted` lines (conlleval's input, as fine-tuning writes it) when the input
  had gold tags, else `word predicted`; a blank line after each sentence."""
  path = os.path.join(directory, PREDICTIONS_FILE)
  if result["gold"]:
    tag_metrics.write_conll(path, result["words"], result["gold"], result["tags"])
    return [path]
  with open(path, "w", encoding="utf-8") as f:
    for words, tags in zip(result["words"], result["tags"]):
      f.write("".join(f"{w} {t}\n" for w, t in zip(words, tags)) + "\n")
  return [path]
