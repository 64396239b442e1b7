"""bertjax against transformers (PyTorch) on one NVIDIA GPU, at equal work, in one command (issue #49).

  python benchmarks/accelerator.py --out=/tmp/accel.json        # every case, ~5 min on one H100 (see below)
  python benchmarks/accelerator.py --cases=bert-base-128,attention-check --steps=20
  python benchmarks/accelerator.py --smoke                     # every case at tiny sizes on the CPU (a test)

Cases (each: the same model shape, batch, sequence length, masked positions and objective on both sides, AdamW;
bertjax bf16 with its fastest attention, `model.attention=auto` = cuDNN flash attention; PyTorch eager with
`torch.autocast("cuda", bfloat16)`, SDPA attention and fused AdamW; they run in CASES' order, BERT-base 128,
BERT-large, the attention check, ModernBERT, MiniLM, BERT-base 512, the first ones first in case --budget runs
out; a bertjax step that fails with cuDNN attention is timed again with `xla` attention, the failure kept in its
row):
  bert-base-128 / bert-base-512 / bert-large-512   MLM + NSP pretraining step (benchmarks/vs_pytorch.py's two
      sides: bertjax's real jitted train step, masking on device; HF's BertModel + heads with the prediction head
      on the same number of masked slots, clip 1.0). Attention dropout 0 on both (what cuDNN needs), hidden 0.1.
  modernbert-base-1024   ModernBERT-base MLM on packed rows of 1,024 tokens (several examples a row, attention kept
      inside each, positions restarting): bertjax's packed path; transformers' ModernBertForMaskedLM on the SAME
      packed rows, told the examples apart by a block-diagonal `attention_mask` dict (and its sliding-window form)
      and per-example `position_ids` (benchmarks/modern_encoder.py's part (b)), decoder on the masked positions
      only (`sparse_prediction`). transformers 5's ModernBERT has no unpadded path outside flash-attn (not
      installed), so SDPA runs with a dense mask: equal positions computed on both sides. AdamW, no clipping.
  minilm-sst2   fine-tuning a MiniLM-L6-H384 (all-MiniLM-L6-v2's shape, random init) sentence classifier, batch 32,
      seq_len 128, on sentences of SST-2-like lengths (lognormal, mean ~13.5 tokens with [CLS] and [SEP]):
      bertjax's fine-tuning step (bertjax.finetune.train.train_step) on its length-grouped batches, each cut to
      its length bucket (bucket_lengths=auto); PyTorch on the same rows per step, each batch padded to its
      longest row (transformers' DataCollatorWithPadding). Tokens/s counts real tokens; the whole stream of steps
      is timed (the step is small: per-step launch overhead is part of what is measured).
  attention-check   not a timing: cuDNN attention (`model.attention=cudnn`, bf16) against `xla` attention on the
      same parameters and batch (BERT-base with padded and packed rows; ModernBERT with local windows): max abs
      difference of the MLM logits and of the loss, pass/fail against ATTENTION_TOLERANCE. On the CPU (--smoke)
      `dot_product` stands in for cudnn.

MFU: the same analytic FLOPs (bertjax.model.flops) for both sides, against the GPU's dense bf16 peak
(flops.PEAK_FLOPS); on the CPU against a float32 matmul timed here. Each side compiles/warms up first, then
`--steps` steps are timed, each waited for (block_until_ready / torch.cuda.synchronize). PyTorch runs in a
process of its own (its own CUDA context and libraries), started once; JAX does not preallocate GPU memory so
both fit. `--budget` seconds: cases not started by then are skipped (reported). `--out` writes the figures as JSON.

Runs from a checkout without installing bertjax (`PYTHONPATH=$PWD`); reads no data and needs no network.
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
sys.path.insert(0, os.path.join(REPO, "benchmarks"))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np  # noqa: E402

# In the order they run by default: what matters most first, in case --budget runs out.
CASES = ("bert-base-128", "bert-large-512", "attention-check", "modernbert-base-1024", "minilm-sst2", "bert-base-512")
TIMED = tuple(c for c in CASES if c != "attention-check")
# case: (config, batch, seq_len) on the GPU, and in --smoke (CPU, float32, tiny sizes).
SHAPES = {
    "bert-base-128": (("configs/bert.py:base", 128, 128), ("configs/bert.py:tiny", 4, 64)),
    "bert-base-512": (("configs/bert.py:base", 32, 512), ("configs/bert.py:tiny", 2, 128)),
    "bert-large-512": (("configs/bert.py:large", 32, 512), ("configs/bert.py:tiny", 2, 128)),
    "modernbert-base-1024": (("configs/modernbert.py:base", 16, 1024), ("configs/modernbert.py:tiny", 2, 256)),
    "minilm-sst2": (("configs/bert.py:base", 32, 128), ("configs/bert.py:tiny", 8, 64)),
}
MINILM = (6, 384, 12, 1536)  # all-MiniLM-L6-v2: layers, hidden, heads, FFN
SST2_LENGTHS = (9.5, 0.65, 66)  # lognormal median and sigma of words, longest row: mean ~13.5 with [CLS] [SEP]
# Pass if |logits diff| <= atol + rtol * max|logits| and |loss diff| <= rtol * max(1, |loss|): bf16 keeps ~3
# significant digits, and two attention kernels round differently through 12 layers.
ATTENTION_TOLERANCE = dict(rtol=2e-2, atol=2e-2)


def load_config(spec: str, smoke: bool, batch: int, seq_len: int):
  """A configs/*.py config at the case's shape: one phase, bf16 with attention dropout 0 and
  `model.attention=auto` (cuDNN on GPU) on the GPU; float32 on the CPU (--smoke)."""
  from bertjax.core import config as config_lib

  c = config_lib.load(os.path.join(REPO, spec))
  c.batch_size, c.seq_len, c.phases, c.grad_accum_steps = batch, seq_len, (), 1
  c.model.dtype = "float32" if smoke else "bfloat16"
  c.model.attention_dropout, c.model.attention = 0.0, "auto"
  return c


# ------------------------------------------------------------------------------------------------ PyTorch side


def _torch_bert(spec: dict, batch: dict):
  """vs_pytorch's BERT MLM + NSP step (masked-slots head): a step(i) closure."""
  import functools

  import torch
  import vs_pytorch

  model, opt = vs_pytorch.torch_model(spec)
  dev = next(model.parameters()).device
  batch = {k: torch.as_tensor(v).to(dev) for k, v in batch.items()}
  loss_fn = functools.partial(vs_pytorch.torch_loss, head="masked")
  return lambda i: vs_pytorch.torch_step(loss_fn, model, opt, batch, spec)


def _torch_modernbert(spec: dict, masked: dict):
  """ModernBertForMaskedLM on bertjax's packed, masked rows (modern_encoder.torch_inputs), AdamW, no clipping."""
  import modern_encoder
  import torch
  from transformers import ModernBertConfig, ModernBertForMaskedLM

  gpu = spec["device"] == "gpu"
  dev = "cuda" if gpu else "cpu"
  model = ModernBertForMaskedLM(ModernBertConfig(**spec["hf"])).train().to(dev)
  opt = torch.optim.AdamW(model.parameters(), **spec["adamw"], **(dict(fused=True) if gpu else {}))
  b = {k: torch.as_tensor(v).to(dev) for k, v in modern_encoder.torch_inputs(masked, spec["window"]).items()}

  def step(i):
    with torch.autocast("cuda", dtype=torch.bfloat16, enabled=gpu):
      out = model(input_ids=b["input_ids"], position_ids=b["position_ids"], labels=b["labels"],
                  attention_mask={"full_attention": b["full"], "sliding_attention": b["sliding"]})
    out.loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
  return step


def _torch_classifier(spec: dict, batches: list):
  """BertForSequenceClassification (SDPA) on per-step batches padded to their longest row, AdamW, clip 1.0."""
  import torch
  from transformers import BertConfig, BertForSequenceClassification

  gpu = spec["device"] == "gpu"
  dev = "cuda" if gpu else "cpu"
  kwargs = dict(attn_implementation="sdpa") if gpu else {}
  model = BertForSequenceClassification(BertConfig(**spec["bert"], **kwargs)).train().to(dev)
  opt = torch.optim.AdamW(model.parameters(), **spec["adamw"], **(dict(fused=True) if gpu else {}))
  tb = [{k: torch.as_tensor(v).to(dev) for k, v in b.items()} for b in batches]

  def step(i):
    with torch.autocast("cuda", dtype=torch.bfloat16, enabled=gpu):
      loss = model(**tb[i % len(tb)]).loss
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), spec["clip_norm"])
    opt.step()
    opt.zero_grad(set_to_none=True)

  # One untimed step per padded length first, as bertjax gets one per bucket (its compiles): eager PyTorch sets up
  # kernels per shape too (SDPA's cuDNN plans, cuBLAS heuristics), once a run.
  first = {}
  for i, b in enumerate(tb):
    first.setdefault(tuple(b["input_ids"].shape), i)
  step.prime = sorted(first.values())
  return step


TORCH_KINDS = {"bert": _torch_bert, "modernbert": _torch_modernbert, "classifier": _torch_classifier}


def torch_worker(conn, threads: int):
  """The PyTorch process: answers ("run", kind, spec, data, warmup, steps, per_step) with the timed steps' seconds
  (each waited for when `per_step`, else one time for all) and the peak GPU memory, until ("close",)."""
  import torch

  torch.set_num_threads(threads)
  torch.manual_seed(0)
  gpu = torch.cuda.is_available()
  conn.send(dict(version=torch.__version__, device=torch.cuda.get_device_name() if gpu else "cpu",
                 threads=torch.get_num_threads()))
  sync = torch.cuda.synchronize if gpu else (lambda: None)
  while (msg := conn.recv())[0] != "close":
    _, kind, spec, data, warmup, steps, per_step = msg
    try:
      if gpu:
        torch.cuda.reset_peak_memory_stats()
      step = TORCH_KINDS[kind](spec, data)
      for i in getattr(step, "prime", ()):
        step(i)
      for i in range(warmup):
        step(i)
      sync()
      times, t0 = [], time.perf_counter()
      for i in range(steps):
        step(warmup + i)
        if per_step:
          sync()
          times.append(time.perf_counter() - t0)
          t0 = time.perf_counter()
      if not per_step:
        sync()
        times = [time.perf_counter() - t0]
      conn.send(dict(times=times, peak_memory_bytes=torch.cuda.max_memory_allocated() if gpu else 0))
    except Exception as e:  # one case failing (e.g. out of memory) must not end the others
      conn.send(dict(error=f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"))
    step = None
    if gpu:
      torch.cuda.empty_cache()


class TorchSide:
  """`torch_worker` in a spawned process (its own CUDA context; it imports no JAX backend)."""

  def __init__(self, threads: int):
    ctx = multiprocessing.get_context("spawn")
    self.conn, child = ctx.Pipe()
    self.proc = ctx.Process(target=torch_worker, args=(child, threads), daemon=True)
    self.proc.start()
    self.info = self.conn.recv()

  def run(self, kind: str, spec: dict, data, warmup: int, steps: int, per_step: bool = True) -> dict:
    self.conn.send(("run", kind, spec, data, warmup, steps, per_step))
    return self.conn.recv()

  def close(self):
    self.conn.send(("close",))
    self.proc.join()


# ------------------------------------------------------------------------------------------------ bertjax side


def jax_times(run, state, warmup: int, steps: int, per_step: bool = True):
  """(state, seconds): `run(state, i)` returns the next state (not waited for); warmup steps, then `steps` timed,
  each waited for when `per_step`, else one time for all."""
  import jax

  for i in range(warmup):
    state = run(state, i)
  jax.block_until_ready(state)
  times, t0 = [], time.perf_counter()
  for i in range(steps):
    state = run(state, warmup + i)
    if per_step:
      jax.block_until_ready(state)
      times.append(time.perf_counter() - t0)
      t0 = time.perf_counter()
  if not per_step:
    jax.block_until_ready(state)
    times = [time.perf_counter() - t0]
  return state, times


def packed_rows(config, rng) -> dict:
  """Synthetic packed rows (the loader's `packed` format): examples of log-uniform lengths (16 to seq_len), each
  [CLS] ... [SEP] with its own group id and positions from 0, filled into rows first come; a tail too short for an
  example is padding (group 0)."""
  from bertjax.data.tokenizer import SPM_SPECIAL as sp

  b, s = config.batch_size, config.seq_len
  out = {k: np.zeros((b, s), np.int32) for k in ("input_ids", "groups", "position_ids")}
  for r in range(b):
    at, g = 0, 0
    while s - at >= 16:
      n = min(s - at, int(np.exp(rng.uniform(np.log(16), np.log(s)))))
      g += 1
      out["input_ids"][r, at:at + n] = rng.integers(10, config.model.vocab_size, n)
      out["input_ids"][r, at], out["input_ids"][r, at + n - 1] = sp.cls, sp.sep
      out["groups"][r, at:at + n], out["position_ids"][r, at:at + n] = g, np.arange(n)
      at += n
  return dict(out, type_ids=np.zeros((b, s), np.int32), word_start=rng.random((b, s)) < 0.7,
              sentence_label=np.zeros(b, np.int32), example_weight=np.ones(b, np.float32))


def pretrain_case(name: str, config, torch_side, args, peak: float) -> dict:
  """A pretraining case: bertjax's train step (bench.pretrain_job) and the same work in PyTorch."""
  from bertjax.train import bench, build, step as step_lib
  from bertjax.data.tokenizer import SPM_SPECIAL

  device = "cpu" if args.smoke else "gpu"
  if name.startswith("modernbert"):
    import modern_encoder

    o = config.optimizer  # AdamW, no clipping on both sides (StableAdamW is not in torch)
    o.name, o.clip_norm, o.schedule = "adamw", 0.0, "linear"
    batch = packed_rows(config, np.random.default_rng(0))
    cfg = build.step_config(config, SPM_SPECIAL, build.placeholder_counts(config))
    masked = {k: np.asarray(v) for k, v in step_lib.training_batch(batch, 0, cfg).items()}
    spec = dict(hf=modern_encoder.hf_config(config).to_dict(), window=config.model.local_window, device=device,
                adamw=dict(lr=config.learning_rate, betas=(o.b1, o.b2), eps=o.eps, weight_decay=o.weight_decay))
    kind, data = "modernbert", masked
    note = "packed rows on both sides (transformers: block-diagonal attention_mask dict + position_ids, SDPA)"
  else:
    import vs_pytorch

    batch = bench.synthetic_batch(config, config.batch_size)
    spec, kind, data = vs_pytorch.torch_spec(config, device, "masked"), "bert", vs_pytorch.torch_batch(config, batch)
    note = "MLM head on the masked slots on both sides; NSP"
  job = bench.pretrain_job(config, batch=batch)
  state, times = jax_times(lambda st, i: job.run(st), job.state, args.warmup, args.steps)
  first = job.scalars(state)
  del state, job.state
  tokens = config.batch_size * config.seq_len
  t = torch_side.run(kind, spec, data, args.warmup, args.steps)
  real = float(np.count_nonzero(batch["groups"])) / tokens
  return result(name, tokens, job.flops_per_token, peak, times, t, dict(
      note=note, batch_size=config.batch_size, seq_len=config.seq_len, real_token_share=real,
      compile_seconds=job.compile_seconds, bertjax_loss=first["loss"],
      attention=resolved_attention(config), bertjax_peak_memory_bytes=job.peak_memory))


def resolved_attention(config) -> str:
  import jax

  from bertjax.model import attention

  m = config.model
  return attention.resolve(m.attention, m.attention_dropout, jax.default_backend(), m.dtype)[0]


def sst2_rows(config, n: int, vocab_size: int, rng) -> dict:
  """n single-sentence rows encoded to seq_len as bertjax.finetune encodes them ([CLS] words [SEP], type 0,
  groups 1 on real tokens), lengths drawn from SST2_LENGTHS; binary labels."""
  from bertjax.data.tokenizer import SPM_SPECIAL as sp

  median, sigma, longest = SST2_LENGTHS
  words = np.clip(np.round(np.exp(rng.normal(np.log(median), sigma, n))), 1, min(longest, config.seq_len) - 2)
  lengths = words.astype(np.int64) + 2
  ids = rng.integers(10, vocab_size, (n, config.seq_len)).astype(np.int32)
  real = np.arange(config.seq_len)[None] < lengths[:, None]
  ids[:, 0], ids[np.arange(n), lengths - 1] = sp.cls, sp.sep
  return dict(input_ids=np.where(real, ids, sp.pad).astype(np.int32), type_ids=np.zeros_like(ids),
              groups=real.astype(np.int32), label=rng.integers(0, 2, n).astype(np.int32))


def finetune_case(name: str, pre, torch_side, args, peak: float) -> dict:
  """MiniLM-L6-H384 sequence classification: bertjax.finetune's step on length-bucketed batches vs PyTorch on
  the same rows padded to each batch's longest."""
  import functools
  import types

  import jax
  import jax.numpy as jnp

  from bertjax.core import config as config_lib, sharding as sh
  from bertjax.finetune import batches, train as ft
  from bertjax.finetune.classification import model as task_model
  from bertjax.model import flops

  m = pre.model
  if not args.smoke:
    m.num_layers, m.hidden_size, m.num_heads, m.intermediate_size = MINILM
  m.dropout = 0.1
  c = config_lib.load(os.path.join(REPO, "configs/finetune.py:sst2"))
  c.batch_size, c.seq_len, c.model.dtype, c.learning_rate = pre.batch_size, pre.seq_len, m.dtype, 5e-5
  c.optimizer.bias_correction = True  # torch.optim.AdamW's
  n_steps = args.steps * 10  # a MiniLM step on ~14-token rows takes milliseconds: time a stream of them
  rows = sst2_rows(c, (n_steps + args.warmup) * c.batch_size, m.vocab_size, np.random.default_rng(0))
  total = n_steps + args.warmup
  longest = batches.batch_longest(batches.row_lengths(rows), total, c, [c.seed])
  layout = batches.layout(c, rows, ("input_ids", "type_ids", "groups"), fit_to=longest)
  host = [ft.train_batch(rows, i, c, c.seed, layout) for i in range(total)]
  cfg = ft.encoder_config(c, types.SimpleNamespace(config=pre))
  model = task_model.Classifier(cfg, 2, c.model.classifier_dropout, deterministic=False, head="pooler")
  ids = jnp.zeros((1, 8), jnp.int32)
  params = sh.strip_boxes(jax.jit(lambda r: model.init({"params": r}, ids, ids, ids + 1))(jax.random.key(0))["params"])
  tx = ft.make_tx(c, params, cfg, total, total // 10)
  step_fn = jax.jit(functools.partial(ft.train_step, model=model, tx=tx), donate_argnums=(0, 1))
  dev = [jax.device_put(b) for b in host]

  def run(state, i):
    p, o = state
    p, o, _ = step_fn(p, o, dev[i], jnp.uint32(0), jnp.int32(i))
    return p, o

  state, seen, t0 = (params, tx.init(params)), set(), time.perf_counter()
  for i, b in enumerate(host):  # one step per bucket shape first: bertjax compiles once per bucket, once a run
    if b["input_ids"].shape[1] not in seen:
      seen.add(b["input_ids"].shape[1])
      state = jax.block_until_ready(run(state, i))
  compile_seconds = time.perf_counter() - t0
  _, times = jax_times(run, state, args.warmup, n_steps, per_step=False)
  lengths = [batches.row_lengths(b) for b in host]
  cut = lambda x, n: np.asarray(x, np.int64)[:, :int(n.max())]  # torch's index dtype
  torch_batches = [dict(input_ids=cut(b["input_ids"], n), token_type_ids=cut(b["type_ids"], n),
                        attention_mask=cut(b["groups"], n), labels=np.asarray(b["label"], np.int64))
                   for b, n in zip(host, lengths)]
  spec = dict(device="cpu" if args.smoke else "gpu", clip_norm=c.optimizer.clip_norm,
              bert=dict(vocab_size=m.vocab_size, hidden_size=m.hidden_size, num_hidden_layers=m.num_layers,
                        num_attention_heads=m.num_heads, intermediate_size=m.intermediate_size,
                        hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.0, classifier_dropout=0.1,
                        max_position_embeddings=m.max_positions, type_vocab_size=m.type_vocab_size,
                        layer_norm_eps=m.layer_norm_eps, num_labels=2),
              adamw=dict(lr=c.learning_rate, betas=(c.optimizer.b1, c.optimizer.b2), eps=c.optimizer.eps,
                         weight_decay=c.optimizer.weight_decay))
  t = torch_side.run("classifier", spec, torch_batches, args.warmup, n_steps, per_step=False)
  timed = lengths[args.warmup:]
  real = sum(int(n.sum()) for n in timed)
  # Useful FLOPs: each example's real tokens through the encoder, attention over its own length, x3 for training.
  useful = sum(3 * flops.encoder_forward_flops(cfg, int(x)) * int(x) for n in timed for x in n)
  positions = sum(b["input_ids"].size for b in host[args.warmup:])
  return result(name, real, useful / real, peak, times, t, dict(
      note="real tokens; bertjax length buckets vs PyTorch padded to each batch's longest row (same rows)",
      batch_size=c.batch_size, seq_len=c.seq_len, steps_timed=n_steps, mean_length=real / (n_steps * c.batch_size),
      buckets=[int(x) for x in layout.buckets], bertjax_real_share=real / positions, compile_seconds=compile_seconds,
      attention=cfg.attention), per_run=True)


def result(name, tokens, fpt, peak, jax_t, torch_r, extra, per_run=False) -> dict:
  """One case's row: tokens/s (median step, or the whole timed stream when `per_run`) and MFU of each side."""
  side = lambda sec: dict(tokens_per_sec=tokens / sec, step_seconds=sec, mfu=tokens * fpt / sec / peak)
  j = side(jax_t[0] if per_run else statistics.median(jax_t))
  r = dict(case=name, flops_per_token=fpt, tokens_per_step=tokens, bertjax=j, **extra)
  if "error" in torch_r:
    r["torch"], r["ratio"] = dict(error=torch_r["error"]), None
  else:
    t = side(torch_r["times"][0] if per_run else statistics.median(torch_r["times"]))
    t["peak_memory_bytes"] = torch_r["peak_memory_bytes"]
    r["torch"], r["ratio"] = t, j["tokens_per_sec"] / t["tokens_per_sec"]
  return r


def mlm_loss(logits, masked) -> float:
  """The MLM loss of logits [B, P, V] on a masked batch's slots (mlm_labels, weighted by mlm_weights)."""
  z = logits - logits.max(-1, keepdims=True)
  logp = z - np.log(np.exp(z).sum(-1, keepdims=True))
  labels, w = np.asarray(masked["mlm_labels"]), np.asarray(masked["mlm_weights"], np.float64)
  nll = -np.take_along_axis(logp, labels[..., None], -1)[..., 0]
  return float((nll * w).sum() / max(w.sum(), 1.0))


def attention_check(args) -> dict:
  """cudnn (GPU; dot_product on the CPU) vs xla attention: the same params and masked batch through the
  pretraining model; max abs diff of the MLM logits and of their loss, per model."""
  import jax

  from bertjax.data.tokenizer import SPM_SPECIAL
  from bertjax.train import bench, step as step_lib

  fused = "dot_product" if args.smoke else "cudnn"
  out = dict(case="attention-check", pair=f"{fused} vs xla", tolerance=ATTENTION_TOLERANCE, models={})
  for label, spec in (("bert-base", SHAPES["bert-base-512"]), ("modernbert-base", SHAPES["modernbert-base-1024"])):
    path, b, s = spec[1] if args.smoke else spec[0]
    config = load_config(path, args.smoke, min(b, 4), s)
    rng = np.random.default_rng(1)
    batch = packed_rows(config, rng) if label.startswith("modern") else bench.synthetic_batch(config, config.batch_size)
    if not label.startswith("modern"):  # a padded row and a row of two examples: the segment mask must hold
      batch["groups"][0, s // 2:], batch["input_ids"][0, s // 2:] = 0, SPM_SPECIAL.pad
      batch["groups"][1, s // 2:] = 2
    logits, losses, params = {}, {}, None
    for impl in ("xla", fused):
      config.model.attention = impl
      setup = bench.setup(config, batch=batch)
      if params is None:  # the same weights for both; stacked, the layout model.apply takes (the steps' may be split)
        params = setup.steps.stored(setup.steps.init(jax.random.key(0)).params)
      masked = step_lib.eval_batch(setup.batch, 0, setup.steps.cfg)
      model = setup.steps.model
      masked = jax.device_get(masked)
      logits[impl] = np.asarray(jax.jit(lambda p, x: model.apply({"params": p}, x)["mlm_logits"])(params, masked),
                                np.float32)
      losses[impl] = mlm_loss(logits[impl], masked)
    scored = np.asarray(masked["mlm_weights"]) > 0  # the slots the loss reads (not the unused ones)
    diff = float(np.max(np.abs(logits[fused] - logits["xla"])[scored]))
    scale = float(np.max(np.abs(logits["xla"])[scored]))
    loss_diff = abs(losses[fused] - losses["xla"])
    tol = ATTENTION_TOLERANCE
    ok = diff <= tol["atol"] + tol["rtol"] * scale and loss_diff <= tol["rtol"] * max(1.0, abs(losses["xla"]))
    out["models"][label] = dict(max_abs_logits_diff=diff, max_abs_logit=scale, loss_xla=losses["xla"],
                                loss_fused=losses[fused], loss_abs_diff=loss_diff, passed=bool(ok),
                                batch_size=config.batch_size, seq_len=s)
  out["passed"] = all(m["passed"] for m in out["models"].values())
  return out


# ------------------------------------------------------------------------------------------------ report


def print_table(rows: list):
  """The side-by-side table: tokens/s and MFU of each side, and bertjax's speed over PyTorch's."""
  print(f"\n{'case':<22} {'batch x seq':>12} {'attention':>11} {'bertjax tok/s':>14} {'MFU':>6} {'PyTorch tok/s':>14} "
        f"{'MFU':>6} {'ratio':>6}")
  for r in rows:
    if r.get("skipped") or r["case"] == "attention-check":
      continue
    j, t = r["bertjax"], r["torch"]
    shape = f"{r['batch_size']} x {r['seq_len']}"
    tt = (f"{t['tokens_per_sec']:>14,.0f} {t['mfu']:>6.1%}" if "error" not in t else f"{'error':>14} {'':>6}")
    ratio = f"{r['ratio']:>5.2f}x" if r["ratio"] else ""
    print(f"{r['case']:<22} {shape:>12} {r['attention']:>11} {j['tokens_per_sec']:>14,.0f} {j['mfu']:>6.1%} {tt} {ratio}")
  for r in rows:
    if r.get("skipped"):
      print(f"{r['case']}: skipped ({r['skipped']})")
    elif r["case"] == "attention-check":
      for name, m in r["models"].items():
        print(f"attention {r['pair']} {name}: max |logits diff| {m['max_abs_logits_diff']:.3g} (max |logit| "
              f"{m['max_abs_logit']:.3g}), loss {m['loss_xla']:.5f} vs {m['loss_fused']:.5f} (diff "
              f"{m['loss_abs_diff']:.2g}): {'PASS' if m['passed'] else 'FAIL'}")
    elif "error" in r["torch"]:
      print(f"{r['case']}: PyTorch failed: {r['torch']['error']}")
  print(flush=True)


def timed_case(name: str, torch_side, args, peak: float) -> dict:
  """One timed case; if bertjax's step fails with its fused attention (cuDNN), once more with `xla` attention, so
  that the run still gives figures (the failure is kept in the row as `fused_attention_error`)."""
  path, b, s = SHAPES[name][1 if args.smoke else 0]
  case = finetune_case if name == "minilm-sst2" else pretrain_case
  try:
    return case(name, load_config(path, args.smoke, b, s), torch_side, args, peak)
  except Exception as e:
    if args.smoke:
      raise
    import traceback

    traceback.print_exc()
    print(f"{name}: bertjax failed with model.attention=auto; once more with xla attention", flush=True)
    config = load_config(path, args.smoke, b, s)
    config.model.attention = "xla"
    return dict(case(name, config, torch_side, args, peak), fused_attention_error=f"{type(e).__name__}: {str(e)[:300]}")


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--cases", default=",".join(CASES), help=f"comma-separated, from {', '.join(CASES)}")
  p.add_argument("--steps", type=int, default=20, help="timed steps per side (minilm-sst2: 10x as many)")
  p.add_argument("--warmup", type=int, default=2, help="untimed steps per side after compiling")
  p.add_argument("--budget", type=float, default=360.0, help="seconds: cases not started by then are skipped")
  p.add_argument("--smoke", action="store_true", help="every case at tiny sizes on the CPU (float32)")
  p.add_argument("--out", default="", help="also write the figures as JSON here")
  args = p.parse_args(argv)
  cases = [c for c in args.cases.split(",") if c]
  unknown = [c for c in cases if c not in CASES]
  if unknown:
    p.error(f"--cases: unknown {unknown}; choose from {', '.join(CASES)}")
  start = time.perf_counter()
  if args.smoke:
    os.environ["JAX_PLATFORMS"] = "cpu"
  else:  # both frameworks share the GPU: JAX must not take 75% of its memory up front
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
  from bertjax.core import runtime

  runtime.setup()
  import jax

  from bertjax.model import flops
  from bertjax.train import bench

  device = jax.devices()[0]
  if not args.smoke and device.platform != "gpu":
    p.error(f"JAX sees {device.platform} devices, no GPU: run on an NVIDIA GPU, or pass --smoke for the CPU check")
  peak = bench.matmul_peak(n=1024, repeats=3) if args.smoke else flops.peak_flops(device)
  # --smoke: one PyTorch thread (the numbers mean nothing on the CPU; spinning threads only slow a loaded machine)
  torch_side = TorchSide(1 if args.smoke else os.cpu_count() or 1) if set(cases) & set(TIMED) else None
  header = dict(jax=jax.__version__, device=device.device_kind, platform=device.platform,
                peak_flops=peak, xla_flags=os.environ.get("XLA_FLAGS", ""), smoke=args.smoke, steps=args.steps,
                warmup=args.warmup, torch=torch_side.info if torch_side else None)
  import transformers

  header["transformers"] = transformers.__version__
  print(f"jax {header['jax']} on {header['device']} ({'peak' if not args.smoke else 'f32 matmul'} "
        f"{peak / 1e12:.1f} TFLOP/s), torch {header['torch'] and header['torch']['version']} on "
        f"{header['torch'] and header['torch']['device']}, transformers {header['transformers']}; "
        f"XLA_FLAGS={header['xla_flags']!r}", flush=True)
  rows = []
  for name in cases:
    if time.perf_counter() - start > args.budget:
      rows.append(dict(case=name, skipped=f"--budget {args.budget:.0f}s spent"))
      continue
    t0 = time.perf_counter()
    try:
      r = attention_check(args) if name == "attention-check" else timed_case(name, torch_side, args, peak)
    except Exception as e:  # report and go on: one case must not cost the others' figures
      import traceback

      traceback.print_exc()
      r = dict(case=name, skipped=f"failed: {type(e).__name__}: {str(e).strip()[:200]}")
    r["seconds"] = time.perf_counter() - t0
    rows.append(r)
    print(f"{name}: done in {r['seconds']:.0f} s" + (f" ({r['skipped']})" if r.get("skipped") else ""), flush=True)
  if torch_side:
    torch_side.close()
  print_table(rows)
  total = time.perf_counter() - start
  print(f"total {total:.0f} s", flush=True)
  if args.out:
    with open(args.out, "w") as f:
      json.dump(dict(header, cases=rows, total_seconds=total), f, indent=1)
  return 0 if all(not r.get("skipped", "").startswith("failed") for r in rows) else 1


if __name__ == "__main__":
  from bertjax.core import cli

  cli.script(main)
