"""ModernBERT-class encoders on real text (issue #37): unpadding, speed against transformers, learning curves.

  python benchmarks/modern_encoder.py                                   # all three parts (~40 min on 2 busy cores)
  python benchmarks/modern_encoder.py --parts=a,b --steps=3 --rounds=2  # the two speed ratios only
  python benchmarks/modern_encoder.py --parts=c --curve_steps=200 --json=/tmp/modern.json
  python benchmarks/modern_encoder.py --layers=4 --hidden=256 --batch_size=8   # larger, for a quieter machine

Data: `--corpus` (default ../shared/data/pretrain/{wiki,books}-00.txt: Wikipedia articles and books, one
paragraph a line, blank lines between documents), prepared once under `--work_dir` into `packed` rows of
`--seq_len` (ModernBERT's 1,024; (c): `--curve_seq_len`) with a BPE SentencePiece vocabulary of `--vocab` trained
on it (`python -m bertjax.data.prepare`'s
code path). An example is a run of whole sentences of one document, at most seq_len - 2 tokens (a document
longer than that gives several); the packed rows put several examples side by side, each with its own group
(attention stays inside it) and positions restarting at 0 (RoPE restarts).

(a) **Unpadded vs padded**, one small ModernBERT (`--layers` x `--hidden`, GeGLU, RoPE, local/global attention),
    the same examples: packed rows against one example per row padded to seq_len (what a padded trainer
    computes). Equal parameters, equal real tokens; reported as real tokens/s, alternating rounds in one process.
(b) **bertjax vs transformers' ModernBertForMaskedLM** (PyTorch, in its own process, all cores), same sizes,
    same packed batches masked once by bertjax (30%): HF gets the rows' block-diagonal masks (and their
    sliding-window form) as its `attention_mask` dict and per-example `position_ids`, and `sparse_prediction`
    so its decoder runs on the masked positions only, as bertjax's does. Both AdamW (StableAdamW is not in
    torch), no clipping, dropout 0, float32. Steps alternate in rounds (the machine is shared: only the ratio
    measured side by side means anything).
(c) **Learning curves at equal compute**: a small BERT (post-LN, learned positions, GELU MLP 4H, biases; MLM
    only at 15%, AdamW, linear decay, clip 1.0) and a small ModernBERT (the tiny recipe of
    configs/modernbert.py: 30% masking, StableAdamW, warmup-stable-decay) of about the same parameters (GeGLU
    width 8H/3 matches the MLP's 2 x H x 4H), the same steps, batch and rows; eval MLM loss on the same held-out
    rows at 15% masking (masking.eval_mask_prob) every `--eval_every` steps. BERT trains without NSP so that
    both see the same packed rows.
"""

import argparse
import json
import multiprocessing
import os
import statistics
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402


