"""BERT (Devlin et al., NAACL 2019): post-LN encoder pretrained with masked LM + next-sentence prediction.

Recipe (paper, §A.2): 1M steps of batch 256, the first 90% at seq 128 and the last 10% at seq 512 (one
schedule through both phases); Adam(1e-4, b2=0.999, wd 0.01), 10k warmup steps, linear decay, dropout 0.1,
15% masking 80/10/10 with at most 20 predictions at 128 and 80 at 512.
`large_lamb`: the LAMB paper's (You et al. 2020) two-phase BERT-large recipe as NVIDIA publishes it.
`tiny_two_phase`: a CPU-sized two-phase run (seq 64 then 128) for tests and users.

  python -m bertjax.train --config=configs/bert.py:base --workdir=gs://BUCKET/bert-base
  python -m bertjax.train --config=configs/bert.py:tiny --workdir=/tmp/bert-tiny   # ~3 min on 2 CPU cores
  python -m bertjax.summary --config=configs/bert.py:large                          # params: 336226108
"""

from bertjax.core.config import defaults, phase, tiny_on_demo

# name: (layers, hidden, heads, ffn). base/large as published; tiny is a CPU smoke-test size.
SIZES = {
    "tiny": (2, 128, 2, 512),
    "tiny_two_phase": (2, 128, 2, 512),
    "base": (12, 768, 12, 3072),
    "large": (24, 1024, 16, 4096),
    "large_lamb": (24, 1024, 16, 4096),
}
# The published masking budgets (google-research/bert README, create_pretraining_data.py's
# max_predictions_per_seq: 20 at seq 128, 80 at 512; NVIDIA's LAMB data uses the same).
PHASES = (phase(0.9, seq_len=128, max_predictions=20), phase(0.1, seq_len=512, max_predictions=80))


def get_config(arg: str = "base"):
  """`arg` is a variant name: tiny | tiny_two_phase | base | large | large_lamb."""
  if arg not in SIZES:
    raise ValueError(f"unknown bert variant {arg!r}; use one of {', '.join(SIZES)}")
  c = defaults()
  # Run: 900k steps at 128 then 100k at 512, batch 256, one warmup + linear decay over all 1M steps.
  c.batch_size, c.seq_len = 256, 128
  c.total_steps, c.warmup_steps, c.learning_rate = 1_000_000, 10_000, 1e-4
  c.phases = PHASES
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
  # AdamWeightDecayOptimizer (google-research/bert optimization.py): no Adam bias correction; no decay on
  # exclude_from_weight_decay=["LayerNorm", "layer_norm", "bias"].
  c.optimizer.bias_correction, c.optimizer.decay_mask = False, "bert"
  c.log_every, c.eval_every, c.checkpoint_every = 100, 10_000, 10_000

  if arg == "large_lamb":
    # NVIDIA DeepLearningExamples PyTorch/LanguageModeling/BERT scripts/run_pretraining.sh (the LAMB paper's
    # recipe, You et al. 2020, Table 4's 64k/32k batches): phase 1 7,038 steps of 65,536 x 128, lr 6e-3, warmup
    # 28.43%; phase 2 1,563 steps of 32,768 x 512, lr 4e-3, warmup 12.8%; each phase restarts the schedule
    # (PolyWarmUpScheduler, degree 0.5); LAMB with weight decay 0.01, clip 1.0: apex FusedLAMB
    # (multi_tensor_lamb.cu), Adam bias correction on (bias_correction=True); run_pretraining.py's no_decay
    # ['bias', 'gamma', 'beta', 'LayerNorm'] get weight decay 0 and so no trust ratio: decay_mask bert.
    steps1, steps2 = 7_038, 1_563
    c.total_steps, c.warmup_steps = steps1 + steps2, 0
    c.phases = (phase(steps1 / (steps1 + steps2), seq_len=128, batch_size=65_536, max_predictions=20,
                      learning_rate=6e-3, warmup_fraction=0.2843),
                phase(steps2 / (steps1 + steps2), seq_len=512, batch_size=32_768, max_predictions=80,
                      learning_rate=4e-3, warmup_fraction=0.128))
    c.optimizer.name, c.optimizer.schedule = "lamb", "poly_sqrt"
    c.optimizer.bias_correction, c.optimizer.decay_mask = True, "bert"
  if arg.startswith("tiny"):
    tiny_on_demo(c)
    c.phases = ()
  if arg == "tiny_two_phase":
    # BERT's shape at CPU size: 90% of the steps at seq 64, then 10% at seq 128 (budgets derived: 10 and 20).
    c.phases = (phase(0.9, seq_len=64), phase(0.1, seq_len=128))
    c.checkpoint_every = 50  # saves at 500, 540 (the boundary) and 550 (inside phase 2)
  return c
