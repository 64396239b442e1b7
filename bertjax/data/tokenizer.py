"""One tokenizer interface over SentencePiece models, BERT WordPiece vocab.txt files and published checkpoints'
tokenizers (`hf:DIR`, bertjax.data.hf_tokenizer), and SentencePiece training. A spec string becomes a
tokenizer in bertjax.data.tokenizer_spec, above both."""

import abc
import dataclasses
import hashlib
import io
import json
import os
import random
import re
from typing import Iterable, Iterator, Sequence

import numpy as np
import tokenizers

from bertjax.core.errors import UserError

SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
_SPM_SPACE = "\u2581"  # how SentencePiece spells the space that begins a word
_WORDPIECE_CONTINUATION = "##"
SPECS = '"spm:PATH", "wordpiece:PATH", "wordpiece:PATH:cased" or "hf:DIR" (a checkpoint\'s own tokenizer)'


def _spm():
  """The sentencepiece package, imported where a SentencePiece model is read or trained: WordPiece and `hf:DIR`
  tokenizers (fine-tuning a published BERT checkpoint) run where it is not installed."""
  import sentencepiece

  return sentencepiece


@dataclasses.dataclass(frozen=True)
class SpecialIds:
  """The ids of the special tokens."""

  pad: int
  unk: int
  cls: int
  sep: int
  mask: int

  @property
  def never_masked(self) -> tuple:
    """The ids MLM masking never chooses nor draws as a random replacement."""
    return (self.pad, self.unk, self.cls, self.sep, self.mask)


# bertjax's own SentencePiece layout (train_sentencepiece: pad 0, unk 1, then [CLS] [SEP] [MASK]); what
# synthetic batches (bench, aot, tests) use when no tokenizer is at hand.
SPM_SPECIAL = SpecialIds(pad=0, unk=1, cls=2, sep=3, mask=4)


def _read_bytes(path: str, what: str) -> bytes:
  """The bytes of the file at `path`, or a UserError naming `what` it should have been."""
  if not os.path.isfile(path):
    raise UserError(f"{what} {path} does not exist; check the path in the tokenizer spec ({SPECS})")
  with open(path, "rb") as f:
    return f.read()


def _fingerprint(data: bytes, settings: dict | None = None) -> str:
  """First 16 hex digits of the sha256 of what decides a tokenizer's ids: its model / vocab file's bytes and,
  for a format whose file leaves some of that open (a WordPiece vocab.txt says nothing of casing), the
  settings that do. Rows, caches and checkpoints record it: two tokenizers that may give different ids for one
  text must never share it (docs/integrity.md)."""
  digest = hashlib.sha256(data)
  if settings:
    digest.update(b"\0" + json.dumps(settings, sort_keys=True).encode())
  return digest.hexdigest()[:16]


def wordpiece_settings(lowercase: bool = True, strip_accents: bool | None = None, chinese_chars: bool = True,
                       special: Sequence[str] = SPECIAL_TOKENS) -> dict:
  """What decides a WordPiece tokenizer's ids beside its vocab.txt, which holds only the vocabulary: BERT's
  normalizer (lowercasing; accent stripping, which follows lowercasing unless `strip_accents` says otherwise;
  spaces around CJK characters: `chinese_chars`), its pre-tokenizer, the continuation prefix and the special
  tokens (pad, unk, cls, sep, mask), as transformers' BertTokenizer takes them from tokenizer_config.json."""
  return dict(kind="wordpiece", lowercase=lowercase, strip_accents=lowercase if strip_accents is None else strip_accents,
              clean_text=True, chinese_chars=chinese_chars, pre_tokenizer="bert", continuation=_WORDPIECE_CONTINUATION,
              special=list(special))


def wordpiece_fingerprint(vocab: bytes, settings: dict) -> str:
  """The fingerprint of a WordPiece vocab.txt's bytes read with `settings` (wordpiece_settings)."""
  return _fingerprint(vocab, settings)


