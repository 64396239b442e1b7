"""Pre-tokenized shards on disk: fixed-length rows in flat binary files, a metadata JSON, memory-mapped reads.

Layout of a shards directory (what `python -m bertjax.data.prepare` writes):

  metadata.json          format, seq_len, tokenizer (spec relative to the directory, fingerprint, vocab
                         size), the row layout, the source and settings, counts, and the shard files of
                         each split with their size and sha256 (`verify` checks them before training
                         reads a row); written last, so a directory without it is an unfinished preparation
  tokenizer.model        the tokenizer (vocab.txt for WordPiece, tokenizer/ for a checkpoint's hf:DIR); training uses it
  train-00000.rows ...   rows of the train split; eval-00000.rows ... rows of the held-out documents
  token_counts.npy       int64 [tokenizer vocab]: how often each id occurs in the train split's text (the corpus
                         unigram distribution that masking.replace_dist=unigram and masking.smoothing use)

A .rows file is a flat array of fixed-size records (numpy structured dtype, little-endian, no header), one
per training row: every field of a row is stored together, so gathering a batch reads each row's bytes
in one place, and any row is found by arithmetic (`np.memmap`), never by reading what comes before it.
Fields are stored narrow (ids as uint16 when the vocabulary fits) and widened when read.
"""

import hashlib
import json
import mmap
import os

import numpy as np

from bertjax.core.errors import UserError

METADATA = "metadata.json"
TOKEN_COUNTS = "token_counts.npy"
VERSION = 1
SHARD_BYTES = 1 << 30  # a shard file holds about this many bytes of rows
# Stored type of each field (input_ids: see storage_types); _SCALARS are one value per row.
_STORED = dict(type_ids="u1", word_start="?", groups="<u2", position_ids="<u2", sentence_label="u1",
               unit_start="?", mention="u1",  # entity/phrase spans (bertjax.data.units)
               node_first="<i2", node_last="<i2",  # tree nodes' spans (bertjax.data.trees)
               sentence_parity="?")  # the stream format's sentence flips (bertjax.data.plm)
_SCALARS = ("sentence_label",)


def storage_types(fields, vocab_size: int) -> list:
  """[field name, stored numpy type string] pairs, in row order, for the fields a format writes."""
  wide_ids = "<u2" if vocab_size <= 1 << 16 else "<i4"
  return [[name, wide_ids if name == "input_ids" else _STORED[name]] for name in fields]


def row_dtype(types: list, seq_len: int) -> np.dtype:
  """The structured dtype of one row (little-endian, packed) from [field, stored type] pairs."""
  return np.dtype([(name, t) if name in _SCALARS else (name, t, (seq_len,)) for name, t in types])


def _widen(name: str, column: np.ndarray) -> np.ndarray:
  """A stored column in the type batches carry (int32, or bool for word_start and unit_start)."""
  return column.astype(bool if name in ("word_start", "unit_start", "sentence_parity") else np.int32)


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
    self.shards = []  # [{"file", "rows", "bytes", "sha256"}]
    self._file = None
    self._digest = None

  def write(self, records: np.ndarray):
    """Appends rows (a structured array of this writer's dtype, see to_records)."""
    n, at = len(records), 0
    while at < n:
      if self._file is None or self.shards[-1]["rows"] == self.rows_per_shard:
        self._roll()
      take = min(n - at, self.rows_per_shard - self.shards[-1]["rows"])
      data = records[at:at + take].tobytes()
      self._file.write(data)
      self._digest.update(data)
      self.shards[-1]["rows"] += take
      at += take

  def _finish(self):
    """Closes the current file, recording its size and checksum."""
    self._file.close()
    self._file = None
    self.shards[-1].update(bytes=self.shards[-1]["rows"] * self.dtype.itemsize, sha256=self._digest.hexdigest())

  def _roll(self):
    if self._file is not None:
      self._finish()
    name = f"{self.split}-{len(self.shards):05d}.rows"
    self._file = open(os.path.join(self.directory, name), "wb")
    self._digest = hashlib.sha256()
    self.shards.append(dict(file=name, rows=0))

  def close(self) -> list:
    """Closes the current file; returns the shard list (file, rows, bytes, sha256) for the metadata."""
    if self._file is not None:
      self._finish()
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


