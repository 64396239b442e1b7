"""BERT (Devlin et al., NAACL 2019): post-LN encoder pretrained with masked LM + next-sentence prediction.

Recipe (paper, §A.2): batch 256 x 512 tokens... in practice 90% of 1M steps at seq 128 then 10% at 512;
Adam(1e-4, b2=0.999, wd 0.01), 10k warmup steps, linear decay, dropout 0.1, 15% masking 80/10/10.

  python -m bertjax.train --config=configs/bert.py:base --workdir=gs://BUCKET/bert-base
  python -m bertjax.train --config=configs/bert.py:tiny --workdir=/tmp/bert-tiny   # ~3 min on 2 CPU cores
  python -m bertjax.summary --config=configs/bert.py:large                          # params: 336226108
"""

from bertjax.config import defaults, tiny_on_demo

# name: (layers, hidden, heads, ffn). base/large as published; tiny is a CPU smoke-test size.
SIZES = {
    "tiny": (2, 128, 2, 512),
    "base": (12, 768, 12, 3072),
    "large": (24, 1024, 16, 4096),
}


def get_config(arg: str = "base"):
  """`arg` is a variant name: tiny | base | large."""
  if arg not in SIZES:
    raise ValueError(f"unknown bert variant {arg!r}; use one of {', '.join(SIZES)}")
  c = defaults()
  # Run.
  c.batch_size, c.seq_len = 256, 128
  c.total_steps, c.warmup_steps, c.learning_rate = 1_000_000, 10_000, 1e-4
  # Model.
  c.model.num_layers, c.model.hidden_size, c.model.num_heads, c.model.intermediate_size = SIZES[arg]
  c.model.vocab_size, c.model.max_positions, c.model.type_vocab_size = 30522, 512, 2
  c.model.dtype = "bfloat16"
  # Objectives: MLM + NSP.
  c.objectives.mlm, c.objectives.nsp = 1.0, 1.0
  # Optimizer: AdamW, decay 0.01, clip 1.0; warmup then linear decay to 0 at total_steps
  # (google-research/bert optimization.py: polynomial_decay over num_train_steps, warmup overriding its start).
  c.optimizer.name, c.optimizer.b2, c.optimizer.weight_decay = "adamw", 0.999, 0.01
  c.optimizer.schedule = "linear"
  c.log_every, c.eval_every, c.checkpoint_every = 100, 10_000, 10_000

  if arg == "tiny":
    tiny_on_demo(c)
  return c
