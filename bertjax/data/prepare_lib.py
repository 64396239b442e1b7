"""Streaming, parallel preparation of a corpus into shards: the one road from text to training rows.

`python -m bertjax.data.prepare` runs it with many workers for big corpora; `pipeline.build` runs the same
code (in-process by default) into a cache directory for any source that is not `shards:DIR`.

The flow, with memory bounded whatever the corpus size:

  source (main process, one pass)  ->  chunks of whole documents (~CHUNK_BYTES of text, >= 2 documents,
  each document sent to train or to eval by a fixed rule, independent of the run's seed: held_out_rule)
  ->  worker processes (`--workers`): split sentences, tokenize, make instances
  ->  main process: rows appended to the shard files in chunk order, counts summed, progress printed.

At most 2 x workers chunks are in flight, so memory is a few chunks, never the corpus. Every random
choice in a chunk is seeded by (config.seed, split, chunk index), and chunks are formed and written in
corpus order, so the shards are byte-identical whatever the number of workers.

NSP's random next segment must come from another document: it is drawn from the other documents of the
same chunk (BERT drew from the whole corpus, which is what made its preparation need the corpus in
memory). A chunk holds hundreds of Wikipedia articles, or a few books; the last, short chunk of a split
is merged into the one before, so every chunk has two documents at least.
"""

import collections
import dataclasses
import hashlib
import multiprocessing
import os
import random
import shutil
import sys
import time

import numpy as np

from bertjax.core.errors import UserError
from bertjax.data import hf_tokenizer, instances, plm, shards, sources, trees, units
from bertjax.data.progress import Progress
from bertjax.data.tokenizer import reservoir_sample, Tokenizer, train_sentencepiece
from bertjax.data.tokenizer_spec import load_tokenizer

# Nothing here imports JAX (worker processes stay light): bertjax.core.config is imported lazily, in the
# main process only, by `prepare`, to validate the config.

# The version of the code that turns documents into rows: sources.to_sentences and the sentence splitter,
# the chunking and seeding here, instances (pairs, packing, truncation) and the stored row layout. Part of
# the cache key and recorded in metadata.json, so rows built by other code are never reused silently. Bump
# it with any change to the rows that code makes; tests/test_rows_version.py holds the golden digests of
# every format's rows for this version, and fails when they change while it does not.
ROWS_VERSION = 2  # 2: single blocks end on sentence boundaries (overflow starts the next block), one pass
CHUNK_BYTES = 1 << 20  # text per work unit: big enough to amortize the hand-over, small enough to spread
_EVAL_SPLIT_SEED = 1234  # held-out documents do not depend on the run's seed
_HF_DIR = "tokenizer"  # an hf:DIR tokenizer's files, copied beside the shards
_OUR_FILES = (shards.METADATA, "tokenizer.model", "tokenizer.vocab", "vocab.txt", _HF_DIR, shards.TOKEN_COUNTS)


@dataclasses.dataclass(frozen=True)
class Settings:
  """What a worker needs to turn raw documents into rows (picklable; no config, no JAX)."""

  tokenizer: str  # absolute spec of the tokenizer beside the shards
  paragraphs: bool  # lines are paragraphs: split them into sentences
  fmt: str
  seq_len: int
  short_seq_prob: float
  dupe_factor: int
  seed: int
  dtype: np.dtype  # the stored row
  units: str = ""  # entity/phrase spans: "" (none) | spans (the span source's own sentences) | gazetteer (matched)
  gazetteer: object = None  # units.Gazetteer for "gazetteer"
  replace_prob: float = 0.0  # WKLM: share of mentions replaced by another of their type (0: no corruption)
  trees: bool = False  # lines are bracketed trees (bertjax.data.trees)


@dataclasses.dataclass
class ChunkResult:
  split: str
  records: np.ndarray  # structured rows, Settings.dtype (the stream format: one record a token, plm.StreamWriter)
  stats: instances.InstanceStats
  documents: int
  sentences: int
  tokens: int  # tokens of the corpus text (before instances are made)
  token_counts: np.ndarray  # int64 [vocab]: how often each id occurs in that text (train chunks; eval: zeros)