def write_token_counts(directory: str, counts: np.ndarray) -> dict:
  """Writes the corpus token counts beside the shards; returns their metadata entry (file, sha256, tokens)."""
  path = os.path.join(directory, TOKEN_COUNTS)
  np.save(path, np.asarray(counts, np.int64))
  return dict(file=TOKEN_COUNTS, sha256=file_sha256(path), tokens=int(np.sum(counts)))


def read_token_counts(directory: str, meta: dict):
  """The corpus token counts a preparation stored (int64 [vocab]), checked against their sha256; None for a
  preparation made before they were stored."""
  entry = meta.get("token_counts")
  if not entry:
    return None
  path = os.path.join(os.path.expanduser(directory), entry["file"])
  if not os.path.isfile(path) or file_sha256(path) != entry["sha256"]:
    raise UserError(f"{path} is missing or not the token counts metadata.json records; prepare the shards again")
  return np.load(path)


def count_tokens(rows, vocab_size: int, never: tuple, batch: int = 4096) -> np.ndarray:
  """Token counts of the ids in `rows` (shards.Rows or pipeline.ArrayRows) other than the ids in `never`
  (padding and special tokens), read `batch` rows at a time: the fallback for shards without stored counts."""
  counts = np.zeros(vocab_size, np.int64)
  for start in range(0, len(rows), batch):
    ids = rows.take(np.arange(start, min(start + batch, len(rows))))["input_ids"].ravel()
    counts += np.bincount(ids[~np.isin(ids, never)], minlength=vocab_size)[:vocab_size]
  return counts


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


VERIFY_MODES = ("size", "first", "full")


def file_sha256(path: str) -> str:
  """The sha256 of a file, read in 8 MiB blocks (memory stays flat whatever its size)."""
  digest = hashlib.sha256()
  with open(path, "rb") as f:
    while block := f.read(1 << 23):
      digest.update(block)
  return digest.hexdigest()


def _stamp(path: str, expected: str) -> str:
  """The name of the record that the file at `path`, as it is now (inode, size, mtime), had checksum
  `expected`: any write to the file changes its mtime, and with it the name, so it is verified again."""
  st = os.stat(path)
  what = f"{os.path.abspath(path)}|{st.st_ino}|{st.st_size}|{st.st_mtime_ns}|{expected}"
  return hashlib.sha256(what.encode()).hexdigest()[:32]


def verify(directory: str, meta: dict, mode: str = "first", stamps: str = "") -> list:
  """Checks every shard file of `directory` against metadata.json before a row is read; returns the files
  whose full checksum was computed.

  The size always (a truncated or extended file); the sha256 too when `mode` is "full", or when it is
  "first" and `stamps` (a directory of records, one per file state already verified) has no record of this
  file as it is now. A preparation older than checksums is checked by size only. UserError naming the file
  at the first one that differs.
  """
  if mode not in VERIFY_MODES:
    raise UserError(f"data.verify={mode!r}; use one of {', '.join(VERIFY_MODES)}")
  checked = []
  for split in sorted(meta["splits"]):
    dtype = row_dtype(meta["fields"], meta["seq_len"])
    for shard in meta["splits"][split]["shards"]:
      path = os.path.join(os.path.expanduser(directory), shard["file"])
      expected = shard["rows"] * dtype.itemsize
      if not os.path.isfile(path):
        raise UserError(f"shard {path} is missing; prepare the shards again")
      size = os.path.getsize(path)
      if size != expected:
        raise UserError(f"shard {path} is {size} bytes, metadata.json says {expected} (truncated or overwritten); "
                        "prepare the shards again")
      if "sha256" not in shard or mode == "size":
        continue
      stamp = os.path.join(stamps, _stamp(path, shard["sha256"])) if stamps else ""
      if mode == "first" and stamp and os.path.exists(stamp):
        continue
      actual = file_sha256(path)
      checked.append(path)
      if actual != shard["sha256"]:
        raise UserError(f"shard {path} is corrupt: its sha256 is {actual[:16]}..., metadata.json records "
                        f"{shard['sha256'][:16]}... (bytes changed on disk); prepare the shards again")
      if stamp:
        try:
          os.makedirs(stamps, exist_ok=True)
          open(stamp, "w").close()
        except OSError:  # a read-only cache only means verifying again next time
          pass
  return checked


def open_split(directory: str, meta: dict, split: str) -> Rows:
  """The memory-mapped rows of `split` ("train" or "eval") of a prepared directory."""
  dtype = row_dtype(meta["fields"], meta["seq_len"])
  return Rows(os.path.expanduser(directory), meta["splits"][split]["shards"], dtype)
