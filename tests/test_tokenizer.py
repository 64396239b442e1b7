"""Tests for the SentencePiece and WordPiece tokenizers and SentencePiece training."""

import hashlib
import io
import pathlib
import pickle
import re
import subprocess
import sys

import numpy as np
import pydoc_data.topics
import pytest
import sentencepiece as spm

from bertjax.data.sentences import paragraphs_to_sentences
from bertjax.data.tokenizer import (
    SPECIAL_TOKENS,
    SentencePieceTokenizer,
    SpecialIds,
    WordPieceTokenizer,
    train_sentencepiece,
)
from bertjax.core.errors import UserError
from bertjax.data.tokenizer_spec import load_tokenizer

VOCAB_SIZE = 300
# Fixed so that the determinism test compares like with like (the thread count changes the model).
THREADS = 4
TEXT = "The quick brown fox jumps over the lazy dog."


def _corpus() -> list[str]:
  """Sentences of the Python reference manual, which ships with Python (no download needed)."""
  paragraphs = [p for topic in pydoc_data.topics.topics.values() for p in re.split(r"\n\s*\n", topic)]
  return list(paragraphs_to_sentences(paragraphs))


def _train(prefix, vocab_size=VOCAB_SIZE, seed=0, sentences=None, input_sentence_size=2000):
  return train_sentencepiece(_corpus() if sentences is None else sentences, str(prefix), vocab_size,
                             input_sentence_size=input_sentence_size, seed=seed, num_threads=THREADS)


def _words(tok, text):
  """The words of `text` rebuilt from token pieces, cut wherever word_start is True."""
  ids, word_start = tok.encode(text)
  words = []
  for i, start in zip(ids, word_start):
    piece = tok.id_to_token(int(i)).replace("\u2581", "").removeprefix("##")
    if start:
      words.append(piece)
    else:
      words[-1] += piece
  return [w for w in words if w]


@pytest.fixture(scope="module")
def sp_tok(tmp_path_factory):
  return _train(tmp_path_factory.mktemp("spm") / "sub" / "m")


# --- SentencePiece ---------------------------------------------------------------------------------------


def test_spm_special_ids_are_0_to_4(sp_tok):
  assert sp_tok.special == SpecialIds(pad=0, unk=1, cls=2, sep=3, mask=4)
  assert [sp_tok.id_to_token(i) for i in range(5)] == list(SPECIAL_TOKENS)
  assert sp_tok.vocab_size == VOCAB_SIZE
  assert sp_tok.kind == "spm"


def test_spm_writes_model_and_vocab(sp_tok):
  assert sp_tok.path.endswith("sub/m.model")
  with open(sp_tok.path.removesuffix(".model") + ".vocab", encoding="utf-8") as f:
    lines = f.read().splitlines()
  assert len(lines) == VOCAB_SIZE
  assert lines[0] == "[PAD]\t0" and lines[4] == "[MASK]\t0"
  assert lines[5].split("\t")[0] == sp_tok.id_to_token(5)


def test_spm_round_trip(sp_tok):
  for text in (TEXT, "Functions defined with async def are coroutines.", "x = 3.14 + y[0]"):
    ids, word_start = sp_tok.encode(text)
    assert ids.dtype == np.int32 and word_start.dtype == bool and ids.shape == word_start.shape
    assert sp_tok.decode(ids) == text
    assert sp_tok.decode(ids.tolist()) == text  # lists work as well as arrays


def test_spm_decode_drops_padding(sp_tok):
  ids, _ = sp_tok.encode(TEXT)
  assert sp_tok.decode(np.concatenate([ids, [0, 0]])) == TEXT


def test_spm_word_start_marks_whitespace_words(sp_tok):
  ids, word_start = sp_tok.encode(TEXT)
  assert word_start[0]
  assert word_start.sum() == len(TEXT.split())
  assert len(ids) > len(TEXT.split())  # with 300 pieces some words are split, so continuations are tested
  assert _words(sp_tok, TEXT) == TEXT.split()


def test_spm_mask_literal_is_the_mask_id(sp_tok):
  ids, word_start = sp_tok.encode("The capital of France is [MASK].")
  assert (ids == sp_tok.special.mask).sum() == 1
  at = int(np.flatnonzero(ids == sp_tok.special.mask)[0])
  # The lone "▁" before [MASK] begins the word; [MASK] continues it.
  assert sp_tok.id_to_token(int(ids[at - 1])) == "\u2581" and word_start[at - 1] and not word_start[at]
  ids, word_start = sp_tok.encode("[MASK] is here")
  assert sp_tok.special.mask in ids and word_start[0]


