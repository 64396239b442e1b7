"""ModernBERT (Warner et al., 2024, "Smarter, Better, Faster, Longer", arXiv:2412.13663): BERT's encoder
modernized: rotary positions (theta 160k on global layers, 10k on local ones), GeGLU feed-forward layers,
pre-LayerNorm with a LayerNorm after the embeddings and a final one, no biases but the decoder's, alternating
attention (global every third layer, a 128-token sliding window elsewhere), unpadded (packed) sequences, 30%
masking, a BPE vocabulary of 50,368 ids, trained on 2T tokens with StableAdamW and a trapezoidal
(warmup-stable-decay) schedule.

Architecture: transformers' ModernBertConfig defaults (= answerdotai/ModernBERT-base config.json) and the
paper's §2.1 and Table 4 (appendix); large: answerdotai/ModernBERT-large config.json. Training: paper §2.2.

  python -m bertjax.train --config=configs/modernbert.py:base --workdir=gs://BUCKET/modernbert-base
  python -m bertjax.summary --config=configs/modernbert.py:base      # params: 149655232 (large: 395881664)
  python -m bertjax.train --config=configs/modernbert.py:tiny --workdir=/tmp/modernbert-tiny   # CPU, minutes

ModernBertModel (the encoder alone) has 149,014,272 (base) and 394,781,696 (large) parameters; the MLM head
adds its dense H->H, its LayerNorm scale and the decoder bias (tied decoder). docs/modernbert.md has the details.
"""

from bertjax.core.config import defaults, tiny_on_demo

# name: (layers, hidden, heads, GeGLU width (each half), peak lr, batch): ModernBertConfig defaults / the
# released config.json files (base 22 x 768, 12 heads, 1152; large 28 x 1024, 16 heads, 2624); lr and batch
# from the paper §2.2 (base lr 8e-4, large 5e-4; batch 4,608 and 4,928 sequences of 1,024 tokens after its
# batch-size warmup). tiny is for CPU.
VARIANTS = {
    "tiny": (2, 128, 2, 256, 2e-3, 32),
    "base": (22, 768, 12, 1152, 8e-4, 4608),
    "large": (28, 1024, 16, 2624, 5e-4, 4928),
}


