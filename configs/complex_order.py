"""Complex-order embeddings (Wang, Zhao, Lioma, Li, Zhang and Simonsen, ICLR 2020, "Encoding word order in
complex embeddings"): a word's embedding is the amplitude of r exp(i omega pos) with a learned frequency vector
omega per word (model.position=complex_order, bertjax.model.complex_order; docs/models.md), on BERT's real
encoder and MLM. The embedding-only variant: the paper's complex layers are not here.

Recipe: the authors' classification Transformer (github.com/FreedomIntelligence/complex-order, TEXT
CLASSIFICATION/Transformer/config.py: N=1, d 256, d_ff 512, 8 heads, dropout 0.1) has no pretraining recipe;
base is BERT-base's shape and recipe with the complex embedding in place of the learned positions.

  python -m bertjax.train --config=configs/complex_order.py:tiny --workdir=/tmp/complex-tiny   # CPU, minutes
"""

from bertjax.core.config import defaults, tiny_on_demo

# name: (layers, hidden, heads, ffn). base: BERT-base's shape; tiny is a CPU smoke-test size.
SIZES = {
    "tiny": (2, 128, 2, 512),
    "base": (12, 768, 12, 3072),
}


def get_config(arg: str = "base"):
  """`arg` is a variant name: tiny | base."""
  if arg not in SIZES:
    raise ValueError(f"unknown complex_order variant {arg!r}; use one of {', '.join(SIZES)}")
  c = defaults()
  # Run: BERT-base's (Devlin et al. 2019: 1M steps of 256 x 512 tokens, 1e-4, 10k warmup).
  c.batch_size, c.seq_len = 256, 512
  c.total_steps, c.warmup_steps, c.learning_rate = 1_000_000, 10_000, 1e-4
  # Data: one example per row (blocks of whole sentences): the code's descending count runs along the row.
  c.data.format = "single"
  # Model: the frequency table replaces the position table; positions counted as the authors' code counts them
  # (Complex_order.py: klen - 1 down to 0 along the row); --config.model.complex_positions=ascending: the paper's.
  c.model.num_layers, c.model.hidden_size, c.model.num_heads, c.model.intermediate_size = SIZES[arg]
  c.model.position, c.model.complex_positions = "complex_order", "descending"
  # Objectives: MLM only (the code's models are classifiers; no sentence objective to carry over).
  c.objectives.mlm, c.objectives.nsp = 1.0, 0.0
  c.log_every, c.eval_every, c.checkpoint_every = 100, 1000, 10_000

  if arg == "tiny":
    tiny_on_demo(c)  # seq 128, batch 32, 600 steps, vocab 2000 on the demo corpus
  return c
