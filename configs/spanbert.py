"""SpanBERT (Joshi et al., TACL 2020): BERT pretrained on single segments with span masking, MLM + the
span-boundary objective (SBO), no NSP.

Recipe (paper §3, §4.1 "Implementation", Appendix A "Pre-training procedure"): single contiguous segments of
up to 512 tokens, stopping at a document boundary, no NSP and none of BERT's short-sequence tricks; span
masking: 15% of the tokens in spans of whole words with length ~ Geometric(0.2) clipped at 10 (mean 3.8
words), [MASK]/random/kept 80/10/10 decided per span; loss = MLM + SBO; BERT-large's shape on cased WordPiece
(the released spanbert-base-cased and spanbert-large-cased: vocab 28996); Adam lr 1e-4, betas (0.9, 0.999),
L2 weight decay 0.01, 10,000 warmup steps then linear decay, dropout 0.1, GELU; batch 256, 2.4M steps.
The published command (facebookresearch/SpanBERT pretraining/README.md) adds --adam-eps 1e-8 --clip-norm 1.0
--max-pair-targets 15 --replacement-method span; its fairseq code decays every parameter, ends blocks on
sentence boundaries and draws random replacements from the corpus token stream. The span sampler is SpanBERT's
own (masking.py; `masking.scheme=span`). Every value's source and the differences that remain: docs/recipes.md.

  python -m bertjax.train --config=configs/spanbert.py:tiny --workdir=/tmp/spanbert-tiny
  python -m bertjax.summary --config=configs/spanbert.py:base      # params: 110300480
"""

from bertjax.core.config import defaults, tiny_on_demo

# name: (layers, hidden, heads, ffn). base and large are BERT's (paper §4.1: "the model configuration of
# BERT-large"; spanbert-base-cased is BERT-base's shape); tiny is for CPU.
SIZES = {
    "tiny": (2, 128, 2, 512),
    "base": (12, 768, 12, 3072),
    "large": (24, 1024, 16, 4096),
}


def get_config(arg: str = "base"):
  """`arg` is a variant name: tiny | base | large."""
  if arg not in SIZES:
    raise ValueError(f"unknown spanbert variant {arg!r}; use one of {', '.join(SIZES)}")
  c = defaults()
  # Run: batch 256 sequences of up to 512 tokens for 2.4M steps, 10k warmup steps (Appendix A).
  c.batch_size, c.seq_len = 256, 512
  c.total_steps, c.warmup_steps, c.learning_rate = 2_400_000, 10_000, 1e-4
  # Data: single segments of whole sentences up to 512 tokens, ending at a document boundary (§4.1: "we always
  # take sequences of up to 512 tokens until it reaches a document boundary"); no pairs, so no short targets
  # (--short-seq-prob 0.0). The sentence that would overflow a block starts the next (no_nsp_span_bert_dataset.py
  # BlockDataset, break_mode doc); the rows depend on no seed, so they are written once (dupe_factor aside).
  c.data.format = "single"
  # Masking: SpanBERT's span sampler (§3.1): geometric(p=0.2) lengths in whole words clipped at 10, 15% of the
  # tokens (ceil, as its masking.py), 80/10/10 per span; max_predictions derived: ceil(512 x 0.15) = 77.
  c.masking.scheme, c.masking.mask_prob, c.masking.span_p, c.masking.max_span = "span", 0.15, 0.2, 10
  c.masking.mask_token_prob, c.masking.random_token_prob = 0.8, 0.1
  # Random replacements from the corpus token stream (masking.py span_masking: np.random.choice(tokens), tokens
  # the training split's token buffer): each id with probability proportional to its count.
  c.masking.replace_dist = "unigram"
  # Model: BERT's architecture on cased WordPiece (spanbert-*-cased config.json: vocab_size 28996, 512
  # positions, 2 segment types), dropout 0.1 on all layers, GELU (Appendix A).
  c.model.num_layers, c.model.hidden_size, c.model.num_heads, c.model.intermediate_size = SIZES[arg]
  c.model.vocab_size, c.model.max_positions, c.model.type_vocab_size = 28996, 512, 2
  c.model.dropout = c.model.attention_dropout = 0.1
  c.model.dtype = "bfloat16"
  # Objectives: MLM + SBO, summed (§3.2: L(x_i) = L_MLM(x_i) + L_SBO(x_i); --pair-loss-weight 1.0); no NSP (§3.3,
  # --no-nsp). SBO predicts the first 15 tokens of a span (--max-pair-targets 15: bertjax.model.heads).
  c.objectives.mlm, c.objectives.sbo = 1.0, 1.0
  # Optimizer: the published command (pretraining/README.md: --optimizer adam --lr 0.0001 --weight-decay 0.01
  # --adam-eps 1e-8 --clip-norm 1.0 --warmup-updates 10000 --lr-scheduler polynomial_decay; betas default
  # (0.9, 0.999)). Its fairseq/optim/adam.py decouples the weight decay, applies it to every parameter
  # (decay_mask all: no bias/LayerNorm groups) and corrects Adam's bias (eps added to sqrt(v) before the
  # correction: docs/recipes.md). Its polynomial_decay_schedule.py (SpanBERT's fairseq copy) sets
  # lr x (1 - t / T) after the warmup, over the whole run as BERT's: bertjax's "linear" (--end-learning-rate
  # default 0; --min-lr 1e-9 is fairseq's stopping threshold, not a floor).
  c.optimizer.name, c.optimizer.b1, c.optimizer.b2, c.optimizer.eps = "adamw", 0.9, 0.999, 1e-8
  c.optimizer.weight_decay, c.optimizer.clip_norm = 0.01, 1.0
  c.optimizer.schedule = "linear"
  c.optimizer.bias_correction, c.optimizer.decay_mask = True, "all"
  c.log_every, c.eval_every, c.checkpoint_every = 100, 10_000, 10_000

  if arg == "tiny":
    tiny_on_demo(c)  # seq 128 (max_predictions ceil(128 x 0.15) = 20), batch 32, 600 steps, vocab 2000
  return c
