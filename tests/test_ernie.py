"""ERNIE 1.0's unit masking (masking.scheme=ernie, bertjax.objectives.ernie) and the span sources that give the
units (bertjax.data.units): the spec sheet's two worked examples of ERNIE's mask() with injected draws, the
budget cut, whole units on random rows, CoNLL/JSONL parsing, unit_start on tokens, and bad input."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bertjax.core.errors import UserError
from bertjax.data import instances, units
from bertjax.data.tokenizer import SpecialIds, WordPieceTokenizer
from bertjax.objectives import ernie, masking

PAD, CLS, SEP, MASK = 0, 1, 2, 3
A, B, C, D = 10, 11, 12, 13
CFG = masking.MaskingConfig(special_ids=(PAD, 4, CLS, SEP, MASK), mask_id=MASK, vocab_size=50, scheme="ernie",
                            mask_prob=0.15, max_predictions=6)
# [CLS] a b c d [SEP] with ERNIE's seg labels [-1, 0, 1, 0, 1, -1]: units [a b] and [c d].
IDS = jnp.array([[CLS, A, B, C, D, SEP]])
STARTS = jnp.array([[True, True, False, True, False, True]])
CANDIDATES = ~jnp.isin(IDS, jnp.array(CFG.special_ids))


def _mask(p, budget=CFG.max_predictions):
  """ERNIE's mask() on the example row with draws p, every random replacement id 7 (as the spec sheet)."""
  selected, u, masked, cut = ernie.select(jnp.array([p]), CANDIDATES, STARTS, budget, CFG.mask_prob)
  out = masking.corrupt_and_gather(IDS, selected, u, jnp.full_like(IDS, 7), CANDIDATES, CFG)
  n = int(out["mlm_weights"].sum())
  return (out["input_ids"][0].tolist(), out["mlm_labels"][0, :n].tolist(), out["mlm_positions"][0, :n].tolist(),
          float(masked[0]), float(cut[0]))


def test_worked_example_one_selects_the_first_unit():
  # Spec sheet §9(f), computed by the transcribed mask(): ids [1, MASK, 7, 12, 13, 2], labels [a, b] at [1, 2].
  ids, labels, positions, masked, cut = _mask([0.5, 0.10, 0.15, 0.90, 0.05, 0.5])
  assert ids == [CLS, MASK, 7, C, D, SEP]
  assert labels == [A, B] and positions == [1, 2]
  assert (masked, cut) == (1.0, 0.0)


def test_worked_example_two_predicts_a_kept_token():
  # p = [., .02, .15, .12, .05, .] -> ids [1, 7, 7, MASK, 13, 2], labels [a, b, c, d]: d kept but predicted.
  ids, labels, positions, masked, cut = _mask([0.5, 0.02, 0.15, 0.12, 0.05, 0.5])
  assert ids == [CLS, 7, 7, MASK, D, SEP]
  assert labels == [A, B, C, D] and positions == [1, 2, 3, 4]
  assert (masked, cut) == (2.0, 0.0)


def test_budget_keeps_units_in_draw_order_and_counts_the_cut():
  # Both units selected, three slots: the unit of the smaller draw (c d: .01) is kept whole, a b (.12) is cut.
  ids, labels, positions, masked, cut = _mask([0.5, 0.12, 0.15, 0.01, 0.05, 0.5], budget=3)
  assert positions == [3, 4] and labels == [C, D] and ids[1:3] == [A, B]
  assert (masked, cut) == (1.0, 1.0)


def test_mask_batch_ernie_masks_whole_units_at_the_rate():
  rng = np.random.default_rng(0)
  b, s = 64, 48
  ids = rng.integers(10, 50, (b, s)).astype(np.int32)
  ids[:, 0], ids[:, -1] = CLS, SEP
  starts = rng.random((b, s)) < 0.4
  protect = jnp.asarray(rng.random((b, s)) < 0.1)
  cfg = masking.MaskingConfig(**{**CFG.__dict__, "max_predictions": 30})
  out = jax.jit(lambda r: masking.mask_batch(r, jnp.asarray(ids), jnp.asarray(starts), cfg, protect=protect))(
      jax.random.key(1))
  selected = np.zeros((b, s), bool)
  np.put_along_axis(selected, np.asarray(out["mlm_positions"]), np.asarray(out["mlm_weights"]) > 0, axis=1)
  cand = ~np.isin(ids, CFG.special_ids) & ~np.asarray(protect)
  assert not (selected & ~cand).any()  # never a special or protected token
  first = np.asarray(ernie.unit_starts(jnp.asarray(cand), jnp.asarray(starts)))
  unit = np.where(cand, np.cumsum(first, 1), -1)
  for r in range(b):  # every token of a selected unit is selected
    for k in np.unique(unit[r][selected[r]]):
      assert selected[r][unit[r] == k].all()
  share = (selected & first).sum() / first.sum()
  assert 0.11 < share < 0.19, share  # ERNIE's 15% of the units (none cut at this budget)
  assert float(out["units_cut"].sum()) == 0 and float(out["units_masked"].sum()) == (selected & first).sum()