def resolve_format(config) -> str:
  """The instance format of a run: the sentence objective's pairs, else config.data.format (auto: single).

  The sentence objectives are named like the pair formats they train on (nsp, sop); XLNet's plm reads windows of
  a token stream (bertjax.data.plm)."""
  sentence = [o for o, weight in sorted(config.objectives.items()) if weight and o in instances.PAIR_FORMATS]
  if config.objectives.get("plm", 0):
    if sentence or config.data.format not in ("auto", "stream"):
      raise UserError(f"objective plm reads a token stream, not {(sentence or [config.data.format])[0]} instances; "
                      "set --config.data.format=auto and switch off the sentence objectives")
    return "stream"
  if config.data.format == "stream":
    raise UserError("data.format='stream' makes the token stream of objective plm, which the config does not train; "
                    "set --config.objectives.plm or --config.data.format=auto")
  if len(sentence) > 1:
    raise UserError(f"objectives {sentence} need different instances; keep one of them in --config.objectives")
  needed, chosen = (sentence[0] if sentence else "single"), config.data.format
  if needed in instances.PAIR_FORMATS:
    if chosen not in ("auto", needed):
      raise UserError(f"objective {needed} needs {needed} pairs, not data.format={chosen!r}; "
                      f"set --config.data.format=auto or switch off --config.objectives.{needed}")
    return needed
  if chosen in instances.PAIR_FORMATS:
    raise UserError(f"data.format={chosen!r} makes pairs for a sentence objective the config does not train; "
                    f"set --config.objectives.{chosen} or --config.data.format=auto")
  return "single" if chosen == "auto" else chosen


def check_vocab_size(tok: Tokenizer, vocab: int):
  # A published checkpoint may pad its embedding table beyond its tokenizer (rows no text reaches).
  if tok.vocab_size != vocab and not (tok.kind == "hf" and tok.vocab_size < vocab):
    raise UserError(f"tokenizer {tok.spec()} has {tok.vocab_size} ids but config.model.vocab_size={vocab}; "
                    f"set --config.model.vocab_size={tok.vocab_size}")


def chunk_seed(seed: int, split: str, index: int) -> int:
  """The seed of one chunk's random choices: a function of where the chunk is, not of who processes it."""
  return int.from_bytes(hashlib.sha256(f"{seed}/{split}/{index}".encode()).digest()[:7], "little")


def held_out_rule(eval_fraction: float):
  """A function called once per document in corpus order: True if that document is held out for eval."""
  rng = random.Random(_EVAL_SPLIT_SEED)
  return lambda: rng.random() < eval_fraction


def chunk_documents(docs, eval_fraction: float, chunk_bytes: int = CHUNK_BYTES):
  """Yields (split, index, documents): consecutive documents of one split, >= chunk_bytes of text and
  >= 2 documents each, except that a split with a single document gives one chunk of one. Holds at
  most two chunks per split (the last one waits to see whether the split's tail must join it)."""
  held = held_out_rule(eval_fraction)
  state = {split: dict(open=[], size=0, pending=None, index=0) for split in ("train", "eval")}

  def emit(split, docs_):
    s = state[split]
    s["index"] += 1
    return split, s["index"] - 1, docs_

  for lines in docs:
    split = "eval" if held() else "train"
    s = state[split]
    s["open"].append(lines)
    s["size"] += sum(len(units.text_of(line)) for line in lines)
    if len(s["open"]) >= 2 and s["size"] >= chunk_bytes:
      if s["pending"] is not None:
        yield emit(split, s["pending"])
      s["pending"], s["open"], s["size"] = s["open"], [], 0
  for split, s in state.items():
    last = s["open"]
    if s["pending"] is not None and len(last) < 2:
      s["pending"], last = s["pending"] + last, []
    if s["pending"] is not None:
      yield emit(split, s["pending"])
    if last:
      yield emit(split, last)


_TOKENIZERS = {}


def _tokenizer(spec: str) -> Tokenizer:
  if spec not in _TOKENIZERS:  # loaded once per worker process
    _TOKENIZERS[spec] = load_tokenizer(spec)
  return _TOKENIZERS[spec]


