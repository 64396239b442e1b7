"""Pre-tokenized shards on disk: fixed-length rows in flat binary files, a metadata JSON, memory-mapped reads.

Layout of a shards directory (what `python -m bertjax.data.prepare` writes):

  metadata.json          format, seq_len, tokenizer (spec relative to the directory, fingerprint, vocab
                         size), the row layout, the source and settings, counts, and the shard files of
                         each split; written last, so a directory without it is an unfinished preparation
  tokenizer.model        the tokenizer (vocab.txt for WordPiece, tokenizer/ for a checkpoint's hf:DIR); training uses it
  train-00000.rows ...   rows of the train split; eval-00000.rows ... rows of the held-out documents

A .rows file is a flat array of fixed-size records (numpy structured dtype, little-endian, no header), one
per training row: every field of a row is stored together, so gathering a batch reads each row's bytes
in one place, and any row is found by arithmetic (`np.memmap`), never by reading what comes before it.
Fields are stored narrow (ids as uint16 when the vocabulary fits) and widened when read.
"""

import json
import mmap
import os

import numpy as np

from bertjax.core.errors import UserError

METADATA = "metadata.json"
VERSION = 1
SHARD_BYTES = 1 << 30  # a shard file holds about this many bytes of rows
# Stored type of each field (input_ids: see storage_types); _SCALARS are one value per row.
_STORED = dict(type_ids="u1", word_start="?", groups="<u2", position_ids="<u2", sentence_label="u1")
_SCALARS = ("sentence_label",)


def storage_types(fields, vocab_size: int) -> list:
  """[field name, stored numpy type string] pairs, in row order, for the fields a format writes."""
  wide_ids = "<u2" if vocab_size <= 1 << 16 else "<i4"
  return [[name, wide_ids if name == "input_ids" else _STORED[name]] for name in fields]


def row_dtype(types: list, seq_len: int) -> np.dtype:
  """The structured dtype of one row (little-endian, packed) from [field, stored type] pairs."""
  return np.dtype([(name, t) if name in _SCALARS else (name, t, (seq_len,)) for name, t in types])


def _widen(name: str, column: np.ndarray) -> np.ndarray:
  """A stored column in the type batches carry (int32, or bool for word_start)."""
  return column.astype(bool if name == "word_start" else np.int32)


def to_records(arrays: dict, dtype: np.dtype) -> np.ndarray:
  """In-memory instance arrays (field -> [N, ...]) as N stored rows."""
  records = np.empty(len(arrays["input_ids"]), dtype)
  for name in dtype.names:
    records[name] = arrays[name]
  return records


class ShardWriter:
  """Appends rows of one split to shard files of at most ~SHARD_BYTES each."""

  def __init__(self, directory: str, split: str, dtype: np.dtype):
    self.directory, self.split, self.dtype = directory, split, dtype
    self.rows_per_shard = max(1, SHARD_BYTES // dtype.itemsize)
    self.shards = []  # [{"file", "rows"}]
    self._file = None

  def write(self, records: np.ndarray):
    """Appends rows (a structured array of this writer's dtype, see to_records)."""
    n, at = len(records), 0
    while at < n:
      if self._file is None or self.shards[-1]["rows"] == self.rows_per_shard:
        self._roll()
      take = min(n - at, self.rows_per_shard - self.shards[-1]["rows"])
      records[at:at + take].tofile(self._file)
      self.shards[-1]["rows"] += take
      at += take

  def _roll(self):
    if self._file is not None:
      self._file.close()
    name = f"{self.split}-{len(self.shards):05d}.rows"
    self._file = open(os.path.join(self.directory, name), "wb")
    self.shards.append(dict(file=name, rows=0))

  def close(self) -> list:
    """Closes the current file; returns the shard list for the metadata."""
    if self._file is not None:
      self._file.close()
      self._file = None
    return self.shards


class Rows:
  """The rows of one split, memory-mapped: `take(indices)` reads only those rows.

  Each shard file is mapped once, when first read (one open mapping per file per process); nothing
  else of the corpus is held in memory.
  """

  def __init__(self, directory: str, shards: list, dtype: np.dtype):
    self.directory, self.shards, self.dtype = directory, shards, dtype
    counts = np.array([s["rows"] for s in shards], np.int64)
    self._ends = np.cumsum(counts)
    self._starts = self._ends - counts
    self._maps = {}

  def __len__(self) -> int:
    return int(self._ends[-1]) if len(self._ends) else 0

  @property
  def opened(self) -> list:
    """The shard files this process has mapped so far: only those holding a row it read."""
    return sorted(self.shards[i]["file"] for i in self._maps)

  def _map(self, i: int) -> np.memmap:
    if i not in self._maps:
      path = os.path.join(self.directory, self.shards[i]["file"])
      expected = self.shards[i]["rows"] * self.dtype.itemsize
      if not os.path.exists(path) or os.path.getsize(path) != expected:
        raise UserError(f"shard {path} is missing or not {expected} bytes; prepare the shards again")
      rows = np.memmap(path, dtype=self.dtype, mode="r")
      # Batches read rows at random: without this hint every row read would also read ahead the
      # pages after it (128 KiB and more), which costs I/O and fills memory with rows nobody asked for.
      if hasattr(rows, "_mmap") and hasattr(mmap, "MADV_RANDOM"):
        rows._mmap.madvise(mmap.MADV_RANDOM)
      self._maps[i] = rows
    return self._maps[i]

  def records(self, indices) -> np.ndarray:
    """The stored records of rows `indices` (any order, repeats allowed), as one structured array."""
    indices = np.asarray(indices, np.int64)
    out = np.empty(len(indices), self.dtype)
    shard = np.searchsorted(self._ends, indices, side="right")
    for i in np.unique(shard):
      sel = shard == i
      out[sel] = self._map(int(i))[indices[sel] - self._starts[i]]
    return out

  def take(self, indices) -> dict:
    """Rows `indices` as field -> array in the in-memory types."""
    records = self.records(indices)
    return {name: _widen(name, records[name]) for name in self.dtype.names}


def write_metadata(directory: str, meta: dict):
  """Writes metadata.json atomically (it marks the directory as complete)."""
  path = os.path.join(directory, METADATA)
  tmp = path + ".tmp"
  with open(tmp, "w") as f:
    json.dump(meta, f, indent=2, sort_keys=True)
  os.replace(tmp, path)


def read_metadata(directory: str) -> dict:
  """The metadata of a shards directory; UserError if there is none or it is of another version."""
  path = os.path.join(os.path.expanduser(directory), METADATA)
  if not os.path.exists(path):
    raise UserError(f"{directory} holds no {METADATA}: not a finished preparation; run "
                    f"python -m bertjax.data.prepare --config=CONFIG --out={directory}")
  with open(path) as f:
    meta = json.load(f)
  if meta.get("version") != VERSION:
    raise UserError(f"{path} is shards format version {meta.get('version')}, this bertjax reads {VERSION}; "
                    "prepare the shards again")
  return meta


def open_split(directory: str, meta: dict, split: str) -> Rows:
  """The memory-mapped rows of `split` ("train" or "eval") of a prepared directory."""
  dtype = row_dtype(meta["fields"], meta["seq_len"])
  return Rows(os.path.expanduser(directory), meta["splits"][split]["shards"], dtype)
