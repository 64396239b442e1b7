"""Multiple choice: SWAG CSV and JSONL readers (with their one-line errors) and pair features."""

import json

import numpy as np
import pytest

from bertjax.core.errors import UserError
from bertjax.finetune.multiple_choice import data as mc_data, task as mc

SWAG_HEADER = ",video-id,fold-ind,startphrase,sent1,sent2,gold-source,ending0,ending1,ending2,ending3,label\n"


def test_swag_csv_pairs_sent1_with_sent2_and_each_ending(tmp_path):
  (tmp_path / "train.csv").write_text(SWAG_HEADER + '0,v,1,"A man sits. He","A man sits.",He,gold,'
                                      'eats.,"runs, fast.",sleeps.,sings.,1\n')
  ex = mc_data.read_swag(str(tmp_path / "train.csv"))
  assert ex.contexts == ["A man sits."] and ex.labels.tolist() == [1]
  assert ex.choices == [["He eats.", "He runs, fast.", "He sleeps.", "He sings."]]
  (tmp_path / "test.csv").write_text(SWAG_HEADER.replace(",label", "") + "0,v,1,a,b,c,d,e,f,g,h\n")
  with pytest.raises(UserError, match=r"test.csv:1: no column\(s\) label"):
    mc_data.read_swag(str(tmp_path / "test.csv"))


def test_jsonl_reader_cloze_questions_and_errors(tmp_path):
  rows = [dict(context="Tom has a cat.", question="Tom's pet is a _ .", choices=["cat", "dog"], label=0),
          dict(context="Sky.", question="It is", choices=["blue", "green", "red"], label=2)]
  path = tmp_path / "dev.jsonl"
  path.write_text("\n".join(json.dumps(r) for r in rows) + "\n\n")
  ex = mc_data.read_jsonl(str(path))
  assert ex.choices == [["Tom's pet is a cat .", "Tom's pet is a dog ."], ["It is blue", "It is green", "It is red"]]
  assert ex.labels.tolist() == [0, 2]
  for bad, message in (('{"context": "a", "choices": ["x", "y"], "label": 2}', "label 2 is not one of the 2"),
                       ('{"context": "a", "choices": ["x"], "label": 0}', "expected"), ("not json", "not a JSON")):
    path.write_text(json.dumps(rows[0]) + "\n" + bad + "\n")
    with pytest.raises(UserError, match=f"dev.jsonl:2: {message}"):
      mc_data.read_jsonl(str(path))


class _Tok:
  class special:
    pad, unk, cls, sep, mask = 0, 1, 2, 3, 4

  def encode(self, text):
    return np.array([10 + len(w) for w in text.split()], np.int32), None


def test_features_pad_missing_choices_and_they_never_win():
  ex = mc_data.Examples(["a b", "c"], [["x", "y y", "z"], ["u", "v"]], np.array([1, 0], np.int32), "mem")
  arrays = mc_data.encode(ex, _Tok(), 8)
  assert arrays["input_ids"].shape == (2, 3, 8)
  assert arrays["input_ids"][0, 1].tolist() == [2, 11, 11, 3, 11, 11, 3, 0]  # [CLS] a b [SEP] y y [SEP]
  assert arrays["type_ids"][0, 1].tolist() == [0, 0, 0, 0, 1, 1, 1, 0]
  assert arrays["choice_mask"].tolist() == [[1, 1, 1], [1, 1, 0]]
  scores = np.array([[0.0, 1.0, 0.5], [0.2, 0.1, 9.0]], np.float32)  # padding choice scored highest
  data = type("D", (), dict(eval=arrays))
  assert mc.evaluate(scores, data, None, None) == {"accuracy": 1.0}
  loss = np.asarray(mc.loss(scores, arrays))
  assert np.isfinite(loss).all()
  assert loss[1] == pytest.approx(-np.log(np.exp(0.2) / (np.exp(0.2) + np.exp(0.1))), rel=1e-5)
