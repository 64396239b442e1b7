"""From the config's data section to training rows, and batches that are a pure function of the step.

`build(config)` either opens prepared shards (`shards:DIR`, memory-mapped: nothing is loaded) after
checking that they were made for this config, or, for the other sources, reads the source into memory,
resolves the tokenizer (trains and caches a SentencePiece model when none is given), holds out whole
documents for eval, and makes instances in the format the objectives need (small corpora; large ones
go through `python -m bertjax.prepare`, which streams). `batch_at(arrays, step, ...)` is the loader: a
global batch is rows `step*B .. step*B+B-1` of an endless sequence of per-epoch permutations keyed by
(seed, epoch), so any process can compute its share of any step's batch with no state, reads only
those rows, and resuming at step k replays exactly the same data.
"""

import dataclasses
import hashlib
import os
import random

import numpy as np

from bertjax.data import instances, shards, sources
from bertjax.data.tokenizer import Tokenizer, load_tokenizer, train_sentencepiece
from bertjax.config import active_objectives
from bertjax.errors import UserError
from bertjax.objectives import SENTENCE_OBJECTIVES


@dataclasses.dataclass
class Dataset:
  train: dict  # name -> np.ndarray [N, ...] in memory, or shards.Rows (memory-mapped) for shards:DIR
  eval: dict
  tokenizer: Tokenizer
  stats: dict  # counts to report at start-up


def instance_format(objectives) -> str:
  """The instance format the objectives need: NSP or SOP pairs, else single segments."""
  sentence = [o for o in objectives if o in SENTENCE_OBJECTIVES]
  if len(sentence) > 1:
    raise UserError(f"objectives {sentence} need different instances; keep one of them in --config.objectives")
  return sentence[0] if sentence else "single"


def resolve_format(config) -> str:
  """The instance format of a run: the sentence objective's pairs, else config.data.format (auto: single)."""
  needed, chosen = instance_format(active_objectives(config)), config.data.format
  if needed in instances.PAIR_FORMATS:
    if chosen not in ("auto", needed):
      raise UserError(f"objective {needed} needs {needed} pairs, not data.format={chosen!r}; "
                      f"set --config.data.format=auto or switch off --config.objectives.{needed}")
    return needed
  if chosen in instances.PAIR_FORMATS:
    raise UserError(f"data.format={chosen!r} makes pairs for a sentence objective the config does not train; "
                    f"set --config.objectives.{chosen} or --config.data.format=auto")
  return "single" if chosen == "auto" else chosen


def cache_dir(config) -> str:
  return os.path.expanduser(config.data.cache_dir or os.environ.get("BERTJAX_CACHE", "~/.cache/bertjax"))


def resolve_tokenizer(config, train_docs=None) -> Tokenizer:
  """The tokenizer named by config.data.tokenizer, or a SentencePiece model trained on the training
  documents at first use and cached under cache_dir by (source fingerprint, vocab size, how it was trained)."""
  d = config.data
  spec, vocab = d.tokenizer, config.model.vocab_size
  if spec:
    tok = load_tokenizer(spec)
  else:
    how = (f"{d.tokenizer_model}:{d.tokenizer_sentences}:{d.tokenizer_max_sentence_length}:{d.split_paragraphs}:"
           f"{d.eval_fraction}:{config.seed}")
    name = f"spm-{sources.fingerprint(d.source)}-{vocab}-{hashlib.sha256(how.encode()).hexdigest()[:8]}"
    prefix = os.path.join(cache_dir(config), name)
    if os.path.exists(prefix + ".model"):
      tok = load_tokenizer("spm:" + prefix + ".model")
    else:
      os.makedirs(cache_dir(config), exist_ok=True)
      tok = train_tokenizer(config, (s for doc in train_docs for s in doc), prefix)
  check_vocab_size(tok, vocab)
  return tok


def train_tokenizer(config, sentences, prefix: str) -> Tokenizer:
  """A SentencePiece model trained on `sentences` as config.data says (type, sample size, longest sentence)."""
  d = config.data
  return train_sentencepiece(sentences, prefix, config.model.vocab_size, model_type=d.tokenizer_model,
                             input_sentence_size=d.tokenizer_sentences,
                             max_sentence_length=d.tokenizer_max_sentence_length, seed=config.seed)


def check_vocab_size(tok: Tokenizer, vocab: int):
  if tok.vocab_size != vocab:
    raise UserError(f"tokenizer {tok.spec()} has {tok.vocab_size} ids but config.model.vocab_size={vocab}; "
                    f"set --config.model.vocab_size={tok.vocab_size}")


def _tokenize(docs, tok):
  out = []
  for doc in docs:
    sents = [tok.encode(s) for s in doc]
    sents = [s for s in sents if len(s[0])]
    if sents:
      out.append(sents)
  return out


def split_documents(docs, eval_fraction: float):
  """Holds out whole documents (a fixed choice, independent of the run's seed) for eval."""
  rng = random.Random(1234)
  held = [rng.random() < eval_fraction for _ in docs]
  return [d for d, h in zip(docs, held) if not h], [d for d, h in zip(docs, held) if h]


