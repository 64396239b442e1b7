"""The model section of the run config: the frozen EncoderConfig it makes, and the checks of its values."""

import jax

from bertjax.core import config as config_lib
from bertjax.core.config import check, DTYPES
from bertjax.model import attention as attention_lib, kinds, layer_kinds, lsra, xlnet_models  # noqa: F401  (the built-in kinds)
from bertjax.model.dropout import GENERATORS
from bertjax.model.hparams import EncoderConfig, REMAT_POLICIES, SHARING_MODES
from bertjax.model.layers import ACTIVATIONS, DENSE_GRADS


def encoder_config(m, generator: bool = False, platform: str | None = None) -> EncoderConfig:
  """The frozen EncoderConfig of the main network, or of the ELECTRA generator (widths scaled), with the
  attention implementation that model.attention resolves to on `platform` (default: JAX's backend)."""
  f = m.generator_fraction if generator else 1.0
  impl, _ = resolve_attention(m, platform or jax.default_backend(), strict=False)
  hidden = int(m.hidden_size * f)
  return EncoderConfig(
      vocab_size=m.vocab_size, hidden_size=hidden, num_layers=m.num_layers,
      num_heads=max(1, int(m.num_heads * f)), intermediate_size=int(m.intermediate_size * f),
      embedding_size=m.embedding_size or m.hidden_size, max_positions=m.max_positions,
      type_vocab_size=m.type_vocab_size, dropout=m.dropout, attention_dropout=m.attention_dropout,
      layer_norm_eps=m.layer_norm_eps, init_std=m.init_std, sharing=m.sharing,
      num_groups=m.num_hidden_groups if m.sharing != "none" else 1, dtype=DTYPES[m.dtype], remat=m.remat,
      scan_unroll=scan_unroll(m.scan_unroll, m.num_layers, platform or jax.default_backend()),
      dropout_rng=dropout_rng(m.get("dropout_rng", "auto"), platform or jax.default_backend()),
      activation=m.activation, position_offset=m.position_offset, attention=impl, head_size=m.head_size,
      position=m.position, rope_theta=m.rope_theta, local_rope_theta=m.local_rope_theta, ffn=m.ffn, norm=m.norm,
      use_bias=m.use_bias, local_layers=local_layers(m), local_window=m.local_window, init=m.init,
      attention_kind=m.attention_kind, layer=m.layer, bottleneck_size=m.bottleneck_size,
      bottleneck_qk_shared=m.bottleneck_qk_shared, bottleneck_attention=m.bottleneck_attention, num_ffn=m.num_ffn,
      trigram_input=m.trigram_input, embedding_transformation=m.embedding_transformation,
      mlm_extra_output=m.mlm_extra_output, pooler_activation=m.pooler_activation,
      lsra_kernel_sizes=lsra.parse_kernel_sizes(m.lsra_kernel_sizes),
      lsra_conv=m.lsra_conv, lsra_glu=m.lsra_glu, lsra_weight_dropout=m.lsra_weight_dropout,
      constituent_scale=m.constituent_scale,
      constituent_renormalize=m.constituent_renormalize,
      complex_positions=m.complex_positions, tree_max_horiz=m.get("tree_max_horiz", 100),
      tree_max_vert=m.get("tree_max_vert", 1024), tree_vertical=m.get("tree_vertical", "depth"),
      reversible=m.reversible, chunk_size_feed_forward=m.chunk_size_feed_forward,
      axial_pos_shape=tuple(m.axial_pos_shape), axial_pos_embds_dim=tuple(m.axial_pos_embds_dim),
      axial_norm_std=m.axial_norm_std, mlm_decoder=m.mlm_decoder,
      attn_layers=config_lib.names_list(m.attn_layers), causal=m.causal,
      local_attn_chunk_length=m.local_attn_chunk_length, local_num_chunks_before=m.local_num_chunks_before,
      local_num_chunks_after=m.local_num_chunks_after, local_attention_dropout=m.local_attention_dropout,
      lsh_attn_chunk_length=m.lsh_attn_chunk_length, lsh_num_chunks_before=m.lsh_num_chunks_before,
      lsh_num_chunks_after=m.lsh_num_chunks_after, lsh_attention_dropout=m.lsh_attention_dropout,
      num_hashes=m.num_hashes, num_buckets=config_lib.ints_list(m.num_buckets, "model.num_buckets"),
      hash_seed=m.hash_seed,
      dense_grad=dense_grad(m.get("dense_grad", "xla"), platform or jax.default_backend()))


def resolve_attention(m, platform: str, strict: bool = True) -> tuple[str, str]:
  """(implementation, notice) that model.attention resolves to on `platform` for the model section `m`:
  attention_lib.resolve's, except xla for an attention kind no fused kernel can run (its `fused` is False)."""
  impl, notice = attention_lib.resolve(m.attention, m.attention_dropout, platform, m.dtype, strict=strict)
  if impl != "xla" and not kinds.get("attention", m.attention_kind).fused:
    return "xla", f"model.attention={m.attention}: model.attention_kind={m.attention_kind} runs on xla attention only"
  return impl, notice