def _missing_special_tokens_error(path: str, missing: Sequence[str], fix: str) -> UserError:
  """The error for a vocabulary that lacks some of SPECIAL_TOKENS."""
  return UserError(f"vocabulary {path} lacks the special tokens {' '.join(missing)}; {fix}")


class Tokenizer(abc.ABC):
  """Text to ids and back, with the BERT special tokens and word boundaries.

  Attributes:
    vocab_size: the number of ids; every id is in [0, vocab_size).
    special: the ids of [PAD], [UNK], [CLS], [SEP] and [MASK].
    fingerprint: first 16 hex digits of a sha256 over everything that changes ids: the model / vocab file's
      bytes, and for WordPiece the normalization (casing, accents) and pre-tokenization it applies.
    kind: "spm", "wordpiece" or "hf".
    path: the model / vocab file, as given.
  """

  vocab_size: int
  special: SpecialIds
  fingerprint: str
  kind: str
  path: str
  _word_start_table: np.ndarray  # indexed by id: whether that token begins a word; set by subclasses

  def encode(self, text: str) -> tuple[np.ndarray, np.ndarray]:
    """Tokenizes `text` without adding special tokens.

    The literal "[MASK]" inside `text` becomes the mask id (fill-mask inputs are written that way).

    Args:
      text: the text to tokenize.

    Returns:
      `(ids, word_start)`: int32 ids and a bool array, True where the token begins a new word (for
      whole-word masking). The first token always begins a word; both arrays are empty for blank text.
    """
    ids = np.asarray(self._encode_ids(text), dtype=np.int32)
    word_start = self._word_start_table[ids]
    if word_start.size:
      word_start[0] = True  # whatever the pieces look like, nothing comes before the first word
    return ids, word_start

  @abc.abstractmethod
  def encode_offsets(self, text: str) -> tuple[np.ndarray, np.ndarray]:
    """Tokenizes `text` without special tokens and says where each token came from (extractive QA).

    Returns:
      `(ids, offsets)`: int32 ids [n] and int32 character offsets [n, 2] into `text` (start, end), after
      the tokenizer's own normalization is undone. A token may cover the whitespace before its word
      (SentencePiece's "▁"), so text cut by offsets is to be stripped. A literal "[MASK]" is plain text here.
    """

  @abc.abstractmethod
  def decode(self, ids: Sequence[int] | np.ndarray) -> str:
    """The text of `ids`: [PAD] is dropped, the other special tokens are written out."""

  @abc.abstractmethod
  def id_to_token(self, i: int) -> str:
    """The piece / token string of id `i`; IndexError outside [0, vocab_size)."""

  def spec(self) -> str:
    """The string `load_tokenizer` accepts to load this tokenizer again."""
    return f"{self.kind}:{self.path}"

  def __reduce__(self):
    # Native tokenizers are not picklable; worker processes reload the model from its path.
    return (type(self), (self.path,))

  @abc.abstractmethod
  def _encode_ids(self, text: str) -> list[int]:
    """The ids of `text`, no special tokens added."""

  def _check_id(self, i: int) -> int:
    """`i` as an int, or IndexError when it is not an id of this vocabulary."""
    i = int(i)
    if not 0 <= i < self.vocab_size:
      raise IndexError(f"token id {i} is outside the vocabulary [0, {self.vocab_size})")
    return i

  def __repr__(self) -> str:
    return f"{type(self).__name__}({self.spec()!r}, vocab_size={self.vocab_size}, fingerprint={self.fingerprint})"


