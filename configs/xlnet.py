"""XLNet (Yang et al., NeurIPS 2019, "XLNet: Generalized Autoregressive Pretraining for Language Understanding",
arXiv:1906.08237): permutation language modeling with two-stream relative attention and Transformer-XL memory
(bertjax.model.xlnet; docs/models.md, XLNet).

Variants:
- `large`: XLNet-Large as paper v2 Table 7 gives it (24 layers, d 1024, 16 heads x 64, FFN 4096; batch 8192,
  lr 4e-4, 500k steps, 40k warmup, linear decay, Adam eps 1e-6, weight decay 0.01) with the memory and data
  shape of the reference's train.py command (zihangdai/xlnet@bbaa3a6 README: seq_len 512, reuse_len 256,
  mem_len 384, bi_data from data_utils.py's command, num_predict 85).
- `base`: XLNet-Base, BERT-Base's size; the paper (section 3.4) trains it "with BERT-Base's hyperparameters", so
  BERT's optimizer recipe (batch 256, lr 1e-4, 1M steps, 10k warmup) at XLNet's data shape. The released
  base checkpoint's own recipe is not published: this is our reading.
- `tiny`: a CPU smoke-test size on the demo corpus (the spec sheet's suggestion: d 64, 2 layers, seq 64,
  reuse 32, memory 48).

Where the sources disagree: paper v1 Table 7 has batch 2048, warmup 20k and memory 384 (v2: batch 8192, 40k
warmup; v2 gives no memory length); the reference command matches v1's batch. We take v2's optimizer values
(the published model's) and the command's memory (384, the only stated value). The TF code's `gelu` is the
tanh approximation; transformers runs the released weights with exact GELU and so do we (model.activation=
gelu_new switches). The reference optimizer with weight decay has no bias correction (its
AdamWeightDecayOptimizer), hence optimizer.bias_correction=False; its decay skips LayerNorm and biases but
includes r_w/r_r/r_s_bias, as bertjax's decay mask does (their names are not `bias`).

  python -m bertjax.summary --config=configs/xlnet.py:base    # params: 116750336 (XLNetLMHeadModel)
  python -m bertjax.summary --config=configs/xlnet.py:large   # params: 360300800
  python -m bertjax.aot --config=configs/xlnet.py:large --topology=v4-32
"""

from bertjax.core.config import defaults, tiny_on_demo
from bertjax.model import memory

# name: (layers, d_model, heads, d_inner). base/large as released (xlnet_config.json of each checkpoint).
SIZES = {"tiny": (2, 64, 4, 256), "base": (12, 768, 12, 3072), "large": (24, 1024, 16, 4096)}


def get_config(arg: str = "base"):
  """`arg` is a variant name: tiny | base | large."""
  if arg not in SIZES:
    raise ValueError(f"unknown xlnet variant {arg!r}; use one of {', '.join(SIZES)}")
  c = defaults()
  # Run.
  c.seq_len = 512  # train.py --seq_len=512
  if arg == "large":
    c.batch_size = 8192  # paper v2 Table 7 (v1 and the README command: 2048)
    c.total_steps, c.warmup_steps, c.learning_rate = 500_000, 40_000, 4e-4  # v2 Table 7 (v1: 20k warmup)
  else:
    c.batch_size = 256  # BERT-Base's (paper section 3.4)
    c.total_steps, c.warmup_steps, c.learning_rate = 1_000_000, 10_000, 1e-4  # BERT-Base's
  # Optimizer: Adam eps 1e-6, weight decay 0.01, linear decay (v2 Table 7), clip 1.0 (train.py --clip default),
  # no bias correction (model_utils.AdamWeightDecayOptimizer, used when weight_decay > 0).
  c.optimizer.name, c.optimizer.eps, c.optimizer.weight_decay = "adamw", 1e-6, 0.01
  c.optimizer.schedule, c.optimizer.clip_norm, c.optimizer.bias_correction = "linear", 1.0, False
  # Model.
  m = c.model
  m.num_layers, m.hidden_size, m.num_heads, m.intermediate_size = SIZES[arg]
  m.vocab_size = 32000  # the released SentencePiece model (spiece.model, 32k pieces)
  m.layer = "xlnet"  # the whole model is XLNet's (bertjax.model.xlnet_models); the other kind keys are unread
  m.embedding_size, m.max_positions, m.type_vocab_size = 0, 512, 3  # segment ids 0/1/2 (<cls> is 2): relative
  m.dropout, m.attention_dropout = 0.1, 0.1  # v2 Table 7: hidden dropout 0.1, attention dropout 0.1
  m.layer_norm_eps, m.init_std, m.activation = 1e-12, 0.02, "gelu"  # modeling.py; init normal(0.02)
  m.dtype = "bfloat16"
  m.xlnet = memory.section(
      mem_len=384,  # README train.py --mem_len=384 (paper v1 Table 7: memory length 384)
      reuse_len=256,  # --reuse_len=256: each segment's first half continues the previous one
      clamp_len=-1,  # train.py default: no clamp
      bi_data=True,  # data_utils.py command --bi_data=True: half of each batch reads reversed streams
      attn_type="bi",  # train.py default
      cmem_len=0,  # the Compressive Transformer's memory is off in XLNet's recipe (model.xlnet.cmem_* options)
  )
  # Objectives and data: permutation LM alone (no NSP: paper v2 section 2.5) on the corpus read as streams
  # (bertjax.data.plm; docs/models.md, XLNet's data). Targets: num_predict=85 per 512 (README train.py
  # --num_predict=85, ~1/K with K=6: paper v2 Table 7), spans of about mask_beta=1 in mask_alpha=6 tokens (README
  # data_utils.py --mask_alpha=6 --mask_beta=1); permutation blocks perm_size=256 (train.py --perm_size=256).
  c.objectives.mlm, c.objectives.nsp, c.objectives.plm = 0.0, 0.0, 1.0
  c.data.perm_size, c.data.num_predict, c.data.mask_alpha, c.data.mask_beta = 256, 85, 6.0, 1.0
  c.masking.max_predictions = c.data.num_predict  # what the FLOP count takes as the predicted positions
  c.log_every, c.eval_every, c.checkpoint_every = 100, 10_000, 10_000
  if arg == "tiny":
    tiny_on_demo(c)
    c.seq_len, c.batch_size = 64, 8  # spec sheet's CPU smoke size (B 8 parallel streams)
    m.xlnet.mem_len, m.xlnet.reuse_len, m.xlnet.bi_data = 48, 32, False
    c.data.perm_size, c.data.num_predict = 32, 10  # the reuse part; ~64 / 6
    c.masking.max_predictions = c.data.num_predict
  return c