def test_spm_empty_text(sp_tok):
  ids, word_start = sp_tok.encode("   ")
  assert ids.shape == (0,) and word_start.shape == (0,)


def test_spm_fingerprint_is_file_hash_and_stable(sp_tok):
  with open(sp_tok.path, "rb") as f:
    assert sp_tok.fingerprint == hashlib.sha256(f.read()).hexdigest()[:16]
  again = load_tokenizer(sp_tok.spec())
  assert isinstance(again, SentencePieceTokenizer)
  assert again.fingerprint == sp_tok.fingerprint and again.spec() == f"spm:{sp_tok.path}"


def test_spm_training_is_deterministic(sp_tok, tmp_path):
  # A different directory and prefix name too: the path must not leak into the model's bytes.
  same = _train(tmp_path / "again")
  assert same.fingerprint == sp_tok.fingerprint
  other_seed = _train(tmp_path / "seed1", seed=1)  # a different sample of the corpus
  assert other_seed.fingerprint != sp_tok.fingerprint
  other_size = _train(tmp_path / "small", vocab_size=200)
  assert other_size.fingerprint != sp_tok.fingerprint


def test_spm_training_is_deterministic_across_processes(sp_tok, tmp_path):
  # SentencePiece's own sampling repeats within a process but not across processes, so check a fresh one.
  here = pathlib.Path(__file__).resolve().parent
  script = (f"import sys; sys.path[:0] = [{str(here.parent)!r}, {str(here)!r}]; import test_tokenizer as t; "
            f"print(t._train({str(tmp_path / 'm')!r}).fingerprint)")
  result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
  assert result.stdout.strip() == sp_tok.fingerprint


def test_spm_pickles(sp_tok):
  clone = pickle.loads(pickle.dumps(sp_tok))
  assert clone.fingerprint == sp_tok.fingerprint
  np.testing.assert_array_equal(clone.encode(TEXT)[0], sp_tok.encode(TEXT)[0])


def test_spm_vocab_too_large_for_corpus(tmp_path):
  with pytest.raises(UserError, match=r"at most \d+ SentencePiece pieces.*--config.model.vocab_size"):
    _train(tmp_path / "m", vocab_size=5000, sentences=["A tiny corpus.", "Two sentences only."])
  assert not (tmp_path / "m.model").exists()


def test_spm_vocab_too_small_for_characters(tmp_path):
  with pytest.raises(UserError, match="raise --config.model.vocab_size"):
    _train(tmp_path / "m", vocab_size=10)


def test_spm_empty_corpus(tmp_path):
  with pytest.raises(UserError, match="no sentences"):
    _train(tmp_path / "m", sentences=["", "   "])


def test_spm_model_without_special_tokens(tmp_path):
  # A model trained elsewhere with SentencePiece's defaults: no pad, no [CLS]/[SEP]/[MASK].
  model = io.BytesIO()
  spm.SentencePieceTrainer.train(sentence_iterator=iter(_corpus()[:500]), model_writer=model, vocab_size=200,
                                 minloglevel=2)
  path = tmp_path / "plain.model"
  path.write_bytes(model.getvalue())
  with pytest.raises(UserError, match=r"lacks the special tokens \[PAD\] \[CLS\] \[SEP\] \[MASK\]"):
    load_tokenizer(f"spm:{path}")


def test_spm_unreadable_model(tmp_path):
  path = tmp_path / "garbage.model"
  path.write_bytes(b"not a model")
  with pytest.raises(UserError, match="is not a SentencePiece model"):
    load_tokenizer(f"spm:{path}")


# --- WordPiece -------------------------------------------------------------------------------------------

WORDPIECE_VOCAB = [*SPECIAL_TOKENS, "the", "cat", "sat", "##s", "play", "##ing", ",", ".", "Cat"]


@pytest.fixture
def vocab_path(tmp_path):
  path = tmp_path / "vocab.txt"
  path.write_text("\n".join(WORDPIECE_VOCAB) + "\n", encoding="utf-8")
  return str(path)


def _tokens(tok, text):
  return [tok.id_to_token(int(i)) for i in tok.encode(text)[0]]


