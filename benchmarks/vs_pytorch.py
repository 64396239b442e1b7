"""bertjax's train step against HF transformers' BertForPreTraining in PyTorch, side by side on CPU.

Same BERT config (float32), batch, sequence length and thread count; both train with dropout 0.1, MLM on
15% of the tokens plus NSP, AdamW and gradient clipping at 1.0. bertjax runs its real jitted train step
(masking on device included); PyTorch runs eager HF (its default attention), with the masked batch made
once beforehand, as a data loader would. Steps of the two alternate in rounds, so both see the same
machine load; the medians and their ratio are printed, then one JSON line. bertjax's MFU is against a
2048^3 float32 matmul timed between its steps, as `python -m bertjax.bench` does on CPU.

Note that HF's BertForPreTraining decodes all `seq_len` positions through the vocabulary (bertjax only
the `max_predictions` masked slots), so it does more FLOPs per token; `hf_flops_per_token` counts them.

  python benchmarks/vs_pytorch.py                        # tiny (batch 32) and base (batch 8), seq 128
  python benchmarks/vs_pytorch.py --variants=base --batch_size=8 --steps=5 --rounds=3
"""

import json
import os
import statistics
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax
import numpy as np
from absl import app, flags

from bertjax import bench, config as config_lib, loop

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Default batch per variant: tiny's own recipe; base at the batch `python -m bertjax.bench` is quoted at.
BATCH_SIZES = {"tiny": 32, "base": 8, "large": 4}
_VARIANTS = flags.DEFINE_list("variants", ["tiny", "base"], "configs/bert.py variants to compare")
_BATCH = flags.DEFINE_integer("batch_size", 0, "global batch size for every variant (0: BATCH_SIZES)")
_SEQ = flags.DEFINE_integer("seq_len", 128, "sequence length")
_STEPS = flags.DEFINE_integer("steps", 5, "timed steps per side and round")
_ROUNDS = flags.DEFINE_integer("rounds", 2, "rounds of alternating bertjax / PyTorch steps")
_THREADS = flags.DEFINE_integer("threads", 0, "PyTorch intra-op threads (0: all cores, as XLA uses)")


def bert_config(variant: str, batch_size: int, seq_len: int):
  """The variant's bertjax config in float32 at the benchmark's batch and sequence length."""
  config = config_lib.load(os.path.join(REPO, f"configs/bert.py:{variant}"))
  config.model.dtype = "float32"
  config.batch_size = batch_size or BATCH_SIZES.get(variant, 8)
  config.seq_len = seq_len
  return config


def torch_model(config):
  """HF BertForPreTraining with the same sizes, dropout and LayerNorm epsilon, and its AdamW."""
  import torch
  from transformers import BertConfig, BertForPreTraining

  m = config.model
  hf = BertConfig(vocab_size=m.vocab_size, hidden_size=m.hidden_size, num_hidden_layers=m.num_layers,
                  num_attention_heads=m.num_heads, intermediate_size=m.intermediate_size, hidden_act="gelu",
                  hidden_dropout_prob=m.dropout, attention_probs_dropout_prob=m.attention_dropout,
                  max_position_embeddings=m.max_positions, type_vocab_size=m.type_vocab_size,
                  layer_norm_eps=m.layer_norm_eps, initializer_range=m.init_std)
  model = BertForPreTraining(hf).train()
  o = config.optimizer
  opt = torch.optim.AdamW(model.parameters(), lr=config.learning_rate, betas=(o.b1, o.b2), eps=o.eps,
                          weight_decay=o.weight_decay)
  return model, opt


def torch_batch(config, batch: dict, seed: int = 0) -> dict:
  """The synthetic batch masked as BERT does (15% of non-special tokens, at most max_predictions per
  row; 80% [MASK], 10% random, 10% kept), as torch tensors with -100 on unscored positions."""
  import torch

  sp = loop.DEFAULT_SPECIAL
  rng = np.random.default_rng(seed)
  ids = batch["input_ids"].copy()
  labels = np.full_like(ids, -100)
  p = config_lib.masking_config(config)
  for row in range(ids.shape[0]):
    candidates = np.nonzero(~np.isin(ids[row], [sp.pad, sp.unk, sp.cls, sp.sep, sp.mask]))[0]
    n = min(p.max_predictions, max(1, round(len(candidates) * p.mask_prob)))
    chosen = rng.choice(candidates, n, replace=False)
    labels[row, chosen] = ids[row, chosen]
    u = rng.random(n)
    ids[row, chosen[u < 0.8]] = sp.mask
    rand = chosen[(u >= 0.8) & (u < 0.9)]
    ids[row, rand] = rng.integers(5, config.model.vocab_size, len(rand))
  t = lambda a: torch.as_tensor(np.asarray(a, np.int64))
  return dict(input_ids=t(ids), token_type_ids=t(batch["type_ids"]), attention_mask=t(batch["groups"] > 0),
              labels=t(labels), next_sentence_label=t(batch["sentence_label"]))


