"""Long rows on the CPU: compiled temporary memory (XLA's memory_analysis of the jitted gradient step) and step time
of one encoder stack per attention and stack kind, at equal width and depth, for sequence lengths 512 to 16,384.

  python benchmarks/long_context.py                                  # 512 ... 16384, 3 timed steps each
  python benchmarks/long_context.py --lengths=512,1024,2048,4096 --steps=1

Stacks (hidden 128, 2 heads of 64, FFN 512, 4 layers, batch 1, float32, dropout 0; the gradient of sum(out^2) with
respect to the parameters and the input, as a training step's backward pass runs):
- dense: BERT's layer with global multi-head attention (layer=bert, mha), scanned, remat none.
- local_global: ModernBERT's pattern, 2 of every 3 layers a sliding window of 128 (mha, local_window, global_every 3).
- lsh: the Reformer layer with LSH attention (chunks 64, 2 rounds, buckets by transformers' rule), reversible.
- local_reversible / local_remat_full: the Reformer layer with local attention (chunks 64, one chunk before and
  after), as a reversible stack (custom VJP) and under plain autodiff with remat=full (scanned): the same parameters.
Step time: the best of --steps runs after the compile. A stack whose dense [S, S] scores would exceed --max_scores_mib
is skipped at that length (printed as "-").
"""

import argparse
import dataclasses
import os
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
os.environ.setdefault("JAX_PLATFORMS", "cpu")

H, HEADS, FFN, LAYERS, BATCH = 128, 2, 512, 4, 1


def stacks(seq_len: int) -> dict:
  """{name: EncoderConfig} of every stack at one length."""
  from bertjax.model import layer_kinds  # noqa: F401  (every kind registers)
  from bertjax.model.hparams import EncoderConfig

  base = EncoderConfig(vocab_size=256, hidden_size=H, num_layers=LAYERS, num_heads=HEADS, intermediate_size=FFN,
                       embedding_size=H, max_positions=seq_len, dropout=0.0, attention_dropout=0.0, scan_unroll=1)
  reformer = dataclasses.replace(base, layer="reformer", norm="reversible", mlm_decoder="untied", use_bias=False,
                                 local_attn_chunk_length=64, lsh_attn_chunk_length=64, local_num_chunks_after=1,
                                 lsh_num_chunks_after=1, num_hashes=2)
  return {
      "dense": base,
      "local_global": dataclasses.replace(base, local_layers=tuple(i % 3 != 0 for i in range(LAYERS)),
                                          local_window=128),
      "lsh": dataclasses.replace(reformer, attention_kind="lsh"),
      "local_reversible": dataclasses.replace(reformer, attention_kind="local"),
      "local_remat_full": dataclasses.replace(reformer, attention_kind="local", reversible=False, remat="full"),
  }


def measure(c, seq_len: int, steps: int) -> tuple:
  """(temporary MiB, best step seconds) of the jitted gradient of one stack."""
  import jax
  import jax.numpy as jnp
  from flax import linen as nn

  from bertjax.model.encoder import Encoder

  x = jax.random.normal(jax.random.key(1), (BATCH, seq_len, H))
  groups = jnp.ones((BATCH, seq_len), jnp.int32)
  params = nn.unbox(jax.jit(Encoder(c).init)(jax.random.key(0), x, groups)["params"])
  grad = jax.jit(jax.grad(lambda p, x: jnp.sum(Encoder(c).apply({"params": p}, x, groups) ** 2), argnums=(0, 1)))
  compiled = grad.lower(params, x).compile()
  temp = compiled.memory_analysis().temp_size_in_bytes / 2**20
  best = float("inf")
  for _ in range(steps):
    start = time.perf_counter()
    jax.block_until_ready(compiled(params, x))
    best = min(best, time.perf_counter() - start)
  return temp, best


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--lengths", default="512,1024,2048,4096,8192,16384")
  parser.add_argument("--steps", type=int, default=3)
  parser.add_argument("--max_scores_mib", type=float, default=4096.0, help="skip dense stacks above this [S, S] size")
  parser.add_argument("--only", default="", help="comma-separated stack names (default: all)")
  args = parser.parse_args(argv)
  lengths = [int(s) for s in args.lengths.split(",")]
  names = list(stacks(512)) if not args.only else args.only.split(",")
  print(f"{'stack':<18}" + "".join(f"{n:>20}" for n in lengths))
  print(f"{'':<18}" + "".join(f"{'temp MiB / step s':>20}" for _ in lengths))
  for name in names:
    cells = []
    for n in lengths:
      c = stacks(n)[name]
      scores_mib = BATCH * HEADS * n * n * 4 / 2**20
      if name in ("dense", "local_global") and scores_mib > args.max_scores_mib:
        cells.append("-")
        continue
      temp, seconds = measure(c, n, args.steps)
      cells.append(f"{temp:,.0f} / {seconds:.2f}")
    print(f"{name:<18}" + "".join(f"{cell:>20}" for cell in cells), flush=True)


if __name__ == "__main__":
  from bertjax.core import cli

  cli.script(main)
