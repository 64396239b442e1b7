"""XLNet's permutation-LM data (Yang et al. 2019; zihangdai/xlnet data_utils.py @bbaa3a6): the corpus as one token
stream, cut into B parallel streams read window by window, each window `reuse | A <sep> B <sep> <cls>` with its
span-sampled targets and the permutation ranks of its two halves. NumPy only (data workers import no JAX).

Preparation (`--config.objectives.plm`, data format `stream`) writes each split's text as one stream of tokens,
documents in corpus order with [SEP] between them (our tokenizers have no <eod>), in rows of seq_len tokens that
carry `input_ids`, `word_start` and `sentence_parity` (flips at every sentence: the reference's `sent_ids`, which
its A/B split cuts at). `StreamWriter` turns the chunks' token runs into those rows.

Training reads windows, never rows: a split of N tokens holds B = batch_size streams of T = N // B tokens (the
reference's `batchify`); window t of stream b starts at b*T + t*reuse_len, so each step's reuse part continues
the previous step's and a row of the batch always continues the same stream (the memory is the real preceding
text; the reference never shuffles, data_utils.py:564). A pass is W windows per stream; every pass draws new
A/B splits, spans and permutations from (seed, pass, stream, window), so a batch is a pure function of the step
(`batch_at`) and a resumed run reads exactly what it would have. Per window (create_tfrecords, :455-525):
- reuse = the stream's next reuse_len tokens; A and B (`split_a_and_b`) fill seq_len - reuse_len - 3 tokens
  from the text after it: B is the real continuation, or with probability 1/2 a span from elsewhere in the stream
  (its label is not trained: the paper drops NSP, §2.5). Segment ids: 0 for reuse, A and its <sep>, 1 for B and
  its <sep>, 2 for <cls>.
- `sample_mask` picks ceil(num_predict / 2) targets in the reuse half and the rest in the other half (spans of
  n ~ 1/n pieces in a context of n * mask_alpha / mask_beta, then single tokens up to the goal).
- `local_perm` draws one order of perm_size positions per half, repeated over the half's blocks; the batch
  carries these ranks, and bertjax.objectives.plm builds perm_mask and target_mapping from them on device.

Deliberate differences from the reference: one pass is not stored per preparation but drawn at load time (as
many passes as the run needs, none on disk); A's sentence scan looks at most seq_len tokens past tot_len for a
boundary and a random B at most seq_len tokens around it (the reference scans to the next boundary however far);
with model.xlnet.bi_data the batch's halves are the forward and the reversed streams (the reference orders them
so per core, transformers' model negates the distances of the batch's second half, which this order gives).
"""

import dataclasses

import numpy as np

from bertjax.core.errors import UserError

FIELDS = ("input_ids", "word_start", "sentence_parity")  # what a stream row stores
MAX_GRAM = 5  # _sample_mask's max_gram: span lengths 1..5 with p(n) ~ 1/n


@dataclasses.dataclass(frozen=True)
class Layout:
  """What makes a window: lengths, the targets' sampling and the special ids."""

  seq_len: int
  reuse_len: int
  perm_size: int
  num_predict: int
  mask_alpha: float
  mask_beta: float
  sep: int
  cls: int
  bi_data: bool = False  # the second half of every batch reads the first half's streams reversed

  @property
  def tot_len(self) -> int:
    """Tokens of A and B together (the row less the reuse part, two <sep> and <cls>)."""
    return self.seq_len - self.reuse_len - 3


def _memory(config) -> dict:
  """The model's memory section (config.model.xlnet: bertjax.model.memory), {} for a model without one."""
  return dict(config.model.get("xlnet", None) or {})


def reuse_len(config) -> int:
  """The reuse part of a row, which is also the stride of the streams and what each step pushes into the memory:
  model.xlnet.reuse_len (the reference's 256 of 512), or half the row where the model sets none."""
  return _memory(config).get("reuse_len", 0) or config.seq_len // 2


def bi_data(config) -> bool:
  """Whether the second half of every batch reads the first half's streams reversed (model.xlnet.bi_data)."""
  return bool(_memory(config).get("bi_data", False))


def perm_size(config) -> int:
  """The permutation block: data.perm_size, or the reuse part (the reference's README sets perm_size=reuse_len)."""
  return config.data.perm_size or reuse_len(config)


