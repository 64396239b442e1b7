"""Attention analysis (Clark et al. 2019, "What Does BERT Look At?"; Kovaleva et al. 2019): for a checkpoint
and a text file, per layer and head, where attention goes and how spread out it is.

  python -m bertjax.compress.analysis --workdir=W --text_file=F [--out=DIR] [--max_len=128] [--max_texts=200]
  python -m bertjax.compress.analysis --hf_dir=D --text_file=F --input_format=documents ...

Inputs (--input_format): `lines` (default), one input per non-blank line of F, a tab splitting it into
segments A and B ([CLS] A [SEP] B [SEP]; without a tab, [CLS] line [SEP]), truncated to max_len tokens;
`documents`, Clark et al.'s own inputs (their preprocess_unlabeled.py): F holds one sentence a line and a blank
line between documents, and consecutive sentences of a document are packed up to max_len - 3 tokens and cut
at a random sentence boundary into A and B (`document_pairs`). A checkpoint with another pair template (RoBERTa's
<s> A </s></s> B </s>) gets its own.

Statistics, per layer and head, as Clark et al.'s General_Analysis.ipynb computes them: each input's mean over
its query tokens, then the mean over inputs (every input weighs the same, whatever its length).
`entropy` (nats) of a query's attention distribution, `entropy_cls` of [CLS]'s (the first token); the share
of attention on `cls` ([CLS]), `sep` (every [SEP]), `punct` ("." and ","), `self`, `prev` and `next` (the
tokens just before and after the query: Clark's left and right, divided like theirs by all n queries, so
the edge query counts 0); `sep_sep`, the share on [SEP] of the [SEP] queries' attention, and `rest_sep`,
that of all other queries (Clark's sep_sep and rest_sep: divided by the number of [SEP]s and of other
tokens, their 2 and n - 2 for a pair). Entropy is exact (0 log 0 = 0); Clark's notebook mixes 1e-4 of a
uniform distribution into the attention first to avoid log 0, which moves a one-hot head's entropy by about
1e-3 nats. The attention probabilities are the ones the encoder computes (sown in its forward pass,
bertjax.hf.inference), not a re-implementation. Writes DIR/attention.json (the table, and its layer x head
arrays) and DIR/attention.png (a heatmap grid: one layer x head map per statistic).
"""

import json
import os
import random

import numpy as np

from bertjax.core.errors import UserError

STATS = ("entropy", "entropy_cls", "cls", "sep", "sep_sep", "rest_sep", "punct", "self", "prev", "next")
INPUT_FORMATS = ("lines", "documents")
PUNCTUATION = (".", ",")  # Clark et al.'s punct: the tokens "." and ","


def example_stats(probs: np.ndarray, ids, cls_id: int, sep_id: int, punct_ids=()) -> dict:
  """Each statistic of one input: its mean over the input's query tokens (Clark et al.'s denominators).

  probs: [layers, heads, n, n] attention of one unpadded input of n tokens (rows sum to 1).
  ids: its n token ids (where [CLS], [SEP] and the punctuation are); punct_ids: the ids counted as punct.
  Returns name -> [layers, heads], or None where the input has no query of that kind (sep_sep without a
  [SEP], rest_sep with nothing but [SEP]s).
  """
  p = np.asarray(probs, np.float64)
  n = p.shape[-1]
  ids = np.asarray(ids)
  sep = ids == sep_id
  n_sep = int(sep.sum())
  eye = np.arange(n)
  plogp = p * np.log(np.where(p > 0, p, 1.0))
  on = lambda keys: p[..., keys].sum(-1)  # [layers, heads, n]: each query's attention on those keys
  to_sep = on(sep)
  return {
      "entropy": -plogp.sum(-1).sum(-1) / n,
      "entropy_cls": -plogp[..., 0, :].sum(-1),
      "cls": on(ids == cls_id).sum(-1) / n,
      "sep": to_sep.sum(-1) / n,
      "sep_sep": to_sep[..., sep].sum(-1) / n_sep if n_sep else None,
      "rest_sep": to_sep[..., ~sep].sum(-1) / (n - n_sep) if n > n_sep else None,
      "punct": on(np.isin(ids, np.asarray(list(punct_ids), ids.dtype))).sum(-1) / n,
      "self": p[..., eye, eye].sum(-1) / n,
      "prev": p[..., eye[1:], eye[:-1]].sum(-1) / n,
      "next": p[..., eye[:-1], eye[1:]].sum(-1) / n,
  }


