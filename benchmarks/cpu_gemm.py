"""The matmuls of a BERT train step, one at a time: XLA:CPU (what jax compiles them to) against PyTorch (MKL).

Issue #35 asks why bertjax's CPU train step runs below PyTorch's at equal work. This times each GEMM shape of
one dense layer (forward `x @ W`, input gradient `dy @ W^T`, weight gradient `x^T @ dy`) and attention's
batched dots (scores, context, and the context's gradient contracted over the queries) alone, float32,
both sides on the same threads, alternating in one process, and prints GFLOP/s per side and their ratio.
If every dot is slower in isolation, no routing of the step's dots can make the step faster than PyTorch's.

  python benchmarks/cpu_gemm.py                      # BERT-base (8 x 128 tokens) and MiniLM (32 x 96) shapes
  python benchmarks/cpu_gemm.py --repeats=40 --json=/tmp/gemm.json
"""

import argparse
import json
import os
import statistics
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# name: (tokens, hidden, ffn, batch x heads, seq, head width)
MODELS = {"bert-base 8x128": (1024, 768, 3072, 8 * 12, 128, 64), "minilm 32x96": (3072, 384, 1536, 32 * 12, 96, 32)}


def cases(tokens, hidden, ffn, bh, seq, dh):
  """(name, jax einsum, torch function of the operands, operand shapes, flops) of every dot of one layer."""
  dense = []
  for k, n in ((hidden, hidden), (hidden, ffn), (ffn, hidden)):
    f = 2.0 * tokens * k * n
    dense += [(f"dense {k}->{n} fwd  x@W", "tk,kn->tn", lambda a, b: a @ b, [(tokens, k), (k, n)], f),
              (f"dense {k}->{n} dx   dy@W^T", "tn,kn->tk", lambda a, b: a @ b.T, [(tokens, n), (k, n)], f),
              (f"dense {k}->{n} dW   x^T@dy", "tk,tn->kn", lambda a, b: a.T @ b, [(tokens, k), (tokens, n)], f)]
  f = 2.0 * bh * seq * seq * dh
  attention = [("attention scores  q@k^T", "bqd,bkd->bqk", lambda a, b: a @ b.transpose(1, 2),
                [(bh, seq, dh), (bh, seq, dh)], f),
               ("attention context p@v", "bqk,bkd->bqd", lambda a, b: a @ b, [(bh, seq, seq), (bh, seq, dh)], f),
               ("attention dv      p^T@dy", "bqk,bqd->bkd", lambda a, b: a.transpose(1, 2) @ b,
                [(bh, seq, seq), (bh, seq, dh)], f)]
  return dense + attention


def main():
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--repeats", type=int, default=20, help="timed calls per side and round")
  p.add_argument("--rounds", type=int, default=3, help="rounds alternating the two sides (the median is kept)")
  p.add_argument("--json", default="")
  args = p.parse_args()
  from bertjax.core import runtime

  runtime.setup()
  import jax
  import jax.numpy as jnp
  import numpy as np
  import torch

  torch.set_num_threads(os.cpu_count())

  def timed(run, repeats):
    run()
    t0 = time.perf_counter()
    for _ in range(repeats):
      out = run()
    getattr(out, "block_until_ready", lambda: None)()  # jax runs async: wait; torch has already finished
    return (time.perf_counter() - t0) / repeats

  print(f"{os.cpu_count()} cores, jax {jax.__version__} ({jax.default_backend()}), torch {torch.__version__} "
        f"({torch.get_num_threads()} threads); GFLOP/s, median of {args.rounds} rounds of {args.repeats} calls")
  rows = []
  for model, dims in MODELS.items():
    print(f"\n{model}\n  {'dot':28s} {'jax':>7s} {'torch':>7s} {'jax/torch':>10s}")
    for name, spec, torch_fn, shapes, flops in cases(*dims):
      rng = np.random.default_rng(0)
      arrays = [rng.standard_normal(s).astype(np.float32) for s in shapes]
      jx = [jnp.asarray(a) for a in arrays]
      tx = [torch.from_numpy(a) for a in arrays]
      fn = jax.jit(lambda a, b, spec=spec: jnp.einsum(spec, a, b))
      np.testing.assert_allclose(np.asarray(fn(*jx)), torch_fn(*tx).numpy(), rtol=2e-3, atol=2e-2)
      times = {"jax": [], "torch": []}
      for _ in range(args.rounds):
        times["jax"].append(timed(lambda: fn(*jx), args.repeats))
        times["torch"].append(timed(lambda: torch_fn(*tx), args.repeats))
      rate = {k: flops / statistics.median(v) / 1e9 for k, v in times.items()}
      rows.append(dict(model=model, dot=name, jax_gflops=rate["jax"], torch_gflops=rate["torch"],
                       ratio=rate["jax"] / rate["torch"]))
      print(f"  {name:28s} {rate['jax']:7.0f} {rate['torch']:7.0f} {rate['jax'] / rate['torch']:9.2f}x", flush=True)
  if args.json:
    with open(args.json, "w") as f:
      json.dump(rows, f, indent=1)


if __name__ == "__main__":
  from bertjax.core import cli

  cli.script(main)