def local_layers(m) -> tuple:
  """Per layer, whether it attends locally: model.layer_types when given, else every layer but each
  global_every-th (layers 0, global_every, 2 x global_every, ... are global; ModernBERT: every third);
  () when model.local_window is 0 (every layer global)."""
  if not m.local_window:
    return ()
  if m.layer_types:
    return tuple(t.strip() == "local" for t in m.layer_types.split(","))
  return tuple(i % m.global_every != 0 for i in range(m.num_layers))


def scan_unroll(value: int, num_layers: int, platform: str) -> int:
  """model.scan_unroll resolved on a platform: 0 (automatic) runs every layer unrolled on the CPU, where a
  rolled loop's saved activations are copied into [layers, ...] buffers and back (BERT-base's train step
  351 -> 371 tokens/s unrolled, docs/cpu.md), and leaves the choice to the encoder elsewhere (up to
  hparams.UNROLL_MAX_LAYERS layers unrolled, else rolled: compile time flat in depth)."""
  return num_layers if value == 0 and platform == "cpu" else value


def dense_grad(value: str, platform: str) -> str:
  """model.dense_grad resolved on a platform: `auto` is `transposed` on the CPU (XLA:CPU's YNNPACK then runs
  the weight gradients, which it otherwise leaves to Eigen: docs/cpu.md) and `xla` elsewhere."""
  if value == "auto":
    return "transposed" if platform == "cpu" else "xla"
  return value


def dropout_rng(value: str, platform: str) -> str:
  """model.dropout_rng resolved on a platform: `auto` is `lowbias32` on the CPU (a 32-bit integer hash per
  element: the attention-dropout masks of a MiniLM fine-tuning step cost ~8x less than Threefry's, docs/cpu.md)
  and `threefry`, the reference, elsewhere (not measured there)."""
  if value == "auto":
    return "lowbias32" if platform == "cpu" else "threefry"
  return value


def check_dropout_rng(m):
  """Checks model.dropout_rng (of a pretraining or a fine-tuning config's model section)."""
  check(m.get("dropout_rng", "auto") in ("auto", *GENERATORS),
        f"model.dropout_rng={m.get('dropout_rng')!r}; use one of auto, {', '.join(GENERATORS)}")


def validate(config):
  """Checks config.model (head width, activation, sharing, remat, dtype, attention at every phase's seq_len);
  raises UserError with the fix on the first problem."""
  m = config.model
  check(m.head_size > 0 or m.hidden_size % m.num_heads == 0,
        f"model.hidden_size={m.hidden_size} is not divisible by model.num_heads={m.num_heads}; "
        "change one of them so that the head width is whole")
  check(m.activation in ACTIVATIONS, f"model.activation={m.activation!r}; use one of {', '.join(ACTIVATIONS)}")
  check(m.sharing in SHARING_MODES, f"model.sharing={m.sharing!r}; use one of {', '.join(SHARING_MODES)}")
  check(m.remat in REMAT_POLICIES, f"model.remat={m.remat!r}; use one of {', '.join(REMAT_POLICIES)}")
  check(m.get("dense_grad", "xla") in ("auto", *DENSE_GRADS),
        f"model.dense_grad={m.get('dense_grad')!r}; use one of auto, {', '.join(DENSE_GRADS)}")
  check_dropout_rng(m)
  check(m.dtype in DTYPES, f"model.dtype={m.dtype!r}; use one of {', '.join(DTYPES)}")
  check(m.num_hidden_groups >= 1 and m.num_layers % m.num_hidden_groups == 0,
        f"model.num_hidden_groups={m.num_hidden_groups} must divide model.num_layers={m.num_layers}")
  _validate_kinds(m)
  kinds.check_run(config)


def _validate_kinds(m):
  """The kinds of the encoder's parts (bertjax.model.kinds: each family's key names a registered kind, and each
  kind checks its own options: rope's head width, the pattern of local layers) and the init scheme."""
  kinds.check(m)
  check(not m.attn_layers or m.attention_kind == "per_layer", f"model.attn_layers={m.attn_layers!r} names each "
        "layer's attention kind for model.attention_kind=per_layer only; set it, or clear attn_layers")
  check(m.init in ("bert", "modernbert"), f"model.init={m.init!r}; use bert or modernbert")
  check(m.mlm_decoder in ("tied", "untied"), f"model.mlm_decoder={m.mlm_decoder!r}; use tied or untied")
  check(not m.trigram_input or m.embedding_transformation,
        "model.trigram_input=True concatenates 3 embeddings that only the embeddings' projection maps to H; "
        "set model.embedding_transformation=True")


def validate_attention(config):
  """Checks that the requested attention runs at every phase's seq_len (model.attention's own rules)."""
  m = config.model
  attention_lib.check(m.attention, m.attention_dropout, m.dtype, [p.config.seq_len for p in config_lib.phases(config)])
