"""WKLM's entity replacement (configs/wklm.py): the invariants of the host-side corruption (same type, never the
same string, never two adjacent mentions), mention labels and boundaries through rows and the on-device gather,
the head's boundary gather, MLM kept off mentions, and the config checks."""

import random

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bertjax.core.errors import UserError
from bertjax.data import instances, units
from bertjax.data.tokenizer import SpecialIds, WordPieceTokenizer
from bertjax.model.heads import WKLMHead
from bertjax.objectives import masking, wklm

from conftest import micro

NAMES = {"PER": ["Ann Lee", "Bo Chan", "ann lee", "Cy Dee"], "LOC": ["Oslo", "Lima", "New York"]}


def _docs(rng, n=200):
  """Documents of sentences that name 1-4 entities each, spans as units.corrupt takes them."""
  docs = []
  for _ in range(n):
    doc = []
    for _ in range(rng.randrange(1, 3)):
      text, spans = "", []
      for _ in range(rng.randrange(1, 5)):
        kind = rng.choice(sorted(NAMES))
        name = rng.choice(NAMES[kind])
        text += "we saw "
        spans.append((len(text), len(text) + len(name), kind, False))
        text += name + " "
      doc.append((text.strip(), tuple(spans)))
    docs.append(doc)
  return docs


def test_corruption_same_type_other_string_no_adjacent_pair():
  docs = _docs(random.Random(0))
  out, replaced = units.corrupt(docs, random.Random(1), 0.5)
  total = flags = 0
  for doc, new_doc in zip(docs, out):
    previous = False
    for (text, spans), (new_text, new_spans) in zip(doc, new_doc):
      assert len(spans) == len(new_spans)
      for (s, e, kind, _), (ns, ne, nkind, was_replaced) in zip(spans, new_spans):
        old, new = text[s:e], new_text[ns:ne]
        assert nkind == kind
        if was_replaced:
          assert new in NAMES[kind] and new.lower() != old.lower()  # same type, never the same string
          assert not previous  # never two adjacent mentions
        else:
          assert new == old
        previous = was_replaced
        total, flags = total + 1, flags + was_replaced
      # The text between mentions is untouched.
      assert new_text.replace(" ", "").count("wesaw") == len(spans)
  assert flags == replaced
  assert 0.25 < replaced / total < 0.5, replaced / total  # a coin per mention, none right after a replaced one


def _wordpiece(tmp_path):
  vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "we", "saw", "ann", "lee", "bo", "chan", "cy", "dee",
           "oslo", "lima", "new", "york"]
  (tmp_path / "vocab.txt").write_text("\n".join(vocab) + "\n")
  return WordPieceTokenizer(str(tmp_path / "vocab.txt"))


def test_labels_and_boundaries_from_rows_to_slots(tmp_path):
  tok = _wordpiece(tmp_path)
  docs, _ = units.corrupt(_docs(random.Random(2), 40), random.Random(3), 0.5)
  stats = {}
  encoded = [[units.encode(tok, s, stats) for s in doc] for doc in docs]
  arrays, _ = instances.make_instances(encoded, "full_sentences", 48, SpecialIds(0, 1, 2, 3, 4), units=True)
  mention = arrays["mention"]
  slots = wklm.mention_slots(jnp.asarray(mention, jnp.int32), 16)
  first, last, labels, weights = (np.asarray(slots[k]) for k in ("wklm_first", "wklm_last", "wklm_labels",
                                                                 "wklm_weights"))
  ids = arrays["input_ids"]
  checked = 0
  for r in range(len(ids)):
    inside = (mention[r] & units.MENTION_INSIDE) > 0
    n = int(weights[r].sum())
    assert n == min(16, int(((mention[r] & units.MENTION_FIRST) > 0).sum()))
    for k in range(n):
      a, b = first[r, k], last[r, k]
      assert a <= b and inside[a:b + 1].all()  # one mention: its first and last token, all inside
      assert (a == 0 or not inside[a - 1] or mention[r, a - 1] & units.MENTION_LAST)
      assert labels[r, k] == (0 if mention[r, a] & units.MENTION_REPLACED else 1)
      name = tok.decode(ids[r, a:b + 1])
      assert any(name == x.lower() for xs in NAMES.values() for x in xs)  # whole names, replaced or not
      checked += 1
  assert checked > 50 and 0 < labels[weights > 0].mean() < 1


def test_truncation_drops_a_cut_mention():
  m = np.array([0, 9, 8, 10, 0, 11, 9, 8], np.uint8)  # [first.. ..last] [first+last] [first .. (cut)]
  assert units.whole_mentions(m).tolist() == [0, 9, 8, 10, 0, 11, 0, 0]
  assert units.whole_mentions(m[2:]).tolist() == [0, 0, 0, 11, 0, 0]  # its first token cut off


def test_head_reads_the_first_and_last_token():
  from bertjax.model.config import encoder_config

  c = micro("configs/wklm.py:tiny")
  c.model.hidden_size = 4
  cfg = encoder_config(c.model)
  head = WKLMHead(cfg)
  hidden = jax.random.normal(jax.random.key(0), (2, 6, 4))
  first, last = jnp.array([[1, 3], [0, 2]]), jnp.array([[2, 3], [4, 5]])
  params = head.init(jax.random.key(1), hidden, first, last)
  logits = head.apply(params, hidden, first, last)
  w = params["params"]["logit"]["kernel"]
  w = getattr(w, "value", w)[:, 0]
  bias = params["params"]["logit"]["bias"]
  bias = getattr(bias, "value", bias)[0]
  for r in range(2):
    for k in range(2):
      x = jnp.concatenate([hidden[r, first[r, k]], hidden[r, last[r, k]]])
      np.testing.assert_allclose(logits[r, k], x @ w + bias, rtol=1e-5)


def test_mlm_never_masks_a_mention():
  rng = np.random.default_rng(0)
  ids = jnp.asarray(rng.integers(10, 50, (16, 40)), jnp.int32)
  mention = jnp.asarray(np.where(rng.random((16, 40)) < 0.5, units.MENTION_INSIDE, 0), jnp.int32)
  cfg = masking.MaskingConfig(special_ids=(0, 1, 2, 3, 4), mask_id=4, vocab_size=50, mask_prob=0.3,
                              max_predictions=12)
  out = jax.jit(lambda r: masking.mask_batch(r, ids, jnp.ones_like(ids, bool), cfg, protect=wklm.protected(mention)))(
      jax.random.key(0))
  at = np.take_along_axis(np.asarray(mention), np.asarray(out["mlm_positions"]), axis=1)
  assert (np.asarray(out["mlm_weights"]).sum(1) > 0).all() and not (at[np.asarray(out["mlm_weights"]) > 0]).any()


def test_config_checks():
  from bertjax.train import build

  c = micro("configs/wklm.py:tiny")
  with pytest.raises(UserError, match="the wklm objective scores the mentions of data.units"):
    build.validate(c)
  c.objectives.wklm = 0.0
  with pytest.raises(UserError, match="data.source=units trains on the text of a span source"):
    build.validate(c)
  c.data.units = "conll:/nonexistent/x"
  with pytest.raises(UserError, match="no files match '/nonexistent/x'"):
    build.validate(c)
