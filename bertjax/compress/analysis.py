"""Attention analysis (Clark et al. 2019, "What Does BERT Look At?"; Kovaleva et al. 2019): for a checkpoint
and a text file, per layer and head, where attention goes and how spread out it is.

  python -m bertjax.compress.analysis --workdir=W --text_file=F [--out=DIR] [--max_len=128] [--max_texts=200]
  python -m bertjax.compress.analysis --hf_dir=D --text_file=F ...

Each non-blank line of F is one input ([CLS] line [SEP], truncated to max_len tokens). Per layer and head,
averaged over every query token of every input: `entropy` (nats) of its attention distribution, and the
share of its attention on `cls` ([CLS]), `sep` (every [SEP]), `self` (the query token itself), `prev` and
`next` (the tokens just before and after it; averaged over the queries that have one). The attention
probabilities are the ones the encoder computes (sown in its forward pass, bertjax.hf.inference), not a
re-implementation. Writes DIR/attention.json (the table, and its layer x head arrays) and
DIR/attention.png (a heatmap grid: one layer x head map per statistic).
"""

import json
import os

import numpy as np

from bertjax.core.errors import UserError

STATS = ("entropy", "cls", "sep", "self", "prev", "next")


def example_stats(probs: np.ndarray, ids, cls_id: int, sep_id: int) -> dict:
  """(sum over query tokens, number of query tokens) of each statistic, for one input.

  probs: [layers, heads, n, n] attention of one unpadded input of n tokens (rows sum to 1).
  ids: its n token ids (where [CLS] and [SEP] are).
  Returns name -> (sums [layers, heads], count): entropy, cls, sep and self over all n queries; prev over
  the n - 1 queries with a previous token, next over those with a next one.
  """
  p = np.asarray(probs, np.float64)
  n = p.shape[-1]
  ids = np.asarray(ids)
  eye = np.arange(n)
  logp = np.log(np.where(p > 0, p, 1.0))
  return {
      "entropy": (-(p * logp).sum(-1).sum(-1), n),
      "cls": (p[..., ids == cls_id].sum(-1).sum(-1), n),
      "sep": (p[..., ids == sep_id].sum(-1).sum(-1), n),
      "self": (p[..., eye, eye].sum(-1), n),
      "prev": (p[..., eye[1:], eye[:-1]].sum(-1), n - 1),
      "next": (p[..., eye[:-1], eye[1:]].sum(-1), n - 1),
  }


def head_stats(examples, cls_id: int, sep_id: int) -> dict:
  """name -> [layers, heads] means over all query tokens of all `examples`, an iterable of (probs [layers,
  heads, n, n], ids [n]) pairs (inputs of any lengths)."""
  sums, counts = {}, dict.fromkeys(STATS, 0)
  for probs, ids in examples:
    for name, (s, c) in example_stats(probs, ids, cls_id, sep_id).items():
      sums[name] = sums.get(name, 0) + s
      counts[name] += c
  if not sums:
    raise UserError("no input to analyse: the text file has no non-blank lines")
  return {name: sums[name] / max(counts[name], 1) for name in STATS}


def table(stats: dict) -> list:
  """One row per (layer, head): {"layer", "head", entropy, cls, sep, self, prev, next}."""
  layers, heads = stats["entropy"].shape
  return [dict(layer=l, head=h, **{k: float(stats[k][l, h]) for k in STATS}) for l in range(layers)
          for h in range(heads)]


def plot(stats: dict, path: str, title: str = ""):
  """The heatmap grid: one [layers x heads] panel per statistic."""
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  layers, heads = stats["entropy"].shape
  fig, axes = plt.subplots(2, 3, figsize=(3 * max(3, 0.35 * heads + 1.5), 2 * max(2.2, 0.3 * layers + 1.2)))
  for ax, name in zip(axes.flat, STATS):
    vmax = None if name == "entropy" else 1.0
    im = ax.imshow(stats[name], cmap="magma" if name == "entropy" else "viridis", vmin=0, vmax=vmax, aspect="auto")
    ax.set_title(f"{name} (nats)" if name == "entropy" else f"share on {name}")
    ax.set_xlabel("head")
    ax.set_ylabel("layer")
    ax.set_xticks(range(heads))
    ax.set_yticks(range(layers))
    fig.colorbar(im, ax=ax, fraction=0.046)
  if title:
    fig.suptitle(title)
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)


def _texts(path: str, max_texts: int) -> list:
  if not os.path.isfile(path):
    raise UserError(f"no text file at {path!r}; give --text_file=FILE with one input per line")
  with open(path, encoding="utf-8") as f:
    lines = [line.strip() for line in f if line.strip()]
  return lines[:max_texts] if max_texts else lines


def analyse(loaded, texts: list, max_len: int = 128, batch_size: int = 16):
  """(stats name -> [layers, heads], number of inputs, tokens) of a loaded model (bertjax.hf.inference.Loaded)
  on `texts`. Inputs are padded to one length per batch (the padding keys get no attention), so one compile
  serves them all; padded query rows are left out."""
  from bertjax.hf import inference, tokenizers as hf_tokenizers

  if loaded.tokenizer is None:
    raise UserError("this checkpoint has no tokenizer files (tokenizer.json, vocab.txt or spiece.model)")
  m = loaded.config.model
  max_len = min(max_len, m.max_positions - m.position_offset)
  tok = loaded.tokenizer
  encoded = [hf_tokenizers.encode_example(tok, t, None, max_len) for t in texts]
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

  stats = head_stats(examples(), tok.special.cls, tok.special.sep)
  return stats, len(encoded), sum(len(ids) for ids, _ in encoded)


def run(hf_dir: str, workdir: str, text_file: str, out: str, max_len: int = 128, max_texts: int = 200) -> dict:
  """The command: loads the checkpoint, analyses the text file, writes attention.json and attention.png."""
  from bertjax.hf import inference

  texts = _texts(text_file, max_texts)
  if not texts:
    raise UserError(f"{text_file} has no non-blank lines; give one input per line")
  loaded = inference.load(hf_dir, workdir)
  stats, n, tokens = analyse(loaded, texts, max_len)
  os.makedirs(out, exist_ok=True)
  result = dict(checkpoint=hf_dir or workdir, text_file=text_file, inputs=n, tokens=tokens, max_len=max_len,
                stats=list(STATS), heads=table(stats), arrays={k: v.tolist() for k, v in stats.items()})
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
  text_file = flags.DEFINE_string("text_file", None, "one input per non-blank line")
  out = flags.DEFINE_string("out", "", "where attention.json and attention.png go (default: ./attention)")
  max_len = flags.DEFINE_integer("max_len", 128, "tokens per input at most ([CLS] and [SEP] included)")
  max_texts = flags.DEFINE_integer("max_texts", 200, "inputs read from the file at most (0: all)")
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
    run(hf_dir.value, workdir.value, text_file.value, out.value or "attention", max_len.value, max_texts.value)

  run_app(_main)


if __name__ == "__main__":
  main()
