"""ALBERT (Lan et al., ICLR 2020): factorized embeddings (E=128), cross-layer sharing, MLM + SOP, LAMB.

Recipe (paper §4.1): batch 4096, 125k steps, LAMB lr 0.00176, seq 512 (10% shorter), n-gram masking
(n <= 3), no dropout, vocab 30000 (SentencePiece). Sharing saves parameters, not activations or FLOPs.

  python -m bertjax.train --config=configs/albert.py:base --workdir=gs://BUCKET/albert-base
  python -m bertjax.train --config=configs/albert.py:tiny --workdir=/tmp/albert-tiny
  python -m bertjax.summary --config=configs/albert.py:base --config.model.sharing=none   # 89780402
"""

from bertjax.config import defaults, tiny_on_demo

# name: (layers, hidden, heads, ffn), all with E=128. As published (Table 1); tiny is for CPU.
SIZES = {
    "tiny": (2, 128, 2, 512),
    "base": (12, 768, 12, 3072),
    "large": (24, 1024, 16, 4096),
    "xlarge": (24, 2048, 16, 8192),
    "xxlarge": (12, 4096, 64, 16384),
}


def get_config(arg: str = "base"):
  """`arg` is a variant name: tiny | base | large | xlarge | xxlarge."""
  if arg not in SIZES:
    raise ValueError(f"unknown albert variant {arg!r}; use one of {', '.join(SIZES)}")
  c = defaults()
  # Run.
  c.batch_size, c.seq_len = 4096, 512
  c.total_steps, c.warmup_steps, c.learning_rate = 125_000, 3125, 0.00176
  # Data and masking: SOP pairs, n-gram masking of whole words.
  c.masking.scheme, c.masking.max_ngram = "ngram", 3
  # At most 20 predictions per 512-token example (~4%; google-research/albert README and run_pretraining.py
  # max_predictions_per_seq=20), not ceil(512 x 0.15) = 77.
  c.masking.max_predictions = 20
  # Model: factorized embeddings, all layers share one set of parameters.
  c.model.num_layers, c.model.hidden_size, c.model.num_heads, c.model.intermediate_size = SIZES[arg]
  c.model.vocab_size, c.model.embedding_size = 30000, 128
  c.model.sharing, c.model.num_hidden_groups = "all", 1
  c.model.dropout = c.model.attention_dropout = 0.0
  c.model.dtype = "bfloat16"
  # Objectives: MLM + SOP.
  c.objectives.mlm, c.objectives.sop = 1.0, 1.0
  # Optimizer: LAMB (google-research/albert lamb_optimizer.py: no bias correction, biases and LayerNorm
  # excluded from decay and layer adaptation), decay 0.01, clip 1.0, BERT's warmup + linear decay.
  c.optimizer.name, c.optimizer.b2, c.optimizer.weight_decay = "lamb", 0.999, 0.01
  c.optimizer.schedule = "linear"
  c.log_every, c.eval_every, c.checkpoint_every = 100, 10_000, 5_000

  if arg == "tiny":
    tiny_on_demo(c)
    c.masking.max_predictions = 0  # derived: the tiny runs keep BERT's 15% budget
    c.model.embedding_size = 64
    # LAMB scales each update to lr x the weight's norm; 0.02-std weights have small norms, so a short
    # run needs a far larger rate than ALBERT's 0.00176. Re-tuned after LAMB became ALBERT's (no bias
    # correction, biases and LayerNorm not adapted, trust ratio per layer): full 600-step runs on the demo
    # corpus, final eval mlm_accuracy / sop_accuracy (73 SOP pairs, +-0.06 is noise): 0.095 / 0.60 at
    # 5e-3, 0.127 / 0.53 at 1e-2, 0.082 / 0.51 at 2e-2, 0.055 / 0.51 at 4e-2.
    c.learning_rate = 1e-2
  return c
