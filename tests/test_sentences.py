"""Tests for the rule-based sentence splitter."""

import pytest

from bertjax.data.sentences import paragraphs_to_sentences, split_sentences


@pytest.mark.parametrize("paragraph, expected", [
    ("Mr. Smith met Mrs. Jones. They talked.", ["Mr. Smith met Mrs. Jones.", "They talked."]),
    ("Dr. Who and Prof. X met at St. Paul. Sr. and Jr. came too.",
     ["Dr. Who and Prof. X met at St. Paul.", "Sr. and Jr. came too."]),
    ("Apples vs. Oranges is old. Use fruit, e.g. Apples, i.e. Red ones. See Fig. 3 and No. 5 now.",
     ["Apples vs. Oranges is old.", "Use fruit, e.g. Apples, i.e. Red ones.", "See Fig. 3 and No. 5 now."]),
    ("Acme Inc. Sells things. Acme Ltd. And Acme Co. Too. Cf. Smith.",
     ["Acme Inc. Sells things.", "Acme Ltd. And Acme Co. Too.", "Cf. Smith."]),
    ("The U.S. Army left at 9 a.m. Monday and came back at 5 p.m. Tuesday. Then it rested.",
     ["The U.S. Army left at 9 a.m. Monday and came back at 5 p.m. Tuesday.", "Then it rested."]),
    ("Pens, pencils, etc. Were on the desk. It was tidy.",
     ["Pens, pencils, etc. Were on the desk.", "It was tidy."]),
])
def test_abbreviations_do_not_end_sentences(paragraph, expected):
  assert split_sentences(paragraph) == expected


def test_initials_do_not_end_sentences():
  assert split_sentences("J. K. Rowling wrote it. George R. R. Martin did not.") == [
      "J. K. Rowling wrote it.", "George R. R. Martin did not."]


def test_pronoun_i_ends_a_sentence():
  assert split_sentences("So did I. Then we left.") == ["So did I.", "Then we left."]


def test_decimals_do_not_split():
  assert split_sentences("Pi is 3.14 or so. The value 2.5 is 2. 7 is next.") == [
      "Pi is 3.14 or so.", "The value 2.5 is 2.", "7 is next."]


def test_quotes_and_brackets():
  assert split_sentences('He said "Stop." Then he ran. "Go!" she said. (It was late.) "Why?" Nobody knew.') == [
      'He said "Stop."', "Then he ran.", '"Go!" she said.', "(It was late.)", '"Why?"', "Nobody knew."]


def test_question_and_exclamation_marks():
  assert split_sentences("Really? Yes! Wow?! 42 is the answer.") == ["Really?", "Yes!", "Wow?!", "42 is the answer."]


def test_lowercase_continuation_does_not_split():
  assert split_sentences("Wait... what happened? Nothing... Then silence! and more.") == [
      "Wait... what happened?", "Nothing...", "Then silence! and more."]


def test_newlines_and_whitespace_inside_paragraph():
  assert split_sentences("  First line\nstill the first.\n\nSecond\t sentence here.  ") == [
      "First line still the first.", "Second sentence here."]


def test_no_terminator_keeps_the_text():
  assert split_sentences("a heading without a period") == ["a heading without a period"]


@pytest.mark.parametrize("paragraph", ["", "   ", "\n\n\t"])
def test_empty_input(paragraph):
  assert split_sentences(paragraph) == []


def test_paragraphs_to_sentences_treats_each_line_as_a_paragraph():
  lines = ["One. Two.", "", "Three is here. Four"]
  assert list(paragraphs_to_sentences(lines)) == ["One.", "Two.", "Three is here.", "Four"]