def process_chunk(task) -> ChunkResult:
  """(settings, split, index, raw documents) -> the chunk's rows and counts. Runs in a worker."""
  settings, split, index, docs = task
  tok, train = _tokenizer(settings.tokenizer), split == "train"
  if settings.trees:  # one bracketed tree an example (bertjax.data.trees)
    arrays, stats, sentences, tokens, counts = trees.chunk_rows(tok, docs, settings.fmt, settings.seq_len, train)
  elif settings.fmt == "stream":  # one run of tokens, cut into rows by the main process (plm.StreamWriter)
    tokenized, sentences, tokens, counts, _ = _tokenized(settings, split, index, docs, tok)
    stream, n = plm.token_stream(tokenized, tok.special.sep)
    records = np.empty(n, [(name, settings.dtype[name].base) for name in plm.FIELDS])  # one record a token
    for name in plm.FIELDS:
      records[name] = stream[name]
    return ChunkResult(split, records, instances.InstanceStats(tokens=n), len(docs), sentences, tokens, counts)
  else:
    arrays, stats, sentences, tokens, counts = _text_rows(settings, split, index, docs, tok)
  records = np.empty(0, settings.dtype) if arrays is None else shards.to_records(arrays, settings.dtype)
  return ChunkResult(split, records, stats, len(docs), sentences, tokens, counts)


def _text_rows(settings, split, index, docs, tok) -> tuple:
  """(arrays or None, stats, sentences, tokens, token counts) of a chunk of text (or marked sentences)."""
  tokenized, sentences, tokens, counts, span_counts = _tokenized(settings, split, index, docs, tok)
  train = split == "train"
  arrays, stats = instances.make_instances(
      tokenized, settings.fmt, settings.seq_len, tok.special,
      short_seq_prob=settings.short_seq_prob if train else 0.0, dupe_factor=settings.dupe_factor if train else 1,
      seed=chunk_seed(settings.seed if train else 0, split, index), units=bool(settings.units))
  stats.spans, stats.unaligned_spans = span_counts.get("spans", 0), span_counts.get("unaligned", 0)
  stats.replaced_mentions = span_counts["replaced"]
  return arrays, stats, sentences, tokens, counts


def _tokenized(settings, split, index, docs, tok) -> tuple:
  """(documents as lists of encoded sentences, sentences, tokens, train unigram counts, span counts) of a chunk."""
  tokenized, sentences, tokens, train = [], 0, 0, split == "train"
  counts = np.zeros(tok.vocab_size, np.int64)
  span_counts = dict(replaced=0)
  if settings.units:
    docs = units.marked_chunk(settings, docs, chunk_seed(settings.seed if train else 0, split, index) + 1, span_counts)
  for lines in docs:
    if settings.units:
      sents = lines
      encode = lambda s: units.encode(tok, s, span_counts)
    else:
      sents, encode = sources.to_sentences(lines, settings.paragraphs), tok.encode
    sentences += len(sents)
    encoded = [e for e in map(encode, sents) if len(e[0])]
    tokens += sum(len(e[0]) for e in encoded)
    if encoded:
      tokenized.append(encoded)
      if train:  # the corpus unigram counts (masking.replace_dist=unigram, masking.smoothing) are the train text's
        counts += np.bincount(np.concatenate([e[0] for e in encoded]), minlength=tok.vocab_size)[:tok.vocab_size]
  return tokenized, sentences, tokens, counts, span_counts


def ordered_map(fn, tasks, workers: int, max_in_flight: int = 0):
  """fn over tasks, results in task order: in this process (workers=0) or in `workers` spawned processes
  with at most `max_in_flight` (default 2 x workers) tasks handed out and not yet taken back, so a
  fast reader never piles up the corpus in queues (Pool.imap would read the whole iterator ahead)."""
  if workers <= 0:
    yield from map(fn, tasks)
    return
  limit = max_in_flight or 2 * workers
  # spawn, not fork: the parent may hold TensorFlow (tfds) or JAX threads, which fork can deadlock.
  with multiprocessing.get_context("spawn").Pool(workers) as pool:
    pending = collections.deque()
    for task in tasks:
      pending.append(pool.apply_async(fn, (task,)))
      if len(pending) >= limit:
        yield pending.popleft().get()
    while pending:
      yield pending.popleft().get()


