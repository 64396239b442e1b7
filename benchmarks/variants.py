"""Encoder variants at equal parameters and equal steps on real text (issue #48): eval MLM loss and CPU step time
of BERT, ModernBERT, the Tree Transformer, complex-order embeddings and the Lite Transformer's LSRA.

  python benchmarks/variants.py          # 34 min on 2 cores under load average 16-23 (compiles: ~10 of them)
  python benchmarks/variants.py --steps=1000 --layers=4 --hidden=256 --json=/tmp/variants.json
  python benchmarks/variants.py --methods=bert,tree --steps=20   # a subset, quickly

Each method is its preset's model section (METHODS: one line a method, a config file and the overrides that put
it on the shared rows) at `--layers` x `--hidden` (heads of 64), with its feed-forward width chosen so that its
encoder (every parameter but the embeddings and the MLM head) has as many parameters as BERT's (4H MLP): the
widths and both counts are printed. The run is the same for all: the shared text (`--corpus`, default
../shared/data/pretrain/wiki-00.txt, its first `--corpus_mb` MB of whole documents) prepared once into packed rows of `--seq_len` with a BPE vocabulary of
`--vocab` (benchmarks/modern_encoder.py's `prepared`, `python -m bertjax.data.prepare`'s code path), BERT's MLM
(15%, 80/10/10, no NSP), AdamW at `--lr` with 10% warmup and linear decay, clipping 1.0, dropout 0, float32,
`--steps` steps of the same batches, one seed (`--seed`: one run, no spread). Eval: MLM loss on the same held-out
rows with the same masks. Training is bertjax.train's jitted step (build.make_steps), the methods stepped in
turn, so their step times are measured side by side under the same load: the median of each one's steps after
the first (compiles excluded).
"""

import argparse
import json
import os
import statistics
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
sys.path.insert(1, os.path.join(REPO, "benchmarks"))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import modern_encoder as modern  # noqa: E402 (prepared: the shards; trainee, eval_mlm: the steps and the eval)

# name: (preset, overrides of its model section). Adding a method is one line here.
METHODS = {
    "bert": ("configs/bert.py:tiny", {}),
    "modernbert": ("configs/modernbert.py:tiny", {}),
    "tree": ("configs/tree.py:tiny", {}),  # constituent attention in every layer
    # packed rows: positions counted per example (the paper's), not down the whole row (the code's, for single rows)
    "complex_order": ("configs/complex_order.py:tiny", {"complex_positions": "ascending"}),
    "lsra": ("configs/lite.py:tiny", {"lsra_kernel_sizes": ""}),  # the reference's kernels by layer: 3, 7, 15, 31...
}


