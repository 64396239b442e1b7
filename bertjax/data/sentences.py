"""A rule-based English sentence splitter for turning corpus paragraphs into sentences."""

import re
from typing import Iterable, Iterator

# A sentence may end in a run of terminators ("?!", "...", "…") and then closing quotes or brackets.
_CANDIDATE = re.compile(r"[.!?\u2026]+[\"')\]}\u201d\u2019\u00bb]*(?= )")
# What may open the next sentence besides an uppercase letter or a digit.
_OPENERS = "\"'([{\u201c\u2018\u00ab"
# Lowercased abbreviations that are followed by a period but rarely end a sentence.
_ABBREVIATIONS = frozenset((
    "mr.", "mrs.", "ms.", "dr.", "prof.", "st.", "jr.", "sr.", "vs.", "etc.", "cf.", "fig.", "no.",
    "inc.", "ltd.", "co.", "e.g.", "i.e.", "u.s.", "a.m.", "p.m.",
))
# "J." as in "J. K. Rowling", and dotted letter runs such as "U.K." or "e.g.". "I." is left out:
# the pronoun ending a sentence ("So did I.") is more common than the initial.
_INITIALS = re.compile(r"[A-HJ-Z]\.|(?:[A-Za-z]\.){2,}")


def _is_abbreviation(word: str) -> bool:
  """Whether `word` (the whitespace-delimited token ending in the period) is an abbreviation or initial."""
  word = word.lstrip(_OPENERS)
  return word.lower() in _ABBREVIATIONS or _INITIALS.fullmatch(word) is not None


def _starts_sentence(char: str) -> bool:
  """Whether `char` may begin a sentence: lowercase after a period usually means the sentence goes on."""
  return char.isupper() or char.isdigit() or char in _OPENERS


def _is_boundary(text: str, match: re.Match) -> bool:
  """Whether the terminator run `match` (followed by one space in `text`) ends a sentence."""
  if not _starts_sentence(text[match.end() + 1]):
    return False
  terminators = match.group().rstrip("\"')]}\u201d\u2019\u00bb")
  if terminators != ".":
    return True  # "!", "?" and ellipses are never part of an abbreviation
  word_start = text.rfind(" ", 0, match.start()) + 1
  return not _is_abbreviation(text[word_start:match.start() + 1])


def split_sentences(paragraph: str) -> list[str]:
  """Splits a paragraph into sentences.

  Line breaks and runs of whitespace inside the paragraph count as one space. A sentence ends at `.`, `!`,
  `?` or an ellipsis (optionally followed by closing quotes or brackets) when whitespace and then an
  uppercase letter, a digit, a quote or an opening bracket follow; a period never ends a sentence after
  a common abbreviation ("Dr.", "e.g.", "U.S.", ...) or a single capital initial ("J. K. Rowling").
  Periods inside numbers ("3.14") are not followed by whitespace and so never split.

  Args:
    paragraph: the text of one paragraph.

  Returns:
    The sentences in order, stripped and non-empty (an empty list for blank input).
  """
  text = " ".join(paragraph.split())
  sentences = []
  start = 0
  for match in _CANDIDATE.finditer(text):
    if _is_boundary(text, match):
      sentences.append(text[start:match.end()])
      start = match.end() + 1  # skip the single space between sentences
  sentences.append(text[start:])
  return [s for s in sentences if s]


def paragraphs_to_sentences(lines: Iterable[str]) -> Iterator[str]:
  """Yields the sentences of each line in turn, treating every line as one paragraph."""
  for line in lines:
    yield from split_sentences(line)