def num_predict(config) -> int:
  """Targets per row: data.num_predict, or seq_len x mask_beta / mask_alpha (the reference's 512 / 6 -> 85)."""
  d = config.data
  return d.num_predict or int(config.seq_len * d.mask_beta / d.mask_alpha)


def layout(config, special) -> Layout:
  """The window layout of a run config (its data section's PLM keys) and tokenizer special ids."""
  d = config.data
  return Layout(config.seq_len, reuse_len(config), perm_size(config), num_predict(config), d.mask_alpha, d.mask_beta,
                special.sep, special.cls, bi_data(config))


def validate(config):
  """Checks the PLM keys of config.data against the row (one line naming the key on the first problem)."""
  d, s = config.data, config.seq_len
  r, p, n = reuse_len(config), perm_size(config), num_predict(config)
  other = s - r
  mem = _memory(config)
  if mem.get("mem_len", 0) and not mem.get("reuse_len", 0):
    raise UserError(f"model.xlnet.reuse_len=0 pushes whole rows into the memory, but the plm objective's rows overlap "
                    f"(each continues the previous one's reuse part); set --config.model.xlnet.reuse_len (XLNet: "
                    f"seq_len // 2 = {s // 2})")
  if not 0 < r <= s - 5:  # A, B and their <sep> <sep> <cls> need 5 positions at least
    raise UserError(f"model.xlnet.reuse_len={r} leaves no room for A <sep> B <sep> <cls> in a row of seq_len {s}; "
                    f"set --config.model.xlnet.reuse_len between 1 and {s - 5}")
  if mem.get("mem_len", 0) and any(ph["batch_size"] not in (0, config.batch_size) for ph in config.phases):
    raise UserError("phases[].batch_size: the memory holds one row per stream, so the streams (batch_size) cannot "
                    "change between phases; keep every phase at --config.batch_size")
  if bi_data(config) and config.grad_accum_steps > 1:  # a microbatch would hold one direction only
    raise UserError(f"grad_accum_steps={config.grad_accum_steps}: model.xlnet.bi_data reverses the second half of "
                    "the batch the model sees, which a microbatch is not; set --config.grad_accum_steps=1 or "
                    "--config.model.xlnet.bi_data=False")
  if bi_data(config) and config.batch_size % 2:
    raise UserError(f"batch_size={config.batch_size}: model.xlnet.bi_data reads every stream forward and reversed, "
                    "in the two halves of the batch; use an even batch_size")
  if p > min(r, other) or r % p or other % p:
    raise UserError(f"data.perm_size={p} must divide both halves of the row and be at most the smaller (reuse part "
                    f"{r}, the rest {other} of seq_len {s}; the reference's assert perm_size <= reuse_len and "
                    f"<= seq_len - reuse_len); set --config.data.perm_size to a common divisor, e.g. {_gcd(r, other)}")
  if not 0 < d.mask_beta <= d.mask_alpha:
    raise UserError(f"data.mask_alpha={d.mask_alpha}, data.mask_beta={d.mask_beta}: mask_beta of every mask_alpha "
                    "tokens are predicted; set 0 < mask_beta <= mask_alpha (XLNet: 6 and 1)")
  if not 2 <= n <= s // 2:
    raise UserError(f"data.num_predict={n} targets per row of seq_len {s}; set --config.data.num_predict between 2 "
                    f"and {s // 2} (0: seq_len x mask_beta / mask_alpha)")


def _gcd(a: int, b: int) -> int:
  while b:
    a, b = b, a % b
  return a


