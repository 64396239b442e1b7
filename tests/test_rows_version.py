"""The row-builder version (prepare_lib.ROWS_VERSION) against golden digests of every format's rows.

Rows made from a fixed small corpus (text -> sentences -> WordPiece ids -> instances -> stored records, the
code `prepare` runs in its workers) are hashed per format and compared with tests/golden_rows.json, which
holds the digests together with the version they belong to. A change to the code that makes rows fails
here until ROWS_VERSION is bumped; then the goldens are rewritten for the new version with
`PYTHONPATH=. python tests/test_rows_version.py --update` (the documented way; docs/integrity.md), and
every cache entry of the old version stops being read.
"""

import hashlib
import json
import os
import sys

import pytest

from bertjax.data import instances, prepare_lib, shards
from bertjax.data.tokenizer import SPECIAL_TOKENS

GOLDEN = os.path.join(os.path.dirname(os.path.abspath(__file__)), "golden_rows.json")
VOCAB = [*SPECIAL_TOKENS, *"abcdefghijklmnopqrstuvwxyz", ".", ",", "the", "cat", "dog", "sat", "ran", "on", "mat",
         "big", "small", "red", "##s", "##ed", "##ing", "##er", "and", "then", "it", "was", "home"]
WORDS = ["the", "cat", "dog", "sat", "ran", "on", "mat", "a", "big", "small", "red", "cats", "dogs", "runner",
         "and", "then", "it", "was", "home", "sitting"]


def corpus() -> list:
  """Twelve documents of a few paragraphs (lines split into sentences), made by a fixed rule, no randomness."""
  docs = []
  for d in range(12):
    lines = []
    for p in range(1 + d % 3):
      sentences = []
      for s in range(2 + (d + p) % 3):
        n = 3 + (d * 7 + p * 3 + s * 5) % 9
        words = [WORDS[(d * 13 + p * 5 + s * 3 + w * 7) % len(WORDS)] for w in range(n)]
        sentences.append(" ".join(words).capitalize() + ".")
      lines.append(" ".join(sentences))
    docs.append(lines)
  return docs


def digests(vocab_path: str) -> dict:
  """{format: sha256 of its rows' stored bytes (train split, two chunks) and its dtype}."""
  out = {}
  for fmt in instances.FORMATS:
    fields = prepare_lib._fields(fmt)
    dtype = shards.row_dtype(shards.storage_types(fields, len(VOCAB)), 32)
    settings = prepare_lib.Settings(f"wordpiece:{vocab_path}", True, fmt, 32, 0.1, 2, 7, dtype)
    h = hashlib.sha256(str(dtype.descr).encode())
    docs = corpus()
    for index, chunk in enumerate((docs[:6], docs[6:])):
      result = prepare_lib.process_chunk((settings, "train", index, chunk))
      h.update(result.records.tobytes())
    out[fmt] = h.hexdigest()[:16]
  return out


def _vocab(directory) -> str:
  path = os.path.join(directory, "vocab.txt")
  with open(path, "w", encoding="utf-8") as f:
    f.write("\n".join(VOCAB) + "\n")
  return path


def test_the_rows_of_every_format_match_the_goldens_of_this_row_builder_version(tmp_path):
  with open(GOLDEN) as f:
    golden = json.load(f)
  assert golden["rows_version"] == prepare_lib.ROWS_VERSION, (
      f"tests/golden_rows.json holds digests of row-builder version {golden['rows_version']}, the code is version "
      f"{prepare_lib.ROWS_VERSION}: rewrite them with PYTHONPATH=. python tests/test_rows_version.py --update")
  got = digests(_vocab(tmp_path))
  assert set(got) == set(golden["digests"]), "a format without a golden digest: run the --update"
  changed = sorted(f for f in got if got[f] != golden["digests"][f])
  assert not changed, (
      f"the rows of {changed} changed while ROWS_VERSION stayed {prepare_lib.ROWS_VERSION}: caches would reuse rows "
      "of the old code. Bump bertjax.data.prepare_lib.ROWS_VERSION, then PYTHONPATH=. python tests/test_rows_version.py --update")


def test_every_format_makes_rows_from_the_corpus_and_one_changed_token_changes_its_digest(tmp_path):
  """The check can fail: each format's digest covers real rows, and a one-token change in them shows."""
  vocab = _vocab(tmp_path)
  for fmt in instances.FORMATS:
    dtype = shards.row_dtype(shards.storage_types(prepare_lib._fields(fmt), len(VOCAB)), 32)
    settings = prepare_lib.Settings(f"wordpiece:{vocab}", True, fmt, 32, 0.1, 2, 7, dtype)
    rows = prepare_lib.process_chunk((settings, "train", 0, corpus()[:6])).records
    assert len(rows) >= 3, fmt
    before = hashlib.sha256(rows.tobytes()).hexdigest()
    at = (len(rows) // 2, 1) if rows["input_ids"].ndim == 2 else (len(rows) // 2,)  # stream: one record a token
    rows["input_ids"][at] += 1
    assert hashlib.sha256(rows.tobytes()).hexdigest() != before


if __name__ == "__main__":
  if sys.argv[1:] != ["--update"]:
    sys.exit("usage: PYTHONPATH=. python tests/test_rows_version.py --update  (after bumping ROWS_VERSION)")
  import tempfile

  with tempfile.TemporaryDirectory() as d:
    table = dict(rows_version=prepare_lib.ROWS_VERSION, digests=digests(_vocab(d)))
  with open(GOLDEN, "w") as f:
    json.dump(table, f, indent=2, sort_keys=True)
    f.write("\n")
  print(f"wrote {GOLDEN} for row-builder version {prepare_lib.ROWS_VERSION}")
