"""StructBERT (Wang et al., ICLR 2020): BERT with two structural objectives beside MLM: the word-structural
objective (WSO: restore the order of shuffled trigrams) and the sentence-structural objective (SSO: is B
the next sentence, the previous one, or one from another document).

Recipe (paper §2.2 and §3 "Pre-training"): BERT's architecture (base and large); WSO: 5% of the unmasked
trigrams (K = 3) shuffled, the original tokens predicted at their positions through the MLM head; SSO: a
3-way classifier on [CLS] over pairs that are next / previous / other-document with probability 1/3 each;
MLM as BERT's (15%, 80/10/10); sequences of up to 512 tokens; Adam lr 1e-4, betas (0.9, 0.999), L2 weight
decay 0.01, warmup over the first 10% of the steps then linear decay, dropout 0.1, GELU; 40 epochs over
English Wikipedia and BookCorpus. The paper gives no step count or batch for those 40 epochs: bertjax takes
BERT's 1M steps of 256 sequences, which BERT's paper (§A.2) states are about 40 epochs of the same corpus.

  python -m bertjax.train --config=configs/structbert.py:tiny --workdir=/tmp/structbert-tiny
  python -m bertjax.summary --config=configs/structbert.py:base    # params: 110107197
"""

from bertjax.core.config import defaults, tiny_on_demo

# name: (layers, hidden, heads, ffn): BERT-base and BERT-large (paper §3); tiny is for CPU.
SIZES = {
    "tiny": (2, 128, 2, 512),
    "base": (12, 768, 12, 3072),
    "large": (24, 1024, 16, 4096),
}


def get_config(arg: str = "base"):
  """`arg` is a variant name: tiny | base | large."""
  if arg not in SIZES:
    raise ValueError(f"unknown structbert variant {arg!r}; use one of {', '.join(SIZES)}")
  c = defaults()
  # Run: sequences of up to 512 tokens; 40 epochs = BERT's 1M steps of 256 (see above); warmup over the first
  # 10% of the steps, peak 1e-4 (§3).
  c.batch_size, c.seq_len = 256, 512
  c.total_steps, c.learning_rate = 1_000_000, 1e-4
  c.warmup_steps, c.warmup_fraction = -1, 0.1
  # Data: SSO pairs (next / previous / other document, 1/3 each; data.format follows the sso objective), BERT's
  # 10% shorter pair targets (data.short_seq_prob 0.1).
  c.data.short_seq_prob = 0.1
  # Masking: BERT's (15% of the tokens, 80/10/10); WSO shuffles 5% of the unmasked trigrams (§2.2).
  c.masking.scheme, c.masking.mask_prob = "token", 0.15
  c.masking.mask_token_prob, c.masking.random_token_prob = 0.8, 0.1
  c.masking.wso_share = 0.05
  # Model: BERT's (uncased WordPiece, 30522 ids: alibaba/AliceMind StructBERT config/large_bert_config.json).
  c.model.num_layers, c.model.hidden_size, c.model.num_heads, c.model.intermediate_size = SIZES[arg]
  c.model.vocab_size, c.model.max_positions, c.model.type_vocab_size = 30522, 512, 2
  c.model.dropout = c.model.attention_dropout = 0.1
  c.model.dtype = "bfloat16"
  # Objectives: MLM + WSO + SSO, summed with equal weights (§2.2: the objectives are trained jointly).
  c.objectives.mlm, c.objectives.wso, c.objectives.sso = 1.0, 1.0, 1.0
  # Optimizer: Adam, L2 weight decay 0.01 (decoupled, as every bertjax recipe), betas (0.9, 0.999), linear
  # decay (§3). eps and clipping are not published: BERT's 1e-6 and 1.0.
  c.optimizer.name, c.optimizer.b1, c.optimizer.b2, c.optimizer.eps = "adamw", 0.9, 0.999, 1e-6
  c.optimizer.weight_decay, c.optimizer.clip_norm = 0.01, 1.0
  c.optimizer.schedule = "linear"
  # The pretraining code is not published; the optimizer alibaba/AliceMind releases with StructBERT
  # (StructBERT/optimization.py BERTAdam) corrects Adam's bias, and BERT's recipe excludes biases and LayerNorm.
  c.optimizer.bias_correction, c.optimizer.decay_mask = True, "bert"
  c.log_every, c.eval_every, c.checkpoint_every = 100, 10_000, 10_000

  if arg == "tiny":
    tiny_on_demo(c)  # seq 128, batch 32, 600 steps, vocab 2000: ~5 WSO trigrams and 20 MLM slots a row
  return c