def _sample_lines(reader: sources.Reader, eval_fraction: float, size: int, seed: int) -> list:
  """A uniform sample (reservoir) of `size` lines of the training documents (all of them if size <= 0)."""
  held = held_out_rule(eval_fraction)
  kept = (lines for lines in reader.read(sources.SourceStats()) if not held())  # held() once per document
  return reservoir_sample((units.text_of(line) for lines in kept for line in lines), size, seed)


def prepare_tokenizer(config, reader: sources.Reader, directory: str, tokenizer: str = "") -> str:
  """Puts the run's tokenizer in `directory` and returns its spec relative to `directory`.

  `tokenizer` (default config.data.tokenizer) is copied there; with none, SentencePiece
  (data.tokenizer_model) is trained on a sample of the training documents: data.tokenizer_sentences
  lines drawn uniformly (a reservoir, one pass, memory bounded by the sample), split into sentences,
  shuffled with the seed.
  """
  d = config.data
  tokenizer = tokenizer or d.tokenizer
  if tokenizer:
    tok = load_tokenizer(tokenizer)
    if tok.kind == "hf":  # a checkpoint's tokenizer files, as they came (same bytes: same fingerprint)
      os.makedirs(os.path.join(directory, _HF_DIR), exist_ok=True)
      for name in hf_tokenizer.TOKENIZER_FILES:
        if os.path.isfile(os.path.join(tok.path, name)):
          shutil.copyfile(os.path.join(tok.path, name), os.path.join(directory, _HF_DIR, name))
      spec = f"hf:{_HF_DIR}"
    else:
      name = "tokenizer.model" if tok.kind == "spm" else "vocab.txt"
      shutil.copyfile(tok.path, os.path.join(directory, name))
      spec = f"{tok.kind}:{name}" + (":cased" if tok.kind == "wordpiece" and not tok.lowercase else "")
  else:
    lines = _sample_lines(reader, d.eval_fraction, d.tokenizer_sentences, config.seed)
    if not lines:
      raise _no_text(reader.spec)
    sentences = [s for line in lines for s in sources.to_sentences([line], reader.paragraphs)]
    random.Random(config.seed).shuffle(sentences)
    train_sentencepiece(sentences, os.path.join(directory, "tokenizer"), config.model.vocab_size,
                        model_type=d.tokenizer_model, input_sentence_size=d.tokenizer_sentences,
                        max_sentence_length=d.tokenizer_max_sentence_length, seed=config.seed)
    spec = "spm:tokenizer.model"
  check_vocab_size(load_tokenizer(absolute_spec(spec, directory)), config.model.vocab_size)
  return spec


def _no_text(source: str) -> UserError:
  return UserError(f"data source {source!r} holds no text; point --config.data.source at a non-empty corpus")


def absolute_spec(spec: str, directory: str) -> str:
  kind, _, path = spec.partition(":")
  return f"{kind}:{os.path.join(directory, path)}"


def _claim_directory(directory: str, overwrite: bool):
  """Creates the output directory, refusing (unless overwrite) one that holds a preparation already."""
  if "://" in directory:
    raise UserError(f"--out={directory}: shards are memory-mapped, so write them to a local or mounted "
                    "directory (gcsfuse for a bucket)")
  os.makedirs(directory, exist_ok=True)
  ours = [n for n in os.listdir(directory) if n in _OUR_FILES or n.endswith(".rows")]
  if ours and not overwrite:
    raise UserError(f"{directory} already holds a preparation ({', '.join(sorted(ours)[:3])}, ...); "
                    "use another --out, or --overwrite to replace it")
  for name in [shards.METADATA] + ours:  # the metadata first: a crash after this leaves no false 'done'
    path = os.path.join(directory, name)
    if os.path.isdir(path):
      shutil.rmtree(path)
    elif os.path.exists(path):
      os.remove(path)


def _fields(fmt: str, with_units: bool = False, with_trees: bool = False) -> list:
  if fmt == "stream":
    return list(plm.FIELDS)
  return ["input_ids", "type_ids", "word_start", "groups", "sentence_label"] + (
      ["position_ids"] if fmt == "packed" else []) + (["unit_start", "mention"] if with_units else []) + (
      list(trees.FIELDS) if with_trees else [])


