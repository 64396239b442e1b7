"""The encoder's hyperparameters: the frozen `EncoderConfig` every part reads, and the depth-wide constants
(sharing modes, remat policies, how many layers one scan iteration unrolls)."""

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp

SHARING_MODES = ("none", "all", "attention", "ffn")
# Up to this depth the layer scan is unrolled (same parameters, initialization and randomness): a rolled
# loop stacks every layer's saved activations into [layers, ...] buffers (zero-filled, then sliced in the
# backward pass), ~10% of a 2-layer CPU step, while a few unrolled layers add little compile time. Deeper
# models keep the rolled loop, so their compile time stays flat in depth, except on the CPU, where step time
# wins and every layer is unrolled (bertjax.model.config.scan_unroll).
UNROLL_MAX_LAYERS = 4


def default_unroll(num_layers: int) -> int:
  """Layers per scan iteration when the config leaves it open (scan_unroll 0 off the CPU): all up to
  UNROLL_MAX_LAYERS, else 1."""
  return num_layers if num_layers <= UNROLL_MAX_LAYERS else 1


def layers_per_iteration(c) -> int:
  """How many layers one iteration of the layer scan runs (its `unroll`)."""
  return c.scan_unroll or default_unroll(c.num_layers)


# Non-trainable state a quantizer keeps per layer (bertjax.compress.q8bert's activation ranges): stacked
# along the layer scan like the params.
QUANT_RANGES = "quant_ranges"

REMAT_POLICIES = {
    "none": None,  # keep every activation: fastest, most memory
    "full": jax.checkpoint_policies.nothing_saveable,  # recompute the whole layer in the backward pass
    "dots": jax.checkpoint_policies.checkpoint_dots,  # keep matmul outputs, recompute the cheap rest
    "dots_no_batch": jax.checkpoint_policies.checkpoint_dots_with_no_batch_dims,  # keep weight matmuls only
}