class SentencePieceTokenizer(Tokenizer):
  """A SentencePiece model (unigram or BPE) whose vocabulary holds all of SPECIAL_TOKENS.

  A token begins a word when its piece starts with "▁" (U+2581). SentencePiece sometimes emits a lone "▁"
  piece before a piece it cannot join with a space, such as "[MASK]" or an unknown character: then the
  lone "▁" is the word start and the following piece continues that word, so whole-word masking masks
  both together.
  """

  kind = "spm"

  def __init__(self, path: str):
    """Loads the model at `path`; UserError if it is missing, unreadable or lacks a special token."""
    data = _read_bytes(path, "SentencePiece model")
    self.path = path
    self.fingerprint = _fingerprint(data)
    self._sp = _spm().SentencePieceProcessor()
    try:
      self._sp.LoadFromSerializedProto(data)
    except (RuntimeError, OSError) as e:
      raise UserError(f"{path} is not a SentencePiece model ({e}); pass the .model file written by training") from e
    self.vocab_size = self._sp.get_piece_size()
    self.special = self._special_ids()
    self._word_start_table = np.array(
        [self._sp.id_to_piece(i).startswith(_SPM_SPACE) for i in range(self.vocab_size)], dtype=bool)

  def _special_ids(self) -> SpecialIds:
    """The special ids, checking that the model has them all and encodes a literal "[MASK]" as one."""
    unk = self._sp.unk_id()
    ids = {token: self._sp.piece_to_id(token) for token in SPECIAL_TOKENS[2:]}
    missing = [token for token, i in ids.items() if i == unk]
    if self._sp.pad_id() < 0:
      missing.insert(0, "[PAD]")
    if missing:
      raise _missing_special_tokens_error(
          self.path, missing, "train the model with bertjax (train_sentencepiece) or with pad_id set and "
          "[CLS],[SEP],[MASK] as user_defined_symbols")
    special = SpecialIds(pad=self._sp.pad_id(), unk=unk, cls=ids["[CLS]"], sep=ids["[SEP]"], mask=ids["[MASK]"])
    # A [MASK] that is a control symbol exists but is never produced from text, which breaks fill-mask.
    if special.mask not in self._sp.encode("[MASK]"):
      raise UserError(f"SentencePiece model {self.path} does not encode the text [MASK] as its mask token; "
                      "retrain it with [MASK] among user_defined_symbols (not control_symbols)")
    return special

  def _encode_ids(self, text: str) -> list[int]:
    return self._sp.encode(text)

  def encode_offsets(self, text: str) -> tuple[np.ndarray, np.ndarray]:
    # SentencePiece reports UTF-8 byte offsets into the original text: map them to character offsets.
    pieces = self._sp.encode(text, return_type="proto").pieces
    char_of_byte = np.zeros(len(text.encode("utf-8")) + 1, np.int32)
    char_of_byte[np.cumsum([0] + [len(ch.encode("utf-8")) for ch in text])] = np.arange(len(text) + 1)
    char_of_byte = np.maximum.accumulate(char_of_byte)  # bytes inside a character map to that character
    ids = np.array([p.id for p in pieces], np.int32)
    offsets = np.array([[char_of_byte[p.begin], char_of_byte[p.end]] for p in pieces], np.int32).reshape(-1, 2)
    return ids, offsets

  def decode(self, ids: Sequence[int] | np.ndarray) -> str:
    # [PAD] is a control symbol, which SentencePiece already decodes to nothing.
    return self._sp.decode([self._check_id(i) for i in ids])

  def id_to_token(self, i: int) -> str:
    return self._sp.id_to_piece(self._check_id(i))



