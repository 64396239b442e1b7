"""The model section of the run config: the frozen EncoderConfig it makes, and the checks of its values."""

import jax

from bertjax.core import config as config_lib
from bertjax.core.config import check, DTYPES
from bertjax.model import attention as attention_lib
from bertjax.model.encoder import DENSE_GRADS, EncoderConfig, REMAT_POLICIES, SHARING_MODES


def encoder_config(m, generator: bool = False, platform: str | None = None) -> EncoderConfig:
  """The frozen EncoderConfig of the main network, or of the ELECTRA generator (widths scaled), with the
  attention implementation that model.attention resolves to on `platform` (default: JAX's backend)."""
  f = m.generator_fraction if generator else 1.0
  impl, _ = attention_lib.resolve(m.attention, m.attention_dropout, platform or jax.default_backend(), m.dtype,
                                  strict=False)
  hidden = int(m.hidden_size * f)
  return EncoderConfig(
      vocab_size=m.vocab_size, hidden_size=hidden, num_layers=m.num_layers,
      num_heads=max(1, int(m.num_heads * f)), intermediate_size=int(m.intermediate_size * f),
      embedding_size=m.embedding_size or m.hidden_size, max_positions=m.max_positions,
      type_vocab_size=m.type_vocab_size, dropout=m.dropout, attention_dropout=m.attention_dropout,
      layer_norm_eps=m.layer_norm_eps, init_std=m.init_std, sharing=m.sharing,
      num_groups=m.num_hidden_groups if m.sharing != "none" else 1, dtype=DTYPES[m.dtype], remat=m.remat,
      scan_unroll=m.scan_unroll,
      activation=m.activation, position_offset=m.position_offset, attention=impl, head_size=m.head_size,
      dense_grad=dense_grad(m.get("dense_grad", "xla"), platform or jax.default_backend()))


def dense_grad(value: str, platform: str) -> str:
  """model.dense_grad resolved on a platform: `auto` is `transposed` on the CPU (XLA:CPU's YNNPACK then runs
  the weight gradients, which it otherwise leaves to Eigen: docs/cpu.md) and `xla` elsewhere."""
  if value == "auto":
    return "transposed" if platform == "cpu" else "xla"
  return value


def validate(config):
  """Checks config.model (head width, activation, sharing, remat, dtype, attention at every phase's seq_len);
  raises UserError with the fix on the first problem."""
  m = config.model
  check(m.head_size > 0 or m.hidden_size % m.num_heads == 0,
        f"model.hidden_size={m.hidden_size} is not divisible by model.num_heads={m.num_heads}; "
        "change one of them so that the head width is whole")
  check(m.activation in ("gelu", "gelu_new"), f"model.activation={m.activation!r}; use gelu or gelu_new")
  check(m.sharing in SHARING_MODES, f"model.sharing={m.sharing!r}; use one of {', '.join(SHARING_MODES)}")
  check(m.remat in REMAT_POLICIES, f"model.remat={m.remat!r}; use one of {', '.join(REMAT_POLICIES)}")
  check(m.get("dense_grad", "xla") in ("auto", *DENSE_GRADS),
        f"model.dense_grad={m.get('dense_grad')!r}; use one of auto, {', '.join(DENSE_GRADS)}")
  check(m.dtype in DTYPES, f"model.dtype={m.dtype!r}; use one of {', '.join(DTYPES)}")
  check(m.num_hidden_groups >= 1 and m.num_layers % m.num_hidden_groups == 0,
        f"model.num_hidden_groups={m.num_hidden_groups} must divide model.num_layers={m.num_layers}")


def validate_attention(config):
  """Checks that the requested attention runs at every phase's seq_len (model.attention's own rules)."""
  m = config.model
  attention_lib.check(m.attention, m.attention_dropout, m.dtype, [p.config.seq_len for p in config_lib.phases(config)])
