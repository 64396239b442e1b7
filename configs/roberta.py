"""RoBERTa (Liu et al., 2019): BERT's encoder without NSP, dynamic masking, 50k byte-level BPE vocab,
full-sentence inputs, Adam betas (0.9, 0.98), large batches.

Recipe (paper Table 9): base: batch 8k, 500k steps, lr 6e-4, warmup 24k; large: batch 8k, 500k steps,
lr 4e-4, warmup 30k; seq 512, eps 1e-6, weight decay 0.01. Positions: 514 (HF counts the padding offset).

  python -m bertjax.train --config=configs/roberta.py:base --workdir=gs://BUCKET/roberta-base
  python -m bertjax.summary --config=configs/roberta.py:base       # params: 124697433
"""

from bertjax.config import defaults, tiny_on_demo

# name: (layers, hidden, heads, ffn, lr, warmup).
VARIANTS = {
    "tiny": (2, 128, 2, 512, 1e-3, 100),
    "base": (12, 768, 12, 3072, 6e-4, 24_000),
    "large": (24, 1024, 16, 4096, 4e-4, 30_000),
}


def get_config(arg: str = "base"):
  """`arg` is a variant name: tiny | base | large."""
  if arg not in VARIANTS:
    raise ValueError(f"unknown roberta variant {arg!r}; use one of {', '.join(VARIANTS)}")
  layers, hidden, heads, ffn, lr, warmup = VARIANTS[arg]
  c = defaults()
  # Run.
  c.batch_size, c.seq_len = 8192, 512  # 512 + offset 2 = the 514 positions
  c.total_steps, c.warmup_steps, c.learning_rate = 500_000, warmup, lr
  # Data: FULL-SENTENCES packing across documents (no NSP); a BPE vocabulary when trained on the corpus.
  c.data.format, c.data.tokenizer_model = "full_sentences", "bpe"
  # Model: one segment type, 514 positions, 50265 BPE ids.
  c.model.num_layers, c.model.hidden_size, c.model.num_heads, c.model.intermediate_size = layers, hidden, heads, ffn
  c.model.vocab_size, c.model.max_positions, c.model.type_vocab_size = 50265, 514, 1
  c.model.layer_norm_eps, c.model.position_offset = 1e-5, 2  # HF position ids start at padding_idx + 1
  c.model.dtype = "bfloat16"
  # Objectives: MLM only (dynamic masking is how bertjax always masks).
  c.objectives.mlm = 1.0
  # Optimizer: Adam betas (0.9, 0.98); fairseq's polynomial_decay, which decays over the steps after warmup.
  c.optimizer.name, c.optimizer.b2, c.optimizer.eps, c.optimizer.weight_decay = "adamw", 0.98, 1e-6, 0.01
  c.optimizer.schedule = "linear_after_warmup"
  c.log_every, c.eval_every, c.checkpoint_every = 100, 10_000, 10_000

  if arg == "tiny":
    tiny_on_demo(c)
  return c
