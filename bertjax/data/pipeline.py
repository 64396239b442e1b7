"""From the config's data section to arrays in memory, and batches that are a pure function of the step.

`build(config)` reads the source, resolves the tokenizer (trains and caches a SentencePiece model when
none is given), holds out whole documents for eval, and makes instances in the format the objectives
need. `batch_at(arrays, step, ...)` is the loader: a global batch is rows `step*B .. step*B+B-1` of an
endless sequence of per-epoch permutations seeded by (seed, epoch), so any process can compute its share
of any step's batch with no state, and resuming at step k replays exactly the same data.
"""

import dataclasses
import functools
import os
import random

import numpy as np

from bertjax.data import instances, sources
from bertjax.data.tokenizer import Tokenizer, load_tokenizer, train_sentencepiece
from bertjax.config import active_objectives
from bertjax.errors import UserError
from bertjax.objectives import SENTENCE_OBJECTIVES


@dataclasses.dataclass
class Dataset:
  train: dict  # name -> np.ndarray [N, ...]
  eval: dict
  tokenizer: Tokenizer
  stats: dict  # counts to report at start-up


def instance_format(objectives) -> str:
  """The instance format the objectives need: NSP or SOP pairs, else single segments."""
  sentence = [o for o in objectives if o in SENTENCE_OBJECTIVES]
  if len(sentence) > 1:
    raise UserError(f"objectives {sentence} need different instances; keep one of them in --config.objectives")
  return sentence[0] if sentence else "single"


def cache_dir(config) -> str:
  return os.path.expanduser(config.data.cache_dir or os.environ.get("BERTJAX_CACHE", "~/.cache/bertjax"))


def resolve_tokenizer(config, train_docs=None) -> Tokenizer:
  """The tokenizer named by config.data.tokenizer, or a SentencePiece model trained on the training
  documents at first use and cached under cache_dir by (source fingerprint, vocab size)."""
  spec, vocab = config.data.tokenizer, config.model.vocab_size
  if spec:
    tok = load_tokenizer(spec)
  else:
    prefix = os.path.join(cache_dir(config), f"spm-{sources.fingerprint(config.data.source)}-{vocab}")
    if os.path.exists(prefix + ".model"):
      tok = load_tokenizer("spm:" + prefix + ".model")
    else:
      os.makedirs(cache_dir(config), exist_ok=True)
      sentences = (s for doc in train_docs for s in doc)
      tok = train_sentencepiece(sentences, prefix, vocab, seed=config.seed)
  if tok.vocab_size != vocab:
    raise UserError(f"tokenizer {tok.spec()} has {tok.vocab_size} ids but config.model.vocab_size={vocab}; "
                    f"set --config.model.vocab_size={tok.vocab_size}")
  return tok


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
  """Reads, tokenizes and instantiates the configured source; see the module docstring."""
  d = config.data
  stats = sources.SourceStats()
  docs = list(sources.documents(d.source, stats, d.split_paragraphs))
  if stats.documents == 0 or stats.sentences == 0:
    raise UserError(f"data source {d.source!r} holds no text; point --config.data.source at a non-empty corpus")
  train_docs, eval_docs = split_documents(docs, d.eval_fraction)
  fmt = instance_format(active_objectives(config))
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


@functools.lru_cache(maxsize=4)
def _permutation(seed: int, epoch: int, n: int) -> np.ndarray:
  return np.random.default_rng([seed, epoch]).permutation(n)


def batch_at(arrays, step: int, batch_size: int, seed: int, process_index: int = 0, process_count: int = 1):
  """This process's rows of global batch `step` (batch_size rows in all, split evenly over processes)."""
  n = len(arrays["input_ids"])
  per_process = batch_size // process_count
  g = step * batch_size + process_index * per_process + np.arange(per_process)
  epochs, pos = g // n, g % n
  idx = np.concatenate([_permutation(seed, int(e), n)[pos[epochs == e]] for e in np.unique(epochs)])
  batch = {k: v[idx] for k, v in arrays.items()}
  batch["example_weight"] = np.ones(per_process, np.float32)
  return batch


def eval_batches(arrays, batch_size: int, process_index: int = 0, process_count: int = 1):
  """The whole eval set in order, this process's share; the last batch is padded with weight-0 rows."""
  n = len(arrays["input_ids"])
  per_process = batch_size // process_count
  for start in range(0, n, batch_size):
    g = start + process_index * per_process + np.arange(per_process)
    valid = g < n
    batch = {k: v[np.where(valid, g, 0)] for k, v in arrays.items()}
    batch["example_weight"] = valid.astype(np.float32)
    yield batch