def head_stats(examples, cls_id: int, sep_id: int, punct_ids=()) -> dict:
  """name -> [layers, heads] means over `examples` (an iterable of (probs [layers, heads, n, n], ids [n])
  pairs, inputs of any lengths) of each input's own mean (`example_stats`): per document, as Clark et al.
  average, not per token. A statistic no input defines is NaN."""
  sums, counts, inputs = {}, dict.fromkeys(STATS, 0), 0
  for probs, ids in examples:
    inputs += 1
    for name, value in example_stats(probs, ids, cls_id, sep_id, punct_ids).items():
      if value is not None:
        sums[name] = sums.get(name, 0) + value
        counts[name] += 1
  if not inputs:
    raise UserError("no input to analyse: the text file has no non-blank lines")
  shape = np.shape(sums["entropy"])
  return {name: sums[name] / counts[name] if counts[name] else np.full(shape, np.nan) for name in STATS}


def punctuation_ids(tok) -> tuple:
  """The ids of the tokens "." and "," (Clark et al.'s punct), also when spelled with a word-start mark
  (SentencePiece's "\u2581.", byte-level BPE's "\u0120,")."""
  found = []
  for i in range(tok.vocab_size):
    try:
      token = tok.id_to_token(i)
    except (IndexError, KeyError):
      continue
    if token is not None and token.lstrip("\u2581\u0120") in PUNCTUATION:
      found.append(i)
  return tuple(found)


def _pair_template(tok) -> tuple:
  """(prefix, middle, suffix) as (ids, type_ids) and the (A, B) type ids: the checkpoint's own template for
  HF tokenizers, [CLS] A [SEP] B [SEP] for bertjax's."""
  if hasattr(tok, "pair_template"):
    t = tok.pair_template()
    return t["prefix"], t["middle"], t["suffix"], (t["a_type"], t["b_type"])
  s = tok.special
  return ([s.cls], [0]), ([s.sep], [0]), ([s.sep], [1]), (0, 1)


def document_pairs(documents, tok, max_len: int, max_inputs: int = 0, seed: int = 0) -> list:
  """Clark et al.'s inputs (attention-analysis preprocess_unlabeled.py, itself BERT's
  create_pretraining_data without masking or random next segments), as (ids, type_ids) pairs.

  documents: lists of sentences. Per document, sentences are gathered until they reach max_len minus the
  template's special tokens (3 for BERT) or the document ends; the chunk is cut after a random number of its
  sentences (1 if it has one) into A and B; the longer of A and B loses a token from its front or back (a coin
  flip) until they fit; a chunk with an empty A or B ends its document, as theirs does. One seeded
  random.Random draws in their order (randint, then the coin flips), so the same tokens give their pairs.
  Unlike their script, the last document needs no blank line after it; their final shuffle is left out (the
  statistics do not depend on the order)."""
  rng = random.Random(seed)
  (pre, pre_t), (mid, mid_t), (suf, suf_t), (a_type, b_type) = _pair_template(tok)
  target = max_len - len(pre) - len(mid) - len(suf)
  if target < 2:
    raise UserError(f"--max_len={max_len} leaves no room for two segments; use >= {len(pre) + len(mid) + len(suf) + 2}")
  out = []
  for doc in documents:
    sentences = [list(map(int, tok.encode(s)[0])) for s in doc]
    sentences = [s for s in sentences if s]
    chunk, length = [], 0
    for i, sentence in enumerate(sentences):
      chunk.append(sentence)
      length += len(sentence)
      if i < len(sentences) - 1 and length < target:
        continue
      a_end = rng.randint(1, len(chunk) - 1) if len(chunk) >= 2 else 1
      a = [t for s in chunk[:a_end] for t in s]
      b = [t for s in chunk[a_end:] for t in s]
      while len(a) + len(b) > target:  # their truncate_seq_pair
        longer = a if len(a) > len(b) else b
        if rng.random() < 0.5:
          del longer[0]
        else:
          longer.pop()
      if not a or not b:
        break
      out.append((pre + a + mid + b + suf, pre_t + [a_type] * len(a) + mid_t + [b_type] * len(b) + suf_t))
      if max_inputs and len(out) >= max_inputs:
        return out
      chunk, length = [], 0
  return out