def base_config(args):
  """The shared run: configs/bert.py:tiny's MLM, optimizer and schedule on the benchmark's rows and sizes."""
  from bertjax.core import config as config_lib

  c = config_lib.load(os.path.join(REPO, "configs/bert.py:tiny"))
  c.model.num_layers, c.model.hidden_size = args.layers, args.hidden
  c.model.num_heads, c.model.intermediate_size = max(1, args.hidden // 64), 4 * args.hidden
  c.model.max_positions = max(c.model.max_positions, args.seq_len)
  c.objectives.nsp = 0.0  # packed rows of whole sentences: MLM only, as every preset here but BERT's
  c.model.vocab_size, c.model.dtype, c.seed = args.vocab, "float32", args.seed
  c.batch_size, c.seq_len, c.total_steps = args.batch_size, args.seq_len, args.steps
  c.warmup_steps, c.warmup_fraction, c.learning_rate = -1, 0.1, args.lr
  source = args.corpus if args.corpus == "demo" else f"text:{args.corpus}"  # demo: Python's docs (the smoke test)
  c.data.source, c.data.split_paragraphs, c.data.format = source, True, "packed"
  c.data.tokenizer_model, c.data.tokenizer_sentences, c.data.eval_fraction = "bpe", 300_000, 0.02
  c.data.dupe_factor = 1
  return c


def method_config(name: str, base, shards):
  """`base` with METHODS[name]'s preset model section (sizes, vocabulary and dropout from `base`), reading the
  prepared `shards`."""
  import ml_collections

  from bertjax.core import config as config_lib

  preset, overrides = METHODS[name]
  c = base.copy_and_resolve_references()
  model = config_lib.load(os.path.join(REPO, preset)).model
  for key in ("num_layers", "hidden_size", "num_heads", "intermediate_size", "vocab_size", "dtype"):
    model[key] = base.model[key]
  model.max_positions = max(model.max_positions, base.seq_len)
  model.type_vocab_size = max(model.type_vocab_size, 1)  # packed rows: every token of type 0
  model.dropout = model.attention_dropout = 0.0  # equal regularization (none) for short runs
  model.update(overrides)
  c.model = ml_collections.ConfigDict(model.to_dict())
  c.data.source, c.data.tokenizer_model = shards.data.source, shards.data.tokenizer_model
  return c


def encoder_params(config) -> tuple:
  """(all parameters, the encoder's) of `config`'s pretraining model, from shapes only (nothing compiled)."""
  import functools

  import jax

  from bertjax.core import sharding
  from bertjax.train import build

  model = build.make_model(config)
  shapes = sharding.strip_boxes(jax.eval_shape(functools.partial(build.init_params, model, config),
                                               jax.random.key(0)))
  size = lambda tree: sum(x.size for x in jax.tree.leaves(tree))
  return size(shapes), size(shapes["encoder"])


def match_width(config, target: int, multiple: int = 0):
  """`config` with the feed-forward width (a multiple of `multiple`, default a quarter of the hidden size, 32 at
  128) whose encoder parameter count is closest to `target`: the count is linear in the width, so two counts give
  the line."""
  c = config.copy_and_resolve_references()
  multiple = multiple or max(8, c.model.hidden_size // 4)
  counts = {}
  for width in (multiple, 2 * multiple):
    c.model.intermediate_size = width
    counts[width] = encoder_params(c)[1]
  slope = (counts[2 * multiple] - counts[multiple]) / multiple
  width = counts[multiple] if slope == 0 else multiple + (target - counts[multiple]) / slope
  c.model.intermediate_size = max(multiple, int(round(width / multiple)) * multiple)
  return c


def corpus_head(pattern: str, megabytes: float, work_dir: str) -> str:
  """A file under work_dir holding the first `megabytes` of the corpus files (sorted), cut at a document boundary
  (a blank line): the steps read far less text than a whole shard file holds, and preparing it costs minutes."""
  import glob
  import zlib

  out = os.path.join(work_dir, f"corpus-{zlib.crc32(pattern.encode()):08x}-{megabytes:g}mb.txt")
  if not os.path.isfile(out):
    limit, parts, size = int(megabytes * 2 ** 20), [], 0
    for path in sorted(glob.glob(pattern)):
      with open(path, encoding="utf-8") as f:
        for document in f.read().split("\n\n"):
          parts.append(document.strip("\n"))
          size += len(parts[-1]) + 2
          if size >= limit:
            break
      if size >= limit:
        break
    with open(out + ".tmp", "w", encoding="utf-8") as f:
      f.write("\n\n".join(parts) + "\n")
    os.replace(out + ".tmp", out)
  return out


def run(args) -> dict:
  """Trains every method `args.steps` steps in turn on the same batches; the table's rows."""
  import jax

  from bertjax.data import pipeline

  base = base_config(args)
  shards = modern.prepared(base, args.work_dir)
  data = pipeline.build(shards)
  names = args.methods.split(",")
  unknown = [n for n in names if n not in METHODS]
  if unknown:
    sys.exit(f"error: unknown methods {unknown}; use {', '.join(METHODS)}")
  target = encoder_params(method_config("bert", base, shards))[1]
  runs = {}
  for name in names:
    c = method_config(name, base, shards)
    c = c if name == "bert" else match_width(c, target)
    steps, state, evals, n_params, fpt = modern.trainee(c, data, args.eval_batches)
    total, encoder = encoder_params(c)
    runs[name] = dict(steps=steps, state=state, evals=evals, times=[], config=c,
                      row=dict(params=n_params, encoder_params=encoder, ffn=c.model.intermediate_size,
                               flops_per_token=fpt))
    assert total == n_params, (name, total, n_params)
    print(f"{name:>14}: {n_params:,} parameters, encoder {encoder:,} (BERT's {target:,}), FFN width "
          f"{c.model.intermediate_size}, {fpt / 1e6:.1f} train MFLOPs/token", flush=True)
  t0 = time.time()
  for t in range(args.steps):
    batch = pipeline.batch_at(data.train, t, base.batch_size, base.seed)
    for name in names:  # in turn: every method's steps see the same load
      r = runs[name]
      start = time.perf_counter()
      r["state"], m = r["steps"].train(r["state"], batch)
      jax.block_until_ready((r["state"], m))
      r["times"].append(time.perf_counter() - start)
    if (t + 1) % max(1, args.steps // 10) == 0:
      print(f"  step {t + 1}/{args.steps} ({time.time() - t0:.0f} s)", flush=True)
  tokens = base.batch_size * base.seq_len
  for name in names:
    r = runs[name]
    loss, acc = modern.eval_mlm(r["steps"], r["state"].params, r["evals"])
    step_s = statistics.median(r["times"][1:] or r["times"])
    r["row"].update(eval_mlm_loss=loss, eval_mlm_accuracy=acc, step_seconds=step_s, tokens_per_sec=tokens / step_s,
                    compile_and_first_step_seconds=r["times"][0])
  return {name: runs[name]["row"] for name in names}


def main():
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--methods", default=",".join(METHODS), help=f"of {', '.join(METHODS)}")
  p.add_argument("--corpus", default=os.path.join(REPO, "..", "shared", "data", "pretrain", "wiki-00.txt"),
                 help="text files (GLOB), or demo (Python's own docs)")
  p.add_argument("--corpus_mb", type=float, default=4.0, help="read the first N MB of whole documents (0: all)")
  p.add_argument("--work_dir", default="/tmp/bertjax-variants")
  p.add_argument("--layers", type=int, default=2)
  p.add_argument("--hidden", type=int, default=128)
  p.add_argument("--vocab", type=int, default=8000)
  p.add_argument("--seq_len", type=int, default=128)
  p.add_argument("--batch_size", type=int, default=8)
  p.add_argument("--steps", type=int, default=200)
  p.add_argument("--lr", type=float, default=1e-3)
  p.add_argument("--eval_batches", type=int, default=16)
  p.add_argument("--seed", type=int, default=0)
  p.add_argument("--json", default="", help="also write the table as JSON here")
  args = p.parse_args()
  from bertjax.core import runtime

  runtime.setup()
  import glob

  if args.corpus != "demo" and not glob.glob(args.corpus):
    sys.exit(f"error: no corpus files match {args.corpus!r}; pass --corpus=GLOB (see ../shared/data/MANIFEST.md)")
  os.makedirs(args.work_dir, exist_ok=True)
  if args.corpus != "demo" and args.corpus_mb > 0:
    args.corpus = corpus_head(args.corpus, args.corpus_mb, args.work_dir)
  t0 = time.time()
  rows = run(args)
  print(f"\n{args.layers} layers x {args.hidden}, batch {args.batch_size} x {args.seq_len}, {args.steps} steps, "
        f"vocab {args.vocab}, lr {args.lr:g}, seed {args.seed} (one run); {os.cpu_count()} cores "
        f"({time.time() - t0:.0f} s in all)")
  print(f"{'method':>14} {'params':>10} {'encoder':>9} {'FFN':>5} {'eval MLM loss':>13} {'MLM acc':>8} "
        f"{'step s':>7} {'tok/s':>7}")
  for name, r in rows.items():
    print(f"{name:>14} {r['params']:>10,} {r['encoder_params']:>9,} {r['ffn']:>5} {r['eval_mlm_loss']:>13.4f} "
          f"{r['eval_mlm_accuracy']:>8.4f} {r['step_seconds']:>7.3f} {r['tokens_per_sec']:>7,.0f}")
  if args.json:
    with open(args.json, "w") as f:
      json.dump(dict(args=vars(args), rows=rows), f, indent=1)


if __name__ == "__main__":
  from bertjax.core import cli

  cli.script(main)