def torch_step(model, opt, batch, clip_norm: float):
  import torch

  loss = model(**batch).loss
  loss.backward()
  torch.nn.utils.clip_grad_norm_(model.parameters(), clip_norm)
  opt.step()
  opt.zero_grad(set_to_none=True)


def time_torch(model, opt, batch, clip_norm: float, steps: int) -> list:
  times = []
  for _ in range(steps):
    t0 = time.perf_counter()
    torch_step(model, opt, batch, clip_norm)
    times.append(time.perf_counter() - t0)
  return times


def torch_matmul_peak(n: int = 2048, repeats: int = 10) -> float:
  """FLOP/s of an n^3 float32 matmul in PyTorch (MKL), the median of `repeats` runs (for context)."""
  import torch

  a, b = torch.randn(n, n), torch.randn(n, n)
  a @ b
  times = []
  for _ in range(repeats):
    t0 = time.perf_counter()
    a @ b
    times.append(time.perf_counter() - t0)
  return 2.0 * n**3 / statistics.median(times)


def hf_flops_per_token(config) -> float:
  """Training FLOPs per token of HF's model: bertjax's count with the MLM head on every position."""
  from bertjax import flops

  cfg = config_lib.encoder_config(config.model)
  return flops.train_flops_per_token(cfg, config.seq_len, config.seq_len, sentence_head=True)


def compare(variant: str, batch_size: int, seq_len: int, steps: int, rounds: int) -> dict:
  """Side-by-side medians of one variant's train step in bertjax and in PyTorch; bertjax's MFU is
  against a 2048^3 float32 XLA matmul timed between its steps (same machine load)."""
  import torch

  config = bert_config(variant, batch_size, seq_len)
  b = bench.setup(config)
  compiled, compile_seconds = bench.compile_step(b)
  state = b.steps.init(jax.random.key(0))
  model, opt = torch_model(config)
  tbatch = torch_batch(config, jax.device_get(b.batch))
  clip = config.optimizer.clip_norm
  state, _ = bench.time_steps(compiled, state, b.batch, 0, 2)  # warm-up
  time_torch(model, opt, tbatch, clip, 2)
  jax_times, torch_times = [], []
  probe = bench.MatmulProbe()
  for _ in range(rounds):
    state, t = bench.time_steps(compiled, state, b.batch, steps, 0, probe.sample)
    jax_times += t
    time.sleep(0.5)  # let the other runtime's worker threads go idle
    torch_times += time_torch(model, opt, tbatch, clip, steps)
    time.sleep(0.5)
  tokens, peak = b.batch_size * b.seq_len, probe.flops_per_sec()
  jax_tps, torch_tps = tokens / statistics.median(jax_times), tokens / statistics.median(torch_times)
  del state, model, opt
  return dict(
      variant=variant, batch_size=b.batch_size, seq_len=b.seq_len, torch_threads=torch.get_num_threads(),
      bertjax_tokens_per_sec=jax_tps, torch_tokens_per_sec=torch_tps, ratio=jax_tps / torch_tps,
      bertjax_step_seconds=statistics.median(jax_times), torch_step_seconds=statistics.median(torch_times),
      bertjax_compile_seconds=compile_seconds, bertjax_flops_per_token=b.flops_per_token,
      hf_flops_per_token=hf_flops_per_token(config), bertjax_mfu=jax_tps * b.flops_per_token / peak,
      torch_mfu_hf_flops=torch_tps * hf_flops_per_token(config) / peak, xla_matmul_flops_per_sec=peak,
  )


def main(argv):
  del argv
  import torch

  torch.set_num_threads(_THREADS.value or os.cpu_count())
  peak = bench.matmul_peak()
  torch_peak = torch_matmul_peak()
  print(f"device {jax.devices()[0].device_kind}, {os.cpu_count()} cores, torch {torch.__version__} with "
        f"{torch.get_num_threads()} threads; 2048^3 f32 matmul: XLA {peak / 1e9:.0f} GFLOP/s, "
        f"PyTorch {torch_peak / 1e9:.0f} GFLOP/s", flush=True)
  results = []
  for variant in _VARIANTS.value:
    r = compare(variant, _BATCH.value, _SEQ.value, _STEPS.value, _ROUNDS.value)
    results.append(r)
    print(f"{variant:>6} batch {r['batch_size']} x {r['seq_len']}: bertjax {r['bertjax_tokens_per_sec']:8.0f} tok/s "
          f"(MFU {r['bertjax_mfu']:.2f}), PyTorch {r['torch_tokens_per_sec']:8.0f} tok/s, "
          f"ratio {r['ratio']:.2f}x", flush=True)
  print(json.dumps(dict(xla_matmul_peak=peak, torch_matmul_peak=torch_peak, results=results)))


if __name__ == "__main__":
  app.run(main)
