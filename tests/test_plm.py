"""XLNet's permutation-LM data and objective: span sampling and permutation masks against transcriptions of the
reference (zihangdai/xlnet data_utils.py @bbaa3a6) with injected randomness, hand-computed cases, stream-ordered
windows, and preparation of real text into the stream format."""

import os

import numpy as np
import pytest

from bertjax.core.errors import UserError
from bertjax.data import pipeline, plm
from bertjax.data.tokenizer import SpecialIds

SPECIAL = SpecialIds(pad=0, unk=1, cls=2, sep=3, mask=4)


# ------------------------------------------------------------------ the reference, transcribed
class _NpRandom:
  """The reference's np.random calls on an injected Generator, in the order plm.sample_mask draws."""

  def __init__(self, g):
    self.g = g

  def choice(self, a, p=None):
    return self.g.choice(a, p=p) if p is not None else self.g.integers(a)

  def randint(self, n):
    return self.g.integers(n)


def _reference_sample_mask(random, is_start, seg_len, mask_alpha, mask_beta, max_gram=5, goal_num_predict=None):
  """data_utils.py:331-392 as written (sp.IdToPiece -> is_start, np.random -> `random`, reverse=False)."""
  mask = np.array([False] * seg_len, dtype=bool)
  num_predict = 0
  ngrams = np.arange(1, max_gram + 1, dtype=np.int64)
  pvals = 1. / np.arange(1, max_gram + 1)
  pvals /= pvals.sum(keepdims=True)
  cur_len = 0
  while cur_len < seg_len:
    if goal_num_predict is not None and num_predict >= goal_num_predict: break
    n = random.choice(ngrams, p=pvals)
    if goal_num_predict is not None:
      n = min(n, goal_num_predict - num_predict)
    ctx_size = (n * mask_alpha) // mask_beta
    l_ctx = random.choice(ctx_size)
    r_ctx = ctx_size - l_ctx
    beg = cur_len + l_ctx
    while beg < seg_len and not is_start[beg]:
      beg += 1
    if beg >= seg_len:
      break
    end = beg + 1
    cnt_ngram = 1
    while end < seg_len:
      if is_start[beg]:  # the reference tests seg[beg], never seg[end]
        cnt_ngram += 1
        if cnt_ngram > n:
          break
      end += 1
    if end >= seg_len:
      break
    mask[beg:end] = True
    num_predict += end - beg
    cur_len = end + r_ctx
  while goal_num_predict is not None and num_predict < goal_num_predict:
    i = random.randint(seg_len)
    if not mask[i]:
      mask[i] = True
      num_predict += 1
  return mask


def _reference_local_perm(index, inputs, is_masked):
  """data_utils.py:579-643 in NumPy, given the shuffled `index` (what tf.random_shuffle made)."""
  non_func = ~((inputs == SPECIAL.sep) | (inputs == SPECIAL.cls))
  non_mask = ~is_masked & non_func
  masked_or_func = ~non_mask
  rev_index = np.where(non_mask, -1, index)
  target = masked_or_func & non_func
  self_rev = np.where(target, rev_index, rev_index + 1)
  return ((self_rev[:, None] <= rev_index[None, :]) & masked_or_func).astype(np.float32)


def _reference_perm_mask(inputs, is_masked, rank, reuse_len):
  """The parser's two halves and their cross blocks (data_utils.py:679-695)."""
  s = len(inputs)
  p0 = _reference_local_perm(rank[:reuse_len], inputs[:reuse_len], is_masked[:reuse_len])
  p1 = _reference_local_perm(rank[reuse_len:], inputs[reuse_len:], is_masked[reuse_len:])
  return np.concatenate([np.concatenate([p0, np.ones((reuse_len, s - reuse_len))], 1),
                         np.concatenate([np.zeros((s - reuse_len, reuse_len)), p1], 1)], 0)


# ------------------------------------------------------------------ span sampling
class _Scripted:
  """Draws given in advance: n-gram lengths, then context offsets, then single tokens."""

  def __init__(self, ngrams, offsets, singles=()):
    self.ngrams, self.offsets, self.singles = list(ngrams), list(offsets), list(singles)

  def choice(self, a, p=None):
    return self.ngrams.pop(0)

  def integers(self, n):
    return (self.offsets or self.singles).pop(0)