def sample_mask(rng, word_start, goal, alpha, beta, max_gram=MAX_GRAM):
  """bool [n]: `goal` targets in a segment, as the reference's `_sample_mask` (data_utils.py:331-392) draws them.

  Spans: n ~ p(n) proportional to 1/n over 1..max_gram, capped at what the goal still needs; a context of
  ctx = n * alpha // beta tokens of which l_ctx ~ U[0, ctx) come before the span; the span starts at the first
  word start at or after cur + l_ctx and takes n pieces (the reference's inner loop tests the span's first piece,
  never its end, so a span is n pieces, not n words: kept); a span reaching the segment's end stops the spans.
  The next search begins at the span's end + ctx - l_ctx. Then single tokens at random until the goal is met.
  `rng`: a numpy Generator (choice over the n-grams, integers for l_ctx and the single tokens), so a test can
  inject the reference's draws.
  """
  seg_len = len(word_start)
  mask = np.zeros(seg_len, bool)
  ngrams = np.arange(1, max_gram + 1, dtype=np.int64)
  pvals = 1.0 / np.arange(1, max_gram + 1)
  pvals /= pvals.sum(keepdims=True)
  num_predict, cur = 0, 0
  while cur < seg_len and num_predict < goal:
    n = min(int(rng.choice(ngrams, p=pvals)), goal - num_predict)
    ctx = int((n * alpha) // beta)
    l_ctx = int(rng.integers(ctx))
    beg = cur + l_ctx
    while beg < seg_len and not word_start[beg]:
      beg += 1
    if beg >= seg_len:
      break
    end = beg + n  # the reference's count of pieces (its loop re-tests seg[beg], a word start, n times)
    if end >= seg_len:
      break
    mask[beg:end] = True
    num_predict += end - beg
    cur = end + ctx - l_ctx
  while num_predict < goal:
    i = int(rng.integers(seg_len))
    if not mask[i]:
      mask[i] = True
      num_predict += 1
  return mask


def local_perm(rng, length, perm_size):
  """int32 [length]: a half's permutation ranks as the reference's `_local_perm` (data_utils.py:579-595) makes
  them: one random order of perm_size positions, the same for every block of perm_size, blocks in order (rank
  of position k * perm_size + p = k * perm_size + order[p])."""
  order = rng.permutation(perm_size)
  blocks = length // perm_size
  return (np.arange(blocks)[:, None] * perm_size + order[None, :]).reshape(-1).astype(np.int32)


def split_a_and_b(rng, sent, begin, tot_len, data_len, lookahead):
  """(a_begin, a_end, b_begin, b_end, label) in stream positions, as the reference's `_split_a_and_b`
  (data_utils.py:256-318) cuts them: A starts at `begin`; cut points are the sentence changes before tot_len
  tokens; with probability 1/2 (or no cut point) B is a span of the stream drawn at random (label 0), else the
  sentences after A's cut (label 1); then the longer of the two loses tokens at its end until they fit.

  `sent(i, j)` gives the sentence parities of stream positions [i, j) (a stream read lazily); the scans stop
  `lookahead` tokens past where the reference's would need no more (see the module docstring). None when the
  stream ends first.
  """
  if begin + tot_len >= data_len:
    return None
  stop = min(data_len, begin + tot_len + lookahead)
  s = sent(begin, stop)
  change = np.flatnonzero(s[1:] != s[:-1]) + 1  # offsets from begin where a sentence starts
  past = change[change >= tot_len]
  end = begin + (int(past[0]) if len(past) else stop - begin)
  cut_points = [begin + int(c) for c in change[change < tot_len]]
  a_begin = begin
  if not cut_points or rng.random() < 0.5:
    label = 0
    a_end = end if not cut_points else cut_points[int(rng.integers(len(cut_points)))]
    b_len = max(1, tot_len - (a_end - a_begin))
    b_begin = int(rng.integers(0, data_len - 1 - b_len + 1))  # random.randint(0, data_len - 1 - b_len)
    b_end = b_begin + b_len
    lo, hi = max(0, b_begin - lookahead), min(data_len, b_end + lookahead)
    around = sent(lo, hi)
    while b_begin > lo and around[b_begin - 1 - lo] == around[b_begin - lo]:
      b_begin -= 1
    while b_end < hi - 1 and around[b_end - 1 - lo] == around[b_end - lo]:
      b_end += 1
  else:
    label = 1
    a_end = cut_points[int(rng.integers(len(cut_points)))]
    b_begin, b_end = a_end, end
  while a_end - a_begin + b_end - b_begin > tot_len:
    if a_end - a_begin > b_end - b_begin:
      a_end -= 1  # "delete the right side only for the LM objective"
    else:
      b_end -= 1
  return a_begin, a_end, b_begin, b_end, label


class Stream:
  """A split's token stream over its stored rows (shards.Rows or pipeline.ArrayRows of FIELDS): `read(i, j)`
  gives positions [i, j) of the stream, reading only the rows that hold them."""

  def __init__(self, rows, tokens: int, width: int):
    self.rows, self.tokens, self.width = rows, tokens, width

  def read(self, start: int, stop: int) -> dict:
    first, last = start // self.width, (stop - 1) // self.width + 1
    got = self.rows.take(np.arange(first, last))
    off = start - first * self.width
    return {k: got[k].reshape(-1)[off:off + stop - start] for k in FIELDS}


def geometry(tokens: int, num_streams: int, lay: Layout, split: str):
  """(T, W): tokens per stream and windows per pass of a split of `tokens` tokens read as `num_streams` streams;
  UserError when a stream cannot hold one window."""
  per_stream = tokens // num_streams
  windows = (per_stream - lay.seq_len) // lay.reuse_len
  if windows < 1:
    raise UserError(f"the {split} text ({tokens:,} tokens) is too short for {num_streams} streams of windows of "
                    f"seq_len {lay.seq_len} (each stream needs > {lay.seq_len + lay.reuse_len} tokens); use a larger "
                    f"corpus, a smaller batch_size / eval_batch_size, or a larger data.eval_fraction")
  return per_stream, windows


def _reader(stream: Stream, base: int, per_stream: int, reverse: bool):
  """read(a, b): positions [a, b) of the stream that starts at `base`, or of that stream reversed (the
  reference's bi_data: `fwd_data[..., ::-1]`, read from the forward stream's end)."""
  if not reverse:
    return lambda a, b: stream.read(base + a, base + b)
  return lambda a, b: {k: v[::-1] for k, v in stream.read(base + per_stream - b, base + per_stream - a).items()}


def window(read, per_stream: int, i: int, lay: Layout, rng, reverse: bool = False) -> dict:
  """One row: positions i ... of a stream (`read`, see _reader) as the reuse part and the A/B after them; see the
  module docstring. A reversed row's spans start at words of the forward text (the reference samples a reversed
  row's mask on the row flipped back, `_sample_mask(..., reverse=True)`)."""
  cut = split_a_and_b(rng, lambda a, b: read(a, b)["sentence_parity"], i + lay.reuse_len, lay.tot_len, per_stream,
                      lay.seq_len)
  a0, a1, b0, b1, _ = cut  # geometry leaves room: never None
  reuse, a, b = read(i, i + lay.reuse_len), read(a0, a1), read(b0, b1)
  sep, cls = np.array([lay.sep]), np.array([lay.cls])
  ids = np.concatenate([reuse["input_ids"], a["input_ids"], sep, b["input_ids"], sep, cls]).astype(np.int32)
  starts = np.concatenate([reuse["word_start"], a["word_start"], [True], b["word_start"], [True, True]])
  type_ids = np.concatenate([np.zeros(lay.reuse_len + a1 - a0 + 1), np.ones(b1 - b0 + 1), [2]]).astype(np.int32)
  goal_1 = lay.num_predict // 2  # the reference: num_predict_0 = num_predict - num_predict // 2 in the reuse half
  flip = (lambda x: x[::-1]) if reverse else (lambda x: x)
  sample = lambda part, goal: flip(sample_mask(rng, flip(part), goal, lay.mask_alpha, lay.mask_beta))
  masked = np.concatenate([sample(starts[:lay.reuse_len], lay.num_predict - goal_1),
                           sample(starts[lay.reuse_len:], goal_1)])
  rank = np.concatenate([local_perm(rng, lay.reuse_len, lay.perm_size),
                         local_perm(rng, lay.seq_len - lay.reuse_len, lay.perm_size)])
  return dict(input_ids=ids, type_ids=type_ids, word_start=starts, plm_masked=masked, perm_rank=rank)


def _rows(stream: Stream, lay: Layout, seed: int, pass_and_window, rows, batch_size: int, split: str) -> dict:
  """Rows `rows` of a global batch of `batch_size` at (pass, window): row r reads stream r, or with bi_data
  stream r mod B/2, reversed in the second half of the batch (transformers' XLNet negates the distances of the
  second half)."""
  streams = batch_size // 2 if lay.bi_data else batch_size
  per_stream, windows = geometry(stream.tokens, streams, lay, split)
  e, t = pass_and_window(windows)
  out = []
  for r in rows:
    b, reverse = int(r % streams), bool(r >= streams)
    out.append(window(_reader(stream, b * per_stream, per_stream, reverse), per_stream, t * lay.reuse_len, lay,
                      np.random.default_rng([seed, e, b, t, int(reverse)]), reverse))
  batch = {k: np.stack([row[k] for row in out]) for k in out[0]}
  n = len(out)
  batch.update(groups=np.ones((n, lay.seq_len), np.int32), sentence_label=np.zeros(n, np.int32),
               example_weight=np.ones(n, np.float32))
  return batch


def _mine(batch_size: int, process_index: int, process_count: int):
  per_process = batch_size // process_count
  return process_index * per_process + np.arange(per_process)


def batch_at(stream: Stream, step: int, batch_size: int, seed: int, lay: Layout, process_index: int = 0,
             process_count: int = 1) -> dict:
  """This process's rows of global batch `step`: row b continues stream b (window step % W of pass step // W);
  the processes hold consecutive streams, as they hold consecutive rows of every batch."""
  return _rows(stream, lay, seed, lambda windows: divmod(step, windows),
               _mine(batch_size, process_index, process_count), batch_size, "train")


EVAL_SEED = 0  # eval windows are the same for every run


def eval_batches(stream: Stream, batch_size: int, lay: Layout, process_index: int = 0, process_count: int = 1):
  """The eval split's windows in stream order, one pass: batch t holds window t of every stream (this process's
  streams), the same in every run."""
  streams = batch_size // 2 if lay.bi_data else batch_size
  _, windows = geometry(stream.tokens, streams, lay, "eval")
  for t in range(windows):
    yield _rows(stream, lay, EVAL_SEED, lambda _: (0, t), _mine(batch_size, process_index, process_count),
                batch_size, "eval")


def token_stream(docs, sep: int):
  """(arrays, tokens): one chunk's tokenized documents (lists of (ids, word_start, ...) sentences) as one stream,
  [SEP] between documents; `sentence_parity` flips at each sentence and at each separator (the reference's
  `sent_id = not sent_id` per line, an empty line's <eod> included)."""
  ids, starts, par, parity = [], [], [], False
  for d, doc in enumerate(docs):
    if d:
      ids.append(np.array([sep], np.int32))
      starts.append(np.ones(1, bool))
      par.append(np.full(1, parity))
      parity = not parity
    for sentence in doc:
      ids.append(np.asarray(sentence[0], np.int32))
      starts.append(np.asarray(sentence[1], bool))
      par.append(np.full(len(sentence[0]), parity))
      parity = not parity
  if not ids:
    return dict(input_ids=np.zeros(0, np.int32), word_start=np.zeros(0, bool), sentence_parity=np.zeros(0, bool)), 0
  arrays = dict(input_ids=np.concatenate(ids), word_start=np.concatenate(starts), sentence_parity=np.concatenate(par))
  return arrays, len(arrays["input_ids"])


class StreamWriter:
  """Appends chunks' token streams (token_stream's arrays) to a shards.ShardWriter as rows of `width` tokens,
  carrying the remainder to the next chunk; a chunk that begins with the parity the stream ended on is flipped
  (the reference's `sent_ids = np.logical_not(sent_ids)`), and a [SEP] goes between chunks as between documents."""

  def __init__(self, writer, width: int, sep: int):
    self.writer, self.width, self.sep = writer, width, sep
    self.carry = {k: np.zeros(0, np.int32 if k == "input_ids" else bool) for k in FIELDS}
    self.tokens = self.rows = 0
    self.last = None

  def write(self, arrays: dict):
    if not len(arrays["input_ids"]):
      return
    if self.last is not None:  # between chunks, as between documents: [SEP], then parities that keep flipping
      par = arrays["sentence_parity"]
      par = par if par[0] == self.last else ~par
      arrays = dict(input_ids=np.concatenate([[self.sep], arrays["input_ids"]]).astype(np.int32),
                    word_start=np.concatenate([[True], arrays["word_start"]]),
                    sentence_parity=np.concatenate([[not self.last], par]))
    self.last = bool(arrays["sentence_parity"][-1])
    self.tokens += len(arrays["input_ids"])
    merged = {k: np.concatenate([self.carry[k], arrays[k]]) for k in FIELDS}
    self._emit(merged, len(merged["input_ids"]) // self.width)

  def _emit(self, merged: dict, n: int):
    k = n * self.width
    if n:
      records = np.empty(n, self.writer.dtype)
      for name in FIELDS:
        records[name] = merged[name][:k].reshape(n, self.width)
      self.writer.write(records)
      self.rows += n
    self.carry = {name: merged[name][k:] for name in FIELDS}

  def close(self) -> list:
    """Writes the last, padded row (its padding lies past `tokens`, never read); returns the shard list."""
    left = len(self.carry["input_ids"])
    if left:
      pad = self.width - left
      self._emit({k: np.concatenate([v, np.zeros(pad, v.dtype)]) for k, v in self.carry.items()}, 1)
    return self.writer.close()
