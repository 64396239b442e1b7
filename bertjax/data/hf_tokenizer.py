"""A published checkpoint's own tokenizer (`hf:DIR`) behind bertjax's Tokenizer interface, for data and inference.

tokenizer.json (HF's fast tokenizer: BERT WordPiece, RoBERTa byte-level BPE, ALBERT unigram) is read with the
`tokenizers` library, so ids, normalization (casing, accents) and special tokens are exactly HF's; a bare
vocab.txt is read as transformers' BertTokenizer reads it, with tokenizer_config.json's do_lower_case,
strip_accents, tokenize_chinese_chars and special-token names (bertjax's WordPieceTokenizer where those are
BERT's defaults, so its spec and fingerprint stay `wordpiece:`'s); a directory with only spiece.model or
vocab.json + merges.txt is converted by transformers, as `AutoTokenizer` would load it. The special-token ids
([CLS]/<s>, [SEP]/</s>, [MASK]/<mask>, [PAD]/<pad>, [UNK]/<unk>) come from tokenizer_config.json and go to
masking and instances.

Fingerprints (what rows, caches and checkpoints are keyed by) cover every setting that changes ids: all bytes of
the tokenizer files for tokenizer.json and converted directories, and for a bare vocab.txt its bytes plus the
settings above as read (so a key tokenizer_config.json holds that changes no id, such as model_max_length,
leaves it alone).
"""

import hashlib
import json
import os

import numpy as np
import tokenizers

from bertjax.core.errors import UserError
from bertjax.data.tokenizer import (SPECIAL_TOKENS, SentencePieceTokenizer, SpecialIds, Tokenizer, WordPieceTokenizer,
                                    wordpiece_fingerprint, wordpiece_settings)

# Special-token roles: the tokenizer_config.json key, and the spellings to try when the config names none.
ROLES = {
    "pad": ("pad_token", ("[PAD]", "<pad>")),
    "unk": ("unk_token", ("[UNK]", "<unk>")),
    "cls": ("cls_token", ("[CLS]", "<cls>", "<s>")),  # <cls>/<sep>: XLNet's (it has <s> and </s> too)
    "sep": ("sep_token", ("[SEP]", "<sep>", "</s>")),
    "mask": ("mask_token", ("[MASK]", "<mask>")),
}
# The files a checkpoint's tokenizer may consist of (copied with it: into shards, workdirs, exports).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.txt",
                   "vocab.json", "merges.txt", "spiece.model")
_CONVERTED = ("spiece.model", "vocab.json")  # tokenizer files only transformers' converters read


def files_fingerprint(directory: str) -> str:
  """First 16 hex digits of a sha256 over every tokenizer file of `directory` (name and bytes, in a fixed
  order): tokenizer.json holds the vocabulary, normalizer and pre-tokenizer, and tokenizer_config.json /
  special_tokens_map.json name the special tokens, so a change to any of them changes the fingerprint."""
  digest = hashlib.sha256()
  for name in TOKENIZER_FILES:
    path = os.path.join(directory, name)
    if os.path.isfile(path):
      with open(path, "rb") as f:
        data = f.read()
      digest.update(f"{name}\0{len(data)}\0".encode() + data)
  return digest.hexdigest()[:16]


def _json(path: str) -> dict:
  if not os.path.isfile(path):
    return {}
  with open(path) as f:
    return json.load(f)


def _token_text(value):
  """A special token as tokenizer_config.json writes it: a string or an AddedToken dict."""
  return value.get("content") if isinstance(value, dict) else value


def _named(directory: str) -> dict:
  """tokenizer_config.json over special_tokens_map.json: the settings and special-token names a directory gives."""
  return {**_json(os.path.join(directory, "special_tokens_map.json")),
          **_json(os.path.join(directory, "tokenizer_config.json"))}


def vocab_settings(directory: str) -> dict:
  """wordpiece_settings of a directory whose tokenizer is a bare vocab.txt, as transformers' BertTokenizer reads
  its tokenizer_config.json (defaults: lowercase, accents stripped when lowercasing, CJK characters split, BERT's
  special tokens). UserError for added tokens beyond the special ones: a vocab.txt does not carry them."""
  named = _named(directory)
  special = [_token_text(named.get(ROLES[role][0])) or default for role, default in
             zip(("pad", "unk", "cls", "sep", "mask"), SPECIAL_TOKENS)]
  added = {_token_text(t) for t in named.get("added_tokens_decoder", {}).values()}
  added |= set(_json(os.path.join(directory, "added_tokens.json")))
  with open(os.path.join(directory, "vocab.txt"), encoding="utf-8", errors="replace") as f:
    vocab = {line.strip() for line in f}
  missing = [t for t in special if t not in vocab]
  if missing:
    raise UserError(f"the vocab.txt in {directory} lacks the special tokens {' '.join(missing)} that its "
                    "tokenizer_config.json names; add them to vocab.txt or name its own in tokenizer_config.json")
  if added - set(special):
    raise UserError(f"the tokenizer in {directory} adds tokens to its vocab.txt ({', '.join(sorted(added - set(special))[:5])}), "
                    "which bertjax reads only from tokenizer.json; save it with "
                    "AutoTokenizer.from_pretrained(DIR).save_pretrained(DIR)")
  return wordpiece_settings(named.get("do_lower_case", True), named.get("strip_accents"),
                            named.get("tokenize_chinese_chars", True), special)