def modern_config(args, curve: bool = False):
  """configs/modernbert.py:tiny at the benchmark's sizes (heads of 64, GeGLU width 8H/3 rounded to 32, so that
  its 3 x H x width parameters match an MLP's 2 x H x 4H); `curve`: at (c)'s length, window and batch."""
  from bertjax.core import config as config_lib

  c = config_lib.load(os.path.join(REPO, "configs/modernbert.py:tiny"))
  c.model.num_layers, c.model.hidden_size, c.model.num_heads = args.layers, args.hidden, max(1, args.hidden // 64)
  c.model.intermediate_size = max(32, round(8 * args.hidden / 3 / 32) * 32)
  # ModernBERT's: a 128-token window, global every third layer (layer 0 global).
  c.model.local_window, c.model.global_every = (args.curve_window if curve else args.window), 3
  _common(c, args, curve)
  return c


def bert_config(args):
  """configs/bert.py:tiny at the same layers and width (MLP 4H), MLM only, on the same packed rows."""
  from bertjax.core import config as config_lib

  c = config_lib.load(os.path.join(REPO, "configs/bert.py:tiny"))
  c.model.num_layers, c.model.hidden_size, c.model.num_heads = args.layers, args.hidden, max(1, args.hidden // 64)
  c.model.intermediate_size, c.model.max_positions = 4 * args.hidden, args.curve_seq_len
  c.objectives.nsp = 0.0  # the same rows as ModernBERT's (NSP needs pairs)
  c.model.dropout = c.model.attention_dropout = 0.0  # as ModernBERT's released config: equal regularization
  _common(c, args, True)
  return c


def _common(c, args, curve: bool):
  c.model.vocab_size, c.model.dtype, c.seed = args.vocab, "float32", args.seed
  c.batch_size, c.seq_len = (args.curve_batch_size, args.curve_seq_len) if curve else (args.batch_size, args.seq_len)
  c.total_steps, c.warmup_steps, c.warmup_fraction = args.curve_steps, -1, 0.1
  c.learning_rate = args.lr
  c.masking.eval_mask_prob = 0.15  # eval at 15% for both (ModernBERT: yamls/modernbert eval_loader)
  c.data.source, c.data.split_paragraphs, c.data.format = f"text:{args.corpus}", True, "packed"
  c.data.tokenizer_model, c.data.tokenizer_sentences, c.data.eval_fraction = "bpe", 300_000, 0.02
  c.data.dupe_factor = 1


def prepared(config, work_dir: str):
  """The config reading shards of the corpus under work_dir (prepared once)."""
  import zlib

  from bertjax.data import prepare_lib

  import shutil

  key = zlib.crc32(config.data.source.encode())
  out = os.path.join(work_dir, f"shards-{key:08x}-v{config.model.vocab_size}-s{config.seq_len}")
  tokenizer = os.path.join(work_dir, f"tokenizer-{key:08x}-v{config.model.vocab_size}.model")
  if not os.path.isfile(os.path.join(out, "metadata.json")):
    if os.path.isfile(tokenizer):  # another length of the same corpus: the same vocabulary, trained once
      config = config.copy_and_resolve_references()
      config.data.tokenizer = f"spm:{tokenizer}"
    t0 = time.time()
    meta = prepare_lib.prepare(config, out, workers=os.cpu_count() or 1, overwrite=True)
    print(prepare_lib.summary(meta, out), f"({time.time() - t0:.0f} s)", flush=True)
  if not os.path.isfile(tokenizer):
    shutil.copy(os.path.join(out, "tokenizer.model"), tokenizer)
  shards = config.copy_and_resolve_references()
  shards.data.source = f"shards:{out}"
  return shards


def sample_rows(data, n: int, seed: int) -> dict:
  """n train rows drawn as the loader draws them (a seeded permutation): the file's own order groups long
  documents (a book's full rows) together."""
  from bertjax.data import pipeline

  return pipeline.batch_at(data.train, 0, n, seed)


def unpacked(rows: dict, pad: int) -> dict:
  """One example per row, padded to the same length: the padded layout of the same examples."""
  out = {k: [] for k in ("input_ids", "word_start", "groups", "position_ids")}
  for r in range(len(rows["input_ids"])):
    for g in range(1, rows["groups"][r].max() + 1):
      at = rows["groups"][r] == g
      n = int(at.sum())
      width = rows["input_ids"].shape[1]
      pad_to = lambda x, fill: np.concatenate([x, np.full(width - n, fill, x.dtype)])
      out["input_ids"].append(pad_to(rows["input_ids"][r][at], pad))
      out["word_start"].append(pad_to(rows["word_start"][r][at], False))
      out["groups"].append(pad_to(np.ones(n, np.int32), 0))
      out["position_ids"].append(np.arange(width, dtype=np.int32))
  return {k: np.stack(v) for k, v in out.items()}


def batches_of(layout: dict, batch_size: int, count: int) -> list:
  """The first `count` batches of a layout, with the loader's other fields."""
  out = []
  for i in range(count):
    b = {k: v[i * batch_size:(i + 1) * batch_size] for k, v in layout.items()}
    b["type_ids"] = np.zeros_like(b["input_ids"])
    b["sentence_label"] = np.zeros(batch_size, np.int32)
    b["example_weight"] = np.ones(batch_size, np.float32)
    out.append(b)
  return out


def timed(steps, state, batches, n: int):
  """(state, [seconds]) of n train steps cycling over `batches` (each waited for)."""
  import jax

  times = []
  for i in range(n):
    t0 = time.perf_counter()
    state, m = steps.train(state, batches[i % len(batches)])
    jax.block_until_ready((state, m))
    times.append(time.perf_counter() - t0)
  return state, times


def real_tokens(batches) -> float:
  return float(np.mean([np.count_nonzero(b["groups"]) for b in batches]))


def part_a(config, data, args) -> dict:
  """Unpadded (packed rows) vs padded (one example per row) real tokens/s on one model and mesh."""
  import jax

  from bertjax.core import sharding
  from bertjax.train import build

  b, n = config.batch_size, args.batches
  packed_rows = sample_rows(data, n * b, config.seed)
  packed = batches_of({k: packed_rows[k] for k in ("input_ids", "word_start", "groups", "position_ids")}, b, n)
  padded_rows = unpacked(packed_rows, data.tokenizer.special.pad)
  padded = batches_of(padded_rows, b, len(padded_rows["input_ids"]) // b)
  steps = build.make_steps(config, sharding.make_mesh("dp", devices=jax.devices()[:1]), data.tokenizer.special)
  state = steps.init(jax.random.key(0))
  state, _ = timed(steps, state, packed, 2)  # compile (one shape serves both layouts) and warm up
  times = {"packed": [], "padded": []}
  for _ in range(args.rounds):
    for name, bs in (("packed", packed), ("padded", padded)):
      state, t = timed(steps, state, bs, args.steps)
      times[name] += t
  r = {}
  for name, bs in (("packed", packed), ("padded", padded)):
    tokens = real_tokens(bs)
    r[name] = dict(real_tokens_per_batch=tokens, efficiency=tokens / (b * config.seq_len),
                   step_seconds=statistics.median(times[name]),
                   real_tokens_per_sec=tokens / statistics.median(times[name]))
  r["ratio"] = r["packed"]["real_tokens_per_sec"] / r["padded"]["real_tokens_per_sec"]
  r["examples_per_packed_row"] = len(padded_rows["input_ids"]) / (n * b)
  return r


def hf_config(config):
  """transformers' ModernBertConfig of a bertjax ModernBERT config (same sizes, windows, thetas, dropout 0)."""
  from transformers import ModernBertConfig

  m = config.model
  types = ["full_attention" if i % m.global_every == 0 else "sliding_attention" for i in range(m.num_layers)]
  return ModernBertConfig(
      vocab_size=m.vocab_size, hidden_size=m.hidden_size, num_hidden_layers=m.num_layers,
      num_attention_heads=m.num_heads, intermediate_size=m.intermediate_size, max_position_embeddings=m.max_positions,
      norm_eps=m.layer_norm_eps, layer_types=types, local_attention=m.local_window, global_rope_theta=m.rope_theta,
      local_rope_theta=m.local_rope_theta, sparse_prediction=True, attention_dropout=0.0, mlp_dropout=0.0,
      embedding_dropout=0.0, pad_token_id=0, bos_token_id=None, eos_token_id=None, cls_token_id=None,
      sep_token_id=None, attn_implementation="sdpa")


def torch_inputs(masked: dict, window: int) -> dict:
  """HF's inputs for a bertjax-masked packed batch: masks that keep each example apart (a padding position
  sees only itself, so no softmax row is empty), their sliding-window form (|i - j| <= window // 2, HF's
  rule), per-example positions, and labels on the scored slots only."""
  g = np.asarray(masked["groups"])
  same = (g[:, :, None] == g[:, None, :]) & (g[:, None, :] > 0)
  same |= np.eye(g.shape[1], dtype=bool)[None]
  pos = np.asarray(masked["position_ids"])
  near = np.abs(pos[:, :, None] - pos[:, None, :]) <= window // 2
  labels = np.full(g.shape, -100, np.int64)
  rows = np.arange(g.shape[0])[:, None]
  w = np.asarray(masked["mlm_weights"]) > 0
  p = np.asarray(masked["mlm_positions"])
  labels[np.broadcast_to(rows, p.shape)[w], p[w]] = np.asarray(masked["original_ids"])[np.broadcast_to(rows, p.shape)[w], p[w]]
  return dict(input_ids=np.asarray(masked["input_ids"], np.int64), position_ids=pos.astype(np.int64),
              full=same[:, None], sliding=(same & near)[:, None], labels=labels)


def torch_process(conn, hf_kwargs: dict, batches: list, lr: float, threads: int):
  """The PyTorch side: ModernBertForMaskedLM and AdamW; answers ("steps", n) with n step times."""
  import torch

  from transformers import ModernBertConfig, ModernBertForMaskedLM

  torch.set_num_threads(threads)
  torch.manual_seed(0)
  model = ModernBertForMaskedLM(ModernBertConfig(**hf_kwargs)).train()
  opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.98), eps=1e-6, weight_decay=0.0)
  tb = [{k: torch.as_tensor(v) for k, v in b.items()} for b in batches]
  conn.send(dict(threads=torch.get_num_threads(), version=torch.__version__,
                 params=sum(p.numel() for p in model.parameters())))
  i = 0
  while (msg := conn.recv())[0] != "close":
    times = []
    for _ in range(msg[1]):
      b = tb[i % len(tb)]
      i += 1
      t0 = time.perf_counter()
      out = model(input_ids=b["input_ids"], position_ids=b["position_ids"], labels=b["labels"],
                  attention_mask={"full_attention": b["full"], "sliding_attention": b["sliding"]})
      out.loss.backward()
      opt.step()
      opt.zero_grad(set_to_none=True)
      times.append(time.perf_counter() - t0)
    conn.send(times)


def part_b(config, data, args) -> dict:
  """bertjax's train step vs ModernBertForMaskedLM's on the same packed, masked batches."""
  import jax

  from bertjax.core import sharding
  from bertjax.train import build, step as step_lib

  b = config.batch_size
  rows = sample_rows(data, args.batches * b, config.seed)
  batches = batches_of({k: rows[k] for k in ("input_ids", "word_start", "groups", "position_ids")}, b, args.batches)
  steps = build.make_steps(config, sharding.make_mesh("dp", devices=jax.devices()[:1]), data.tokenizer.special)
  masked = [jax.tree.map(np.asarray, step_lib.training_batch(x, 0, steps.cfg)) for x in batches]
  hf = hf_config(config)
  ctx = multiprocessing.get_context("spawn")
  conn, child = ctx.Pipe()
  proc = ctx.Process(target=torch_process, daemon=True, args=(
      child, hf.to_dict(), [torch_inputs(m, config.model.local_window) for m in masked], config.learning_rate,
      args.threads or os.cpu_count()))
  proc.start()
  info = conn.recv()
  state = steps.init(jax.random.key(0))
  state, _ = timed(steps, state, batches, 2)
  conn.send(("steps", 2))
  conn.recv()
  jax_times, torch_times = [], []
  for _ in range(args.rounds):
    state, t = timed(steps, state, batches, args.steps)
    jax_times += t
    time.sleep(0.5)  # let the other runtime's threads go idle
    conn.send(("steps", args.steps))
    torch_times += conn.recv()
    time.sleep(0.5)
  conn.send(("close",))
  proc.join()
  tokens = real_tokens(batches)
  n_params = sum(x.size for x in jax.tree.leaves(state.params))
  return dict(bertjax_params=n_params, torch_params=info["params"], torch=info["version"], threads=info["threads"],
              real_tokens_per_batch=tokens, bertjax_step_seconds=statistics.median(jax_times),
              torch_step_seconds=statistics.median(torch_times),
              bertjax_real_tokens_per_sec=tokens / statistics.median(jax_times),
              torch_real_tokens_per_sec=tokens / statistics.median(torch_times),
              ratio=statistics.median(torch_times) / statistics.median(jax_times))


def trainee(config, data, eval_batches: int) -> tuple:
  """(steps, fresh state, the first `eval_batches` eval batches, parameter count, train FLOPs per token) of
  `config` on one device: bertjax.train.build's jitted steps, as the pretraining loop builds them."""
  import jax

  from bertjax.core import sharding
  from bertjax.data import pipeline
  from bertjax.model import flops
  from bertjax.train import build

  steps = build.make_steps(config, sharding.make_mesh("dp", devices=jax.devices()[:1]), data.tokenizer.special)
  state = steps.init(jax.random.key(config.seed))
  evals = list(pipeline.eval_batches(data.eval, config.batch_size))[:eval_batches]
  n_params = sum(x.size for x in jax.tree.leaves(state.params))
  fpt = flops.model_train_flops_per_token(steps.model, config.seq_len, steps.cfg.masking.max_predictions,
                                          steps.cfg.masking.max_shuffled)
  return steps, state, evals, n_params, fpt


def eval_mlm(steps, params, evals) -> tuple:
  """(MLM loss, MLM accuracy) over `evals`, each batch masked by its index (the same masks for every model whose
  masking config is the same)."""
  import jax

  sums = None
  for i, e in enumerate(evals):
    m = jax.device_get(steps.eval(params, e, i))
    sums = m if sums is None else jax.tree.map(np.add, sums, m)
  return float(sums["mlm_loss"].compute()), float(sums["mlm_accuracy"].compute())


def learning_curve(config, data, args, name: str) -> dict:
  """Trains `config` for config.total_steps, evaluating every eval_every steps on the first eval batches."""
  from bertjax.data import pipeline

  steps, state, evals, n_params, fpt = trainee(config, data, args.eval_batches)
  curve = dict(step=[], mlm_loss=[], mlm_accuracy=[], params=n_params, flops_per_token=fpt, seconds=0.0)
  print(f"{name}: {n_params:,} parameters, {fpt / 1e6:.1f} MFLOPs/token (train)", flush=True)
  t0 = time.time()
  for t in range(config.total_steps):
    state, _ = steps.train(state, pipeline.batch_at(data.train, t, config.batch_size, config.seed))
    if (t + 1) % args.eval_every == 0 or t == 0:
      loss, acc = eval_mlm(steps, state.params, evals)
      for k, v in (("step", t + 1), ("mlm_loss", loss), ("mlm_accuracy", acc)):
        curve[k].append(v)
      print(f"  {name} step {t + 1:>5}: eval MLM loss {loss:.4f} (15% masking), accuracy {acc:.4f}", flush=True)
  curve["seconds"] = time.time() - t0
  return curve


def main():
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--parts", default="a,b,c", help="which parts to run: a (unpadding), b (vs transformers), c (curves)")
  p.add_argument("--corpus", default=os.path.join(REPO, "..", "shared", "data", "pretrain", "*-00.txt"))
  p.add_argument("--work_dir", default="/tmp/bertjax-modern-encoder")
  p.add_argument("--layers", type=int, default=3, help="layers of every model (3: one global, two local)")
  p.add_argument("--hidden", type=int, default=128)
  p.add_argument("--window", type=int, default=128, help="(a), (b): local attention window (ModernBERT: 128)")
  p.add_argument("--vocab", type=int, default=8000)
  p.add_argument("--seq_len", type=int, default=1024, help="(a), (b): row length (ModernBERT's pretraining: 1,024)")
  p.add_argument("--batch_size", type=int, default=4, help="(a), (b): rows per batch")
  p.add_argument("--curve_seq_len", type=int, default=128, help="(c): row length")
  p.add_argument("--curve_batch_size", type=int, default=16, help="(c): rows per batch")
  p.add_argument("--curve_window", type=int, default=32, help="(c): ModernBERT's window (1/4 of the rows)")
  p.add_argument("--batches", type=int, default=4, help="(a), (b): distinct batches the timed steps cycle over")
  p.add_argument("--steps", type=int, default=5, help="(a), (b): timed steps per side and round")
  p.add_argument("--rounds", type=int, default=3, help="(a), (b): alternating rounds")
  p.add_argument("--threads", type=int, default=0, help="(b): PyTorch threads (0: all cores, as XLA)")
  p.add_argument("--curve_steps", type=int, default=300, help="(c): training steps of each model")
  p.add_argument("--eval_every", type=int, default=50)
  p.add_argument("--eval_batches", type=int, default=8)
  p.add_argument("--lr", type=float, default=2e-3)
  p.add_argument("--seed", type=int, default=0)
  p.add_argument("--json", default="", help="also write the results as JSON here")
  args = p.parse_args()
  from bertjax.core import runtime

  runtime.setup()
  import glob

  if not glob.glob(args.corpus):
    sys.exit(f"error: no corpus files match {args.corpus!r}; pass --corpus=GLOB (see ../shared/data/MANIFEST.md)")
  import jax

  from bertjax.data import pipeline

  parts = set(args.parts.split(","))
  os.makedirs(args.work_dir, exist_ok=True)
  modern = prepared(modern_config(args), args.work_dir) if parts & {"a", "b"} else modern_config(args)
  data = pipeline.build(modern) if parts & {"a", "b"} else None
  results = dict(args=vars(args), device=jax.devices()[0].device_kind, cores=os.cpu_count())
  print(f"ModernBERT {args.layers} x {args.hidden} (GeGLU {modern.model.intermediate_size}, window "
        f"{args.window}), vocab {args.vocab}, batch {args.batch_size} x {args.seq_len}; {os.cpu_count()} cores shared "
        "with other work: only side-by-side ratios are meaningful", flush=True)
  if "a" in parts:
    r = results["a"] = part_a(modern, data, args)
    print(f"(a) unpadded {r['packed']['real_tokens_per_sec']:,.0f} real tok/s (efficiency "
          f"{r['packed']['efficiency']:.1%}, {r['examples_per_packed_row']:.2f} examples/row) vs padded "
          f"{r['padded']['real_tokens_per_sec']:,.0f} (efficiency {r['padded']['efficiency']:.1%}): "
          f"{r['ratio']:.2f}x (target >= 1.5x)", flush=True)
  if "b" in parts:
    r = results["b"] = part_b(_b_config(modern), data, args)
    print(f"(b) bertjax {r['bertjax_real_tokens_per_sec']:,.0f} real tok/s vs transformers ModernBertForMaskedLM "
          f"(torch {r['torch']}, {r['threads']} threads) {r['torch_real_tokens_per_sec']:,.0f}: {r['ratio']:.2f}x "
          f"(target >= 1.0x); parameters {r['bertjax_params']:,} / {r['torch_params']:,}", flush=True)
  if "c" in parts:
    curve = prepared(modern_config(args, curve=True), args.work_dir)
    curve_data, bert = pipeline.build(curve), _shards_of(bert_config(args), curve)
    results["c"] = {"bert": learning_curve(bert, curve_data, args, "BERT"),
                    "modernbert": learning_curve(curve, curve_data, args, "ModernBERT")}
    c = results["c"]
    print(f"(c) {'step':>6} {'BERT':>9} {'ModernBERT':>11}  (eval MLM loss at 15% masking, same rows)")
    for i, s in enumerate(c["bert"]["step"]):
      print(f"    {s:>6} {c['bert']['mlm_loss'][i]:>9.4f} {c['modernbert']['mlm_loss'][i]:>11.4f}")
  if args.json:
    with open(args.json, "w") as f:
      json.dump(results, f, indent=1, default=float)


def _b_config(modern):
  """(b)'s config: the benchmark's ModernBERT with AdamW and no clipping (what the torch side runs)."""
  c = modern.copy_and_resolve_references()
  c.optimizer.name, c.optimizer.clip_norm, c.optimizer.weight_decay = "adamw", 0.0, 0.0
  c.optimizer.schedule = "linear"
  return c


def _shards_of(config, prepared_config):
  """`config` reading the shards `prepared_config` reads (same rows, same tokenizer)."""
  c = config.copy_and_resolve_references()
  c.data.source, c.data.tokenizer_model = prepared_config.data.source, prepared_config.data.tokenizer_model
  return c


if __name__ == "__main__":
  from bertjax.core import cli

  cli.script(main)