def test_wordpiece_encode_and_word_start(vocab_path):
  tok = load_tokenizer(f"wordpiece:{vocab_path}")
  assert isinstance(tok, WordPieceTokenizer) and tok.kind == "wordpiece"
  assert tok.special == SpecialIds(pad=0, unk=1, cls=2, sep=3, mask=4)
  assert tok.vocab_size == len(WORDPIECE_VOCAB)
  ids, word_start = tok.encode("The cats playing, [MASK] sat.")
  assert ids.dtype == np.int32 and word_start.dtype == bool
  assert [tok.id_to_token(int(i)) for i in ids] == ["the", "cat", "##s", "play", "##ing", ",", "[MASK]", "sat", "."]
  # No [CLS]/[SEP] added; punctuation begins a word of its own, as in BERT's whole-word masking.
  assert word_start.tolist() == [True, True, False, True, False, True, True, True, True]
  assert tok.decode(ids) == "the cats playing, [MASK] sat."
  assert tok.decode([0, *ids.tolist(), 0]) == "the cats playing, [MASK] sat."


def test_wordpiece_lowercases_by_default_and_cased_keeps_case(vocab_path):
  uncased = load_tokenizer(f"wordpiece:{vocab_path}")
  assert _tokens(uncased, "THE CAT") == ["the", "cat"]
  cased = load_tokenizer(f"wordpiece:{vocab_path}:cased")
  assert not cased.lowercase
  assert _tokens(cased, "The Cat cat") == ["[UNK]", "Cat", "cat"]
  assert cased.spec() == f"wordpiece:{vocab_path}:cased" and uncased.spec() == f"wordpiece:{vocab_path}"
  # One vocab.txt, two tokenizers: casing changes the ids, so it changes the identity rows and caches are keyed by.
  assert cased.fingerprint != uncased.fingerprint
  assert load_tokenizer(f"wordpiece:{vocab_path}:cased").fingerprint == cased.fingerprint  # and stays stable


def test_wordpiece_mask_literal_survives_lowercasing(vocab_path):
  tok = load_tokenizer(f"wordpiece:{vocab_path}")
  assert tok.encode("THE [MASK]")[0].tolist() == [5, tok.special.mask]


def test_wordpiece_fingerprint_changes_with_the_vocab(vocab_path, tmp_path):
  other = tmp_path / "other.txt"
  other.write_text("\n".join([*WORDPIECE_VOCAB, "dog"]) + "\n", encoding="utf-8")
  assert load_tokenizer(f"wordpiece:{other}").fingerprint != load_tokenizer(f"wordpiece:{vocab_path}").fingerprint


def test_wordpiece_vocab_without_mask(tmp_path):
  path = tmp_path / "vocab.txt"
  path.write_text("\n".join(t for t in WORDPIECE_VOCAB if t != "[MASK]") + "\n", encoding="utf-8")
  with pytest.raises(UserError, match=rf"vocabulary {re.escape(str(path))} lacks the special tokens \[MASK\];"):
    load_tokenizer(f"wordpiece:{path}")


def test_wordpiece_pickles(vocab_path):
  tok = WordPieceTokenizer(vocab_path, lowercase=False)
  clone = pickle.loads(pickle.dumps(tok))
  assert clone.spec() == tok.spec()
  assert clone.encode("Cat")[0].tolist() == tok.encode("Cat")[0].tolist()


# --- load_tokenizer --------------------------------------------------------------------------------------


@pytest.mark.parametrize("spec", ["", "spm", "spm:", "bpe:/x.model", "/path/vocab.txt"])
def test_bad_spec(spec):
  with pytest.raises(UserError, match="bad tokenizer spec"):
    load_tokenizer(spec)


@pytest.mark.parametrize("kind", ["spm", "wordpiece"])
def test_missing_file(kind, tmp_path):
  with pytest.raises(UserError, match="does not exist"):
    load_tokenizer(f"{kind}:{tmp_path / 'nope'}")


def test_id_out_of_range(vocab_path, sp_tok):
  for tok in (load_tokenizer(f"wordpiece:{vocab_path}"), sp_tok):
    with pytest.raises(IndexError):
      tok.id_to_token(tok.vocab_size)
    with pytest.raises(IndexError):
      tok.decode([-1])


# --- hf:DIR fingerprints ---------------------------------------------------------------------------------
# Rows, caches and checkpoints are keyed by the fingerprint, so two directories whose tokenizers may give
# different ids for one text must never share it, and one whose id-changing settings are the same keeps it.

HF_VOCAB = [*SPECIAL_TOKENS, "<unk>", "<s>", "cafe", "café", "Café", "中", "国", "中国", "the", "##s"]
HF_TEXT = "Café cafés 中国 the"