def _vocab_json(directory: str, settings: dict) -> str:
  """tokenizer.json text of a bare vocab.txt read with `settings` (vocab_settings), as BertTokenizer builds it."""
  pad, unk, cls, sep, mask = settings["special"]
  tok = tokenizers.BertWordPieceTokenizer(
      os.path.join(directory, "vocab.txt"), unk_token=unk, sep_token=sep, cls_token=cls, pad_token=pad,
      mask_token=mask, clean_text=settings["clean_text"], handle_chinese_chars=settings["chinese_chars"],
      strip_accents=settings["strip_accents"], lowercase=settings["lowercase"],
      wordpieces_prefix=settings["continuation"])
  return tok.to_str()


def _converted(directory: str) -> str:
  """tokenizer.json text for a directory without one, made by transformers from its slow-tokenizer files."""
  try:
    import transformers
  except ImportError:
    raise UserError(f"{directory} has no tokenizer.json, only {', '.join(n for n in _CONVERTED if os.path.isfile(os.path.join(directory, n)))}; "
                    "pip install transformers (to convert it as HF does), or save the tokenizer with "
                    "AutoTokenizer.from_pretrained(DIR).save_pretrained(DIR)") from None
  tok = transformers.AutoTokenizer.from_pretrained(directory, local_files_only=True)
  return tok.backend_tokenizer.to_str()


class HFTokenizer(Tokenizer):
  """An HF fast tokenizer (tokenizer.json) with bertjax's interface, plus HF's own pair template."""

  kind = "hf"

  def __init__(self, directory: str):
    self.path = directory
    path, vocab = os.path.join(directory, "tokenizer.json"), os.path.join(directory, "vocab.txt")
    self.fingerprint = files_fingerprint(directory)
    if os.path.isfile(path):
      with open(path, "rb") as f:
        text = f.read().decode("utf-8")
    elif os.path.isfile(vocab):  # a bare vocab.txt whose settings are not BERT's defaults (from_dir)
      settings = vocab_settings(directory)
      text = _vocab_json(directory, settings)
      with open(vocab, "rb") as f:
        self.fingerprint = wordpiece_fingerprint(f.read(), settings)
    else:  # spiece.model / vocab.json + merges.txt: what transformers makes of them
      text = _converted(directory)
    self._tok = tokenizers.Tokenizer.from_str(text)
    self._tok.no_truncation()
    self._tok.no_padding()
    self.vocab_size = self._tok.get_vocab_size(with_added_tokens=True)
    named = _named(directory)
    ids, self.tokens = {}, {}
    for role, (key, spellings) in ROLES.items():
      candidates = ([_token_text(named[key])] if named.get(key) else []) + list(spellings)
      found = [(t, self._tok.token_to_id(t)) for t in candidates if t and self._tok.token_to_id(t) is not None]
      if not found:
        raise UserError(f"tokenizer in {directory} has no {role} token (tried {', '.join(filter(None, candidates))}); "
                        f"set {key} in its tokenizer_config.json")
      self.tokens[role], ids[role] = found[0]
    self.special = SpecialIds(**ids)
    vocab = self._tok.get_vocab(with_added_tokens=True)
    # WordPiece continues a word with "##"; byte-level BPE ("\u0120") and SentencePiece ("\u2581") mark
    # the space that starts one instead.
    marks = ("\u0120", "\u2581")
    space_marked = any(t.startswith(marks) for t in vocab)
    specials = set(self.tokens.values())
    self._word_start_table = np.ones(self.vocab_size, bool)
    for token, i in vocab.items():
      if i < self.vocab_size:
        self._word_start_table[i] = (token.startswith(marks) or token in specials) if space_marked \
            else not token.startswith("##")

  def _encode_ids(self, text: str) -> list[int]:
    # Fill-mask inputs spell the mask "[MASK]" whatever the checkpoint calls it (RoBERTa: "<mask>").
    text = text.replace("[MASK]", self.tokens["mask"])
    return self._tok.encode(text, add_special_tokens=False).ids

  def encode_offsets(self, text: str) -> tuple[np.ndarray, np.ndarray]:
    enc = self._tok.encode(text, add_special_tokens=False)  # offsets are characters of the original text
    return np.asarray(enc.ids, np.int32), np.asarray(enc.offsets, np.int32).reshape(-1, 2)

  def pair_template(self) -> dict:
    """The checkpoint's pair template: the special tokens around segments A and B with their type ids,
    {"prefix", "middle", "suffix": (ids, type_ids), "a_type", "b_type": int} ([CLS] A [SEP] B [SEP] for
    BERT, <s> A </s></s> B </s> for RoBERTa)."""
    a, b = (self._tok.encode(t, add_special_tokens=False) for t in ("a", "b"))
    out = self._tok.post_process(a, b, add_special_tokens=True)
    # The non-special tokens are A's then B's (sequence_ids are not kept by post_process, the mask is).
    seg = iter([0] * len(a.ids) + [1] * len(b.ids))
    parts, seg_type, part = ([], [], []), {}, 0
    for tok_id, type_id, special in zip(out.ids, out.type_ids, out.special_tokens_mask):
      if special:
        parts[part].append((tok_id, type_id))
      else:
        s = next(seg)
        part, seg_type[s] = s + 1, type_id  # after A comes the middle, after B the suffix
    split = lambda p: ([i for i, _ in p], [t for _, t in p])
    return dict(prefix=split(parts[0]), middle=split(parts[1]), suffix=split(parts[2]), a_type=seg_type[0],
                b_type=seg_type[1])

  def encode_pair(self, a: str, b: str | None, max_len: int) -> tuple[list, list]:
    """(ids, type_ids) of one example with the checkpoint's own template ([CLS] A [SEP] B [SEP], or
    RoBERTa's <s> A </s></s> B </s>), truncating the longer segment first to fit `max_len`."""
    enc = [self._tok.encode(t, add_special_tokens=False) for t in ([a] if b is None else [a, b])]
    budget = max_len - self._tok.num_special_tokens_to_add(b is not None)
    lengths = truncated_lengths([len(e.ids) for e in enc], budget)
    for e, n in zip(enc, lengths):
      e.truncate(n)
    out = self._tok.post_process(enc[0], enc[1] if len(enc) > 1 else None, add_special_tokens=True)
    return out.ids, out.type_ids

  def decode(self, ids) -> str:
    return self._tok.decode([self._check_id(i) for i in ids if int(i) != self.special.pad], skip_special_tokens=False)

  def id_to_token(self, i: int) -> str:
    return self._tok.id_to_token(self._check_id(i))


