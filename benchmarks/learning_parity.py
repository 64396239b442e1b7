"""Learning-curve parity on real text: bertjax and transformers (PyTorch) train the same BERT side by side.

  python benchmarks/learning_parity.py                       # 4 x 256 BERT, MLM + NSP, 1,000 steps of 32 x 128
  python benchmarks/learning_parity.py --steps=200 --plot=/tmp/lp.png --json=/tmp/lp.json

Both sides start from the same weights (bertjax's initialization, exported to HF), train on the same
masked batches (bertjax's loader and on-device masking, step by step) with dropout 0.1 (each side draws
its own), AdamW 1e-3 with BERT's warmup + linear decay and clipping at 1.0, and are evaluated on the same
masked held-out batches every `--eval_every` steps. Target: the final eval MLM loss within 2% of PyTorch's.

Data: `--corpus` (default: ../shared/data/pretrain/*-00.txt, one Wikipedia and one books file, ~34 MB;
one paragraph a line, blank lines between documents). It is prepared once into shards under
`--work_dir` with a SentencePiece vocabulary of `--vocab` trained on it (`python -m bertjax.data.prepare`'s
code path); later runs reuse the shards. Prints both curves, the final difference and tokens/s per side,
and writes a PNG plot (matplotlib) to `--plot`.
"""

import argparse
import json
import os
import sys
import time
import zlib

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
sys.path.insert(1, os.path.join(REPO, "tests"))  # torch_reference: the transformers side, shared with the tests
os.environ.setdefault("HF_HUB_OFFLINE", "1")


