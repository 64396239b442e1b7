"""A checkpoint's own tokenizer for inference and fine-tuning: single sentences and pairs with its template.

The tokenizer itself (`hf:DIR`) lives in the data layer, bertjax.data.hf_tokenizer, since training data
is made with it too; this module adds what interop needs on top.
"""

from bertjax.data.hf_tokenizer import (ROLES, TOKENIZER_FILES, HFTokenizer, from_dir,  # noqa: F401 (re-exported)
                                       has_tokenizer, truncated_lengths)
from bertjax.data.tokenizer import Tokenizer
from bertjax.data.tokenizer_spec import load_tokenizer


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


def load_any(spec: str) -> Tokenizer:
  """A tokenizer from any spec, "hf:DIR" included (kept for callers of the interop API: load_tokenizer)."""
  return load_tokenizer(spec)