def _hf_dir(path, files: dict):
  """A checkpoint's tokenizer directory holding `files` (name -> str, or a dict written as JSON)."""
  import json

  path.mkdir(parents=True, exist_ok=True)
  for name, content in files.items():
    (path / name).write_text(content if isinstance(content, str) else json.dumps(content), encoding="utf-8")
  return path


def _vocab_dir(path, config=None, **more):
  files = {"vocab.txt": "\n".join(HF_VOCAB) + "\n", **more}
  return _hf_dir(path, files if config is None else {**files, "tokenizer_config.json": config})


def test_hf_vocab_txt_fingerprint_covers_every_id_changing_setting(tmp_path):
  """A bare vocab.txt's ids also depend on tokenizer_config.json (transformers' BertTokenizer reads
  do_lower_case, strip_accents, tokenize_chinese_chars and the special-token names from it): flipping each gives
  another fingerprint, and the ids change as BertTokenizer's do; keys that change no id leave it as it was."""
  base = load_tokenizer(f"hf:{_vocab_dir(tmp_path / 'base')}")
  flips = {"strip_accents": {"strip_accents": False}, "cased": {"do_lower_case": False},
           "cased_stripped": {"do_lower_case": False, "strip_accents": True},
           "chinese": {"tokenize_chinese_chars": False}, "unk": {"unk_token": "<unk>"},
           "cls": {"cls_token": {"content": "<s>", "lstrip": False}}}
  toks = {name: load_tokenizer(f"hf:{_vocab_dir(tmp_path / name, config)}") for name, config in flips.items()}
  # Through special_tokens_map.json too (what older transformers wrote the token names into).
  toks["unk_map"] = load_tokenizer(f"hf:{_vocab_dir(tmp_path / 'unk_map', None, **{'special_tokens_map.json': {'unk_token': '<unk>'}})}")
  prints = [base.fingerprint] + [t.fingerprint for t in toks.values()]
  assert len(set(prints)) == len(prints) - 1  # all new, the two spellings of unk_token agree
  assert toks["unk"].fingerprint == toks["unk_map"].fingerprint
  assert _tokens(base, HF_TEXT) == ["cafe", "cafe", "##s", "中", "国", "the"]
  assert _tokens(toks["strip_accents"], HF_TEXT) == ["café", "café", "##s", "中", "国", "the"]
  assert _tokens(toks["cased"], HF_TEXT) == ["Café", "café", "##s", "中", "国", "the"]
  assert _tokens(toks["cased_stripped"], HF_TEXT) == ["[UNK]", "cafe", "##s", "中", "国", "the"]
  assert _tokens(toks["chinese"], HF_TEXT) == ["cafe", "cafe", "##s", "中国", "the"]
  assert toks["unk"].special.unk == HF_VOCAB.index("<unk>") and _tokens(toks["unk"], "dog") == ["<unk>"]
  assert toks["cls"].special.cls == HF_VOCAB.index("<s>")
  # Nothing that changes ids: the same fingerprint (and BERT's defaults keep `wordpiece:`'s spec and fingerprint).
  same = {"none": {}, "max_length": {"model_max_length": 512, "tokenizer_class": "BertTokenizer"},
          "explicit_defaults": {"do_lower_case": True, "strip_accents": True, "tokenize_chinese_chars": True,
                                "unk_token": "[UNK]", "mask_token": "[MASK]"}}
  for name, config in same.items():
    assert load_tokenizer(f"hf:{_vocab_dir(tmp_path / name, config)}").fingerprint == base.fingerprint, name
  assert base.fingerprint == load_tokenizer(f"wordpiece:{tmp_path / 'base' / 'vocab.txt'}").fingerprint
  assert toks["cased"].fingerprint == load_tokenizer(f"wordpiece:{tmp_path / 'cased' / 'vocab.txt'}:cased").fingerprint
  # The tokenizer travels (spec, pickling to data workers) with its settings.
  for tok in toks.values():
    for again in (load_tokenizer(tok.spec()), pickle.loads(pickle.dumps(tok))):
      assert again.fingerprint == tok.fingerprint and _tokens(again, HF_TEXT) == _tokens(tok, HF_TEXT)


