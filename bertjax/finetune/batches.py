"""Fine-tuning batches: which rows make training batch `step` (a pure function of (seed, step)), grouping
rows of similar length, and cutting a batch to the smallest length bucket that holds its longest row.

Every example is encoded to seq_len, but SST-2's sentences average 13 tokens of 128: computing the padding
is most of the work. Cutting each batch to one of a few bucket lengths (`bucket_lengths`) removes most of it
while compiling the step at most once per bucket (on TPUs every shape is a compile, so free-form dynamic
shapes are not the answer). By default the buckets are fitted to the run's training batches: as many as
multiples of 32 would give (seq_len / 32), placed (multiples of 8) where the batches, each padded to the bucket
of its longest row, compute the fewest positions.
Grouping rows by length within a window of `length_window` shuffled batches (transformers' group_by_length:
50 batches a window) makes batches short where their rows are; the window's batches are then dealt in a
seeded random order, so batches stay random and each epoch still sees every row once.
"""

import dataclasses

import numpy as np

from bertjax.data import pipeline, trees
from bertjax.core.errors import UserError

BUCKET_STEP = 32  # "auto" fits seq_len / 32 buckets: as many shapes as multiples of 32 would compile
BUCKET_QUANTUM = 8  # fitted buckets are multiples of 8 (TPU tiles; nothing finer pays on a CPU either)


