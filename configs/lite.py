"""Lite Transformer (Wu, Liu, Lin, Lin, Han, ICLR 2020, "Lite Transformer with Long-Short Range Attention"): every
layer's attention is long-short range attention (LSRA): half the channels through multi-head attention, half through
a light or dynamic convolution (model.attention_kind=lsra; bertjax/model/lsra.py, docs/models.md), with a
"flattened" feed-forward block as wide as the model.

The paper trains encoder-decoder translation models; these configs are its encoders as MLM encoders. Architecture:
the authors' code (mit-han-lab/lite-transformer, fairseq/models/transformer_multibranch_v2.py base_architecture)
and its configs: `embed496` = configs/wmt14.en-fr/attention/multibranch_v2/embed496.yml (the paper's headline
WMT'14 En-Fr model: branches attn:248:4 + dynamic:248:4, GLU), `embed160` =
configs/iwslt14.de-en/attention/multibranch_v2/embed160.yml (attn:80:4 + lightweight:80:4, no GLU). Training: the
WMT yml's optimizer and schedule; there is no published MLM recipe, so the data and masking are BERT's.

  python -m bertjax.train --config=configs/lite.py:tiny --workdir=/tmp/lite-tiny
  python -m bertjax.summary --config=configs/lite.py:embed496
"""

from bertjax.core.config import defaults, tiny_on_demo

# name: (layers, hidden, heads per branch, ffn, conv, glu, dropout, attention dropout, weight dropout): the ymls'
# encoder-embed-dim, encoder-branch-type (type:kernel:dim:heads), encoder-ffn-embed-dim, encoder-glu, dropout,
# attention-dropout (embed160 sets none: base_architecture's 0.0) and weight-dropout; 6 layers (base_architecture's
# encoder_layers). tiny is for CPU: the embed496 branches at width 128.
VARIANTS = {
    "tiny": (2, 128, 2, 128, "dynamic", True, 0.1, 0.1, 0.1),
    "embed496": (6, 496, 4, 496, "dynamic", True, 0.1, 0.08, 0.08),
    "embed160": (6, 160, 4, 160, "lightweight", False, 0.2, 0.0, 0.1),
}


def get_config(arg: str = "embed496"):
  """`arg` is a variant name: tiny | embed496 | embed160."""
  if arg not in VARIANTS:
    raise ValueError(f"unknown lite variant {arg!r}; use one of {', '.join(VARIANTS)}")
  layers, hidden, heads, ffn, conv, glu, dropout, attention_dropout, weight_dropout = VARIANTS[arg]
  c = defaults()
  # Run: the WMT yml's update is max-tokens 4096 x update-freq 16 x 8 GPUs = 524,288 tokens: 1,024 rows of 512;
  # 50k updates (max-update), 5k warmup (warmup-updates), peak 1e-3 (max-lr).
  c.batch_size, c.seq_len = 1024, 512
  c.total_steps, c.warmup_steps, c.learning_rate = 50_000, 5_000, 1e-3
  # Data: the reference's encoder sees one sentence at a time; packed rows keep each example apart (attention and
  # the convolution stay inside it, positions restart), without the padding.
  c.data.format = "packed"
  # Masking: BERT's 15% with 80/10/10 (no published MLM recipe).
  c.masking.scheme, c.masking.mask_prob = "token", 0.15
  c.masking.mask_token_prob, c.masking.random_token_prob = 0.8, 0.1
  # Model.
  c.model.num_layers, c.model.hidden_size, c.model.num_heads, c.model.intermediate_size = layers, hidden, heads, ffn
  c.model.attention_kind = "lsra"  # encoder-branch-type: [attn:1:d/2:heads, conv:default:d/2:heads]
  c.model.lsra_conv, c.model.lsra_glu = conv, glu  # the branch type; encoder-glu
  c.model.lsra_kernel_sizes = "3,7,15,31,31,31"  # base_architecture's encoder_kernel_size_list ("default" kernels)
  c.model.dropout, c.model.attention_dropout = dropout, attention_dropout
  c.model.lsra_weight_dropout = weight_dropout  # weight-dropout (DropConnect on the convolution kernels)
  c.model.max_positions = 1024  # DEFAULT_MAX_SOURCE_POSITIONS
  c.model.attention = "xla"  # lsra runs its attention half with the xla implementation
  c.model.vocab_size, c.model.type_vocab_size = 30522, 2  # BERT's uncased WordPiece (the ymls' dictionaries are MT's)
  c.model.dtype = "bfloat16"  # the ymls train in fp32 (fp16: false); bf16 as every bertjax recipe on accelerators
  # Objectives: MLM only.
  c.objectives.mlm = 1.0
  # Optimizer: Adam betas (0.9, 0.98) (adam-betas), no weight decay (weight-decay 0.0) and no clipping (clip-norm
  # 0.0); a cosine schedule from warmup to 0 (lr-scheduler cosine, one period of lr-period-updates 45k = the
  # steps after warmup, min-lr 1e-9). eps: fairseq's Adam default 1e-8.
  c.optimizer.name, c.optimizer.b1, c.optimizer.b2, c.optimizer.eps = "adamw", 0.9, 0.98, 1e-8
  c.optimizer.weight_decay, c.optimizer.clip_norm = 0.0, 0.0
  c.optimizer.schedule = "cosine"
  c.optimizer.bias_correction = True  # fairseq's Adam corrects its moments' bias
  c.log_every, c.eval_every, c.checkpoint_every = 100, 5_000, 5_000
  if arg == "embed160":  # the IWSLT yml: lr 5e-4 (its inverse_sqrt schedule is not bertjax's), weight-decay 1e-4
    c.learning_rate, c.warmup_steps, c.optimizer.weight_decay = 5e-4, 4_000, 1e-4

  if arg == "tiny":
    tiny_on_demo(c)  # seq 128, batch 32, 600 steps, vocab 2000, the demo corpus
    c.model.lsra_kernel_sizes = "3,7"  # the reference's first two layers' kernels
  return c