def truncated_lengths(lengths: list, budget: int) -> list:
  """Segment lengths after HF's longest_first truncation: drop one token from the longest until they fit."""
  lengths = list(lengths)
  while sum(lengths) > budget and max(lengths) > 0:
    lengths[lengths.index(max(lengths))] -= 1
  return lengths


def has_tokenizer(directory: str) -> bool:
  """Whether an HF checkpoint directory holds tokenizer files bertjax can read."""
  return any(os.path.isfile(os.path.join(directory, n)) for n in ("tokenizer.json", "vocab.txt") + _CONVERTED)


def _importable(name: str) -> bool:
  import importlib.util

  return importlib.util.find_spec(name) is not None


def _bertjax_spiece(directory: str) -> bool:
  """A spiece.model as bertjax exports it (no lowercasing, accents kept), with no tokenizer.json."""
  config = _json(os.path.join(directory, "tokenizer_config.json"))
  return (os.path.isfile(os.path.join(directory, "spiece.model"))
          and not os.path.isfile(os.path.join(directory, "tokenizer.json"))
          and config.get("do_lower_case") is False and config.get("keep_accents") is True)


def from_dir(directory: str) -> Tokenizer:
  """The tokenizer of an HF checkpoint directory (see the module docstring); UserError if it has none."""
  if not os.path.isdir(directory):
    raise UserError(f"tokenizer directory {directory!r} does not exist; check the path in hf:DIR")
  vocab = os.path.join(directory, "vocab.txt")
  if not os.path.isfile(os.path.join(directory, "tokenizer.json")) and os.path.isfile(vocab):
    settings = vocab_settings(directory)
    if settings == wordpiece_settings(settings["lowercase"]):  # BERT's: `wordpiece:` says it all
      return WordPieceTokenizer(vocab, lowercase=settings["lowercase"])
    return HFTokenizer(directory)  # accents, CJK or special tokens of its own: the directory is the spec
  spiece = os.path.join(directory, "spiece.model")
  if _bertjax_spiece(directory) and not _importable("transformers"):
    return SentencePieceTokenizer(spiece)  # bertjax's own export: read as transformers would read it
  if has_tokenizer(directory):
    return HFTokenizer(directory)
  raise UserError(f"no tokenizer.json, vocab.txt or spiece.model in {directory!r}; copy the checkpoint's "
                  "tokenizer files there")