def build(config) -> Dataset:
  """The run's train and eval rows and tokenizer; see the module docstring."""
  d = config.data
  if d.source.startswith("shards:"):
    return _open_shards(config)
  stats = sources.SourceStats()
  docs = list(sources.documents(d.source, stats, d.split_paragraphs, tfds_text_key=d.tfds_text_key,
                                tfds_data_dir=d.tfds_data_dir))
  if stats.documents == 0 or stats.sentences == 0:
    raise UserError(f"data source {d.source!r} holds no text; point --config.data.source at a non-empty corpus")
  train_docs, eval_docs = split_documents(docs, d.eval_fraction)
  fmt = resolve_format(config)
  if len(eval_docs) < 2 or len(train_docs) < 2:
    raise UserError(f"corpus {d.source!r} has {stats.documents} documents: too few to hold out "
                    f"{d.eval_fraction:.0%} for eval; use a larger corpus or change --config.data.eval_fraction")
  tok = resolve_tokenizer(config, train_docs)
  special = tok.special
  train, train_stats = instances.make_instances(
      _tokenize(train_docs, tok), fmt, config.seq_len, special,
      short_seq_prob=d.short_seq_prob, dupe_factor=d.dupe_factor, seed=config.seed)
  evals, eval_stats = instances.make_instances(
      _tokenize(eval_docs, tok), fmt, config.seq_len, special, short_seq_prob=0.0, seed=0)
  if train is None or evals is None:
    raise UserError(f"corpus {d.source!r} gives no {fmt} instances; it needs documents of at least two sentences")
  return Dataset(train, evals, tok, dict(source=stats, train=train_stats, eval=eval_stats, format=fmt))


def _open_shards(config) -> Dataset:
  """Prepared shards, after checking that format, seq_len and tokenizer are this config's."""
  directory = os.path.expanduser(config.data.source.partition(":")[2])
  meta = shards.read_metadata(directory)
  fix = "prepare them for this config (python -m bertjax.prepare --config=... --out=DIR) or change the config"
  fmt = resolve_format(config)
  if meta["format"] != fmt:
    raise UserError(f"shards {directory} hold {meta['format']} instances but this config trains on {fmt}; {fix}")
  if meta["seq_len"] != config.seq_len:
    raise UserError(f"shards {directory} have seq_len {meta['seq_len']} but config.seq_len={config.seq_len}; {fix}")
  theirs = meta["tokenizer"]
  kind, _, path = theirs["spec"].partition(":")
  own = load_tokenizer(f"{kind}:{os.path.join(directory, path)}")
  if own.fingerprint != theirs["fingerprint"]:
    raise UserError(f"the tokenizer in {directory} is not the one its shards were made with; prepare them again")
  tok = own
  if config.data.tokenizer:
    tok = load_tokenizer(config.data.tokenizer)
    if tok.fingerprint != theirs["fingerprint"]:
      raise UserError(f"config.data.tokenizer {tok.spec()} is not the tokenizer the shards in {directory} were "
                      "made with; leave --config.data.tokenizer empty to use theirs")
  check_vocab_size(tok, config.model.vocab_size)
  counts = meta["counts"]
  stats = dict(source=sources.SourceStats(**counts["source"]), format=fmt,
               train=instances.InstanceStats(**counts["train"]), eval=instances.InstanceStats(**counts["eval"]))
  return Dataset(shards.open_split(directory, meta, "train"), shards.open_split(directory, meta, "eval"), tok, stats)


def _num_rows(arrays) -> int:
  return len(arrays) if isinstance(arrays, shards.Rows) else len(arrays["input_ids"])


def _take(arrays, idx) -> dict:
  """Rows `idx` of in-memory arrays or of memory-mapped shards."""
  if isinstance(arrays, shards.Rows):
    return arrays.take(idx)
  return {k: v[idx] for k, v in arrays.items()}


def permuted(seed: int, epoch: int, positions: np.ndarray, n: int) -> np.ndarray:
  """Where `positions` go under a pseudo-random permutation of range(n) keyed by (seed, epoch).

  Computed per index, never materialized, so the loader's memory does not grow with the corpus: a few
  rounds of bijections of the k-bit integers (multiplication by an odd key, adding a key, xor with the
  upper half shifted down), then cycle-walking (apply again while the result is >= n) to stay in range.
  """
  if n == 1:
    return np.zeros_like(positions)
  bits = int(n - 1).bit_length()
  mask, shift = np.uint64((1 << bits) - 1), np.uint64(max(1, (bits + 1) // 2))
  keys = np.random.default_rng([seed, epoch]).integers(0, 1 << 62, (4, 2), dtype=np.uint64)
  x = positions.astype(np.uint64)
  todo = np.ones(len(x), bool)
  while todo.any():
    y = x[todo]
    for mul, add in keys:
      y = (y * (mul | np.uint64(1))) & mask
      y = (y + add) & mask
      y ^= y >> shift
    x[todo] = y
    todo[todo] = y >= n
  return x.astype(np.int64)


def batch_at(arrays, step: int, batch_size: int, seed: int, process_index: int = 0, process_count: int = 1):
  """This process's rows of global batch `step` (batch_size rows in all, split evenly over processes)."""
  n = _num_rows(arrays)
  per_process = batch_size // process_count
  g = step * batch_size + process_index * per_process + np.arange(per_process)
  epochs, pos = g // n, g % n
  idx = np.empty(per_process, np.int64)
  for e in np.unique(epochs):
    idx[epochs == e] = permuted(seed, int(e), pos[epochs == e], n)
  batch = _take(arrays, idx)
  batch["example_weight"] = np.ones(per_process, np.float32)
  return batch


def eval_batches(arrays, batch_size: int, process_index: int = 0, process_count: int = 1):
  """The whole eval set in order, this process's share; the last batch is padded with weight-0 rows."""
  n = _num_rows(arrays)
  per_process = batch_size // process_count
  for start in range(0, n, batch_size):
    g = start + process_index * per_process + np.arange(per_process)
    valid = g < n
    batch = _take(arrays, np.where(valid, g, 0))
    batch["example_weight"] = valid.astype(np.float32)
    yield batch