def _add(total: instances.InstanceStats, part: instances.InstanceStats):
  for f in dataclasses.fields(total):
    setattr(total, f.name, getattr(total, f.name) + getattr(part, f.name))


def prepare(config, directory: str, workers: int = 0, overwrite: bool = False, progress=sys.stderr,
            tokenizer: str = "") -> dict:
  """Prepares config.data.source into shards in `directory` for runs of `config`; returns the metadata.

  Args:
    config: a training config (its seq_len, objectives / data.format, tokenizer and data settings).
    directory: where to write (created; see bertjax.data.shards for the layout).
    workers: processes that tokenize and make instances; 0 does everything in this process.
    overwrite: replace a preparation already in `directory`.
    progress: stream for the progress line (None: quiet).
    tokenizer: a tokenizer spec to use instead of config.data.tokenizer (pipeline's cached one).
  """
  from bertjax.core import config as config_lib  # imports JAX: main process only, never in the workers

  config_lib.validate(config)  # the run's own keys and the data's; `python -m bertjax.data.prepare` checks all
  instances.validate(config)
  d = config.data
  if d.source.startswith("shards:"):
    raise UserError(f"data.source={d.source!r} is prepared already; name a corpus (demo, text:GLOB, tfds:NAME)")
  fmt = resolve_format(config)
  directory = os.path.abspath(os.path.expanduser(directory))
  _claim_directory(directory, overwrite)
  reader = trees.open_reader(config)
  mode = units.units_mode(config)
  gazetteer = units.Gazetteer(d.units) if mode == "gazetteer" else None
  if gazetteer is not None and progress:
    print(f"prepare: a gazetteer of {len(gazetteer):,} mention strings from {d.units} marks mentions in "
          f"{d.source}", file=progress, flush=True)
  t0 = time.time()
  if progress and not (tokenizer or d.tokenizer):
    print(f"prepare: training a SentencePiece {d.tokenizer_model} tokenizer of {config.model.vocab_size} pieces on "
          f"up to {d.tokenizer_sentences:,} sampled lines (one pass over the corpus)", file=progress, flush=True)
  spec = prepare_tokenizer(config, reader, directory, tokenizer)
  tok = load_tokenizer(absolute_spec(spec, directory))
  types = shards.storage_types(_fields(fmt, bool(mode), d.get("trees", False)), tok.vocab_size)
  settings = Settings(absolute_spec(spec, directory), reader.paragraphs, fmt, config.seq_len, d.short_seq_prob,
                      d.dupe_factor, config.seed, shards.row_dtype(types, config.seq_len), mode, gazetteer,
                      units.replace_prob(config), d.get("trees", False))

  t1 = time.time()
  stats = sources.SourceStats()
  writers = {split: shards.ShardWriter(directory, split, settings.dtype) for split in ("train", "eval")}
  if fmt == "stream":  # chunks' token runs into rows of seq_len tokens
    writers = {split: plm.StreamWriter(w, config.seq_len, tok.special.sep) for split, w in writers.items()}
  made = {split: instances.InstanceStats() for split in writers}
  documents, sentences, tokens = dict(train=0, eval=0), 0, 0
  token_counts = np.zeros(tok.vocab_size, np.int64)
  bar = Progress(reader, progress) if progress else None
  chunks = chunk_documents(reader.read(stats), d.eval_fraction, CHUNK_BYTES)
  tasks = ((settings, split, index, docs) for split, index, docs in chunks)
  for result in ordered_map(process_chunk, tasks, workers):
    writers[result.split].write(result.records)
    _add(made[result.split], result.stats)
    documents[result.split] += result.documents
    sentences, tokens = sentences + result.sentences, tokens + result.tokens
    token_counts += result.token_counts
    if bar:
      bar.update(stats, tokens, made["train"].instances + made["eval"].instances)
  files = {split: w.close() for split, w in writers.items()}
  for split, w in writers.items() if fmt == "stream" else ():
    made[split].instances, made[split].tokens = w.rows, w.tokens  # rows written; the stream's tokens
  seconds = time.time() - t1
  if bar:
    bar.update(stats, tokens, made["train"].instances + made["eval"].instances, force=True)
    bar.close()
  stats.sentences = sentences
  if not sentences:
    raise _no_text(d.source)
  if not made["train"].instances or not made["eval"].instances:
    raise UserError(f"corpus {d.source!r} gave {made['train'].instances} train and {made['eval'].instances} eval "
                    f"{fmt} instances from {stats.documents} documents; use a larger corpus (SOP needs "
                    "documents of two sentences or more) or change --config.data.eval_fraction")
  meta = dict(
      version=shards.VERSION, rows_version=ROWS_VERSION, format=fmt, seq_len=config.seq_len, fields=types,
      tokenizer=dict(spec=spec, fingerprint=tok.fingerprint, vocab_size=tok.vocab_size),
      source=d.source, settings=dict(seed=config.seed, dupe_factor=d.dupe_factor, short_seq_prob=d.short_seq_prob,
                                     eval_fraction=d.eval_fraction, split_paragraphs=reader.paragraphs,
                                     chunk_bytes=CHUNK_BYTES),
      splits={split: dict(rows=made[split].instances, documents=documents[split], shards=files[split])
              for split in writers},
      counts=dict(source=dataclasses.asdict(stats), tokens=tokens,
                  **{split: dataclasses.asdict(made[split]) for split in writers}),
      timing=dict(tokenizer_seconds=t1 - t0, seconds=seconds, workers=workers, tokens_per_second=tokens / seconds),
      token_counts=shards.write_token_counts(directory, token_counts),
  )
  if settings.trees:  # what the rows hold (bertjax.data.trees); trees too long for a row: counts.*.long_trees
    meta["trees"] = True
  if mode:
    meta["units"] = dict(spec=d.units, mode=mode, replace_prob=settings.replace_prob,
                         gazetteer=len(gazetteer) if gazetteer is not None else 0)
  shards.write_metadata(directory, meta)
  return meta


