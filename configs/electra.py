"""ELECTRA (Clark et al., ICLR 2020): a small MLM generator corrupts the input and the discriminator
learns replaced-token detection; loss = generator MLM + 50 x discriminator BCE over all real tokens.

Recipe (paper Table 6): small: batch 128, lr 5e-4, 1M steps, seq 128, generator 1/4; base: batch 256,
lr 2e-4, 766k steps, seq 512, generator 1/3; large: batch 2048, lr 2e-4, 400k steps, seq 512,
generator 1/4, 25% masking. Masked tokens: 85% [MASK], 15% kept, none random. Shared embeddings.
Data as google-research/electra's build_pretraining_dataset.py makes it: data.format=electra.

  python -m bertjax.train --config=configs/electra.py:small --workdir=gs://BUCKET/electra-small
  python -m bertjax.train --config=configs/electra.py:tiny --workdir=/tmp/electra-tiny
  python -m bertjax.summary --config=configs/electra.py:base        # discriminator params: 109483009
"""

from bertjax.core.config import defaults, tiny_on_demo

# name: (layers, hidden, heads, ffn, embedding, generator fraction, batch, lr, steps, seq, mask rate).
VARIANTS = {
    "tiny": (2, 128, 2, 512, 128, 1 / 4, 32, 5e-4, 600, 128, 0.15),
    "small": (12, 256, 4, 1024, 128, 1 / 4, 128, 5e-4, 1_000_000, 128, 0.15),
    "base": (12, 768, 12, 3072, 768, 1 / 3, 256, 2e-4, 766_000, 512, 0.15),
    "large": (24, 1024, 16, 4096, 1024, 1 / 4, 2048, 2e-4, 400_000, 512, 0.25),
}


def get_config(arg: str = "small"):
  """`arg` is a variant name: tiny | small | base | large."""
  if arg not in VARIANTS:
    raise ValueError(f"unknown electra variant {arg!r}; use one of {', '.join(VARIANTS)}")
  layers, hidden, heads, ffn, emb, frac, batch, lr, steps, seq, rate = VARIANTS[arg]
  c = defaults()
  # Run.
  c.batch_size, c.seq_len = batch, seq
  c.total_steps, c.warmup_steps, c.learning_rate = steps, 10_000, lr
  # Data: ELECTRA's examples (google-research/electra build_pretraining_dataset.py, ExampleBuilder): whole
  # sentences up to seq_len, 90% split into segments A and B (type ids 0 and 1) though there is no sentence
  # objective, 10% one segment; the next example's target is random in [5, seq_len] with probability 0.05
  # (`random.random() < 0.05` there); one pass over the corpus (its script has no dupe factor; masking is
  # dynamic, so each epoch masks the rows anew).
  c.data.format, c.data.short_seq_prob, c.data.dupe_factor = "electra", 0.05, 1
  # Masking: ELECTRA replaces 85% of the chosen tokens by [MASK] and keeps 15%; no random tokens.
  c.masking.mask_prob, c.masking.mask_token_prob, c.masking.random_token_prob = rate, 0.85, 0.0
  # google-research/electra configure_pretraining.py: max_predictions_per_seq = int((mask_prob + 0.005) * seq).
  c.masking.max_predictions = int((rate + 0.005) * seq)
  # Model: discriminator sizes; the generator is `generator_fraction` as wide (same depth).
  c.model.num_layers, c.model.hidden_size, c.model.num_heads, c.model.intermediate_size = layers, hidden, heads, ffn
  c.model.vocab_size, c.model.embedding_size = 30522, emb
  c.model.generator_fraction, c.model.sample_temperature = frac, 1.0
  c.model.dtype = "bfloat16"
  # Objectives: generator MLM (weight 1) + discriminator RTD (weight 50). No sentence objective.
  c.objectives.mlm, c.objectives.rtd = 1.0, 50.0
  # Optimizer: AdamW; warmup *multiplies* the linear decay (google-research/electra model/optimization.py).
  c.optimizer.name, c.optimizer.b2, c.optimizer.weight_decay = "adamw", 0.999, 0.01
  c.optimizer.schedule = "electra"
  # AdamWeightDecayOptimizer (electra model/optimization.py, BERT's): no Adam bias correction; no decay on
  # exclude_from_weight_decay=["LayerNorm", "layer_norm", "bias"].
  c.optimizer.bias_correction, c.optimizer.decay_mask = False, "bert"
  c.log_every, c.eval_every, c.checkpoint_every = 100, 10_000, 10_000

  if arg == "tiny":
    tiny_on_demo(c)
    # The shared tiny rate (2e-3) leaves the discriminator at the base rate (micro runs, 150 steps:
    # eval/rtd_auc 0.53 at 2e-3, 0.81 at 5e-4); ELECTRA-small's own 5e-4 works.
    c.learning_rate = lr
    # Sampling temperature 2: in 600 steps the generator learns roughly the unigram distribution of the
    # ~100k-token corpus (mlm_accuracy ~0.12, as BERT-tiny's), and a 2-layer discriminator learns no
    # better language model than that, so samples at temperature 1 are undetectable (final eval/rtd_auc
    # 0.54) -- the paper's "too strong a generator" (Sec. 3.2) at tiny scale. A flatter sampling
    # distribution keeps the generator weaker than the discriminator: final eval/rtd_auc 0.77 at 2.0,
    # 0.72 at 1.5 (same steps, same generator accuracy). Other variants keep the paper's 1.0.
    c.model.sample_temperature = 2.0
  return c
