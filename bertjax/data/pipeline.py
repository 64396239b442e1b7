"""From the config's data section to training rows, and batches that are a pure function of the step.

Every source takes one road, bertjax.data.prepare_lib (what `python -m bertjax.data.prepare` runs), into
shards that training reads memory-mapped. `build(config)` opens `shards:DIR` as it is; any other source
(`demo`, `text:GLOB`, `tfds:...`) is prepared once into the cache, `cache_dir(config)/shards-KEY` with KEY a
hash of the source's fingerprint, the tokenizer's fingerprint (vocabulary, casing, normalization), the
row-builder version (prepare_lib.ROWS_VERSION) and every setting that changes the rows, and opened from
there, so the same config gives the same rows whether it names the corpus or shards prepared from it. A
SentencePiece tokenizer trained on the source is cached apart (`tokenizer-KEY`), keyed by what changes it
only, so configs that differ in seq_len or format share it. Either way the shard files are checked against
their metadata (size, sha256: shards.verify) before a row is read; docs/integrity.md.

`batch_at(rows, step, ...)` is the loader: a global batch is rows `step*B .. step*B+B-1` of an endless
sequence of per-epoch permutations keyed by (seed, epoch), so any process can compute its share of any
step's batch with no state, reads only those rows, and resuming at step k replays exactly the same data.
"""

import dataclasses
import functools
import hashlib
import json
import os
import sys

import numpy as np

from bertjax.core.errors import UserError
from bertjax.data import cache_entry, instances, plm, prepare_lib, shards, sources, trees, units
from bertjax.data.tokenizer import Tokenizer
from bertjax.data.tokenizer_spec import load_tokenizer


@dataclasses.dataclass
class Dataset:
  train: shards.Rows  # memory-mapped rows of the prepared train split
  eval: shards.Rows
  tokenizer: Tokenizer
  stats: dict  # counts to report at start-up: source, train, eval (as prepared) and format
  token_counts: np.ndarray = None  # int64 [tokenizer vocab] of the train text, as prepared (None: not stored)
  windows: plm.Layout = None  # the stream format's (XLNet's PLM): how batches are cut from the token streams

  def train_batch(self, step: int, batch_size: int, seed: int, process_index: int = 0, process_count: int = 1):
    """This process's rows of global training batch `step`: `batch_at`, or the streams' windows (plm.batch_at)."""
    if self.windows is None:
      return batch_at(self.train, step, batch_size, seed, process_index, process_count)
    return plm.batch_at(self._stream("train"), step, batch_size, seed, self.windows, process_index, process_count)

  def eval_batches(self, batch_size: int, process_index: int = 0, process_count: int = 1):
    """The whole eval set, this process's share: `eval_batches`, or the eval streams' windows in order."""
    if self.windows is None:
      return eval_batches(self.eval, batch_size, process_index, process_count)
    return plm.eval_batches(self._stream("eval"), batch_size, self.windows, process_index, process_count)

  def _stream(self, split: str) -> plm.Stream:
    return plm.Stream(getattr(self, split), self.stats[split].tokens, self.windows.seq_len)


def cache_dir(config) -> str:
  return os.path.expanduser(config.data.cache_dir or os.environ.get("BERTJAX_CACHE", "~/.cache/bertjax"))


def _key(settings: dict) -> str:
  return hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:16]


def _read_settings(config, source_fingerprint: str) -> dict:
  """What decides which documents are read and which are held out for eval."""
  d = config.data
  read = dict(source=source_fingerprint, eval_fraction=d.eval_fraction, split_paragraphs=d.split_paragraphs,
              tfds_text_key=d.tfds_text_key, tfds_data_dir=d.tfds_data_dir)
  if d.get("units", ""):  # the span files' content (keys of runs without spans stay as they were)
    read["units"] = units.fingerprint(d.units)
  if d.get("trees", False):  # lines read as bracketed trees (bertjax.data.trees)
    read["trees"] = True
  return read


