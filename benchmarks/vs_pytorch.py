"""bertjax's train step against HF transformers' BertForPreTraining in PyTorch, side by side on CPU.

Same BERT config (float32), batch, sequence length and thread count; both train with dropout 0.1, MLM on
15% of the tokens plus NSP, AdamW and gradient clipping at 1.0. bertjax runs its real jitted train step
(masking on device included); PyTorch runs eager HF (its default attention), with the masked batch made
once beforehand, as a data loader would. PyTorch runs in a process of its own, so that each side has its
own glibc malloc policy (`bertjax/runtime.py`: `BERTJAX_HOST_MALLOC=retain` for bertjax's process,
`--torch_malloc=retain` for PyTorch's) and neither's worker threads spin in the other's way. Steps
of the two alternate in rounds, so both see the same machine load; the medians and their ratio are
printed, then one JSON line. bertjax's MFU is against a 2048^3 float32 matmul timed between its steps,
as `python -m bertjax.bench` does on CPU.

Note that HF's BertForPreTraining decodes all `seq_len` positions through the vocabulary (bertjax only
the `max_predictions` masked slots), so it does more FLOPs per token; `hf_flops_per_token` counts them.

  python benchmarks/vs_pytorch.py                        # tiny (batch 32) and base (batch 8), seq 128
  python benchmarks/vs_pytorch.py --variants=base --batch_size=8 --steps=5 --rounds=3
  BERTJAX_HOST_MALLOC=retain python benchmarks/vs_pytorch.py --torch_malloc=retain   # README's figures
"""

import json
import multiprocessing
import os
import statistics
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax
import numpy as np
from absl import app, flags

from bertjax import bench, config as config_lib, runtime
from bertjax.data.tokenizer import SPM_SPECIAL

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Default batch per variant: tiny's own recipe; base at the batch `python -m bertjax.bench` is quoted at.
BATCH_SIZES = {"tiny": 32, "base": 8, "large": 4}
_VARIANTS = flags.DEFINE_list("variants", ["tiny", "base"], "configs/bert.py variants to compare")
_BATCH = flags.DEFINE_integer("batch_size", 0, "global batch size for every variant (0: BATCH_SIZES)")
_SEQ = flags.DEFINE_integer("seq_len", 128, "sequence length")
_STEPS = flags.DEFINE_integer("steps", 5, "timed steps per side and round")
_ROUNDS = flags.DEFINE_integer("rounds", 2, "rounds of alternating bertjax / PyTorch steps")
_THREADS = flags.DEFINE_integer("threads", 0, "PyTorch intra-op threads (0: all cores, as XLA uses)")
_TORCH_MALLOC = flags.DEFINE_enum("torch_malloc", "default", ["default", "retain"],
                                  "the PyTorch process's glibc malloc policy (bertjax/runtime.py)")


def bert_config(variant: str, batch_size: int, seq_len: int):
  """The variant's bertjax config in float32 at the benchmark's batch and sequence length."""
  config = config_lib.load(os.path.join(REPO, f"configs/bert.py:{variant}"))
  config.model.dtype = "float32"
  config.batch_size = batch_size or BATCH_SIZES.get(variant, 8)
  config.seq_len = seq_len
  return config


def torch_spec(config) -> dict:
  """What the PyTorch process needs of the config: HF BertConfig arguments (same sizes, dropout and
  LayerNorm epsilon), AdamW's and the clipping norm."""
  m, o = config.model, config.optimizer
  return dict(
      bert=dict(vocab_size=m.vocab_size, hidden_size=m.hidden_size, num_hidden_layers=m.num_layers,
                num_attention_heads=m.num_heads, intermediate_size=m.intermediate_size, hidden_act="gelu",
                hidden_dropout_prob=m.dropout, attention_probs_dropout_prob=m.attention_dropout,
                max_position_embeddings=m.max_positions, type_vocab_size=m.type_vocab_size,
                layer_norm_eps=m.layer_norm_eps, initializer_range=m.init_std),
      adamw=dict(lr=config.learning_rate, betas=(o.b1, o.b2), eps=o.eps, weight_decay=o.weight_decay),
      clip_norm=o.clip_norm)


