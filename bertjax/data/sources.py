"""Corpus sources named by one string (`demo`, `text:GLOB`): each yields documents as lists of sentences."""

import dataclasses
import glob
import hashlib
import os
import re
import sys
from typing import Iterator

from bertjax.data.sentences import split_sentences
from bertjax.errors import UserError

Document = list  # of sentences (str)

_HEADING_RULE = re.compile(r"^([*=\-^~])\1{2,}\s*$")


@dataclasses.dataclass
class SourceStats:
  """Counts a source reports as it is read (DESIGN §5.5: boundaries are easy to get wrong, so count)."""

  documents: int = 0
  sentences: int = 0
  invalid_lines: int = 0  # lines with bytes that are not UTF-8, skipped


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
    stats.sentences += len(doc)
    yield doc


def _text_documents(pattern: str, stats: SourceStats, split: bool) -> Iterator[Document]:
  """Plain text files: one sentence per line (or a paragraph per line with split=True), blank line
  between documents, as google-research/bert reads them. Invalid UTF-8 lines are skipped and counted."""
  for path in text_files(pattern):
    doc = []
    with open(path, "rb") as f:
      for raw in f:
        try:
          line = raw.decode("utf-8").strip()
        except UnicodeDecodeError:
          stats.invalid_lines += 1
          continue
        if not line:
          if doc:
            yield from _count(stats, [doc])
          doc = []
          continue
        doc.extend(split_sentences(line) if split else [line])
    if doc:
      yield from _count(stats, [doc])


def text_files(pattern: str) -> list:
  """The sorted files matching a glob; a UserError if there are none."""
  files = sorted(p for p in glob.glob(os.path.expanduser(pattern), recursive=True) if os.path.isfile(p))
  if not files:
    raise UserError(f"no files match {pattern!r}; check the path in --config.data.source=text:GLOB")
  return files


def documents(source: str, stats: SourceStats, split_paragraphs: bool = False) -> Iterator[Document]:
  """Documents of the source named by `source` (see the module docstring); counts go into `stats`."""
  kind, _, arg = source.partition(":")
  if kind == "demo":
    return _demo_documents(stats)
  if kind == "text" and arg:
    return _text_documents(arg, stats, split_paragraphs)
  raise UserError(f"unknown data source {source!r}; use demo or text:GLOB (--config.data.source)")


def fingerprint(source: str) -> str:
  """A short hash that changes when the source's content does (names the cached tokenizer)."""
  h = hashlib.sha256(source.encode())
  kind, _, arg = source.partition(":")
  if kind == "demo":
    h.update(sys.version.encode())
  elif kind == "text":
    for p in text_files(arg):
      st = os.stat(p)
      h.update(f"{p}:{st.st_size}:{st.st_mtime_ns}".encode())
  return h.hexdigest()[:16]
