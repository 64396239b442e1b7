"""Tree Transformer (Wang, Lee and Chen, EMNLP 2019, "Tree Transformer: Integrating Tree Structures into
Self-Attention"): BERT's MLM with constituent attention, which induces a binary-ish tree of every sentence
without a parser (model.attention_kind=constituent, bertjax.model.constituent; docs/models.md).

Recipe: the authors' code (github.com/yaushian/Tree-Transformer solver.py, main.py, README): 10 layers, d 512,
d_ff 2048, 8 heads, dropout 0.1, Adam 1e-4 (0.9, 0.98, eps 1e-9), gradient clip 1.5, batch 64 sentences of at
most 60 tokens, MLM only, 60k steps. Their parser reads the break probabilities of layers 9 down to 2.

  python -m bertjax.train --config=configs/tree.py:tiny --workdir=/tmp/tree-tiny          # CPU, minutes
  python -m bertjax.compress.trees --workdir=/tmp/tree-tiny --sentence="The cat sat on the mat."
  python -m bertjax.train --config=configs/tree.py:base --config.data.source=text:GLOB --workdir=W

Differences from the code, all deliberate: learned positions (theirs are sinusoidal, embeddings x sqrt(d)),
BERT's post-LayerNorm (theirs is pre-LN: --config.model.norm=pre; the neighbour scores then read the layer's
normalized input through their own LayerNorm), BERT's LayerNorm (theirs divides by the unbiased std + 1e-6),
BERT's initializer (theirs Xavier uniform), and a constant learning rate without warmup is theirs (here BERT's
linear warmup and decay).
"""

from bertjax.core.config import defaults, tiny_on_demo

# name: (layers, hidden, heads, ffn). base: solver.py `_make_model(N=10, d_model=512, d_ff=2048, h=8)`.
SIZES = {
    "tiny": (3, 128, 2, 512),
    "base": (10, 512, 8, 2048),
}


def get_config(arg: str = "base"):
  """`arg` is a variant name: tiny | base."""
  if arg not in SIZES:
    raise ValueError(f"unknown tree variant {arg!r}; use one of {', '.join(SIZES)}")
  c = defaults()
  # Run: solver.py trains 60k steps (main.py --num_step) on batches of 64 sentences (--batch_size 64).
  c.batch_size, c.seq_len = 64, 64
  c.total_steps, c.warmup_steps, c.learning_rate = 60_000, 1_000, 1e-4
  # Data: one sentence of <= 60 tokens per example (utils.py text2id(txt, 60)): packed blocks of whole sentences of
  # one document, each its own attention group with positions restarting (neighbours never cross examples).
  c.data.format = "packed"
  # Model: constituent attention in every layer, the code's neighbour scale (/256) and unnormalized rows.
  c.model.num_layers, c.model.hidden_size, c.model.num_heads, c.model.intermediate_size = SIZES[arg]
  c.model.attention_kind = "constituent"
  c.model.attention = "xla"  # the prior multiplies the probabilities: no fused kernel can
  c.model.constituent_scale, c.model.constituent_renormalize = 256.0, False
  c.model.max_positions = 512
  # Objectives: MLM only (solver.py: masked_lm_loss).
  c.objectives.mlm = 1.0
  # Optimizer: solver.py: Adam(lr 1e-4, betas (0.9, 0.98), eps 1e-9), clip_grad_norm_ 1.5, no weight decay.
  c.optimizer.name, c.optimizer.b1, c.optimizer.b2, c.optimizer.eps = "adamw", 0.9, 0.98, 1e-9
  c.optimizer.weight_decay, c.optimizer.clip_norm = 0.0, 1.5
  c.log_every, c.eval_every, c.checkpoint_every = 200, 1000, 1000  # solver.py: prints every 200, saves every 1000

  if arg == "tiny":
    tiny_on_demo(c)  # batch 32, 600 steps, vocab 2000 on the demo corpus
    c.seq_len = 64  # short rows of whole sentences, as the code's 60-token sentences
  return c
