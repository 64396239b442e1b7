"""RoBERTa (Liu et al., 2019): BERT's encoder without NSP, dynamic masking, 50k byte-level BPE vocab,
full-sentence inputs, Adam betas (0.9, 0.98), large batches, no gradient clipping.

Recipe (paper Table 9, pretraining hyperparameters): base: batch 8k, 500k steps, peak lr 6e-4, warmup 24k;
large: batch 8k, 500k steps, peak lr 4e-4, warmup 30k; both: Adam betas (0.9, 0.98), eps 1e-6, weight decay
0.01, dropout 0.1, attention dropout 0.1, gradient clipping 0.0 (none), linear decay; sequences of at most
512 tokens (§3.1). fairseq's published recipe (examples/roberta/README.pretraining.md) trains with the same
flags: `--optimizer adam --adam-betas '(0.9, 0.98)' --adam-eps 1e-6 --clip-norm 0.0 --lr-scheduler
polynomial_decay --weight-decay 0.01 --dropout 0.1 --attention-dropout 0.1 --tokens-per-sample 512`
(its own example run is smaller: batch 2048, lr 5e-4, 125k updates, 10k warmup).
Positions: 514 (HF counts the padding offset).

  python -m bertjax.train --config=configs/roberta.py:base --workdir=gs://BUCKET/roberta-base
  python -m bertjax.summary --config=configs/roberta.py:base       # params: 124697433
"""

from bertjax.core.config import defaults, tiny_on_demo

# name: (layers, hidden, heads, ffn, peak lr, warmup): paper Table 9 (tiny is for CPU).
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
  # Run: Table 9's batch size 8k (fairseq README.pretraining.md's lr table: 8192 sequences) and 500k max
  # steps; sequences of at most 512 tokens (§3.1; fairseq --tokens-per-sample 512).
  c.batch_size, c.seq_len = 8192, 512  # 512 + offset 2 = the 514 positions
  c.total_steps, c.warmup_steps, c.learning_rate = 500_000, warmup, lr
  # Data: FULL-SENTENCES packing across documents (no NSP, §4.2); a BPE vocabulary when trained on the corpus.
  c.data.format, c.data.tokenizer_model = "full_sentences", "bpe"
  # Masking: BERT's 15% with 80/10/10 (§2.3, §4.1 dynamic masking; fairseq masked_lm's mask_prob 0.15,
  # leave_unmasked_prob 0.1, random_token_prob 0.1), a fresh mask each step as bertjax always masks.
  c.masking.scheme, c.masking.mask_prob = "token", 0.15
  c.masking.mask_token_prob, c.masking.random_token_prob = 0.8, 0.1
  # Model: one segment type, 514 positions, 50265 BPE ids (HF roberta-base config.json).
  c.model.num_layers, c.model.hidden_size, c.model.num_heads, c.model.intermediate_size = layers, hidden, heads, ffn
  c.model.vocab_size, c.model.max_positions, c.model.type_vocab_size = 50265, 514, 1
  c.model.layer_norm_eps, c.model.position_offset = 1e-5, 2  # HF position ids start at padding_idx + 1
  c.model.dropout, c.model.attention_dropout = 0.1, 0.1  # Table 9
  c.model.dtype = "bfloat16"
  # Objectives: MLM only.
  c.objectives.mlm = 1.0
  # Optimizer: Table 9's Adam betas (0.9, 0.98), eps 1e-6, weight decay 0.01 (fairseq's adam decouples it, as
  # AdamW, and decays every parameter: decay_mask all; it corrects Adam's bias), gradient clipping 0.0 (fairseq
  # --clip-norm 0.0: none; bertjax.train.optim treats 0 as off); linear decay as fairseq's polynomial_decay (power
  # 1, end lr 0), which decays over the steps after warmup.
  c.optimizer.name, c.optimizer.b1, c.optimizer.b2, c.optimizer.eps = "adamw", 0.9, 0.98, 1e-6
  c.optimizer.weight_decay, c.optimizer.clip_norm = 0.01, 0.0
  c.optimizer.schedule = "linear_after_warmup"
  c.optimizer.bias_correction, c.optimizer.decay_mask = True, "all"  # fairseq/optim/adam.py (see above)
  c.log_every, c.eval_every, c.checkpoint_every = 100, 10_000, 10_000

  if arg == "tiny":
    tiny_on_demo(c)
  return c