def table(stats: dict) -> list:
  """One row per (layer, head): {"layer", "head", and each of STATS}."""
  layers, heads = stats["entropy"].shape
  return [dict(layer=l, head=h, **{k: float(stats[k][l, h]) for k in STATS}) for l in range(layers)
          for h in range(heads)]


def plot(stats: dict, path: str, title: str = ""):
  """The heatmap grid: one [layers x heads] panel per statistic; the shares on one 0..1 colour scale (one
  colour bar: a bar per panel and tight_layout made the figure several times slower to draw)."""
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  layers, heads = stats["entropy"].shape
  fig, axes = plt.subplots(2, 5, figsize=(5 * max(3, 0.35 * heads + 1.5), 2 * max(2.2, 0.3 * layers + 1.2)),
                           gridspec_kw=dict(wspace=0.4))
  shares = None
  for ax, name in zip(axes.flat, STATS):
    entropy = name.startswith("entropy")
    im = ax.imshow(stats[name], cmap="magma" if entropy else "viridis", vmin=0, vmax=None if entropy else 1.0,
                   aspect="auto")
    ax.set_title(f"{name} (nats)" if entropy else f"share on {name}", fontsize=9)
    ax.set_xticks(range(heads))
    ax.set_yticks(range(layers))
    if entropy:
      fig.colorbar(im, ax=ax, fraction=0.046)
    shares = shares or (None if entropy else im)
  for ax in axes[:, 0]:
    ax.set_ylabel("layer")
  for ax in axes[-1]:
    ax.set_xlabel("head")
  fig.colorbar(shares, ax=[ax for ax, name in zip(axes.flat, STATS) if not name.startswith("entropy")],
               fraction=0.02, label="share of attention")
  if title:
    fig.suptitle(title)
  fig.savefig(path, dpi=110)
  plt.close(fig)


def read_inputs(path: str, input_format: str, max_texts: int = 0) -> list:
  """`lines`: the non-blank lines of the file (the first max_texts); `documents`: lists of sentences, one a
  line, a blank line (or more) between documents (max_texts applies to the pairs made of them)."""
  if input_format not in INPUT_FORMATS:
    raise UserError(f"--input_format={input_format!r}; use one of {', '.join(INPUT_FORMATS)}")
  if not os.path.isfile(path):
    raise UserError(f"no text file at {path!r}; give --text_file=FILE with one input per line")
  with open(path, encoding="utf-8") as f:
    lines = [line.strip() for line in f]
  if input_format == "lines":
    lines = [line for line in lines if line]
    return lines[:max_texts] if max_texts else lines
  docs, doc = [], []
  for line in lines + [""]:
    if line:
      doc.append(line)
    elif doc:
      docs.append(doc)
      doc = []
  return docs


def encode_inputs(tok, inputs: list, input_format: str, max_len: int, max_texts: int = 0, seed: int = 0) -> list:
  """(ids, type_ids) of every input: a line ("A<TAB>B" a pair) or Clark et al.'s document pairs."""
  from bertjax.hf import tokenizers as hf_tokenizers

  if input_format == "documents":
    return document_pairs(inputs, tok, max_len, max_texts, seed)
  encoded = []
  for line in inputs:
    a, _, b = line.partition("\t")
    encoded.append(hf_tokenizers.encode_example(tok, a.strip(), b.strip() or None, max_len))
  return encoded


def analyse(loaded, inputs: list, max_len: int = 128, batch_size: int = 16, input_format: str = "lines",
            max_texts: int = 0, seed: int = 0):
  """(stats name -> [layers, heads], number of inputs, tokens) of a loaded model (bertjax.hf.inference.Loaded)
  on `inputs` (`read_inputs`). Inputs are padded to one length per batch (the padding keys get no attention),
  so one compile serves them all; padded query rows are left out."""
  from bertjax.hf import inference

  tok, max_len = inference.tokenizer_and_length(loaded, max_len)
  encoded = encode_inputs(tok, inputs, input_format, max_len, max_texts, seed)
  if not encoded:
    raise UserError("no input to analyse: with --input_format=documents, a document needs two sentences to "
                    "give a pair (blank lines separate documents)")
  width = max(len(ids) for ids, _ in encoded)

  def examples():
    for start in range(0, len(encoded), batch_size):
      chunk = encoded[start:start + batch_size]
      ids = np.full((batch_size, width), tok.special.pad, np.int32)
      types, groups = np.zeros_like(ids), np.zeros_like(ids)
      for i, (row, row_types) in enumerate(chunk):
        ids[i, :len(row)], types[i, :len(row)], groups[i, :len(row)] = row, row_types, 1
      probs = inference.attention_probs(loaded.config, loaded.params, ids, types, groups)
      for i, (row, _) in enumerate(chunk):
        n = len(row)
        yield probs[:, i, :, :n, :n], row

  stats = head_stats(examples(), tok.special.cls, tok.special.sep, punctuation_ids(tok))
  return stats, len(encoded), sum(len(ids) for ids, _ in encoded)