def test_sample_mask_by_hand():
  # 20 pieces, alpha 6, beta 1, goal 4. Draw n=2, l_ctx=3: the span starts at the word start at or after 3 (3 is
  # a continuation piece, so 4) and takes 2 pieces: 4, 5; the next search starts at 6 + (12 - 3) = 15. Draw n=2,
  # l_ctx=0: 15, 16. Goal met.
  starts = np.ones(20, bool)
  starts[3] = False
  mask = plm.sample_mask(_Scripted([2, 2], [3, 0]), starts, 4, 6, 1)
  assert np.flatnonzero(mask).tolist() == [4, 5, 15, 16]
  # A span that would reach the end stops the spans (n=3 from 8 in 10 pieces); single tokens fill the goal, a drawn
  # duplicate skipped.
  mask = plm.sample_mask(_Scripted([3], [8], [7, 7, 2, 5]), np.ones(10, bool), 3, 6, 1)
  assert np.flatnonzero(mask).tolist() == [2, 5, 7]


@pytest.mark.parametrize("alpha,beta,goal", [(6, 1, 43), (6, 1, 42), (4, 2, 20)])
def test_sample_mask_is_the_reference_s(alpha, beta, goal):
  rng = np.random.default_rng(0)
  for trial in range(30):
    n = int(rng.integers(goal + 5, 256))
    starts = rng.random(n) < 0.7
    ours = plm.sample_mask(np.random.default_rng([1, trial]), starts, goal, alpha, beta)
    theirs = _reference_sample_mask(_NpRandom(np.random.default_rng([1, trial])), starts, n, alpha, beta,
                                    goal_num_predict=goal)
    np.testing.assert_array_equal(ours, theirs)
    assert ours.sum() == goal


# ------------------------------------------------------------------ permutation masks and targets, on device
def _row(rng, s=16, reuse=8, perm_size=4, n_masked=5):
  ids = rng.integers(10, 50, s).astype(np.int32)
  ids[-3], ids[-2], ids[-1] = SPECIAL.sep, SPECIAL.sep, SPECIAL.cls  # ... A <sep> B <sep> <cls>
  ids[reuse + 3] = SPECIAL.sep
  masked = np.zeros(s, bool)
  masked[rng.choice(s, n_masked, replace=False)] = True
  masked[-1] = True  # a sampled <cls> is no target
  rank = np.concatenate([plm.local_perm(rng, reuse, perm_size), plm.local_perm(rng, s - reuse, perm_size)])
  return ids, masked, rank


@pytest.fixture(scope="module")
def on_device():
  import jax

  from bertjax.objectives import plm as objective

  cfg = objective.PLMConfig(reuse_len=8, num_predict=7, sep=SPECIAL.sep, cls=SPECIAL.cls)
  rng = np.random.default_rng(0)
  rows = [_row(rng) for _ in range(6)]
  batch = dict(input_ids=np.stack([r[0] for r in rows]), plm_masked=np.stack([r[1] for r in rows]),
               perm_rank=np.stack([r[2] for r in rows]), example_weight=np.array([1, 1, 1, 1, 1, 0], np.float32))
  out = jax.jit(lambda b: objective.inputs(b, cfg))(batch)
  return batch, jax.device_get(out)


def test_perm_mask_is_the_reference_s(on_device):
  batch, out = on_device
  for b in range(len(batch["input_ids"])):
    theirs = _reference_perm_mask(batch["input_ids"][b], batch["plm_masked"][b], batch["perm_rank"][b], 8)
    np.testing.assert_array_equal(out["perm_mask"][b], theirs)


