"""SQuAD interop: transformers' *ForQuestionAnswering checkpoints imported into bertjax's SpanQA and bertjax
QA models exported back, start/end logits equal within 1e-4 on tiny random models made here."""

import os

os.environ["HF_HUB_OFFLINE"] = "1"  # nothing here may download
os.environ["TRANSFORMERS_OFFLINE"] = "1"

import numpy as np
import pytest

from bertjax.finetune.squad import hf as qa_io

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

SMALL = dict(vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=37,
             max_position_embeddings=64, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
FAMILIES = {
    "bert": ("BertConfig", "BertForQuestionAnswering", {}),
    "roberta": ("RobertaConfig", "RobertaForQuestionAnswering", dict(pad_token_id=1, type_vocab_size=1,
                                                                      max_position_embeddings=66)),
    "albert": ("AlbertConfig", "AlbertForQuestionAnswering", dict(embedding_size=16, num_hidden_groups=1)),
    "electra": ("ElectraConfig", "ElectraForQuestionAnswering", dict(embedding_size=16)),
}


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_qa_checkpoints_import_and_export_with_equal_logits(family, tmp_path):
  conf_cls, model_cls, extra = FAMILIES[family]
  torch.manual_seed(0)
  theirs = getattr(transformers, model_cls)(getattr(transformers, conf_cls)(**{**SMALL, **extra})).eval()
  with torch.no_grad():  # a random head with a visible bias, so a transposed or dropped tensor shows
    theirs.qa_outputs.bias.normal_()
  src = str(tmp_path / "theirs")
  theirs.save_pretrained(src)
  rng = np.random.default_rng(0)
  ids = rng.integers(5, 99, (2, 20))  # no padding id: RoBERTa numbers positions around it
  types = np.zeros_like(ids) if family == "roberta" else (np.arange(20) >= 8).astype(np.int64)[None].repeat(2, 0)
  mask = np.ones_like(ids)
  mask[1, 15:] = 0  # padding at the end of the second row
  with torch.no_grad():
    ref = theirs(torch.tensor(ids), attention_mask=torch.tensor(mask), token_type_ids=torch.tensor(types))
  ref = np.stack([ref.start_logits.numpy(), ref.end_logits.numpy()], -1)

  tm = qa_io.read_hf(src)
  run_config, model, params = tm.config, tm.model, tm.params
  ours = np.asarray(model.apply({"params": params}, ids, types, mask))
  assert ours.shape == ref.shape == (2, 20, 2)
  real = mask.astype(bool)  # padding positions' logits mean nothing (and ALBERT's differ there)
  assert np.abs(ours - ref)[real].max() < 1e-4, family

  out = qa_io.write_hf(tm, str(tmp_path / "ours"))
  back = transformers.AutoModelForQuestionAnswering.from_pretrained(out).eval()
  assert type(back).__name__ == model_cls
  with torch.no_grad():
    again = back(torch.tensor(ids), attention_mask=torch.tensor(mask), token_type_ids=torch.tensor(types))
  again = np.stack([again.start_logits.numpy(), again.end_logits.numpy()], -1)
  assert np.abs(again - ref)[real].max() < 1e-4, family
