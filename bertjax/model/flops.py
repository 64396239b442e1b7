"""Analytic training FLOPs per token (forward + backward = 3x forward), shared by summary and bench.

Counts matrix multiplies only (2 FLOPs per multiply-add), as MFU conventions do: per layer what its kinds count
(bertjax.model.kinds: mha's four projections, and QK^T and PV over the keys a query sees, the whole row on a
global layer and the window on a local one; the FFN kind's matmuls); the E->H projection; the MLM head on
the `max_predictions` gathered positions only; the RTD/sentence heads; SpanBERT's SBO head on the same
positions; StructBERT's shuffled positions through the MLM head. ALBERT sharing changes none of it.
"""

from bertjax.model import kinds, layer_kinds  # noqa: F401  (layer_kinds: the built-in kinds)
from bertjax.model.hparams import EncoderConfig


def encoder_forward_flops(c: EncoderConfig, seq_len: int) -> float:
  """Forward FLOPs per token of one encoder: each layer as its layer kind counts it (the BERT layer: its attention
  and FFN kinds'; a local attention layer over the keys in its window), the position kind's own, and the E->H
  projection (MobileBERT's embedding transformation of 3E with trigram inputs)."""
  layer = kinds.of(c, "layer")
  layers = sum(layer.forward_flops(c, seq_len, i) for i in range(c.num_layers))
  fan_in = c.embedding_size * (3 if c.trigram_input else 1)
  proj = 2 * fan_in * c.hidden_size if c.projects_in_encoder or c.embedding_transformation else 0
  return layers + kinds.of(c, "position").forward_flops(c) + proj


def mlm_head_forward_flops(c: EncoderConfig, seq_len: int, max_predictions: int) -> float:
  """The MLM head on `max_predictions` positions: transform H -> E and decoder E -> V (MobileBERT's extra output
  weights: H -> H and H -> V; the Reformer's untied decoder: 2H -> V, no transform)."""
  if c.mlm_decoder == "untied":
    return 2 * 2 * c.hidden_size * c.vocab_size * max_predictions / seq_len
  width = c.hidden_size if c.mlm_extra_output else c.embedding_size
  per_position = 2 * (c.hidden_size * width + width * c.vocab_size)
  return per_position * max_predictions / seq_len


def sbo_head_forward_flops(c: EncoderConfig, seq_len: int, max_predictions: int) -> float:
  """SpanBERT's SBO head on every MLM slot: (2H + 200) -> H -> E, then the tied decoder."""
  from bertjax.model.heads import SBO_POSITION_SIZE

  h, e = c.hidden_size, c.embedding_size
  per_position = 2 * ((2 * h + SBO_POSITION_SIZE) * h + h * e + e * c.vocab_size)
  return per_position * max_predictions / seq_len


def train_flops_per_token(main: EncoderConfig, seq_len: int, max_predictions: int, generator=None,
                          sentence_head: bool = False, *, sentence_classes: int = 2, sbo: bool = False,
                          wso_positions: int = 0) -> float:
  """Training FLOPs per token (3x the forward pass) of the whole pretraining model (`wso_positions`: the
  shuffled positions per example that the MLM head also decodes)."""
  fwd = encoder_forward_flops(main, seq_len)
  if generator is None:
    fwd += mlm_head_forward_flops(main, seq_len, max_predictions + wso_positions)
  else:
    fwd += encoder_forward_flops(generator, seq_len) + mlm_head_forward_flops(generator, seq_len, max_predictions)
    fwd += 2 * (main.hidden_size * main.hidden_size + main.hidden_size)  # RTD head on every token
  if sentence_head:
    fwd += 2 * (main.hidden_size * main.hidden_size + sentence_classes * main.hidden_size) / seq_len
  if sbo:
    fwd += sbo_head_forward_flops(main, seq_len, max_predictions)
  return 3.0 * fwd


def model_train_flops_per_token(model, seq_len: int, max_predictions: int, wso_positions: int = 0) -> float:
  """Training FLOPs per token of a built model (a Pretrainer, or a Distiller with its teacher), as the model
  counts its own heads and networks."""
  return model.train_flops_per_token(seq_len, max_predictions, wso_positions)


# Peak dense bf16 FLOP/s per device, by jax device_kind prefix (for MFU; CPU has none: bench measures it).
PEAK_FLOPS = {
    "TPU v4": 275e12,
    "TPU v5 lite": 197e12,
    "TPU v5e": 197e12,
    "TPU v5p": 459e12,
    "TPU v5": 459e12,
    "TPU v6 lite": 918e12,
    "TPU v6e": 918e12,
    "NVIDIA H100": 989e12,
    "NVIDIA H200": 989e12,
    "NVIDIA A100": 312e12,
}


def peak_flops(device) -> float:
  """Peak FLOP/s of one device, or 0.0 when unknown (CPU)."""
  kind = getattr(device, "device_kind", "")
  for prefix, peak in PEAK_FLOPS.items():
    if kind.startswith(prefix):
      return peak
  return 0.0
