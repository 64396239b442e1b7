"""Corpus sources named by one string (`demo`, `text:GLOB`, `tfds:NAME[:SPLIT]`), read as a stream of documents.

A source is read in two stages so that the expensive one can run in worker processes:
`open_source(spec).read(stats)` streams *raw* documents (lists of lines, cheap to read) and
`to_sentences(lines, reader.paragraphs)` turns one into sentences (the rule-based splitter, where the
lines are paragraphs). `documents(spec, stats)` does both, for callers that want sentences directly.

- `demo`: Python's own documentation topics (pydoc_data), one document per section; always there.
- `text:GLOB`: plain UTF-8 files (local paths, or gs:// and other remote paths through etils.epath), a
  blank line between documents, one sentence per line as google-research/bert reads them; with
  `data.split_paragraphs` each line is a paragraph and is split into sentences. Lines that are not
  valid UTF-8 are skipped and counted.
- `tfds:NAME[:SPLIT]` (split `train` by default), e.g. `tfds:wikipedia/20230601.en`: one example per
  document, its `data.tfds_text_key` feature split into lines at newlines; tfds text is paragraphs
  (whole articles), so it is always split into sentences. tensorflow-datasets is optional (the `tfds`
  extra), imported only here and only when such a source is read. Datasets prepared as ArrayRecord are
  read without TensorFlow (`tfds.data_source`); others through `tfds.load` (TensorFlow, hidden from
  accelerators).
"""

import dataclasses
import glob
import hashlib
import importlib.util
import os
import re
import sys
from typing import Callable, Iterator

from bertjax.core.errors import UserError
from bertjax.data.sentences import split_sentences

Document = list  # of sentences (str)

_HEADING_RULE = re.compile(r"^([*=\-^~])\1{2,}\s*$")
_GLOB_CHARS = re.compile(r"[*?\[]")
SPECS = "demo, text:GLOB or tfds:NAME[:SPLIT]"


@dataclasses.dataclass
class SourceStats:
  """Counts a source reports as it is read (DESIGN §5.5: boundaries are easy to get wrong, so count)."""

  documents: int = 0
  sentences: int = 0
  invalid_lines: int = 0  # lines (tfds: examples) with bytes that are not UTF-8, skipped
  progress: int = 0  # units of Reader.total read so far (bytes, examples or documents)


@dataclasses.dataclass(frozen=True)
class Reader:
  """An opened source: a stream of raw documents and what its lines are.

  Attributes:
    spec: the source string.
    paragraphs: the lines are paragraphs, to be split into sentences (else one sentence a line).
    total: the size of the source in `unit`s, for progress (0: unknown).
    unit: "bytes", "examples" or "documents".
    read: stats -> iterator over documents, each a list of non-blank lines; counts go into stats.
  """

  spec: str
  paragraphs: bool
  total: int
  unit: str
  read: Callable[[SourceStats], Iterator[list]]


def to_sentences(lines: list, paragraphs: bool) -> list:
  """The sentences of a raw document: each line split by the sentence splitter, or the lines as they are."""
  if not paragraphs:
    return lines
  return [s for line in lines for s in split_sentences(line)]


def _demo_documents(stats: SourceStats) -> Iterator[Document]:
  """Python's own documentation topics (pydoc_data), one document per section, split into sentences."""
  from pydoc_data.topics import topics

  for key in sorted(topics):
    lines = topics[key].splitlines()
    section, paragraph = [], []

    def flush_paragraph():
      if paragraph:
        section.extend(split_sentences(" ".join(paragraph)))
        paragraph.clear()

    for i, line in enumerate(lines):
      nxt = lines[i + 1] if i + 1 < len(lines) else ""
      if _HEADING_RULE.match(nxt) or _HEADING_RULE.match(line):
        # A heading (the line above a rule of *, =, -) ends a section: sections are the documents.
        flush_paragraph()
        if len(section) > 0 and _HEADING_RULE.match(nxt):
          yield from _count(stats, [section[:]])
          section.clear()
        continue
      if not line.strip() or line.lstrip().startswith((">>>", "...")):
        flush_paragraph()
      else:
        paragraph.append(line.strip())
    flush_paragraph()
    if section:
      yield from _count(stats, [section[:]])


def _count(stats: SourceStats, docs) -> Iterator[Document]:
  for doc in docs:
    stats.documents += 1
    stats.progress += 1
    yield doc


def _is_remote(path: str) -> bool:
  return "://" in path


def text_files(pattern: str) -> list:
  """The sorted files matching a glob (local, or remote such as gs:// via etils.epath); UserError if none."""
  if _is_remote(pattern):
    from etils import epath

    # epath globs relative to a directory: split the pattern at the last '/' before its first wildcard.
    first = _GLOB_CHARS.search(pattern)
    cut = pattern.rfind("/", 0, first.start()) if first else pattern.rfind("/")
    base, rest = pattern[:cut], pattern[cut + 1:]
    files = sorted(str(p) for p in epath.Path(base).glob(rest) if p.is_file())
  else:
    files = sorted(p for p in glob.glob(os.path.expanduser(pattern), recursive=True) if os.path.isfile(p))
  if not files:
    raise UserError(f"no files match {pattern!r}; check the path in --config.data.source=text:GLOB")
  return files


def _open(path: str):
  if _is_remote(path):
    from etils import epath

    return epath.Path(path).open("rb")
  return open(path, "rb")


def _size(path: str) -> int:
  if _is_remote(path):
    from etils import epath

    return epath.Path(path).stat().length
  return os.path.getsize(path)