def tokenizer_key(config, source_fingerprint: str) -> str:
  """The cache key of a SentencePiece tokenizer trained on the source: every setting that changes it."""
  d = config.data
  return _key(dict(_read_settings(config, source_fingerprint), seed=config.seed,
                   vocab_size=config.model.vocab_size, model=d.tokenizer_model, sentences=d.tokenizer_sentences,
                   max_sentence_length=d.tokenizer_max_sentence_length))


def shards_key(config, source_fingerprint: str, tokenizer_fingerprint: str) -> str:
  """The cache key of prepared shards: the source, the tokenizer, and every setting that changes the rows."""
  d, replace = config.data, units.replace_prob(config)
  return _key(dict(_read_settings(config, source_fingerprint), version=shards.VERSION,
                   rows_version=prepare_lib.ROWS_VERSION,
                   chunk_bytes=prepare_lib.CHUNK_BYTES, tokenizer=tokenizer_fingerprint,
                   format=prepare_lib.resolve_format(config), seq_len=config.seq_len, seed=config.seed,
                   dupe_factor=d.dupe_factor, short_seq_prob=d.short_seq_prob,
                   **({"replace_prob": replace} if replace else {})))  # only WKLM's: other keys stay as they were


def prepared(config, process_index: int = 0) -> str:
  """The cache directory of config.data.source prepared for this config, prepared first if need be: by one
  process of a multi-process run (process 0 where they share the cache; bertjax.data.cache_entry), the others
  waiting for it up to data.prepare_wait_s."""
  d = config.data
  root, source = cache_dir(config), sources.fingerprint(d.source)
  once = functools.partial(cache_entry.once, process_index=process_index,
                           wait_s=d.get("prepare_wait_s", cache_entry.WAIT_S))
  tokenizer = d.tokenizer
  if not tokenizer:
    directory = os.path.join(root, f"tokenizer-{tokenizer_key(config, source)}")

    def train(tmp):
      prepare_lib.prepare_tokenizer(config, trees.open_reader(config), tmp)

    tokenizer = "spm:" + os.path.join(once(directory, train), "tokenizer.model")
  tok = load_tokenizer(tokenizer)
  prepare_lib.check_vocab_size(tok, config.model.vocab_size)
  directory = os.path.join(root, f"shards-{shards_key(config, source, tok.fingerprint)}")

  def prepare(tmp):  # only in the process that claimed the entry
    print(f"data: preparing {d.source} into {directory} (process {process_index}, once: runs with the same data "
          "settings reuse it)", file=sys.stderr, flush=True)
    stale = stale_caches(root)
    if stale:
      size = sum(b for _, b in stale)
      print(f"data: {len(stale)} cache directories in {root} hold rows of other row-builder versions "
            f"(this bertjax builds version {prepare_lib.ROWS_VERSION}) and are never read again, {size / 1e6:.1f} MB "
            f"in all; delete them to free the space: " + ", ".join(f"{p} ({b / 1e6:.1f} MB)" for p, b in stale),
            file=sys.stderr, flush=True)
    prepare_lib.prepare(config, tmp, workers=d.prepare_workers, progress=sys.stderr, tokenizer=tokenizer)

  return once(directory, prepare)


def _size(directory: str) -> int:
  return sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(directory) for f in files)


def stale_caches(root: str) -> list:
  """[(directory, bytes)] of the prepared cache entries under `root` that another row-builder version made
  (their metadata says so, or predates the version): their key differs from any this bertjax computes."""
  stale = []
  for name in sorted(os.listdir(root)) if os.path.isdir(root) else []:
    path = os.path.join(root, name, shards.METADATA)
    if not name.startswith("shards-") or not os.path.isfile(path):
      continue
    try:
      with open(path) as f:
        version = json.load(f).get("rows_version")
    except (OSError, ValueError):
      version = None
    if version != prepare_lib.ROWS_VERSION:
      stale.append((os.path.join(root, name), _size(os.path.join(root, name))))
  return stale


