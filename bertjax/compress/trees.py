"""The trees a Tree Transformer induces (model.attention_kind=constituent, bertjax.model.constituent): for a
trained workdir and sentences, one bracketed tree per sentence.

  python -m bertjax.compress.trees --workdir=W --text_file=F      # one sentence a line
  python -m bertjax.compress.trees --workdir=W --sentence="The cat sat on the mat." --sentence="..."

The parse is the authors' (github.com/yaushian/Tree-Transformer parse.py `dump_tree`, as solver.py calls it):
the break probabilities a^l between neighbouring tokens, read from the top layer down. A span splits at its
weakest link; where even that is above `threshold` (0.8) the span is read one layer lower, and at the lowest
layer read (the third, `MIN_LAYER`, or the model's top one if it has fewer) it stays one flat constituent. A part
whose links are all above 0.7 is read one layer lower, others at the same layer. The leaves are the tokenizer's
pieces between [CLS] and [SEP] (SentencePiece's word marks dropped, brackets written -LRB- and -RRB-).
"""

import numpy as np

from bertjax.core.errors import UserError

THRESHOLD = 0.8  # parse.py: a span whose weakest link is above it is not split at this layer
INNER = 0.7  # parse.py: a part whose links are all above it is read one layer lower
MIN_LAYER = 2  # parse.py: the lowest layer read (0-based); the two below it are not used


def parse(breaks, leaves, threshold: float = THRESHOLD, inner: float = INNER, min_layer: int = MIN_LAYER):
  """The tree of `leaves` (n strings) from `breaks` [layers, n - 1] (the link between leaf k and k + 1 at each
  layer), as nested lists of leaves (a constituent of one leaf is the leaf itself)."""
  breaks = np.asarray(breaks, np.float64)
  top = breaks.shape[0] - 1
  low = min(min_layer, top)

  def node(layer, start, end):  # leaves start..end (inclusive): links start..end - 1
    if end - start == 0:
      return leaves[start]
    if end - start == 1:
      return [leaves[start], leaves[end]]
    links = breaks[layer, start:end]
    point = int(np.argmin(links))
    if links[point] > threshold:  # no break here: a flat constituent at the lowest layer, else look lower
      return list(leaves[start:end + 1]) if layer == low else node(max(layer - 1, low), start, end)
    children = []
    for part in (links[:point], links[point + 1:]):
      size = part.shape[0]
      if size == 0:
        children.append(leaves[start])
      else:
        children.append(node(max(layer - 1, low) if part.min() > inner else layer, start, start + size))
      start += size + 1
    return children

  return node(top, 0, len(leaves) - 1)


def bracketed(tree) -> str:
  """A tree of `parse` as one line: (a (b c)); the whole sentence is always inside brackets."""
  text = lambda t: t if isinstance(t, str) else "(" + " ".join(text(c) for c in t) + ")"
  return text(tree if isinstance(tree, list) else [tree])


def _leaf(piece: str) -> str:
  piece = piece.replace("\u2581", "").replace("(", "-LRB-").replace(")", "-RRB-")
  return piece or "_"


def trees(loaded, sentences: list, batch_size: int = 16, max_len: int = 128) -> list:
  """One bracketed tree per sentence from a loaded Tree Transformer (bertjax.hf.inference.Loaded)."""
  from bertjax.hf import inference, tokenizers as hf_tokenizers

  m = loaded.config.model
  if m.attention_kind != "constituent":
    raise UserError(f"this model's model.attention_kind={m.attention_kind} induces no trees; train one with "
                    "model.attention_kind=constituent (configs/tree.py)")
  tok, max_len = inference.tokenizer_and_length(loaded, max_len)
  encoded = [hf_tokenizers.encode_example(tok, s, None, max_len)[0] for s in sentences]
  width = max(len(ids) for ids in encoded)
  out = []
  for first in range(0, len(encoded), batch_size):
    chunk = encoded[first:first + batch_size]
    ids = np.full((batch_size, width), tok.special.pad, np.int32)
    groups = np.zeros_like(ids)
    for i, row in enumerate(chunk):
      ids[i, :len(row)], groups[i, :len(row)] = row, 1
    links = inference.layer_values(loaded.config, loaded.params, ids, np.zeros_like(ids), "break_probs", groups)
    for i, row in enumerate(chunk):
      n = len(row) - 2  # the pieces between [CLS] and [SEP]
      leaves = [_leaf(tok.id_to_token(int(t))) for t in row[1:n + 1]]
      out.append(bracketed(parse(links[:, i, 1:n], leaves)) if n else "()")
  return out


def main():
  """The CLI (flags defined here, not at import)."""
  from absl import flags

  from bertjax.core.cli import cli, run as run_app

  workdir = flags.DEFINE_string("workdir", None, "a bertjax workdir of a model with model.attention_kind=constituent")
  text_file = flags.DEFINE_string("text_file", "", "one sentence a line (blank lines skipped)")
  sentence = flags.DEFINE_multi_string("sentence", [], "a sentence (repeatable); after those of --text_file")
  max_len = flags.DEFINE_integer("max_len", 128, "tokens per sentence at most ([CLS] and [SEP] included)")
  flags.mark_flags_as_required(["workdir"])

  @cli
  def _main(argv):
    if len(argv) > 1:
      raise UserError(f"unexpected arguments {' '.join(argv[1:])}; usage: python -m bertjax.compress.trees "
                      "--workdir=W --text_file=F (or --sentence=S ...)")
    sentences = []
    if text_file.value:
      try:
        sentences = [line.strip() for line in open(text_file.value, encoding="utf-8") if line.strip()]
      except OSError as e:
        raise UserError(f"--text_file={text_file.value}: {e.strerror}; give a file of one sentence a line") from None
    sentences += sentence.value
    if not sentences:
      raise UserError("no sentences: give --text_file=F (one sentence a line) or --sentence=S")
    from bertjax.core import runtime
    from bertjax.hf import inference

    runtime.setup()
    for line in trees(inference.load("", workdir.value), sentences, max_len=max_len.value):
      print(line)

  run_app(_main)


if __name__ == "__main__":
  main()