def summary(meta: dict, directory: str) -> str:
  """The lines `prepare` prints when done: what was read, what was made, how fast."""
  c, s, t = meta["counts"], meta["splits"], meta["timing"]
  train, ev = c["train"], c["eval"]
  tok = meta["tokenizer"]
  size = sum(os.path.getsize(os.path.join(directory, f["file"])) for split in s.values() for f in split["shards"])
  n_files = sum(len(split["shards"]) for split in s.values())
  fill = (train["tokens"] + ev["tokens"]) / max(1, (train["instances"] + ev["instances"]) * meta["seq_len"])
  share = train["positive"] / max(1, train["instances"])
  lines = [
      f"prepared {meta['source']} -> {directory}: {meta['format']} rows of seq_len {meta['seq_len']}, "
      f"tokenizer {tok['spec']} ({tok['vocab_size']} ids, fingerprint {tok['fingerprint']})",
      f"documents {c['source']['documents']:,} (train {s['train']['documents']:,}, eval "
      f"{s['eval']['documents']:,}), sentences {c['source']['sentences']:,}, tokens {c['tokens']:,}"
      + (f"; {c['source']['invalid_lines']:,} invalid UTF-8 lines skipped" if c["source"]["invalid_lines"] else ""),
      f"instances train {train['instances']:,}, eval {ev['instances']:,}; label-1 share {share:.3f}; "
      f"documents too short for a pair {train['too_short_documents'] + ev['too_short_documents']:,}",
      f"rows {fill:.1%} full; {n_files} shard files, {size / 1e6:.1f} MB; tokenizer {t['tokenizer_seconds']:.1f}s, "
      f"instances {t['seconds']:.1f}s = {t['tokens_per_second']:,.0f} tokens/s with "
      f"{t['workers'] or 'no'} worker processes",
  ]
  if meta["format"] == "packed":
    lines[2] += f"; {train['examples'] + ev['examples']:,} examples packed"
  if meta["format"] == "electra":
    lines[2] += "; train " + instances.describe_electra(instances.InstanceStats(**train))
  if meta.get("units"):
    lines.append(units.describe(meta))
  return "\n".join(lines)