class WordPieceTokenizer(Tokenizer):
  """A BERT WordPiece vocab.txt (one token per line, "##" marking word continuations).

  A token begins a word when it does not start with "##". BERT's pre-tokenizer splits punctuation off
  words, so punctuation tokens begin words of their own, as in Google's whole-word masking.
  """

  kind = "wordpiece"

  def __init__(self, path: str, lowercase: bool = True):
    """Loads the vocabulary at `path`; UserError if it is missing or lacks a special token.

    Args:
      path: a BERT vocab.txt.
      lowercase: lowercase (and strip accents from) text before tokenizing, as uncased BERT models do.
    """
    data = _read_bytes(path, "WordPiece vocabulary")
    self.path = path
    self.lowercase = lowercase
    # vocab.txt holds only the vocabulary: the normalizer (lowercasing and accent stripping go together in
    # BertWordPieceTokenizer), the pre-tokenizer and the special tokens are settings, and change the ids.
    self.fingerprint = wordpiece_fingerprint(data, wordpiece_settings(lowercase))
    tokens = {line.strip() for line in data.decode("utf-8", errors="replace").splitlines()}
    missing = [token for token in SPECIAL_TOKENS if token not in tokens]
    if missing:
      raise _missing_special_tokens_error(path, missing, "add them to the file (one per line) or use a BERT vocab.txt")
    self._tok = tokenizers.BertWordPieceTokenizer(path, lowercase=lowercase)
    self.vocab_size = self._tok.get_vocab_size()
    self.special = SpecialIds(*(self._tok.token_to_id(token) for token in SPECIAL_TOKENS))
    vocab = self._tok.get_vocab()
    self._word_start_table = np.ones(self.vocab_size, dtype=bool)
    for token, i in vocab.items():
      self._word_start_table[i] = not token.startswith(_WORDPIECE_CONTINUATION)

  def _encode_ids(self, text: str) -> list[int]:
    return self._tok.encode(text, add_special_tokens=False).ids

  def encode_offsets(self, text: str) -> tuple[np.ndarray, np.ndarray]:
    enc = self._tok.encode(text, add_special_tokens=False)  # offsets are characters of the original text
    return np.asarray(enc.ids, np.int32), np.asarray(enc.offsets, np.int32).reshape(-1, 2)

  def decode(self, ids: Sequence[int] | np.ndarray) -> str:
    ids = [i for i in map(self._check_id, ids) if i != self.special.pad]
    return self._tok.decode(ids, skip_special_tokens=False)

  def id_to_token(self, i: int) -> str:
    return self._tok.id_to_token(self._check_id(i))

  def spec(self) -> str:
    return super().spec() + ("" if self.lowercase else ":cased")

  def __reduce__(self):
    return (type(self), (self.path, self.lowercase))


def reservoir_sample(items: Iterable, size: int, seed: int) -> list:
  """A uniform sample of `size` items (all of them if size <= 0) in one pass, memory bounded by the
  sample (reservoir sampling with a seeded generator)."""
  rng, sample = random.Random(seed), []
  for seen, item in enumerate(items):
    if size <= 0 or len(sample) < size:
      sample.append(item)
    elif (slot := int(rng.random() * (seen + 1))) < size:
      sample[slot] = item
  return sample


def _sample_sentences(sentences: Iterable[str], size: int, max_bytes: int, seed: int) -> list[str]:
  """A uniform sample of at most `size` (all if `size` <= 0) non-blank sentences of at most `max_bytes`:
  SentencePiece's own sampling ignores its seed, so the sample is drawn here to make training
  reproducible. SentencePiece would skip longer sentences; dropping them first keeps them from taking
  sample slots."""
  stripped = (s.strip() for s in sentences)
  return reservoir_sample((s for s in stripped if s and len(s.encode("utf-8")) <= max_bytes), size, seed)


def _training_error(error: Exception, vocab_size: int) -> UserError | None:
  """The UserError for SentencePiece's complaint that the corpus cannot support vocab_size, else None."""
  message = str(error)
  if "Vocabulary size too high" in message:
    limit = re.search(r"<=\s*(\d+)", message)
    most = f"at most {limit.group(1)}" if limit else "fewer"
    return UserError(f"the corpus supports {most} SentencePiece pieces, not vocab_size={vocab_size}; "
                     "lower --config.model.vocab_size (or train on more text)")
  if "Vocabulary size is smaller than required_chars" in message:
    needed = re.search(r"vs\s*(\d+)", message)
    least = f"at least {needed.group(1)}" if needed else "more"
    return UserError(f"vocab_size={vocab_size} cannot hold the corpus's characters and special tokens, which need "
                     f"{least}; raise --config.model.vocab_size")
  return None


def _vocab_lines(model: bytes) -> Iterator[str]:
  """The lines of a .vocab file ("piece<TAB>score", as spm_train writes) for a serialized model."""
  sp = _spm().SentencePieceProcessor()
  sp.LoadFromSerializedProto(model)
  for i in range(sp.get_piece_size()):
    yield f"{sp.id_to_piece(i)}\t{sp.get_score(i):g}\n"


