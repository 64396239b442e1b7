"""The one reader of a tokenizer spec string (`spm:PATH`, `wordpiece:PATH[:cased]`, `hf:DIR`): it sits above
bertjax.data.tokenizer (bertjax's own tokenizers) and bertjax.data.hf_tokenizer (a checkpoint's), so neither
imports the other back."""

from bertjax.core.errors import UserError
from bertjax.data import hf_tokenizer
from bertjax.data.tokenizer import SentencePieceTokenizer, SPECS, Tokenizer, WordPieceTokenizer


def load_tokenizer(spec: str) -> Tokenizer:
  """Loads a tokenizer from its spec.

  Args:
    spec: "spm:PATH" (a SentencePiece .model), "wordpiece:PATH" (an uncased BERT vocab.txt),
      "wordpiece:PATH:cased" (a cased one) or "hf:DIR" (an HF checkpoint directory's own tokenizer:
      tokenizer.json, vocab.txt or spiece.model, as transformers loads it; bertjax.data.hf_tokenizer).

  Returns:
    The tokenizer. UserError for a malformed spec, a missing file or a vocabulary without the special
    tokens; there is never a fallback to another tokenizer.
  """
  kind, _, path = spec.partition(":")
  if kind == "spm" and path:
    return SentencePieceTokenizer(path)
  if kind == "wordpiece" and path:
    cased = path.endswith(":cased")
    return WordPieceTokenizer(path.removesuffix(":cased"), lowercase=not cased)
  if kind == "hf" and path:
    return hf_tokenizer.from_dir(path)
  raise UserError(f"bad tokenizer spec {spec!r}; use {SPECS}")
