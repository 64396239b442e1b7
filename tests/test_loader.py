"""The loader: batches are a pure function of (seed, step, process); eval covers everything once."""

import numpy as np

from bertjax.data import pipeline


def _arrays(n=100):
  return {"input_ids": np.arange(n, dtype=np.int32)[:, None].repeat(4, 1)}


def test_batch_is_a_function_of_seed_and_step():
  a = _arrays()
  np.testing.assert_array_equal(pipeline.batch_at(a, 7, 16, 0)["input_ids"], pipeline.batch_at(a, 7, 16, 0)["input_ids"])
  assert not np.array_equal(pipeline.batch_at(a, 7, 16, 0)["input_ids"], pipeline.batch_at(a, 7, 16, 1)["input_ids"])
  assert not np.array_equal(pipeline.batch_at(a, 7, 16, 0)["input_ids"], pipeline.batch_at(a, 8, 16, 0)["input_ids"])


def test_each_epoch_visits_every_example_once():
  a = _arrays(96)
  seen = np.concatenate([pipeline.batch_at(a, s, 16, 3)["input_ids"][:, 0] for s in range(6)])
  assert sorted(seen) == list(range(96))


def test_processes_read_disjoint_shares_of_the_global_batch():
  a = _arrays()
  whole = pipeline.batch_at(a, 5, 32, 0)["input_ids"]
  parts = [pipeline.batch_at(a, 5, 32, 0, process_index=p, process_count=4)["input_ids"] for p in range(4)]
  assert all(len(p) == 8 for p in parts)
  np.testing.assert_array_equal(np.concatenate(parts), whole)


def test_eval_batches_pad_the_last_batch():
  a = _arrays(37)
  batches = list(pipeline.eval_batches(a, 16))
  assert len(batches) == 3 and all(len(b["input_ids"]) == 16 for b in batches)
  weights = np.concatenate([b["example_weight"] for b in batches])
  ids = np.concatenate([b["input_ids"][:, 0] for b in batches])
  assert weights.sum() == 37
  assert sorted(ids[weights > 0]) == list(range(37))
