"""`python -m bertjax.finetune.predict` cuts its batches to length buckets (rows sorted by length) instead of
padding every batch to seq_len, with the outputs of full-width batches, in the input's row order."""

import re

import numpy as np
import pytest
import torch
import transformers
from pydoc_data.topics import topics

from bertjax.finetune import batches, predict, task_models, train
from bertjax.finetune.classification import data as task_data
from bertjax.finetune.tasks import TOKEN_FIELDS

SEQ_LEN = 64


@pytest.fixture(scope="module")
def run(tmp_path_factory):
  """(records, arrays, widths of the batches the predictor ran, task model) over 40 short sentences."""
  tmp = tmp_path_factory.mktemp("predict_layout")
  text = [" ".join(s.split()) for s in re.split(r"(?<=\.)\s+", topics["assert"] + topics["if"])]
  text = [s for s in text if 3 < len(s.split()) < 25][:5] * 8
  text = [f"{s} {' '.join(['word'] * (i % 7))}" for i, s in enumerate(text)]  # lengths vary row to row
  words = sorted({w for s in text for w in re.findall(r"\w+|[^\w\s]", s.lower())})
  torch.manual_seed(0)
  config = transformers.BertConfig(vocab_size=5 + len(words), hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                   intermediate_size=64, max_position_embeddings=SEQ_LEN, num_labels=3)
  model_dir = tmp / "model"
  transformers.BertForSequenceClassification(config).save_pretrained(model_dir)
  (model_dir / "vocab.txt").write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *words]) + "\n")
  (tmp / "lines.txt").write_text("\n".join(text) + "\n")
  widths, fn = [], train._predict_fn
  try:  # record the width of every batch the predictor runs
    train._predict_fn = lambda model: lambda v, b: widths.append(b["input_ids"].shape[-1]) or fn(model)(v, b)
    records = predict.run(predict.parse(["--model", str(model_dir), "--lines", str(tmp / "lines.txt"),
                                         "--seq_len", str(SEQ_LEN), "--batch_size", "8"]))
  finally:
    train._predict_fn = fn
  tm = task_models.load(str(model_dir))
  arrays = task_data.encode(task_data.Examples(text, None, np.zeros(len(text), np.int32)), tm.tokenizer, SEQ_LEN)
  return records, {k: arrays[k] for k in TOKEN_FIELDS}, widths, tm


def test_predictor_batches_are_cut_to_buckets_not_seq_len(run):
  records, arrays, widths, _ = run
  longest = batches.row_lengths(arrays).max()
  assert len(records) == 40 and len(widths) == 5
  assert max(widths) < SEQ_LEN and max(widths) >= longest  # the old predictor ran every batch at 64
  assert len(set(widths)) <= SEQ_LEN // batches.BUCKET_STEP  # few shapes: few compiles
  assert sum(widths) < 5 * longest  # the short sorted batches are cut shorter than the longest row


def test_predictor_outputs_are_those_of_full_width_batches(run):
  records, arrays, _, tm = run
  full = train.predict(tm.params, arrays, tm.model, 8)  # fixed layout: every batch at seq_len, in row order
  scores = np.asarray([r["scores"] for r in records])
  np.testing.assert_allclose(scores, full, atol=1e-5)
  assert [r["label"] for r in records] == [int(i) if not tm.info.get("labels") else tm.info["labels"][int(i)]
                                           for i in full.argmax(1)]