def test_conll_spans_prefix_iob1_and_documents(tmp_path):
  path = tmp_path / "a.conll"
  path.write_text("-DOCSTART- O\n\nen:New\tB-LOC\nen:York\tI-LOC\nen:is\tO\nen:big\tO\n\n"
                  "en:Ann\tI-PER\nen:Lee\tI-PER\nen:met\tO\nen:IBM\tB-ORG\n \t\n-DOCSTART- O\n\nen:Oslo\tB-LOC\n")
  docs = list(units.documents(f"conll:{tmp_path}"))
  assert len(docs) == 2 and len(docs[0]) == 2
  (text, spans), (text2, spans2) = docs[0]
  assert text == "New York is big" and [text[s:e] for s, e, *_ in spans] == ["New York"]
  assert [(text2[s:e], t) for s, e, t, _ in spans2] == [("Ann Lee", "PER"), ("IBM", "ORG")]  # I- opens a span
  assert docs[1] == [("Oslo", ((0, 4, "LOC", False),))]


def test_jsonl_spans_move_into_their_sentence(tmp_path):
  path = tmp_path / "d.jsonl"
  text = "Alan Turing was born in London. He worked at  Bletchley Park."
  path.write_text(json.dumps({"text": text, "spans": [[0, 11, "PER"], [24, 30, "LOC"], [46, 60, "LOC"]]}) + "\n")
  stats = {}
  (doc,) = list(units.documents(f"jsonl:{path}", stats))
  assert [s for s, _ in doc] == ["Alan Turing was born in London.", "He worked at Bletchley Park."]
  got = [(s[a:b], t) for s, spans in doc for a, b, t, _ in spans]
  assert got == [("Alan Turing", "PER"), ("London", "LOC"), ("Bletchley Park", "LOC")]
  assert stats["dropped"] == 0


@pytest.mark.parametrize("content, expected", [
    ("New B-LOC\nYork\n", "a.conll:2: line 'York' has one column"),
    ("New X-LOC\n", "a.conll:1: tag 'X-LOC'"),
])
def test_bad_conll_names_file_and_line(tmp_path, content, expected):
  (tmp_path / "a.conll").write_text(content)
  with pytest.raises(UserError, match=expected.replace("(", r"\(")):
    list(units.documents(f"conll:{tmp_path / 'a.conll'}"))


@pytest.mark.parametrize("line, expected", [
    ('{"text": "abc", "spans": [[1, 9, "X"]]}', r"d.jsonl:2: span \[1, 9\) is outside the text of 3 characters"),
    ('{"text": "abc", spans}', "d.jsonl:2: not JSON"),
])
def test_bad_jsonl_names_file_and_line(tmp_path, line, expected):
  (tmp_path / "d.jsonl").write_text('{"text": "ok"}\n' + line + "\n")
  with pytest.raises(UserError, match=expected):
    list(units.documents(f"jsonl:{tmp_path / 'd.jsonl'}"))
  with pytest.raises(UserError, match="data.units='csv:x'; use conll:PATH or jsonl:PATH"):
    units.parse_spec("csv:x")


def _wordpiece(tmp_path):
  vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "new", "york", "is", "big", "##gest", "the", "city", "."]
  (tmp_path / "vocab.txt").write_text("\n".join(vocab) + "\n")
  return WordPieceTokenizer(str(tmp_path / "vocab.txt"))


def test_unit_start_covers_a_span_and_starts_after_it(tmp_path):
  tok = _wordpiece(tmp_path)
  stats = {}
  sentence = ("the new york city is biggest .", ((4, 17, "LOC", False),))
  ids, word_start, unit_start, mention = units.encode(tok, sentence, stats)
  assert [tok.id_to_token(i) for i in ids] == ["the", "new", "york", "city", "is", "big", "##gest", "."]
  assert word_start.tolist() == [1, 1, 1, 1, 1, 1, 0, 1]
  assert unit_start.tolist() == [1, 1, 0, 0, 1, 1, 0, 1]  # "new york city" is one unit
  assert (mention > 0).tolist() == [0, 1, 1, 1, 0, 0, 0, 0] and stats["spans"] == 1
  # Rows carry unit_start beside word_start; [CLS] and [SEP] are units of their own.
  arrays, _ = instances.make_instances([[(ids, word_start, unit_start, mention)]] * 2, "full_sentences", 16,
                                       SpecialIds(0, 1, 2, 3, 4), units=True)
  assert arrays["unit_start"][0, :10].tolist() == [1, 1, 1, 0, 0, 1, 1, 0, 1, 1]


def test_gazetteer_marks_the_longest_mention_strings(tmp_path):
  (tmp_path / "g.conll").write_text("New B-LOC\nYork I-LOC\nCity I-LOC\n\nYork B-LOC\n\nthe B-ORG\n\nIBM B-ORG\n")
  g = units.Gazetteer(f"conll:{tmp_path / 'g.conll'}")
  text, spans = g.mark("The IBM office in New York City, not York.")
  assert [(text[s:e], t) for s, e, t, _ in spans] == [("IBM", "ORG"), ("New York City", "LOC"), ("York", "LOC")]