def make_config(args):
  from bertjax.core import config as config_lib

  c = config_lib.load(os.path.join(REPO, "configs/bert.py:tiny"))
  c.model.num_layers, c.model.hidden_size, c.model.num_heads, c.model.intermediate_size = (
      args.layers, args.hidden, args.hidden // 64, 4 * args.hidden)
  c.model.vocab_size, c.model.dropout, c.model.attention_dropout = args.vocab, 0.1, 0.1
  c.batch_size, c.seq_len = args.batch_size, args.seq_len
  c.total_steps, c.warmup_steps, c.learning_rate = args.steps, args.steps // 10, args.lr
  c.seed = args.seed
  c.data.source, c.data.split_paragraphs = f"text:{args.corpus}", True
  c.data.tokenizer_sentences, c.data.dupe_factor, c.data.eval_fraction = 300_000, 1, 0.05
  return c


def prepared(config, work_dir: str):
  """Shards of the corpus for this config under work_dir (made once); returns the shards config."""
  from bertjax.data import prepare_lib

  corpus = zlib.crc32(config.data.source.encode())  # another corpus, vocabulary or length: other shards
  out = os.path.join(work_dir, f"shards-{corpus:08x}-v{config.model.vocab_size}-s{config.seq_len}")
  if not os.path.isfile(os.path.join(out, "metadata.json")):
    t0 = time.time()
    meta = prepare_lib.prepare(config, out, workers=os.cpu_count() or 1, overwrite=True)
    print(prepare_lib.summary(meta, out), f"({time.time() - t0:.0f} s)", flush=True)
  shards = config.copy_and_resolve_references()
  shards.data.source = f"shards:{out}"
  return shards


def torch_eval(model, masked_batches):
  """(MLM loss, accuracy) of a BertForPreTraining over bertjax-masked batches, counted as bertjax counts."""
  import numpy as np
  import torch

  import torch_reference as ref

  model.eval()
  loss_sum = correct = n = 0.0
  with torch.no_grad():
    for m in masked_batches:
      kw = ref.mlm_inputs(m)
      logits = model(input_ids=kw["input_ids"], attention_mask=kw["attention_mask"],
                     token_type_ids=kw["token_type_ids"]).prediction_logits
      rows = torch.arange(logits.shape[0])[:, None]
      at = logits[rows, ref.long(m["mlm_positions"])]  # [B, P, V]
      w = torch.tensor(np.asarray(m["mlm_weights"]), dtype=torch.float32)
      labels = ref.long(m["mlm_labels"])
      xent = torch.nn.functional.cross_entropy(at.reshape(-1, at.shape[-1]), labels.reshape(-1), reduction="none")
      loss_sum += float((xent * w.reshape(-1)).sum())
      correct += float(((at.argmax(-1) == labels).float() * w).sum())
      n += float(w.sum())
  model.train()
  return loss_sum / n, correct / n


def main():
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--corpus", default=os.path.join(REPO, "..", "shared", "data", "pretrain", "*-00.txt"))
  p.add_argument("--work_dir", default="/tmp/bertjax-learning-parity")
  p.add_argument("--steps", type=int, default=1000)
  p.add_argument("--eval_every", type=int, default=100)
  p.add_argument("--eval_batches", type=int, default=16, help="held-out batches of --batch_size per eval")
  p.add_argument("--layers", type=int, default=4)
  p.add_argument("--hidden", type=int, default=256)
  p.add_argument("--vocab", type=int, default=8000)
  p.add_argument("--batch_size", type=int, default=32)
  p.add_argument("--seq_len", type=int, default=128)
  p.add_argument("--lr", type=float, default=1e-3)
  p.add_argument("--seed", type=int, default=0)
  p.add_argument("--plot", default="", help="PNG path (default: WORK_DIR/learning_parity.png)")
  p.add_argument("--json", default="", help="also write the curves as JSON here")
  args = p.parse_args()
  from bertjax.core import runtime

  runtime.setup()  # what every entry point does first: platform, host memory, JAX flags
  if args.steps < args.eval_every or args.layers < 1:
    sys.exit("error: --steps must be at least --eval_every")
  import glob

  if not glob.glob(args.corpus):
    sys.exit(f"error: no corpus files match {args.corpus!r}; pass --corpus=GLOB (see ../shared/data/MANIFEST.md)")

  import jax
  import numpy as np
  import torch
  import torch_reference as ref

  from bertjax.core import config as config_lib, sharding
  from bertjax.data import pipeline
  from bertjax.hf import convert
  from bertjax.train import build, step as step_lib

  os.makedirs(args.work_dir, exist_ok=True)
  config = prepared(make_config(args), args.work_dir)
  data = pipeline.build(config)
  special = data.tokenizer.special
  steps = build.make_steps(config, sharding.make_mesh("dp", devices=jax.devices()[:1]), special)
  state = steps.init(jax.random.key(config.seed))
  hf_dir = os.path.join(args.work_dir, "init-hf")
  convert.write_hf(config, jax.tree.map(np.asarray, state.params), hf_dir, special=special)
  torch.manual_seed(config.seed)
  model = ref.load_pretraining("bert", [hf_dir], dropout=True, attn_implementation="sdpa")[""]
  opt, sched, params = ref.adamw(config, [model])
  objectives = config_lib.active_objectives(config)

  masked_fn = jax.jit(lambda b, t: step_lib.training_batch(b, t, steps.cfg))
  eval_sets = list(pipeline.eval_batches(data.eval, config.batch_size))[:args.eval_batches]
  eval_masked_fn = jax.jit(step_lib.eval_batch, static_argnums=2)
  eval_masked = [jax.tree.map(np.asarray, eval_masked_fn(b, i, steps.cfg)) for i, b in enumerate(eval_sets)]
  print(f"BERT {args.layers} x {args.hidden}, vocab {args.vocab}, {args.steps} steps of {config.batch_size} x "
        f"{config.seq_len}; {len(eval_sets)} eval batches; tokenizer {data.tokenizer.spec()}", flush=True)

  def bertjax_eval(params):
    sums = None
    for i, b in enumerate(eval_sets):
      m = jax.device_get(steps.eval(params, b, i))
      sums = m if sums is None else jax.tree.map(np.add, sums, m)
    return sums["mlm_loss"].compute(), sums["mlm_accuracy"].compute()

  curve = {"step": [], "bertjax/mlm_loss": [], "bertjax/mlm_accuracy": [], "torch/mlm_loss": [],
           "torch/mlm_accuracy": [], "bertjax/train_loss": [], "torch/train_loss": []}
  seconds = {"bertjax": 0.0, "torch": 0.0}
  window = {"bertjax": [], "torch": []}
  print(f"{'step':>6} {'bertjax loss':>13} {'torch loss':>11} {'bertjax acc':>12} {'torch acc':>10} {'diff':>7}")
  for t in range(args.steps):
    batch = pipeline.batch_at(data.train, t, config.batch_size, config.seed)
    masked = jax.tree.map(np.asarray, masked_fn(batch, t))
    t0 = time.perf_counter()
    state, metrics = steps.train(state, batch)
    window["bertjax"].append(metrics["loss"].compute())  # waits for the step
    t1 = time.perf_counter()
    window["torch"].append(ref.train_step(ref.pretraining_loss("bert", {"": model}, masked, objectives),
                                          opt, sched, params, config.optimizer.clip_norm))
    seconds["bertjax"] += t1 - t0 if t else 0.0  # step 0 is mostly bertjax's compile
    seconds["torch"] += time.perf_counter() - t1 if t else 0.0
    if (t + 1) % args.eval_every == 0:
      jl, ja = bertjax_eval(state.params)
      tl, ta = torch_eval(model, eval_masked)
      for key, value in (("step", t + 1), ("bertjax/mlm_loss", jl), ("bertjax/mlm_accuracy", ja),
                         ("torch/mlm_loss", tl), ("torch/mlm_accuracy", ta),
                         ("bertjax/train_loss", float(np.mean(window["bertjax"]))),
                         ("torch/train_loss", float(np.mean(window["torch"])))):
        curve[key].append(value)
      window = {"bertjax": [], "torch": []}
      print(f"{t + 1:>6} {jl:>13.4f} {tl:>11.4f} {ja:>12.4f} {ta:>10.4f} {(jl - tl) / tl:>+7.2%}", flush=True)

  tokens = (args.steps - 1) * config.batch_size * config.seq_len
  jl, tl = curve["bertjax/mlm_loss"][-1], curve["torch/mlm_loss"][-1]
  rel = abs(jl - tl) / tl
  print(f"final eval MLM loss: bertjax {jl:.4f}, PyTorch {tl:.4f}, relative difference {rel:.4f} "
        f"({'within' if rel <= 0.02 else 'OUTSIDE'} the 0.02 target)")
  print(f"final eval MLM accuracy: bertjax {curve['bertjax/mlm_accuracy'][-1]:.4f}, "
        f"PyTorch {curve['torch/mlm_accuracy'][-1]:.4f}")
  print(f"train tokens/s (side by side, same process): bertjax {tokens / seconds['bertjax']:,.0f}, "
        f"PyTorch {tokens / seconds['torch']:,.0f}")

  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  fig, axes = plt.subplots(1, 2, figsize=(11, 4))
  for side, style in (("bertjax", "-o"), ("torch", "--s")):
    label = "bertjax" if side == "bertjax" else "transformers (PyTorch)"
    axes[0].plot(curve["step"], curve[f"{side}/mlm_loss"], style, label=label, markersize=3)
    axes[1].plot(curve["step"], curve[f"{side}/mlm_accuracy"], style, label=label, markersize=3)
  axes[0].set(xlabel="step", ylabel="held-out MLM loss", title=f"BERT {args.layers}x{args.hidden}, MLM + NSP")
  axes[1].set(xlabel="step", ylabel="held-out MLM accuracy", title=f"final loss difference {rel:.2%}")
  for ax in axes:
    ax.grid(alpha=0.3)
    ax.legend()
  plot = args.plot or os.path.join(args.work_dir, "learning_parity.png")
  fig.tight_layout()
  fig.savefig(plot, dpi=120)
  print(f"plot: {plot}")
  if args.json:
    with open(args.json, "w") as f:
      json.dump(dict(curve, final_relative_difference=rel, args=vars(args)), f, indent=1)
  return 0 if rel <= 0.02 else 1


if __name__ == "__main__":
  from bertjax.core import cli

  cli.script(main)