def _write_atomically(path: str, data: bytes) -> None:
  """Writes `data` to `path` via a temporary file, so a crash never leaves a truncated model behind."""
  tmp = f"{path}.tmp{os.getpid()}"
  with open(tmp, "wb") as f:
    f.write(data)
  os.replace(tmp, path)


def train_sentencepiece(
    sentences: Iterable[str],
    model_prefix: str,
    vocab_size: int,
    *,
    model_type: str = "unigram",
    input_sentence_size: int = 1_000_000,
    max_sentence_length: int = 4192,
    seed: int = 0,
    num_threads: int = os.cpu_count() or 1,
    character_coverage: float = 0.9995,
) -> SentencePieceTokenizer:
  """Trains a SentencePiece model whose ids 0..4 are [PAD], [UNK], [CLS], [SEP], [MASK].

  [PAD] is SentencePiece's pad (a control symbol), [UNK] its unknown piece, and [CLS], [SEP], [MASK] are
  user-defined symbols, so their literal text encodes to them; there are no BOS/EOS pieces and no byte
  fallback. Writes MODEL_PREFIX.model and MODEL_PREFIX.vocab.

  Training is reproducible: the same sentences, seed, num_threads and sentencepiece version give a
  byte-identical .model. For that the sample of `input_sentence_size` sentences is drawn here with
  `seed` (SentencePiece's own sampling is not seeded), and the model is serialized without
  SentencePiece's model_prefix so that the file does not depend on where it was written. The thread
  count does change the result.

  Args:
    sentences: the training text, one sentence per item.
    model_prefix: path prefix of the files to write; missing directories are created.
    vocab_size: the number of pieces, special tokens included.
    model_type: "unigram", "bpe", "char" or "word".
    input_sentence_size: how many sentences to sample uniformly for training (<= 0: all of them).
    max_sentence_length: sentences longer than this many UTF-8 bytes are skipped.
    seed: seed of the sampling (and of SentencePiece's random generator).
    num_threads: training threads.
    character_coverage: fraction of characters the model must cover; the rarest rest become [UNK].

  Returns:
    The trained tokenizer, loaded from MODEL_PREFIX.model. UserError if there is no text, or when
    vocab_size is too large or too small for the corpus.
  """
  sample = _sample_sentences(sentences, input_sentence_size, max_sentence_length, seed)
  if not sample:
    raise UserError("no sentences to train SentencePiece on (all blank or longer than max_sentence_length); "
                    "check the corpus")
  _spm().set_random_generator_seed(seed)
  model = io.BytesIO()
  try:
    _spm().SentencePieceTrainer.train(
        sentence_iterator=iter(sample),
        model_writer=model,  # no model_prefix: it would be recorded in (and change) the model's bytes
        vocab_size=vocab_size,
        model_type=model_type,
        pad_id=0,
        unk_id=1,
        bos_id=-1,
        eos_id=-1,
        pad_piece="[PAD]",
        unk_piece="[UNK]",
        user_defined_symbols=list(SPECIAL_TOKENS[2:]),
        input_sentence_size=0,  # the sample above is the training set
        shuffle_input_sentence=False,
        max_sentence_length=max_sentence_length,
        character_coverage=character_coverage,
        byte_fallback=False,
        num_threads=num_threads,
        minloglevel=2,
    )
  except ValueError as e:  # SentencePiece's answer to an unknown option value, e.g. model_type
    raise UserError(f"SentencePiece rejected the training options ({e}); check model_type={model_type!r}") from e
  except RuntimeError as e:
    user_error = _training_error(e, vocab_size)
    if user_error is None:
      raise
    raise user_error from e
  os.makedirs(os.path.dirname(model_prefix) or ".", exist_ok=True)
  _write_atomically(f"{model_prefix}.model", model.getvalue())
  _write_atomically(f"{model_prefix}.vocab", "".join(_vocab_lines(model.getvalue())).encode("utf-8"))
  return SentencePieceTokenizer(f"{model_prefix}.model")