def test_perm_mask_by_hand():
  from bertjax.objectives import plm as objective

  # One half of 4 (reuse_len 4, so the other half only sees it): tokens x0 x1 x2 <sep>, x1 and x2 targets, ranks
  # 2 0 3 1. x0 (rank -1) sees x0; x1 (rank 0) sees x0; x2 (rank 3) sees x0, x1 and <sep> (rank 1); <sep> sees x0
  # and x1 (ranked before it) and itself.
  ids = np.array([[20, 21, 22, SPECIAL.sep, 30, 31, 32, SPECIAL.cls]])
  masked = np.array([[0, 1, 1, 0, 0, 0, 0, 0]], bool)
  rank = np.array([[2, 0, 3, 1, 0, 1, 2, 3]])
  cfg = objective.PLMConfig(reuse_len=4, num_predict=3, sep=SPECIAL.sep, cls=SPECIAL.cls)
  sees = 1 - np.asarray(objective.perm_mask(ids, masked, rank, cfg))[0]
  np.testing.assert_array_equal(sees[:4, :4], [[1, 0, 0, 0], [1, 0, 0, 0], [1, 1, 0, 1], [1, 1, 0, 1]])
  assert not sees[:4, 4:].any() and sees[4:, :4].all()  # the reuse half never sees the rest, which sees it all


def test_targets_are_the_masked_tokens_in_order_padded(on_device):
  batch, out = on_device
  for b in range(len(batch["input_ids"])):
    ids, masked = batch["input_ids"][b], batch["plm_masked"][b]
    want = np.flatnonzero(masked & ~np.isin(ids, [SPECIAL.sep, SPECIAL.cls]))[:7]
    n = len(want)
    assert out["plm_weights"][b].sum() == (n if batch["example_weight"][b] else 0)
    np.testing.assert_array_equal(out["plm_positions"][b, :n], want)
    np.testing.assert_array_equal(out["plm_labels"][b, :n], ids[want])
    np.testing.assert_array_equal(out["target_mapping"][b, :n], np.eye(16)[want])
    assert not out["target_mapping"][b, n:].any()
    # a target never sees itself; every position sees the non-targets of its half
    assert all(out["perm_mask"][b, i, i] == 1 for i in want)


# ------------------------------------------------------------------ stream-ordered windows
LAYOUT = plm.Layout(seq_len=32, reuse_len=16, perm_size=8, num_predict=6, mask_alpha=6, mask_beta=1, sep=SPECIAL.sep,
                    cls=SPECIAL.cls)
TOKENS = 4 * 200 + 3  # four streams of 200 (the rest is cut, as batchify cuts it)