def get_config(arg: str = "base"):
  """`arg` is a variant name: tiny | base | large."""
  if arg not in VARIANTS:
    raise ValueError(f"unknown modernbert variant {arg!r}; use one of {', '.join(VARIANTS)}")
  layers, hidden, heads, ffn, lr, batch = VARIANTS[arg]
  c = defaults()
  # Run: the paper's first phase trains at 1,024 tokens (§2.2.3: 1.7T tokens at 1,024, then context extension to
  # 8,192); 1.7T / (4,608 x 1,024) ~ 360k steps for base.
  c.batch_size, c.seq_len = batch, 1024
  # Memory, not recipe (the gradient is the whole batch's either way): base's 4,608 rows in 16 microbatches, 18 rows
  # a device on a v4-32 (python -m bertjax.aot: 19.1 of 32 GiB; without accumulation it needs 225 GiB of
  # temporaries). ModernBERT trained microbatches of 96 a GPU (yamls/modernbert device_train_microbatch_size).
  # A v5e-16 needs more (16 microbatches: 16.7 GiB of temporaries, 16 GiB HBM). Large: not measured yet; its
  # 4,928 rows need a grad_accum_steps dividing 308 for 16 devices.
  c.grad_accum_steps = 16 if arg == "base" else 1
  c.total_steps, c.learning_rate = 360_000, lr
  c.warmup_steps = 3_000_000_000 // (batch * 1024)  # §2.2.2: a 3B-token warmup (base; large 2B)
  # Data: unpadded sequences (§2.1.2): whole examples packed into rows with per-example position_ids (RoPE
  # restarts at every example) and groups that keep attention inside each one; a BPE vocabulary (§2.1.3, a
  # modified OLMo tokenizer) when trained on the corpus.
  c.data.format, c.data.tokenizer_model = "packed", "bpe"
  # Masking: 30% (§2.2.1, after Wettig et al. 2023) with BERT's 80/10/10.
  c.masking.scheme, c.masking.mask_prob = "token", 0.30
  c.masking.mask_token_prob, c.masking.random_token_prob = 0.8, 0.1
  # Model: the architecture options, each as ModernBertConfig has it.
  c.model.num_layers, c.model.hidden_size, c.model.num_heads, c.model.intermediate_size = layers, hidden, heads, ffn
  c.model.vocab_size = 50368  # vocab_size: 50,280 BPE tokens padded to a multiple of 64 (§2.1.3)
  c.model.max_positions = 8192  # max_position_embeddings: the context after extension (no position table)
  c.model.type_vocab_size = 0  # no token types (ModernBertEmbeddings has tok_embeddings only)
  c.model.position = "rope"  # §2.1.1 rotary positions
  c.model.rope_theta, c.model.local_rope_theta = 160_000.0, 10_000.0  # global_rope_theta / local_rope_theta
  c.model.ffn, c.model.activation = "geglu", "gelu"  # §2.1.1 GeGLU; hidden_activation "gelu" (exact erf)
  c.model.norm = "pre"  # §2.1.1 pre-normalization, LayerNorm after the embeddings, first attention LN removed
  c.model.use_bias = False  # attention_bias, mlp_bias, norm_bias, classifier_bias False; decoder_bias True
  c.model.layer_norm_eps = 1e-5  # norm_eps
  c.model.local_window, c.model.global_every = 128, 3  # local_attention 128; global_attn_every_n_layers 3
  c.model.init_std = 0.02  # initializer_range (truncated at 2 std: initializer_cutoff_factor 2.0)
  c.model.init = "modernbert"  # _init_weights: attention/FFN outputs and the MLM transform at 0.02 / sqrt(2 x layers)
  # Dropout: embedding_dropout, mlp_dropout and attention_dropout are 0.0 in the released config.json. (The
  # paper's Table 3 lists 0.1 on the attention output only; bertjax's model.dropout would also drop the embeddings
  # and FFN outputs, so it stays 0, which also lets fused attention run.)
  c.model.dropout, c.model.attention_dropout = 0.0, 0.0
  c.model.dtype = "bfloat16"
  # Objectives: MLM only (no NSP).
  c.objectives.mlm = 1.0
  # Masking at evaluation: 15% ("We always evaluate at 15% masking for consistent comparison":
  # AnswerDotAI/ModernBERT yamls/modernbert/modernbert-base-pretrain.yaml, eval_loader mlm_probability 0.15).
  c.masking.eval_mask_prob = 0.15
  # Optimizer: StableAdamW (§2.2.2; the reference yaml's `decoupled_stableadamw`: lr 8e-4, betas (0.9, 0.98), eps
  # 1e-6, weight_decay 1e-5 not on biases and norms, no gradient clipping: StableAdamW clips each tensor's update).
  # The yaml's decay is optimi's fully decoupled one, p *= 1 - (lr_t / peak) * 1e-5; bertjax's is AdamW's
  # p *= 1 - lr_t * wd, so wd = 1e-5 / peak gives the same decay (docs/modernbert_recipe.md).
  c.optimizer.name, c.optimizer.b1, c.optimizer.b2, c.optimizer.eps = "stableadamw", 0.9, 0.98, 1e-6
  c.optimizer.weight_decay, c.optimizer.clip_norm = 1e-5 / lr, 0.0
  # Schedule: warmup-stable-decay with the 1-sqrt decay (§2.2.2, after Hägele et al. 2024). ModernBERT decays in a
  # stage of its own, the last 50B of its 2T tokens (§2.2.3, after the context extension); this one-stage
  # config puts the same share (50B / 2T = 2.5%) at its end.
  c.optimizer.schedule, c.optimizer.decay_fraction = "wsd", 50 / 2000
  c.log_every, c.eval_every, c.checkpoint_every = 100, 10_000, 10_000

  if arg == "tiny":
    tiny_on_demo(c)
    c.model.local_window = 32  # a window shorter than the tiny run's 128-token rows, so local layers matter
    c.model.global_every = 2  # layer 0 global, layer 1 local
    c.optimizer.weight_decay = 1e-5 / c.learning_rate  # the same decay at the tiny run's peak
    c.optimizer.decay_fraction = 0.2  # a 600-step run: Hägele et al.'s 20% cooldown, so the decay shows
  return c
