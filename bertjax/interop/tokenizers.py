"""A checkpoint's own tokenizer from an HF directory, behind bertjax's Tokenizer interface.

tokenizer.json (HF's fast tokenizer: BERT WordPiece, RoBERTa byte-level BPE, ALBERT unigram) is read with
the `tokenizers` library, so ids, special tokens and pair templates are exactly HF's; a bare vocab.txt
becomes bertjax's WordPieceTokenizer. Specs: "hf:DIR" for the former, bertjax's own specs otherwise.
"""

import json
import os

import numpy as np
import tokenizers

from bertjax.data.tokenizer import SpecialIds, Tokenizer, _fingerprint, load_tokenizer
from bertjax.errors import UserError

# Special-token roles and the spellings to try when the tokenizer config does not name them.
ROLES = {
    "pad": ("pad_token", ("[PAD]", "<pad>")),
    "unk": ("unk_token", ("[UNK]", "<unk>")),
    "cls": ("cls_token", ("[CLS]", "<s>")),
    "sep": ("sep_token", ("[SEP]", "</s>")),
    "mask": ("mask_token", ("[MASK]", "<mask>")),
}
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.txt",
                   "vocab.json", "merges.txt", "spiece.model")


def _json(path: str) -> dict:
  if not os.path.isfile(path):
    return {}
  with open(path) as f:
    return json.load(f)


def _token_text(value):
  """A special token as tokenizer_config.json writes it: a string or an AddedToken dict."""
  return value.get("content") if isinstance(value, dict) else value


class HFTokenizer(Tokenizer):
  """An HF fast tokenizer (tokenizer.json) with bertjax's interface, plus HF's own pair template."""

  kind = "hf"

  def __init__(self, directory: str):
    path = os.path.join(directory, "tokenizer.json")
    with open(path, "rb") as f:
      data = f.read()
    self.path = directory
    self.fingerprint = _fingerprint(data)
    self._tok = tokenizers.Tokenizer.from_str(data.decode("utf-8"))
    self._tok.no_truncation()
    self._tok.no_padding()
    self.vocab_size = self._tok.get_vocab_size(with_added_tokens=True)
    named = {**_json(os.path.join(directory, "special_tokens_map.json")),
             **_json(os.path.join(directory, "tokenizer_config.json"))}
    ids, self.tokens = {}, {}
    for role, (key, spellings) in ROLES.items():
      candidates = ([_token_text(named[key])] if named.get(key) else []) + list(spellings)
      found = [(t, self._tok.token_to_id(t)) for t in candidates if t and self._tok.token_to_id(t) is not None]
      if not found:
        raise UserError(f"tokenizer {path} has no {role} token (tried {', '.join(filter(None, candidates))}); "
                        f"set {key} in tokenizer_config.json")
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


def encode_example(tok: Tokenizer, a: str, b: str | None, max_len: int) -> tuple[list, list]:
  """(ids, type_ids) of a single sentence or a pair, special tokens added, at most `max_len` ids:
  the checkpoint's template for HF tokenizers, [CLS] A [SEP] (B [SEP]) for bertjax's own."""
  if isinstance(tok, HFTokenizer):
    return tok.encode_pair(a, b, max_len)
  segs = [list(tok.encode(a)[0])] + ([] if b is None else [list(tok.encode(b)[0])])
  lengths = truncated_lengths([len(s) for s in segs], max_len - 1 - len(segs))
  s = tok.special
  ids, types = [s.cls, *segs[0][:lengths[0]], s.sep], [0] * (lengths[0] + 2)
  if b is not None:
    ids += [*segs[1][:lengths[1]], s.sep]
    types += [1] * (lengths[1] + 1)
  return ids, types


def from_dir(directory: str) -> Tokenizer:
  """The tokenizer of an HF checkpoint directory: tokenizer.json, else vocab.txt (WordPiece), else a
  bertjax-made spiece.model; UserError if none is there."""
  if os.path.isfile(os.path.join(directory, "tokenizer.json")):
    return HFTokenizer(directory)
  vocab = os.path.join(directory, "vocab.txt")
  if os.path.isfile(vocab):
    lower = _json(os.path.join(directory, "tokenizer_config.json")).get("do_lower_case", True)
    return load_tokenizer(f"wordpiece:{vocab}" + ("" if lower else ":cased"))
  spiece = os.path.join(directory, "spiece.model")
  if os.path.isfile(spiece):
    return load_tokenizer(f"spm:{spiece}")
  raise UserError(f"no tokenizer.json, vocab.txt or spiece.model in {directory!r}; copy the checkpoint's "
                  "tokenizer files there")


def load_any(spec: str) -> Tokenizer:
  """A tokenizer from a spec: "hf:DIR" (an HF checkpoint's files) or any spec `load_tokenizer` takes."""
  if spec.startswith("hf:"):
    return from_dir(spec[3:])
  return load_tokenizer(spec)