def fitted_buckets(lengths, seq_len: int, count: int, quantum: int = BUCKET_QUANTUM) -> tuple:
  """`count` bucket lengths (multiples of `quantum`, the last one holding the longest) that minimize the
  positions computed when each of `lengths` is padded to the smallest bucket holding it: an exact dynamic
  program over the lengths rounded up to `quantum`. Given each training batch's longest row
  (`batch_longest`), that is what the run computes (a batch is its bucket x batch_size positions)."""
  lengths = np.asarray(lengths)
  if not len(lengths):
    return ()
  width = np.minimum(-(-np.maximum(lengths, 1) // quantum) * quantum, seq_len)
  cands, rows = np.unique(width, return_counts=True)  # the only lengths worth a bucket
  below = np.concatenate([[0], np.cumsum(rows)])  # rows of width < cands[i]: below[i]
  n, k = len(cands), min(count, len(cands))
  # cost[j][i]: least positions for the rows up to cands[i] with j + 1 buckets, the last at cands[i].
  cost = np.full((k, n), np.inf)
  back = np.zeros((k, n), np.int64)
  cost[0] = cands * below[1:]
  for j in range(1, k):
    for i in range(j, n):
      prev = cost[j - 1, :i] + cands[i] * (below[i + 1] - below[1:i + 1])
      back[j, i] = int(np.argmin(prev))
      cost[j, i] = prev[back[j, i]]
  j = int(np.argmin(cost[:, n - 1]))  # fewer buckets when more would not save anything
  chosen, i = [], n - 1
  while j >= 0:
    chosen.append(int(cands[i]))
    i, j = back[j, i], j - 1
  return tuple(sorted(chosen))


def bucket_lengths(config, lengths=None) -> tuple:
  """The sorted bucket lengths of `config.bucket_lengths`: "auto" (fitted_buckets to `lengths`, the training
  batches' longest rows, seq_len / 32 of them; multiples of 32 when no lengths are given), "none" or "" (every batch
  padded to seq_len, one shape), or a list "32,64,128". seq_len is always the last bucket, so every row fits
  (with fitted buckets it is only compiled for a batch of longer rows: another split's, or none)."""
  spec, seq_len = str(config.get("bucket_lengths", "auto")).strip().lower(), config.seq_len
  if spec in ("", "none", "off"):
    return (seq_len,)
  if spec == "auto":
    if lengths is None:
      return tuple(range(BUCKET_STEP, seq_len, BUCKET_STEP)) + (seq_len,)
    fitted = fitted_buckets(lengths, seq_len, max(1, seq_len // BUCKET_STEP))
    return tuple(b for b in fitted if b < seq_len) + (seq_len,)
  try:
    values = sorted({int(x) for x in spec.replace(" ", "").split(",") if x})
  except ValueError:
    raise UserError(f"bucket_lengths={config.bucket_lengths!r}; use auto, none or lengths like 32,64,128") from None
  if not values or values[0] < 1 or values[-1] > seq_len:
    raise UserError(f"bucket_lengths={config.bucket_lengths!r} must be lengths in [1, seq_len={seq_len}]")
  return tuple(v for v in values if v < seq_len) + (seq_len,)


def row_lengths(arrays: dict) -> np.ndarray:
  """Each row's length [N]: one past its last real position (groups > 0) along the last axis, the
  longest over any inner axes (e.g. a multiple-choice row's choices)."""
  real = np.asarray(arrays["groups"]) > 0
  ends = np.where(real, np.arange(1, real.shape[-1] + 1), 0)
  return ends.reshape(len(ends), -1).max(1) if ends.ndim > 1 else ends


def _stream(n: int, first: int, count: int, config, seed: int) -> np.ndarray:
  """The rows of `count` consecutive training batches from step `first`, concatenated. bert mode: full
  batches from a stream of reshuffled epochs (as pipeline.batch_at). transformers mode: epoch-aligned
  batches, each epoch a fresh permutation, its last batch short (the steps must lie in one epoch)."""
  bs = config.batch_size
  if config.epoch_mode != "transformers":
    g = first * bs + np.arange(count * bs)
    epochs, pos = g // n, g % n
    idx = np.empty(len(g), np.int64)
    for e in np.unique(epochs):
      idx[epochs == e] = pipeline.permuted(seed, int(e), pos[epochs == e], n)
    return idx
  epoch, k = divmod(first, -(-n // bs))
  return pipeline.permuted(seed, epoch, np.arange(k * bs, min((k + count) * bs, n)), n)


def _pad(rows: np.ndarray, size: int) -> np.ndarray:
  return np.pad(rows, (0, size - len(rows)), constant_values=-1)


def _window(n: int, step: int, config) -> tuple[int, int]:
  """(first step, number of steps) of the window of batches whose rows are grouped with `step`'s:
  `length_window` consecutive batches (cut at an epoch's end in transformers mode, whose batches are
  epoch-aligned)."""
  w = config.length_window
  if config.epoch_mode != "transformers":
    return step // w * w, w
  per_epoch = -(-n // config.batch_size)
  epoch, k = divmod(step, per_epoch)
  first = epoch * per_epoch + k // w * w
  return first, min(first + w, (epoch + 1) * per_epoch) - first


def batch_rows(n: int, step: int, config, seed: int, lengths: np.ndarray | None = None) -> np.ndarray:
  """The rows of training batch `step` (-1: a padding row), a pure function of (seed, step). With
  `lengths` and length_window > 1, the window's rows are sorted by length (longest first, ties in shuffled
  order) and cut into batches, and those batches are dealt to the window's steps in an order drawn from
  (seed, the window's first step)."""
  bs = config.batch_size
  if lengths is None or config.get("length_window", 0) <= 1:
    return _pad(_stream(n, step, 1, config, seed), bs)
  first, count = _window(n, step, config)
  rows, order = _grouped(n, first, count, config, seed, lengths)
  k = order[step - first]
  return _pad(rows[k * bs:(k + 1) * bs], bs)


def _grouped(n: int, first: int, count: int, config, seed: int, lengths: np.ndarray) -> tuple:
  """(rows, order) of the window of `count` batches from step `first`: its rows sorted by length (longest
  first, ties in shuffled order), and for each of its steps the batch of those rows it runs."""
  rows = _stream(n, first, count, config, seed)
  rows = rows[np.argsort(-lengths[rows], kind="stable")]
  return rows, np.random.default_rng([seed, first, 0x6C656E]).permutation(count)


def batch_longest(lengths: np.ndarray, total: int, config, seeds) -> np.ndarray:
  """The longest row of each of the first `total` training batches of every seed in `seeds`, as batch_rows
  makes them (computed per window of batches, not per step): what "auto" buckets are fitted to."""
  n, bs, out = len(lengths), config.batch_size, []
  grouped = config.get("length_window", 0) > 1
  for seed in seeds:
    step = 0
    while n and step < total:
      if grouped:
        first, count = _window(n, step, config)
        rows, order = _grouped(n, first, count, config, seed, lengths)
        ks = order[:total - first]
      else:
        first, count, rows, ks = step, 1, _stream(n, step, 1, config, seed), [0]
      out.extend(int(lengths[rows[k * bs:(k + 1) * bs]].max()) for k in ks)
      step = first + count
  return np.asarray(out, np.int64)


def take(arrays: dict, rows: np.ndarray, layout: "Layout") -> dict:
  """The batch of `rows` (-1: a padding row, weight 0, a copy of row 0), its token fields cut to the
  smallest bucket that holds its longest real row; example_weight added."""
  valid = rows >= 0
  idx = np.where(valid, rows, 0)
  longest = int(layout.lengths[idx[valid]].max()) if valid.any() else 1
  width = next(b for b in layout.buckets if b >= longest)
  batch = {k: (v[idx][..., :width] if k in layout.token_fields else v[idx]) for k, v in arrays.items()}
  batch["example_weight"] = valid.astype(np.float32)
  return batch


def eval_batches(arrays: dict, batch_size: int, layout: "Layout"):
  """(rows, batch) over a whole split sorted by length (each batch cut to its bucket, the last one padded
  with weight-0 rows); `rows` are the split's row numbers of the batch's real rows, to restore the order."""
  order = np.argsort(layout.lengths, kind="stable")
  for start in range(0, len(order), batch_size):
    rows = order[start:start + batch_size]
    yield rows, take(arrays, _pad(rows, batch_size), layout)


@dataclasses.dataclass
class Layout:
  """How a split's rows are cut: the bucket lengths, each row's length, and the fields to cut (padded along
  their last axis)."""

  buckets: tuple
  lengths: np.ndarray
  token_fields: tuple


def layout(config, arrays: dict, token_fields, fit_to=None, buckets=None) -> Layout:
  """The Layout of a split encoded to config.seq_len: `buckets` when given (an evaluation split takes its
  training split's, so a run compiles no other shapes), else config.bucket_lengths, "auto" fitted to `fit_to`
  (the training batches' longest rows, `batch_longest`; default: this split's row lengths)."""
  lengths = row_lengths(arrays)
  if buckets is None:
    buckets = bucket_lengths(config, lengths if fit_to is None else fit_to)
  return Layout(tuple(buckets), lengths, tuple(token_fields))


def prediction_layout(arrays: dict, batch_size: int) -> Layout:
  """The Layout a prediction over a whole split (`eval_batches` order: rows sorted by length) runs with: every
  field of `arrays` cut along its last axis to buckets fitted to the sorted batches' longest rows (width /
  BUCKET_STEP of them, the arrays' width last), as fine-tuning's own evaluation cuts its batches. Padding
  positions change no real output (padding keys get no attention), so the outputs are those of full-width
  batches at a fraction of the positions; a predictor without it would pad every batch to seq_len."""
  lengths = row_lengths(arrays)
  width = np.shape(arrays["input_ids"])[-1]
  longest = np.sort(lengths)[batch_size - 1::batch_size]
  longest = np.append(longest, lengths.max()) if len(lengths) % batch_size else longest
  fitted = fitted_buckets(longest, width, max(1, width // BUCKET_STEP))
  return Layout(tuple(b for b in fitted if b < width) + (width,), lengths, tuple(arrays))


def fixed_layout(arrays: dict) -> Layout:
  """No cutting, no grouping, the split in its own order: every batch as wide as the arrays."""
  n, width = len(arrays["input_ids"]), np.shape(arrays["input_ids"])[-1]
  return Layout((width,), np.zeros(n, np.int64), ())


PACK_SLOTS = 16  # examples a packed row holds at most (the classifier's [CLS] gathers are [rows, PACK_SLOTS])


def packed(batch: dict, seq_len: int) -> dict:
  """A classification batch (B example rows, as `take` makes them) packed several examples to a row, so no
  compute goes to padding (ModernBERT's unpadding; issue #37): first-fit into rows of `seq_len`, each example its
  own `groups` id (attention stays inside it) and `position_ids` restarting at 0, its [CLS] position in
  `cls_positions` [R, PACK_SLOTS] and its label and weight at the same slot (unused slots weigh 0). R is the
  smallest of B/8, B/4, B/2, B rows that holds them (a few shapes, compiled once each, as length buckets)."""
  ids, weight = np.asarray(batch["input_ids"]), np.asarray(batch["example_weight"])
  lengths = row_lengths(batch)
  real = [i for i in range(len(ids)) if weight[i] > 0]
  b = len(ids)
  for rows in sorted({max(1, b // 8), max(1, b // 4), max(1, b // 2), b}):
    fill, slots, place = np.zeros(rows, np.int64), np.zeros(rows, np.int64), {}
    for i in sorted(real, key=lambda i: -lengths[i]):  # first-fit decreasing
      r = next((r for r in range(rows) if fill[r] + lengths[i] <= seq_len and slots[r] < PACK_SLOTS), None)
      if r is None:
        break
      place[i] = (r, fill[r], slots[r])
      fill[r], slots[r] = fill[r] + lengths[i], slots[r] + 1
    if len(place) == len(real):
      break
  out = {k: np.zeros((rows, seq_len), np.int32) for k in ("input_ids", "type_ids", "groups", "position_ids")}
  out.update({k: np.full((rows, seq_len), -1, np.int32) for k in trees.FIELDS if k in batch})  # tree nodes' spans
  out["cls_positions"] = np.zeros((rows, PACK_SLOTS), np.int32)
  out["example_weight"] = np.zeros((rows, PACK_SLOTS), np.float32)
  label = np.asarray(batch["label"])
  out["label"] = np.zeros((rows, PACK_SLOTS), label.dtype)
  for i, (r, at, slot) in place.items():
    n = lengths[i]
    out["input_ids"][r, at:at + n] = ids[i, :n]
    out["type_ids"][r, at:at + n] = np.asarray(batch["type_ids"])[i, :n]
    out["groups"][r, at:at + n] = slot + 1
    out["position_ids"][r, at:at + n] = np.arange(n)
    for k in [f for f in trees.FIELDS if f in out]:  # tree nodes' spans are row positions: moved with the example
      out[k][r, at:at + n] = np.where(batch[k][i, :n] >= 0, batch[k][i, :n] + at, -1)
    out["cls_positions"][r, slot], out["example_weight"][r, slot], out["label"][r, slot] = at, weight[i], label[i]
  return out