def torch_model(spec: dict):
  """HF BertForPreTraining from `torch_spec`, in train mode, and its AdamW."""
  import torch
  from transformers import BertConfig, BertForPreTraining

  model = BertForPreTraining(BertConfig(**spec["bert"])).train()
  return model, torch.optim.AdamW(model.parameters(), **spec["adamw"])


def torch_batch(config, batch: dict, seed: int = 0) -> dict:
  """The synthetic batch masked as BERT does (15% of non-special tokens, at most max_predictions per
  row; 80% [MASK], 10% random, 10% kept), as int64 arrays (torch's inputs) with -100 on unscored positions."""
  sp = SPM_SPECIAL
  rng = np.random.default_rng(seed)
  ids = batch["input_ids"].copy()
  labels = np.full_like(ids, -100)
  p = config_lib.masking_config(config, sp)
  for row in range(ids.shape[0]):
    candidates = np.nonzero(~np.isin(ids[row], [sp.pad, sp.unk, sp.cls, sp.sep, sp.mask]))[0]
    n = min(p.max_predictions, max(1, round(len(candidates) * p.mask_prob)))
    chosen = rng.choice(candidates, n, replace=False)
    labels[row, chosen] = ids[row, chosen]
    u = rng.random(n)
    ids[row, chosen[u < 0.8]] = sp.mask
    rand = chosen[(u >= 0.8) & (u < 0.9)]
    ids[row, rand] = rng.integers(5, config.model.vocab_size, len(rand))
  t = lambda a: np.asarray(a, np.int64)
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


def torch_process(conn, spec: dict, batch: dict, threads: int):
  """The PyTorch side, in its own process: builds the model, then answers ("steps", n) with n step times
  and ("matmul",) with `torch_matmul_peak()`, until ("close",)."""
  runtime.setup()  # BERTJAX_HOST_MALLOC as TorchProcess set it, before torch starts its threads
  import torch

  torch.set_num_threads(threads)
  model, opt = torch_model(spec)
  batch = {k: torch.as_tensor(v) for k, v in batch.items()}
  conn.send(dict(threads=torch.get_num_threads(), version=torch.__version__))
  while (msg := conn.recv())[0] != "close":
    if msg[0] == "steps":
      conn.send(time_torch(model, opt, batch, spec["clip_norm"], msg[1]))
    else:
      conn.send(torch_matmul_peak())


class TorchProcess:
  """`torch_process` in a child process started with the requested glibc malloc policy (a spawned child
  inherits `BERTJAX_HOST_MALLOC`, which `runtime.setup()` applies first thing in `torch_process`)."""

  def __init__(self, spec: dict, batch: dict, threads: int, malloc: str):
    ctx = multiprocessing.get_context("spawn")
    self.conn, child = ctx.Pipe()
    saved = os.environ.get("BERTJAX_HOST_MALLOC")
    os.environ["BERTJAX_HOST_MALLOC"] = malloc
    try:
      self.proc = ctx.Process(target=torch_process, args=(child, spec, batch, threads), daemon=True)
      self.proc.start()
    finally:
      if saved is None:
        del os.environ["BERTJAX_HOST_MALLOC"]
      else:
        os.environ["BERTJAX_HOST_MALLOC"] = saved
    self.info = self.conn.recv()

  def steps(self, n: int) -> list:
    self.conn.send(("steps", n))
    return self.conn.recv()

  def matmul_peak(self) -> float:
    self.conn.send(("matmul",))
    return self.conn.recv()

  def close(self):
    self.conn.send(("close",))
    self.proc.join()


def hf_flops_per_token(config) -> float:
  """Training FLOPs per token of HF's model: bertjax's count with the MLM head on every position."""
  from bertjax import flops

  cfg = config_lib.encoder_config(config.model)
  return flops.train_flops_per_token(cfg, config.seq_len, config.seq_len, sentence_head=True)