def _text_documents(files: list, stats: SourceStats) -> Iterator[list]:
  """Raw documents of plain text files: blank lines separate documents; invalid UTF-8 lines are skipped
  and counted. A file's end also ends its last document."""
  for path in files:
    doc = []
    with _open(path) as f:
      for raw in f:
        stats.progress += len(raw)
        try:
          line = raw.decode("utf-8").strip()
        except UnicodeDecodeError:
          stats.invalid_lines += 1
          continue
        if line:
          doc.append(line)
        elif doc:
          stats.documents += 1
          yield doc
          doc = []
    if doc:
      stats.documents += 1
      yield doc


def import_tfds():
  """tensorflow_datasets; UserError if not installed. Where TensorFlow is installed too, accelerators are
  hidden from it first (DESIGN §5.6: TF must never take the GPU/TPU memory JAX needs)."""
  try:
    import tensorflow_datasets as tfds
  except ImportError as e:
    raise UserError("tfds: sources need tensorflow-datasets; pip install 'bertjax[tfds]', "
                    "or prepare the corpus as text files") from e
  if importlib.util.find_spec("tensorflow") is not None:
    try:
      import tensorflow as tf

      tf.config.set_visible_devices([], "GPU")
      tf.config.set_visible_devices([], "TPU")
    except Exception:  # TF started already, or a build without these device kinds
      pass
  return tfds


def _tfds_name_split(arg: str) -> tuple:
  name, _, split = arg.partition(":")
  return name, split or "train"


def _tfds_size(arg: str, data_dir: str) -> int:
  """Examples in the split, from the dataset's metadata (0 when it does not say)."""
  name, split = _tfds_name_split(arg)
  try:
    return int(import_tfds().builder(name, data_dir=data_dir or None).info.splits[split].num_examples)
  except UserError:
    raise
  except Exception:
    return 0


def tfds_examples(tfds, name: str, split: str, data_dir: str) -> Iterator[dict]:
  """The examples of a tfds split in the dataset's own (unshuffled) order, as dicts of numpy / bytes.

  Read with `tfds.data_source` (random access to ArrayRecord files, no TensorFlow); datasets prepared in
  another file format (TFRecord) fall back to `tfds.load`, which needs TensorFlow."""
  try:
    records = tfds.data_source(name, split=split, data_dir=data_dir or None)
  except Exception as e:  # not ArrayRecord, or not there: tfds.load says which below
    first = e
  else:
    yield from (records[i] for i in range(len(records)))
    return
  try:
    ds = tfds.load(name, split=split, shuffle_files=False, data_dir=data_dir or None)
  except Exception as e:  # tfds raises many types (DatasetNotFoundError, ValueError for a bad split, ...)
    raise UserError(f"tfds could not read {name!r} split {split!r} ({type(first).__name__}: {first}; then "
                    f"{type(e).__name__}: {e}); check the name and split in --config.data.source=tfds:NAME[:SPLIT] "
                    "and --config.data.tfds_data_dir") from e
  yield from tfds.as_numpy(ds)


def _tfds_documents(arg: str, text_key: str, data_dir: str, stats: SourceStats) -> Iterator[list]:
  """One raw document per example of a tfds split, in the dataset's own (unshuffled) order."""
  name, split = _tfds_name_split(arg)
  for example in tfds_examples(import_tfds(), name, split, data_dir):
    stats.progress += 1
    if text_key not in example:
      raise UserError(f"tfds dataset {name!r} has no feature {text_key!r} (it has {', '.join(sorted(example))}); "
                      "set --config.data.tfds_text_key")
    text = example[text_key]
    try:
      text = text.decode("utf-8") if isinstance(text, bytes) else str(text)
    except UnicodeDecodeError:
      stats.invalid_lines += 1
      continue
    lines = [line.strip() for line in text.split("\n") if line.strip()]
    if lines:
      stats.documents += 1
      yield lines


def open_source(spec: str, *, split_paragraphs: bool = False, tfds_text_key: str = "text",
                tfds_data_dir: str = "") -> Reader:
  """The Reader of the source named by `spec` (see the module docstring); UserError for a bad spec."""
  kind, _, arg = spec.partition(":")
  if kind == "demo":
    return Reader(spec, False, 0, "documents", _demo_documents)
  if kind == "text" and arg:
    files = text_files(arg)
    total = sum(_size(p) for p in files)
    return Reader(spec, split_paragraphs, total, "bytes", lambda stats: _text_documents(files, stats))
  if kind == "tfds" and arg:
    return Reader(spec, True, _tfds_size(arg, tfds_data_dir), "examples",
                  lambda stats: _tfds_documents(arg, tfds_text_key, tfds_data_dir, stats))
  raise UserError(f"unknown data source {spec!r}; use {SPECS} (--config.data.source)")


def documents(source: str, stats: SourceStats, split_paragraphs: bool = False, **options) -> Iterator[Document]:
  """Documents of `source` as lists of sentences; counts go into `stats`. `options` go to open_source."""
  reader = open_source(source, split_paragraphs=split_paragraphs, **options)
  for lines in reader.read(stats):
    doc = to_sentences(lines, reader.paragraphs)
    stats.sentences += len(doc)
    yield doc


def fingerprint(source: str) -> str:
  """A short hash that changes when the source's content does (part of the data cache's keys). A tfds
  source is known by its name only: name the version (tfds:wikipedia/20230601.en) to pin its content."""
  h = hashlib.sha256(source.encode())
  kind, _, arg = source.partition(":")
  if kind == "demo":
    h.update(sys.version.encode())
  elif kind == "text":
    for p in text_files(arg):
      if _is_remote(p):
        h.update(f"{p}:{_size(p)}".encode())
      else:
        st = os.stat(p)
        h.update(f"{p}:{st.st_size}:{st.st_mtime_ns}".encode())
  return h.hexdigest()[:16]
