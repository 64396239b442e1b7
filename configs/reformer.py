"""Reformer (Kitaev, Kaiser, Levskaya, ICLR 2020, "Reformer: The Efficient Transformer", arXiv:2001.04451), as
transformers 5.24 implements it (models/reformer): reversible layers over two streams with a final LayerNorm over
both (model.layer=reformer, bertjax/model/reversible.py), an FFN run in chunks of positions, axial position
embeddings, no token types, no embedding norm, an untied 2H -> V decoder; attention local or LSH per layer.

Variants:
- `enwik8`: google/reformer-enwik8's config.json (transformers' ReformerModelWithLMHead; the PaddleNLP copy of the
  hub file, spec sheet mobilebert_reformer.md section 3.1). bertjax trains encoders with MLM, so this is its shape,
  not its causal LM objective: ReformerModelWithLMHead has 149,182,980 parameters (spec sheet 3.6).
- `mlm_base`: the spec sheet's BERT-base-like ReformerForMaskedLM (vocab 30,522, H 768, 12 x 64 heads, FFN 3,072,
  12 layers [local, lsh] x 6, axial (16, 32) / (256, 512), 512 positions): 151,885,940 parameters.
- `tiny`: a CPU recipe on the demo corpus (tiny_on_demo): 2 layers of width 64, axial (8, 16) for seq_len 128.

  python -m bertjax.summary --config=configs/reformer.py:enwik8     # params: 149182980
  python -m bertjax.train --config=configs/reformer.py:tiny --workdir=/tmp/reformer-tiny

Axial positions train at exactly d1 x d2 positions (transformers raises otherwise), so seq_len is d1 x d2 and packed
rows are refused. transformers' Reformer has no published MLM recipe; the training values of mlm_base are BERT's.
"""

from bertjax.core.config import defaults, tiny_on_demo

# name: (vocab, hidden, layers, heads, head width, FFN, activation, axial shape, axial widths, max positions,
# hidden dropout, local chunk, LSH chunk, hashes, buckets, attention pattern). enwik8: config.json's vocab_size 258,
# hidden_size 1024, num_hidden_layers 12 (= len(attn_layers)), num_attention_heads 8, attention_head_size 128,
# feed_forward_size 4096, hidden_act relu, axial_pos_shape [128, 512], axial_pos_embds_dim [256, 768],
# max_position_embeddings 65536, hidden_dropout_prob 0.2, local_attn_chunk_length 128, lsh_attn_chunk_length 256,
# num_hashes 4, num_buckets 512, attn_layers [local, local, lsh, local, local, local, lsh, local, local, local,
# lsh, local]. mlm_base: the spec sheet's section 3.6 row, ReformerConfig's defaults for the rest (gelu,
# hidden_dropout_prob 0.05, chunks of 64, 1 hash, num_buckets None: "" here, transformers' _set_num_buckets rule).
# tiny: 2 hash rounds of 4 buckets in chunks of 32 (128 = 4 chunks).
ENWIK8_PATTERN = "local,local,lsh,local,local,local,lsh,local,local,local,lsh,local"
VARIANTS = {
    "enwik8": (258, 1024, 12, 8, 128, 4096, "relu", (128, 512), (256, 768), 65536, 0.2, 128, 256, 4, "512",
               ENWIK8_PATTERN),
    "mlm_base": (30522, 768, 12, 12, 64, 3072, "gelu", (16, 32), (256, 512), 512, 0.05, 64, 64, 1, "",
                 ",".join(["local,lsh"] * 6)),
    "tiny": (2000, 64, 2, 2, 32, 128, "gelu", (8, 16), (32, 32), 128, 0.05, 32, 32, 2, "4", "local,lsh"),
}


def get_config(arg: str = "mlm_base"):
  """`arg` is a variant name: tiny | enwik8 | mlm_base."""
  if arg not in VARIANTS:
    raise ValueError(f"unknown reformer variant {arg!r}; use one of {', '.join(VARIANTS)}")
  (vocab, hidden, layers, heads, head, ffn, act, axial_shape, axial_dims, max_pos, dropout, local_chunk, lsh_chunk,
   hashes, buckets, pattern) = VARIANTS[arg]
  c = defaults()
  # Run: BERT-base's shape (no published MLM recipe for the Reformer): 256 x 512 (= d1 x d2 of mlm_base), 1M steps,
  # AdamW 1e-4, 10k warmup.
  c.batch_size, c.seq_len = 256, axial_shape[0] * axial_shape[1]
  c.total_steps, c.warmup_steps, c.learning_rate = 1_000_000, 10_000, 1e-4
  # Data: one example a row, no packing (axial positions, module docstring).
  c.data.format = "single"
  # Model.
  m = c.model
  m.vocab_size, m.hidden_size, m.num_layers, m.num_heads, m.head_size = vocab, hidden, layers, heads, head
  m.intermediate_size, m.activation = ffn, act
  m.layer, m.norm, m.mlm_decoder = "reformer", "reversible", "untied"  # ReformerLayer, ReformerOnlyLMHead
  m.position, m.axial_pos_shape, m.axial_pos_embds_dim = "axial", axial_shape, axial_dims
  m.axial_norm_std = 1.0  # ReformerConfig's axial_norm_std
  m.max_positions, m.type_vocab_size = max_pos, 0  # no token types (ReformerEmbeddings)
  m.dropout, m.attention_dropout = dropout, 0.1  # hidden_dropout_prob; lsh_attention_probs_dropout_prob
  # local_attention_probs_dropout_prob: enwik8's 0.2, ReformerConfig's default 0.1 elsewhere.
  m.local_attention_dropout = 0.2 if arg == "enwik8" else 0.1
  m.layer_norm_eps = 1e-12  # ReformerConfig's layer_norm_eps
  m.init_std = 0.02  # ReformerConfig's initializer_range
  m.use_bias = False  # query/key/value and the attention output have no bias (the FFN and norms keep theirs)
  m.chunk_size_feed_forward = 0  # ReformerConfig's (PreTrainedConfig's) default
  m.attention = "xla"  # local and lsh run on xla
  m.attention_kind, m.attn_layers = "per_layer", pattern  # attn_layers
  m.local_attn_chunk_length, m.lsh_attn_chunk_length = local_chunk, lsh_chunk
  m.local_num_chunks_before, m.local_num_chunks_after = 1, 0  # local_num_chunks_before / _after
  m.lsh_num_chunks_before, m.lsh_num_chunks_after = 1, 0  # lsh_num_chunks_before / _after
  m.num_hashes, m.num_buckets = hashes, buckets
  m.causal = arg == "enwik8"  # is_decoder: enwik8 is a causal LM (bertjax trains it with MLM all the same)
  # Objectives: MLM only.
  c.objectives.mlm = 1.0
  c.optimizer.name, c.optimizer.weight_decay = "adamw", 0.01
  if arg == "tiny":
    tiny_on_demo(c)  # batch 32, 600 steps, vocab 2000, the demo corpus; seq 128 = 8 x 16
  return c