def compare(config, steps: int, rounds: int, torch_side: TorchProcess) -> dict:
  """Side-by-side medians of one `bert_config`'s train step in bertjax and in PyTorch (`torch_side`,
  already holding its model); bertjax's MFU is against a 2048^3 float32 XLA matmul timed between its
  steps (same machine load)."""
  b = bench.setup(config)
  compiled, compile_seconds = bench.compile_step(b)
  state = b.steps.init(jax.random.key(0))
  state, _ = bench.time_steps(compiled, state, b.batch, 0, 2)  # warm-up
  torch_side.steps(2)
  jax_times, torch_times = [], []
  probe = bench.MatmulProbe()
  for _ in range(rounds):
    state, t = bench.time_steps(compiled, state, b.batch, steps, 0, probe.sample)
    jax_times += t
    time.sleep(0.5)  # let the other runtime's worker threads go idle
    torch_times += torch_side.steps(steps)
    time.sleep(0.5)
  tokens, peak = b.batch_size * b.seq_len, probe.flops_per_sec()
  jax_tps, torch_tps = tokens / statistics.median(jax_times), tokens / statistics.median(torch_times)
  del state
  hf_flops = hf_flops_per_token(config)
  return dict(
      batch_size=b.batch_size, seq_len=b.seq_len, torch_threads=torch_side.info["threads"],
      bertjax_tokens_per_sec=jax_tps, torch_tokens_per_sec=torch_tps, ratio=jax_tps / torch_tps,
      bertjax_step_seconds=statistics.median(jax_times), torch_step_seconds=statistics.median(torch_times),
      bertjax_compile_seconds=compile_seconds, bertjax_flops_per_token=b.flops_per_token,
      hf_flops_per_token=hf_flops, bertjax_mfu=jax_tps * b.flops_per_token / peak,
      torch_mfu_hf_flops=torch_tps * hf_flops / peak, xla_matmul_flops_per_sec=peak,
  )


def torch_side(config) -> TorchProcess:
  """A PyTorch process holding the config's model and the masked synthetic batch bertjax also trains on
  (`bench.setup` draws the same one)."""
  batch = torch_batch(config, bench.synthetic_batch(config, config.batch_size))
  return TorchProcess(torch_spec(config), batch, _THREADS.value or os.cpu_count(), _TORCH_MALLOC.value)


def main(argv):
  del argv
  runtime.setup()  # what every entry point does first: platform, host memory, JAX flags
  results, peak, torch_peak = [], bench.matmul_peak(), None
  for variant in _VARIANTS.value:
    config = bert_config(variant, _BATCH.value, _SEQ.value)
    side = torch_side(config)
    if torch_peak is None:
      torch_peak = side.matmul_peak()
      print(f"device {jax.devices()[0].device_kind}, {os.cpu_count()} cores, torch {side.info['version']} "
            f"with {side.info['threads']} threads in its own process (malloc: {_TORCH_MALLOC.value}); "
            f"2048^3 f32 matmul: XLA {peak / 1e9:.0f} GFLOP/s, PyTorch {torch_peak / 1e9:.0f} GFLOP/s", flush=True)
    r = dict(variant=variant, **compare(config, _STEPS.value, _ROUNDS.value, side))
    side.close()
    results.append(r)
    print(f"{variant:>6} batch {r['batch_size']} x {r['seq_len']}: bertjax {r['bertjax_tokens_per_sec']:8.0f} tok/s "
          f"(MFU {r['bertjax_mfu']:.2f}), PyTorch {r['torch_tokens_per_sec']:8.0f} tok/s, "
          f"ratio {r['ratio']:.2f}x", flush=True)
  print(json.dumps(dict(xla_matmul_peak=peak, torch_matmul_peak=torch_peak, torch_malloc=_TORCH_MALLOC.value,
                        results=results)))


if __name__ == "__main__":
  app.run(main)