def test_hf_vocab_txt_settings_survive_prepare(tmp_path):
  """Shards keep a copy of their tokenizer: one with settings of its own is copied as its directory (hf:), so
  the copy reads back with the same settings and fingerprint."""
  from bertjax.core import config as config_lib
  from bertjax.data import prepare_lib

  tok = load_tokenizer(f"hf:{_vocab_dir(tmp_path / 'src', {'strip_accents': False})}")
  config = config_lib.defaults()
  config.model.vocab_size = tok.vocab_size
  (tmp_path / "shards").mkdir()
  spec = prepare_lib.prepare_tokenizer(config, None, str(tmp_path / "shards"), f"hf:{tmp_path / 'src'}")
  copy = load_tokenizer(prepare_lib.absolute_spec(spec, str(tmp_path / "shards")))
  assert copy.fingerprint == tok.fingerprint and _tokens(copy, "Café") == _tokens(tok, "Café") == ["café"]


def test_hf_vocab_txt_refuses_what_it_cannot_carry(tmp_path):
  added = {"added_tokens_decoder": {"0": {"content": "[PAD]", "special": True}, "16": {"content": "[NEW]"}}}
  with pytest.raises(UserError, match=r"adds tokens to its vocab.txt \(\[NEW\]\).*save_pretrained"):
    load_tokenizer(f"hf:{_vocab_dir(tmp_path / 'added', added)}")
  with pytest.raises(UserError, match=r"lacks the special tokens <mask> that its tokenizer_config.json names"):
    load_tokenizer(f"hf:{_vocab_dir(tmp_path / 'mask', {'mask_token': '<mask>'})}")


def _tokenizer_json(lowercase=True, strip_accents=None, chinese=True) -> str:
  import tokenizers

  vocab = {t: i for i, t in enumerate(HF_VOCAB)}
  tok = tokenizers.BertWordPieceTokenizer(vocab, lowercase=lowercase, strip_accents=strip_accents,
                                          handle_chinese_chars=chinese)
  return tok.to_str()


def test_hf_tokenizer_json_fingerprint_covers_every_id_changing_setting(tmp_path):
  """tokenizer.json holds the normalizer, pre-tokenizer and vocabulary, tokenizer_config.json and
  special_tokens_map.json the special tokens: a change to any of them is another fingerprint; files of the
  checkpoint that are not its tokenizer (config.json, weights) are not part of it."""
  variants = {"base": {}, "cased": {"tokenizer.json": _tokenizer_json(lowercase=False)},
              "accents": {"tokenizer.json": _tokenizer_json(strip_accents=False)},
              "chinese": {"tokenizer.json": _tokenizer_json(chinese=False)},
              "unk": {"tokenizer_config.json": {"unk_token": "<unk>"}},
              "cls": {"special_tokens_map.json": {"cls_token": "<s>"}}}
  toks = {name: load_tokenizer(f"hf:{_hf_dir(tmp_path / name, {'tokenizer.json': _tokenizer_json(), **files})}")
          for name, files in variants.items()}
  assert len({t.fingerprint for t in toks.values()}) == len(variants)
  assert _tokens(toks["accents"], HF_TEXT) != _tokens(toks["base"], HF_TEXT)
  assert toks["unk"].special.unk == HF_VOCAB.index("<unk>") and toks["cls"].special.cls == HF_VOCAB.index("<s>")
  _hf_dir(tmp_path / "base", {"config.json": {"model_type": "bert"}, "model.safetensors": "weights"})
  assert load_tokenizer(f"hf:{tmp_path / 'base'}").fingerprint == toks["base"].fingerprint


@pytest.mark.slow  # ~9 s: importing transformers, which converts spiece.model
def test_hf_sentencepiece_fingerprint_covers_every_id_changing_setting(sp_tok, tmp_path):
  """spiece.model (converted by transformers as AutoTokenizer would) with tokenizer_config.json's casing and
  accent settings: each flip is another fingerprint."""
  pytest.importorskip("transformers")
  model = pathlib.Path(sp_tok.path).read_bytes()
  special = dict(pad_token="[PAD]", unk_token="[UNK]", cls_token="[CLS]", sep_token="[SEP]", mask_token="[MASK]",
                 tokenizer_class="AlbertTokenizer")
  prints = {}
  for name, settings in {"base": {}, "cased": {"do_lower_case": False}, "accents": {"keep_accents": True}}.items():
    directory = tmp_path / name
    _hf_dir(directory, {"tokenizer_config.json": {**special, **settings}})
    (directory / "spiece.model").write_bytes(model)
    prints[name] = load_tokenizer(f"hf:{directory}").fingerprint
  assert len(set(prints.values())) == 3