def run(hf_dir: str, workdir: str, text_file: str, out: str, max_len: int = 128, max_texts: int = 200,
        input_format: str = "lines", seed: int = 0) -> dict:
  """The command: loads the checkpoint, analyses the text file, writes attention.json and attention.png."""
  from bertjax.hf import inference

  inputs = read_inputs(text_file, input_format, max_texts)
  if not inputs:
    raise UserError(f"{text_file} has no non-blank lines; give one input per line")
  loaded = inference.load(hf_dir, workdir)
  stats, n, tokens = analyse(loaded, inputs, max_len, input_format=input_format, max_texts=max_texts, seed=seed)
  os.makedirs(out, exist_ok=True)
  result = dict(checkpoint=hf_dir or workdir, text_file=text_file, input_format=input_format, inputs=n,
                tokens=tokens, max_len=max_len, stats=list(STATS), heads=table(stats),
                arrays={k: v.tolist() for k, v in stats.items()})
  with open(os.path.join(out, "attention.json"), "w") as f:
    json.dump(result, f, indent=2)
  plot(stats, os.path.join(out, "attention.png"), f"attention of {os.path.basename(os.path.normpath(hf_dir or workdir))} "
       f"on {n} inputs ({tokens} tokens)")
  print(f"{n} inputs, {tokens} tokens; per layer, the mean over heads:")
  for layer in range(stats["entropy"].shape[0]):
    print(f"layer {layer}: " + ", ".join(f"{k} {stats[k][layer].mean():.3f}" for k in STATS))
  print(f"wrote {out}/attention.json and {out}/attention.png")
  return result


def main():
  """The CLI (flags defined here, not at import, so the library imports beside other CLIs' flags)."""
  from absl import flags

  from bertjax.core.cli import cli, run as run_app

  hf_dir = flags.DEFINE_string("hf_dir", "", "an HF checkpoint directory")
  workdir = flags.DEFINE_string("workdir", "", "a bertjax workdir (a training run or an import)")
  text_file = flags.DEFINE_string("text_file", None, "lines: one input per non-blank line (a tab between segments A "
                                  "and B); documents: one sentence a line, a blank line between documents")
  out = flags.DEFINE_string("out", "", "where attention.json and attention.png go (default: ./attention)")
  max_len = flags.DEFINE_integer("max_len", 128, "tokens per input at most ([CLS] and [SEP] included)")
  max_texts = flags.DEFINE_integer("max_texts", 200, "inputs read from the file at most (0: all)")
  input_format = flags.DEFINE_enum("input_format", "lines", INPUT_FORMATS,
                                   "lines: a line is an input; documents: Clark et al.'s [CLS] A [SEP] B [SEP] of "
                                   "consecutive sentences")
  seed = flags.DEFINE_integer("seed", 0, "documents: the seed of the A/B split points and truncation")
  flags.mark_flags_as_required(["text_file"])

  @cli
  def _main(argv):
    if len(argv) > 1:
      raise UserError(f"unexpected arguments {' '.join(argv[1:])}; usage: python -m bertjax.compress.analysis "
                      "--workdir=W|--hf_dir=D --text_file=F")
    if max_len.value < 3:
      raise UserError(f"--max_len={max_len.value} leaves no room for a token between [CLS] and [SEP]; use >= 3")
    from bertjax.core import runtime

    runtime.setup()
    run(hf_dir.value, workdir.value, text_file.value, out.value or "attention", max_len.value, max_texts.value,
        input_format.value, seed.value)

  run_app(_main)


if __name__ == "__main__":
  main()
