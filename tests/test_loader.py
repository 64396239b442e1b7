"""The loader: batches are a pure function of (seed, step, process); eval covers everything once."""

import numpy as np

from bertjax.data import pipeline, shards


def _rows(tmp_path, n=100):
  """Memory-mapped rows whose input_ids are their own index (what training reads), in two shard files."""
  dtype = shards.row_dtype(shards.storage_types(["input_ids", "sentence_label"], 1000), 4)
  records = np.zeros(n, dtype)
  records["input_ids"] = np.arange(n)[:, None]
  writer = shards.ShardWriter(str(tmp_path), "train", dtype)
  writer.rows_per_shard = n // 2 + 1
  writer.write(records)
  return shards.Rows(str(tmp_path), writer.close(), dtype)


def test_batch_is_a_function_of_seed_and_step(tmp_path):
  a = _rows(tmp_path)
  np.testing.assert_array_equal(pipeline.batch_at(a, 7, 16, 0)["input_ids"], pipeline.batch_at(a, 7, 16, 0)["input_ids"])
  assert not np.array_equal(pipeline.batch_at(a, 7, 16, 0)["input_ids"], pipeline.batch_at(a, 7, 16, 1)["input_ids"])
  assert not np.array_equal(pipeline.batch_at(a, 7, 16, 0)["input_ids"], pipeline.batch_at(a, 8, 16, 0)["input_ids"])


def test_each_epoch_visits_every_example_once(tmp_path):
  a = _rows(tmp_path, 96)
  seen = np.concatenate([pipeline.batch_at(a, s, 16, 3)["input_ids"][:, 0] for s in range(6)])
  assert sorted(seen) == list(range(96))


def test_processes_read_disjoint_shares_of_the_global_batch(tmp_path):
  a = _rows(tmp_path)
  whole = pipeline.batch_at(a, 5, 32, 0)["input_ids"]
  parts = [pipeline.batch_at(a, 5, 32, 0, process_index=p, process_count=4)["input_ids"] for p in range(4)]
  assert all(len(p) == 8 for p in parts)
  np.testing.assert_array_equal(np.concatenate(parts), whole)


def test_eval_batches_pad_the_last_batch(tmp_path):
  a = _rows(tmp_path, 37)
  batches = list(pipeline.eval_batches(a, 16))
  assert len(batches) == 3 and all(len(b["input_ids"]) == 16 for b in batches)
  weights = np.concatenate([b["example_weight"] for b in batches])
  ids = np.concatenate([b["input_ids"][:, 0] for b in batches])
  assert weights.sum() == 37
  assert sorted(ids[weights > 0]) == list(range(37))


def test_in_memory_task_arrays_give_the_batches_their_rows_give(tmp_path):
  """Fine-tuning (bertjax.finetune) hands the loader its task arrays in memory, as pipeline.ArrayRows."""
  rows = _rows(tmp_path)
  arrays = pipeline.ArrayRows(rows.take(np.arange(len(rows))))
  for step in (0, 9):
    mapped, held = pipeline.batch_at(rows, step, 16, 2), pipeline.batch_at(arrays, step, 16, 2)
    assert mapped.keys() == held.keys() and all(np.array_equal(mapped[k], held[k]) for k in mapped)
  last = [list(pipeline.eval_batches(r, 16))[-1] for r in (rows, arrays)]
  np.testing.assert_array_equal(last[0]["input_ids"], last[1]["input_ids"])
