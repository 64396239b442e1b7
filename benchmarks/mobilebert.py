"""MobileBERT on this CPU (issue #45): a tiny IB-BERT teacher -> MobileBERT student through every phase of
progressive knowledge transfer and pre-training distillation, against the same student trained from scratch for
the same steps; and the inference speed of MobileBERT against BERT-base at equal sequence length.

  python benchmarks/mobilebert.py                      # ~15 min on 2 busy cores
  python benchmarks/mobilebert.py --teacher_steps=600 --phase_steps=100 --distill_steps=400 --mb=1.0
  python benchmarks/mobilebert.py --parts=speed         # the speed ratio only

Data: the first `--mb` MB (whole documents) of ../shared/data/pretrain/wiki-00.txt and books-00.txt (one
paragraph a line, split into sentences), NSP pairs, a SentencePiece vocabulary of 2,000 trained on it; the
runs are the README's commands at `--batch_size` x `--seq_len`:

(a) **Transfer vs scratch.** `python -m bertjax.train --config=configs/mobilebert.py:ib_bert_tiny` (the teacher:
    4 layers, inter-block 64, intra-block 128, LayerNorm, GELU), then `python -m bertjax.distill
    --config=configs/mobilebert.py:tiny_transfer --config.distill.compare=True` (the student: 4 MobileBERT layers,
    bottleneck 32, 4 FFNs, NoNorm, ReLU, trigram inputs): 4 phases of `--phase_steps`, then `--distill_steps` of
    MLM against 0.5 one-hot + 0.5 teacher + NSP, and the same student trained from scratch (MLM + NSP) for the two
    stages' steps together. Reported: each one's final eval MLM accuracy and loss (the same held-out documents
    and masks).
(b) **Inference speed.** configs/mobilebert.py:mobilebert (24 layers, 25M encoder params) and configs/bert.py:base
    (12 x 768, 110M), float32, random weights, the encoder's forward pass over `--speed_batch` x `--speed_seq_len`
    tokens, jitted; rounds alternate between the two (the machine is shared: only the ratio measured side by side
    means anything). The paper's 5.5x is on a Pixel 4 phone (TFLite); this is XLA on this CPU.
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
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def text_slice(pretrain: str, mb: float, out: str) -> str:
  """benchmarks/continued_pretraining.py's slice of the shared text (imported lazily: that module loads the
  fine-tuning benchmark too)."""
  from continued_pretraining import text_slice as slice_

  return slice_(pretrain, mb, out)


def run(command, env):
  print(" ".join(command), flush=True)
  t0 = time.time()
  subprocess.run(command, cwd=REPO, env=env, check=True)
  return time.time() - t0


def transfer_vs_scratch(args, work: str) -> dict:
  """(a): the teacher, then the transfer and the scratch baseline; their final evals and wall times."""
  env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
  source = text_slice(os.path.join(args.data, "pretrain"), args.mb, os.path.join(work, "text"))
  common = [f"--config.data.source={source}", "--config.data.split_paragraphs=True",
            f"--config.batch_size={args.batch_size}", f"--config.seq_len={args.seq_len}",
            f"--config.model.max_positions={args.seq_len}", f"--config.data.cache_dir={os.path.join(work, 'cache')}"]
  teacher = os.path.join(work, "teacher")
  every = lambda n: [f"--config.log_every={max(1, n // 5)}", f"--config.eval_every={n}", f"--config.checkpoint_every={n}"]
  t_teacher = run([sys.executable, "-m", "bertjax.train", "--config=configs/mobilebert.py:ib_bert_tiny", *common,
                   f"--config.total_steps={args.teacher_steps}", *every(args.teacher_steps), f"--workdir={teacher}"], env)
  student = os.path.join(work, "student")
  transfer_steps = 4 * args.phase_steps
  t_student = run([sys.executable, "-m", "bertjax.distill", "--config=configs/mobilebert.py:tiny_transfer", *common,
                   f"--config.teacher={teacher}", f"--config.transfer.steps={transfer_steps}",
                   f"--config.total_steps={args.distill_steps}", *every(args.distill_steps),
                   "--config.distill.compare=True", f"--workdir={student}"], env)
  with open(os.path.join(teacher, "metrics.jsonl")) as f:
    teacher_eval = [m for m in map(json.loads, f) if "eval/mlm_accuracy" in m][-1]
  with open(os.path.join(student, "comparison.json")) as f:
    comparison = json.load(f)
  return dict(teacher_mlm_accuracy=teacher_eval["eval/mlm_accuracy"],
              transfer_mlm_accuracy=comparison["distilled"]["eval/mlm_accuracy"],
              scratch_mlm_accuracy=comparison["without_teacher"]["eval/mlm_accuracy"],
              teacher_mlm_loss=teacher_eval["eval/mlm_loss"], transfer_mlm_loss=comparison["distilled"]["eval/mlm_loss"],
              scratch_mlm_loss=comparison["without_teacher"]["eval/mlm_loss"],
              steps=dict(teacher=args.teacher_steps, transfer=transfer_steps, distill=args.distill_steps,
                         scratch=transfer_steps + args.distill_steps),
              seconds=dict(teacher=t_teacher, transfer_distill_and_scratch=t_student))


def speed(args) -> dict:
  """(b): median seconds per forward pass of each encoder and the ratio, alternating rounds."""
  from bertjax.core import config as config_lib, runtime

  runtime.setup()
  import jax
  import jax.numpy as jnp
  from bertjax.train import build

  fns = {}
  for name, spec in (("mobilebert", "configs/mobilebert.py:mobilebert"), ("bert_base", "configs/bert.py:base")):
    c = config_lib.load(os.path.join(REPO, spec))
    c.model.dtype, c.model.attention, c.seq_len = "float32", "xla", args.speed_seq_len
    model = build.make_model(c)
    params = jax.jit(lambda r, m=model, c=c: build.init_params(m, c, r))(jax.random.key(0))
    ids = jnp.full((args.speed_batch, args.speed_seq_len), 7, jnp.int32)
    fwd = jax.jit(lambda p, i, m=model: m.apply({"params": p}, i, jnp.zeros_like(i), jnp.ones_like(i), method="encode"))
    fwd(params, ids).block_until_ready()  # compile
    fns[name] = (fwd, params, ids, sum(x.size for x in jax.tree.leaves(params["encoder"])))
  times = {name: [] for name in fns}
  for _ in range(args.rounds):
    for name, (fwd, params, ids, _) in fns.items():
      t0 = time.perf_counter()
      for _ in range(args.reps):
        fwd(params, ids).block_until_ready()
      times[name].append((time.perf_counter() - t0) / args.reps)
  med = {name: statistics.median(t) for name, t in times.items()}
  return dict(batch=args.speed_batch, seq_len=args.speed_seq_len, ms_per_batch={k: 1e3 * v for k, v in med.items()},
              encoder_params={k: int(v[3]) for k, v in fns.items()}, speedup=med["bert_base"] / med["mobilebert"])


def main():
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--parts", default="transfer,speed")
  p.add_argument("--data", default=os.path.join(REPO, "..", "shared", "data"))
  p.add_argument("--mb", type=float, default=0.3, help="MB of text from each of wiki-00 and books-00")
  p.add_argument("--batch_size", type=int, default=16)
  p.add_argument("--seq_len", type=int, default=64)
  p.add_argument("--teacher_steps", type=int, default=300)
  p.add_argument("--phase_steps", type=int, default=40, help="steps per phase (4 phases: one per student layer)")
  p.add_argument("--distill_steps", type=int, default=160)
  p.add_argument("--speed_batch", type=int, default=8)
  p.add_argument("--speed_seq_len", type=int, default=128)
  p.add_argument("--rounds", type=int, default=3)
  p.add_argument("--reps", type=int, default=3)
  p.add_argument("--workdir", default="")
  p.add_argument("--json", default="")
  args = p.parse_args()
  work = args.workdir or tempfile.mkdtemp(prefix="mobilebert-")
  parts = set(args.parts.split(","))
  out = {}
  if "transfer" in parts:
    out["transfer"] = a = transfer_vs_scratch(args, work)
    print(f"\n(a) eval MLM accuracy after {a['steps']['scratch']} student steps (batch {args.batch_size} x "
          f"{args.seq_len}): progressive transfer + distillation {a['transfer_mlm_accuracy']:.4f}, from scratch "
          f"{a['scratch_mlm_accuracy']:.4f} (teacher after {args.teacher_steps} steps: {a['teacher_mlm_accuracy']:.4f}); "
          f"eval MLM loss {a['transfer_mlm_loss']:.4f}, {a['scratch_mlm_loss']:.4f} (teacher {a['teacher_mlm_loss']:.4f})",
          flush=True)
  if "speed" in parts:
    out["speed"] = s = speed(args)
    print(f"\n(b) forward pass, batch {s['batch']} x {s['seq_len']}, float32: MobileBERT "
          f"{s['ms_per_batch']['mobilebert']:.1f} ms ({s['encoder_params']['mobilebert']:,} encoder params), BERT-base "
          f"{s['ms_per_batch']['bert_base']:.1f} ms ({s['encoder_params']['bert_base']:,}): {s['speedup']:.2f}x", flush=True)
  if args.json:
    with open(args.json, "w") as f:
      json.dump(out, f, indent=2)


if __name__ == "__main__":
  from bertjax.core import cli

  cli.script(main)