def build(config, process_index: int = 0) -> Dataset:
  """The run's train and eval rows and tokenizer; see the module docstring. `process_index`: this process's
  in a multi-process run, which decides who prepares a cache entry (prepared)."""
  source = config.data.source
  if source.startswith("shards:"):
    directory = os.path.expanduser(source.partition(":")[2])
    per_phase = os.path.join(directory, f"seq_len_{config.seq_len}")  # prepared for a config with phases
    return _open_shards(config, per_phase if os.path.isdir(per_phase) else directory)
  return _open_shards(config, prepared(config, process_index), cached=True)


def _open_shards(config, directory: str, cached: bool = False) -> Dataset:
  """Prepared shards, after checking that format, seq_len and tokenizer are this config's (and, for a cache
  entry, the row-builder version) and that the shard files are whole (shards.verify)."""
  meta = shards.read_metadata(directory)
  built = meta.get("rows_version")
  if built != prepare_lib.ROWS_VERSION:
    if cached:  # unreachable through the key; a guard against an entry renamed or copied into place
      raise UserError(f"cache entry {directory} holds rows of row-builder version {built}, this bertjax builds "
                      f"{prepare_lib.ROWS_VERSION}; delete it to prepare the rows again")
    print(f"data: note: the shards in {directory} were built by row-builder version {built}, this bertjax "
          f"builds {prepare_lib.ROWS_VERSION}; prepare them again to train on the current rows", file=sys.stderr,
          flush=True)
  fix = "prepare them for this config (python -m bertjax.data.prepare --config=... --out=DIR) or change the config"
  fmt = prepare_lib.resolve_format(config)
  if meta["format"] != fmt:
    raise UserError(f"shards {directory} hold {meta['format']} instances but this config trains on {fmt}; {fix}")
  if units.units_mode(config) and "units" not in meta:
    raise UserError(f"shards {directory} hold no entity/phrase units but the config sets data.units; prepare them "
                    "with --config.data.units=..., or train with --config.data.units= on the shards as they are")
  if bool(meta.get("trees")) != bool(config.data.get("trees", False)):
    raise UserError(f"shards {directory} hold {'' if meta.get('trees') else 'no '}bracketed trees but the config sets "
                    f"data.trees={config.data.get('trees', False)}; prepare them with the config's data.trees")
  if meta["seq_len"] != config.seq_len:
    raise UserError(f"shards {directory} have seq_len {meta['seq_len']} but config.seq_len={config.seq_len}; {fix}")
  theirs = meta["tokenizer"]
  own = load_tokenizer(prepare_lib.absolute_spec(theirs["spec"], directory))
  if own.fingerprint != theirs["fingerprint"]:
    raise UserError(f"the tokenizer in {directory} is not the one its shards were made with; prepare them again")
  tok = own
  if config.data.tokenizer:
    tok = load_tokenizer(config.data.tokenizer)
    if tok.fingerprint != theirs["fingerprint"]:
      raise UserError(f"config.data.tokenizer {tok.spec()} is not the tokenizer the shards in {directory} were "
                      f"made with ({theirs['spec']}, fingerprint {theirs['fingerprint']}; a different vocabulary, "
                      "casing or normalization gives different ids); leave --config.data.tokenizer empty to use "
                      "theirs, or prepare the corpus with this one")
  prepare_lib.check_vocab_size(tok, config.model.vocab_size)
  # Before any step reads a row: the shard files are the ones prepared (size always, sha256 as data.verify says).
  shards.verify(directory, meta, config.data.get("verify", "first"), os.path.join(cache_dir(config), "verified"))
  counts = meta["counts"]
  stats = dict(source=sources.SourceStats(**counts["source"]), format=fmt,
               train=instances.InstanceStats(**counts["train"]), eval=instances.InstanceStats(**counts["eval"]))
  return Dataset(shards.open_split(directory, meta, "train"), shards.open_split(directory, meta, "eval"), tok, stats,
                 shards.read_token_counts(directory, meta), plm.layout(config, tok.special) if fmt == "stream" else None)