@pytest.fixture(scope="module")
def stream():
  pos = np.arange(26 * 32)  # the last row's padding lies past TOKENS
  arrays = dict(input_ids=(pos + 100).astype(np.int32), word_start=pos % 3 != 1, sentence_parity=(pos // 7) % 2 == 1)
  rows = pipeline.ArrayRows({k: v.reshape(-1, 32) for k, v in arrays.items()})
  return plm.Stream(rows, TOKENS, 32)


def test_rows_continue_their_stream_from_step_to_step(stream):
  per_stream, windows = plm.geometry(TOKENS, 4, LAYOUT, "train")
  assert (per_stream, windows) == (200, (200 - 32) // 16)
  batches = [plm.batch_at(stream, t, 4, 0, LAYOUT) for t in range(windows + 1)]
  for t, batch in enumerate(batches[:windows]):
    for b in range(4):
      origin = batch["input_ids"][b] - 100 - b * per_stream  # stream position of each (non-special) token
      np.testing.assert_array_equal(origin[:16], np.arange(t * 16, t * 16 + 16))  # reuse: window t of stream b
      ids, types = batch["input_ids"][b], batch["type_ids"][b]
      assert ids[-1] == SPECIAL.cls and types[-1] == 2 and ids[-2] == SPECIAL.sep and types[-2] == 1
      a_sep = np.flatnonzero(ids == SPECIAL.sep)[0]
      assert (types[:a_sep + 1] == 0).all() and (types[a_sep + 1:-1] == 1).all()
      assert origin[16] == t * 16 + 16 and (np.diff(origin[16:a_sep]) == 1).all()  # A follows the reuse part
      b_part = origin[a_sep + 1:-2]
      assert (np.diff(b_part) == 1).all() and (b_part >= 0).all() and (b_part < per_stream).all()
      assert batch["plm_masked"][b, :16].sum() == 3 and batch["plm_masked"][b, 16:].sum() == 3
      for half in (batch["perm_rank"][b, :16], batch["perm_rank"][b, 16:]):
        blocks = half.reshape(-1, 8)
        assert (blocks - blocks[0] == np.arange(len(blocks))[:, None] * 8).all()  # one order, every block
        assert sorted(blocks[0]) == list(range(8))
  # the next pass starts the streams again with new draws
  np.testing.assert_array_equal(batches[windows]["input_ids"][:, :16], batches[0]["input_ids"][:, :16])
  assert (batches[windows]["plm_masked"] != batches[0]["plm_masked"]).any()


def test_batches_are_a_function_of_the_step_and_split_over_processes(stream):
  whole = plm.batch_at(stream, 3, 4, 7, LAYOUT)
  again = plm.batch_at(stream, 3, 4, 7, LAYOUT)
  halves = [plm.batch_at(stream, 3, 4, 7, LAYOUT, p, 2) for p in range(2)]
  for k in whole:
    np.testing.assert_array_equal(whole[k], again[k])
    np.testing.assert_array_equal(whole[k], np.concatenate([h[k] for h in halves]))
  other_seed = plm.batch_at(stream, 3, 4, 8, LAYOUT)
  assert (other_seed["plm_masked"] != whole["plm_masked"]).any()
  evals = list(plm.eval_batches(stream, 4, LAYOUT))
  assert len(evals) == plm.geometry(TOKENS, 4, LAYOUT, "eval")[1]
  np.testing.assert_array_equal(evals[2]["input_ids"][:, :16] - 100, (np.arange(4) * 200)[:, None] + np.arange(32, 48))
  with pytest.raises(UserError, match="too short for 32 streams"):
    plm.batch_at(stream, 0, 32, 0, LAYOUT)


def test_bi_data_reads_each_stream_forward_and_reversed(stream):
  import dataclasses

  batch = plm.batch_at(stream, 1, 8, 0, dataclasses.replace(LAYOUT, bi_data=True))  # 4 streams, both ways
  for b in range(4):
    forward, backward = (batch["input_ids"][r, :16] - 100 - b * 200 for r in (b, 4 + b))
    np.testing.assert_array_equal(forward, np.arange(16, 32))
    np.testing.assert_array_equal(backward, 199 - np.arange(16, 32))  # window 1 of the stream read from its end


def test_split_a_and_b_cuts_at_sentences():
  sent = (np.arange(400) // 10) % 2 == 1  # a sentence every 10 tokens
  for trial in range(40):
    rng = np.random.default_rng(trial)
    a0, a1, b0, b1, label = plm.split_a_and_b(rng, lambda i, j: sent[i:j], 100, 45, 400, 32)
    assert a0 == 100 and a1 - a0 + b1 - b0 <= 45 and a1 > a0 and b1 > b0
    if label == 1:
      assert b0 % 10 == 0 and a1 <= b0  # B starts at A's cut (A may have lost its end to the budget)
    else:
      assert b0 % 10 == 0  # a random B starts at a sentence


def test_stream_writer_cuts_rows_and_keeps_parities_flipping(tmp_path):
  from bertjax.data import shards

  dtype = shards.row_dtype(shards.storage_types(list(plm.FIELDS), 1000), 8)
  writer = plm.StreamWriter(shards.ShardWriter(str(tmp_path), "train", dtype), 8, SPECIAL.sep)
  docs = [[(np.arange(5) + 10, np.ones(5, bool)), (np.arange(3) + 20, np.ones(3, bool))]]
  for chunk in (docs, docs + docs):
    writer.write(plm.token_stream(chunk, SPECIAL.sep)[0])
  files = writer.close()
  rows = shards.Rows(str(tmp_path), files, dtype).take(np.arange(writer.rows))
  ids = rows["input_ids"].reshape(-1)[:writer.tokens]
  assert writer.tokens == 8 + 1 + 17 and writer.rows == 4
  assert ids.tolist() == [10, 11, 12, 13, 14, 20, 21, 22, 3] + [10, 11, 12, 13, 14, 20, 21, 22, 3] * 1 + \
      [10, 11, 12, 13, 14, 20, 21, 22]
  parity = rows["sentence_parity"].reshape(-1)[:writer.tokens]
  assert (np.flatnonzero(np.diff(parity.astype(int))) + 1).tolist() == [5, 8, 9, 14, 17, 18, 23]


def test_bad_plm_keys_name_the_key():
  from bertjax.core.config import defaults

  c = defaults()
  c.seq_len, c.objectives.plm = 64, 1.0
  plm.validate(c)
  c.data.perm_size = 48
  with pytest.raises(UserError, match=r"^data\.perm_size=48 .*at most the smaller"):
    plm.validate(c)
  c.data.perm_size = 0
  c.model.xlnet = dict(mem_len=48, reuse_len=62)
  with pytest.raises(UserError, match=r"^model\.xlnet\.reuse_len=62 leaves no room"):
    plm.validate(c)
  c.model.xlnet = dict(mem_len=48, reuse_len=0)
  with pytest.raises(UserError, match=r"^model\.xlnet\.reuse_len=0 pushes whole rows"):
    plm.validate(c)
  c.model.xlnet = dict(mem_len=48, reuse_len=32, bi_data=True)
  c.batch_size = 7
  with pytest.raises(UserError, match=r"^batch_size=7: model\.xlnet\.bi_data"):
    plm.validate(c)


# ------------------------------------------------------------------ preparation of real text into the stream format
@pytest.fixture(scope="module")
def prepared_stream(tmp_path_factory):
  import pydoc_data.topics

  from bertjax.data import prepare_lib
  from conftest import micro

  root = tmp_path_factory.mktemp("plm")
  text = root / "text.txt"
  topics = sorted(pydoc_data.topics.topics.items())[:40]
  text.write_text("\n\n".join("\n".join(line for line in body.splitlines() if line.strip()) for _, body in topics))
  config = micro(**{"data.source": f"text:{text}", "objectives.plm": 1.0, "objectives.mlm": 0.0, "objectives.nsp": 0.0,
                    "model.vocab_size": 400, "data.tokenizer_sentences": 2000, "data.eval_fraction": 0.2})
  meta = prepare_lib.prepare(config, str(root / "shards"), workers=0, progress=None)
  return config, str(root / "shards"), meta


def test_preparation_writes_the_split_s_text_as_one_stream(prepared_stream):
  from bertjax.data import shards
  from bertjax.data.tokenizer_spec import load_tokenizer

  config, directory, meta = prepared_stream
  assert meta["format"] == "stream" and [f for f, _ in meta["fields"]] == list(plm.FIELDS)
  tok = load_tokenizer("spm:" + os.path.join(directory, "tokenizer.model"))
  for split in ("train", "eval"):
    tokens = meta["counts"][split]["tokens"]
    rows = shards.open_split(directory, meta, split)
    assert len(rows) == -(-tokens // 64) == meta["counts"][split]["instances"]
    ids = rows.take(np.arange(len(rows)))["input_ids"].reshape(-1)
    assert (ids[tokens:] == 0).all() and (ids[:tokens] != tok.special.cls).all()
    documents = meta["splits"][split]["documents"]
    assert (ids[:tokens] == tok.special.sep).sum() == documents - 1  # [SEP] between documents, never after one
  data = pipeline.build(dict_to_config(config, directory))
  assert data.windows == plm.layout(config, tok.special)
  batch = data.train_batch(5, 16, 0)
  assert batch["input_ids"].shape == (16, 64) and (batch["input_ids"][:, -1] == tok.special.cls).all()
  assert batch["plm_masked"].sum(1).tolist() == [plm.num_predict(config)] * 16
  first = next(iter(data.eval_batches(16)))
  assert first["perm_rank"].shape == (16, 64)


def dict_to_config(config, directory):
  c = config.copy_and_resolve_references()
  c.data.source = f"shards:{directory}"
  return c