@dataclasses.dataclass(frozen=True)
class EncoderConfig:
  """Hyperparameters of one encoder (the layers see nothing else of the run config)."""

  vocab_size: int
  hidden_size: int
  num_layers: int
  num_heads: int
  intermediate_size: int
  embedding_size: int  # E: equals hidden_size unless embeddings are factorized (ALBERT, ELECTRA-small)
  max_positions: int = 512
  type_vocab_size: int = 2
  dropout: float = 0.1
  attention_dropout: float = 0.1
  layer_norm_eps: float = 1e-12
  init_std: float = 0.02
  sharing: str = "none"  # which blocks all layers of a group share: none | all | attention | ffn
  num_groups: int = 1  # ALBERT num_hidden_groups: distinct parameter sets of the shared blocks
  dtype: Any = jnp.float32  # compute dtype; parameters stay float32
  remat: str = "none"  # key of REMAT_POLICIES
  activation: str = "gelu"  # gelu (exact erf, BERT) | gelu_new (tanh approximation, ALBERT)
  position_offset: int = 0  # first position id (HF RoBERTa counts from padding_idx + 1 = 2)
  scan_unroll: int = 0  # layers per scan iteration; 0: all of them up to UNROLL_MAX_LAYERS, else 1
  attention_kind: str = "mha"  # the attention kind (bertjax.model.kinds): mha | a registered one
  attention: str = "xla"  # resolved implementation (bertjax.model.attention): xla | dot_product | cudnn | splash
  head_size: int = 0  # width of one head; 0: hidden_size // num_heads (set when heads were pruned away)
  # Dense matmuls contract the kernel in its own shape, as a quantization library intercepting dot_general
  # needs (qwix matches the operand to the parameter; bertjax.compress.quantize sets it); else as a 2-D [in, out] matrix.
  quantizable: bool = False
  # Sequence length dropout masks are drawn for (0: the input's own). Fine-tuning sets seq_len, so a batch
  # cut to a shorter length bucket gets the fixed-length batch's masks cut to its length: buckets change
  # the cost of a step, not its randomness (bertjax.finetune.batches).
  dropout_length: int = 0
  # The dropout masks' counter-based generator (bertjax.model.dropout.GENERATORS): threefry (the reference) |
  # lowbias32 (cheaper; the CPU's default through model.dropout_rng=auto, bertjax.model.config.dropout_rng).
  dropout_rng: str = "threefry"
  # ModernBERT-class options (docs/modernbert.md); the defaults are BERT's and change nothing.
  # Kinds of the encoder's parts, looked up in bertjax.model.kinds (each module there says what it does).
  position: str = "learned"  # learned (absolute table) | rope (rotary, from position_ids; no table)
  rope_theta: float = 160_000.0  # RoPE base of the global-attention layers (ModernBERT's global_rope_theta)
  local_rope_theta: float = 10_000.0  # ... of the local (sliding-window) layers (ModernBERT's local_rope_theta)
  ffn: str = "mlp"  # mlp (dense-act-dense) | geglu (act(x W_in) * (x W_gate), then W_out; intermediate x2)
  norm: str = "post"  # post (BERT) | pre (LN before each block, a final LN; the first layer's attention LN skipped)
  use_bias: bool = True  # biases of the encoder's dense layers, its LayerNorms and the MLM transform
  local_layers: tuple = ()  # per layer, True: sliding-window attention; empty: every layer global
  local_window: int = 0  # a local layer's whole window: a token sees tokens at most local_window // 2 away
  init: str = "bert"  # bert (truncated normal init_std everywhere) | modernbert (output projections / sqrt(2 L))
  # How a dense layer's weight gradient is computed: "xla" (autodiff: x^T @ dy with x transposed in the
  # dot, which XLA:CPU's YNNPACK rejects and leaves to Eigen) | "transposed" (`matmul_pretransposed`).
  dense_grad: str = "xla"
  # Tree Transformer (bertjax.model.constituent): neighbour-score divisor (0: hidden_size), renormalized rows.
  constituent_scale: float = 256.0
  constituent_renormalize: bool = False
  complex_positions: str = "descending"  # complex-order embeddings (bertjax.model.complex_order)
  # Tree attention on given parses (bertjax.model.tree_attention): index clamps, vertical index (depth | path).
  tree_max_horiz: int = 100
  tree_max_vert: int = 1024
  tree_vertical: str = "depth"
  # The Lite Transformer's long-short range attention (attention_kind="lsra", bertjax.model.lsra); read by no other kind.
  lsra_kernel_sizes: tuple = ()  # per layer (one value: every layer); empty: the reference's 3, 7, 15, 31, ...
  lsra_conv: str = "dynamic"  # dynamic (a kernel per position from the input) | lightweight (a kernel per head)
  lsra_glu: bool = True  # the convolution branch's input Linear doubles its width and gates it (GLU)
  lsra_weight_dropout: float = -1.0  # DropConnect rate of the convolution kernels; < 0: attention_dropout
  # Reformer's chunked attentions (attention_kind local | lsh: bertjax.model.chunked, .lsh) and the per-layer pattern
  # of attention kinds (attention_kind per_layer: bertjax.model.per_layer); names as transformers' ReformerConfig's.
  attn_layers: tuple = ()  # per_layer: the attention kind of each layer of a repeating pattern ("local", "lsh")
  causal: bool = False  # local, lsh: a query reads no later key (transformers' is_decoder)
  local_attn_chunk_length: int = 64
  local_num_chunks_before: int = 1
  local_num_chunks_after: int = 0
  local_attention_dropout: float = -1.0  # < 0: attention_dropout
  lsh_attn_chunk_length: int = 64
  lsh_num_chunks_before: int = 1
  lsh_num_chunks_after: int = 0
  lsh_attention_dropout: float = -1.0  # < 0: attention_dropout
  num_hashes: int = 1  # lsh: hash rounds
  num_buckets: tuple = ()  # lsh: (buckets,) or its factors; (): transformers' rule from the row's length
  hash_seed: int = -1  # lsh: >= 0: one set of rotations for every layer and step; < 0: drawn per layer (and step)
  # MobileBERT-class options (docs/models.md, MobileBERT); the defaults are BERT's and change nothing.
  layer: str = "bert"  # the layer kind (bertjax.model.layer_kinds): bert | mobilebert (bottleneck block)
  bottleneck_size: int = 0  # mobilebert: the intra-bottleneck width (HF intra_bottleneck_size)
  bottleneck_qk_shared: bool = False  # mobilebert: queries and keys read one shared bottleneck of the input
  bottleneck_attention: bool = False  # mobilebert: queries, keys and values read the input bottleneck (tiny)
  num_ffn: int = 1  # mobilebert: feed-forward networks stacked in one layer, each with residual and norm
  trigram_input: bool = False  # the [next, current, previous] word embeddings concatenated (3E wide)
  embedding_transformation: bool = False  # E (3E) -> H inside the embeddings; position/type tables H wide
  mlm_extra_output: bool = False  # MLM transform H -> H, decoder [word embeddings^T; extra [H - E, V]]
  pooler_activation: bool = True  # the sentence head's tanh pooler; False: [CLS]'s state as it is
  # Reformer-class options (docs/models.md, Reformer; configs/reformer.py); the defaults change nothing.
  reversible: bool = True  # layer=reformer: the stack's custom VJP recomputes inputs; False: plain autodiff (remat)
  chunk_size_feed_forward: int = 0  # layer=reformer: FFN over chunks of this many positions (0: at once)
  axial_pos_shape: tuple = ()  # position=axial: (d1, d2), position p -> (p // d2, p % d2)
  axial_pos_embds_dim: tuple = ()  # position=axial: (e1, e2) widths of the two tables, e1 + e2 = E
  axial_norm_std: float = 1.0  # position=axial: std of the tables' normal init (transformers' axial_norm_std)
  mlm_decoder: str = "tied"  # tied (word embeddings^T after the transform) | untied (Reformer: Linear(2H -> V))

  @property
  def projects_in_encoder(self) -> bool:
    """Whether the encoder maps E to H (ALBERT's factorized embeddings; MobileBERT's embeddings do it)."""
    return self.embedding_size != self.hidden_size and not self.embedding_transformation

  @property
  def head_dim(self) -> int:
    return self.head_size or self.hidden_size // self.num_heads

  @property
  def half_window(self) -> int:
    return self.local_window // 2