def corpus_token_counts(data: Dataset, vocab_size: int) -> np.ndarray:
  """int64 [vocab_size]: how often each id occurs in the training text, what masking.replace_dist=unigram and
  masking.smoothing draw from. The counts stored with the shards (prepare counts the text before instances
  are made), or, for shards prepared before they were stored, the ids of the train rows other than padding
  and special tokens, counted once here (a pass over the split; a note says so)."""
  counts = data.token_counts
  if counts is None:
    print(f"data: these shards hold no token counts (prepared before they were stored); counting the "
          f"{len(data.train):,} train rows once", file=sys.stderr, flush=True)
    counts = shards.count_tokens(data.train, vocab_size, data.tokenizer.special.never_masked)
  out = np.zeros(vocab_size, np.int64)
  out[:min(len(counts), vocab_size)] = counts[:vocab_size]  # an HF tokenizer may have fewer ids than the model
  return out


class ArrayRows:
  """In-memory arrays (field -> [N, ...]) behind the interface of shards.Rows, for fine-tuning's task
  data (bertjax.finetune), the loader's one caller that holds its rows in memory."""

  def __init__(self, arrays: dict):
    self.arrays = arrays

  def __len__(self) -> int:
    return len(self.arrays["input_ids"])

  def take(self, idx) -> dict:
    return {k: v[idx] for k, v in self.arrays.items()}


class TracedRows:
  """Rows that log every read: each `take` appends {"split", "of": the split's length, "rows": the row
  indices} as one JSON line to
  `path`. A debug aid, switched on with BERTJAX_TRACE_ROWS=DIR (one file per process,
  DIR/rows-process-I.jsonl), with which a multi-process run shows what each process read."""

  def __init__(self, rows, path: str, split: str):
    self.rows, self.path, self.split = rows, path, split

  def __len__(self) -> int:
    return len(self.rows)

  def take(self, idx) -> dict:
    with open(self.path, "a") as f:
      f.write(json.dumps(dict(split=self.split, of=len(self.rows), rows=np.asarray(idx).tolist())) + "\n")
    return self.rows.take(idx)


def traced(data: Dataset, directory: str, process_index: int) -> Dataset:
  """`data` with both splits' reads logged to directory/rows-process-I.jsonl (see TracedRows)."""
  os.makedirs(directory, exist_ok=True)
  path = os.path.join(directory, f"rows-process-{process_index}.jsonl")
  return dataclasses.replace(data, train=TracedRows(data.train, path, "train"),
                             eval=TracedRows(data.eval, path, "eval"))


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


def batch_at(rows, step: int, batch_size: int, seed: int, process_index: int = 0, process_count: int = 1):
  """This process's rows of global batch `step` (batch_size rows in all, split evenly over processes);
  `rows`: shards.Rows or ArrayRows."""
  n = len(rows)
  per_process = batch_size // process_count
  g = step * batch_size + process_index * per_process + np.arange(per_process)
  epochs, pos = g // n, g % n
  idx = np.empty(per_process, np.int64)
  for e in np.unique(epochs):
    idx[epochs == e] = permuted(seed, int(e), pos[epochs == e], n)
  batch = rows.take(idx)
  batch["example_weight"] = np.ones(per_process, np.float32)
  return batch


def eval_batches(rows, batch_size: int, process_index: int = 0, process_count: int = 1):
  """The whole eval set in order, this process's share; the last batch is padded with weight-0 rows."""
  n = len(rows)
  per_process = batch_size // process_count
  for start in range(0, n, batch_size):
    g = start + process_index * per_process + np.arange(per_process)
    valid = g < n
    batch = rows.take(np.where(valid, g, 0))
    batch["example_weight"] = valid.astype(np.float32)
    yield batch
