"""Q8BERT (Zafrir et al. 2019, "Q8BERT: Quantized 8Bit BERT"): 8-bit quantization-aware fine-tuning with
activation ranges learned as exponential moving averages, then 8-bit inference with those ranges frozen.

Transcribed from the reference, IntelLabs/nlp-architect `nlp_architect/nn/torch/quantization.py`
(QuantizedLinear, QuantizedEmbedding, FakeLinearQuantizationWithSTE) with the per-layer settings of
`nlp_architect/procedures/transformers/config/bert-base-uncased.json`:
- symmetric linear quantization, q = clip(round(x * s), -127, 127), s = 127 / threshold (`quantize`,
  `get_scale`); fake quantization q / s in training with straight-through gradients (identity, unclipped);
- weights (every Dense kernel, the word and position tables) per tensor, threshold max |w|: in the scanned
  encoder each layer's kernel is its own tensor, as each reference Linear is;
- each Dense's input range is an EMA of max |x| over the whole batch tensor, decay 0.9999, started at the
  first quantized step's max (`_update_ema`), updated before it is used; the query and key outputs are
  requantized with their own EMA range (`requantize_output` true for attention_query/key only);
- the head (classifier, qa_outputs) is quantized from training step 200 on (`"head": start_step 200`);
  the segment table stays float (`token_type_embeddings: mode none`); LayerNorm, softmax, GELU, tanh, the
  attention products and the residual sums stay float32;
- inference (ranges not mutable): int8 x int8 -> int32 matmuls, the bias quantized to 32 bits at scale
  s_in * s_w, then dequantized (`inference_quantized_forward`); embeddings dequantized from int8.

How it plugs in: a flax method interceptor (nn.intercept_methods, as qwix intercepts dot_general) around the
model's __call__ catches `Dense.product(x, kernel, bias)` and `Embeddings.tables()`, two hook methods of
bertjax.model.encoder, so every Dense of any head model (encoder, pooler, classifier, QA outputs) is
quantized without a forked encoder, and the params tree is unchanged. The ranges are the flax collection
`encoder.QUANT_RANGES` (per Dense: `input_max`, `output_max` for query/key, and a `step` counter); the
encoder's layer scan stacks it per layer like the params.
Deliberate deviation: a layer whose range was never measured (a head with fewer than 200 training steps)
runs in float at inference; the reference would divide by a zero range.
"""

import functools
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
from flax import linen as nn, traverse_util

from bertjax.model.embeddings import Embeddings
from bertjax.model.hparams import QUANT_RANGES
from bertjax.model.layers import Dense

BITS = 8  # QuantizationConfig weight_bits / activation_bits
BIAS_BITS = 32  # QuantizedLinear.accumulation_bits: the bias at inference
EMA_DECAY = 0.9999  # QuantizationConfig ema_decay (and QuantizedLinear's default)
REQUANTIZE = ("query", "key")  # bert-base-uncased.json: requantize_output false for value, attention_output,
# ffn_intermediate, ffn_output, pooler and head; the QuantizedLinear default (true) for query and key
HEADS = ("classifier", "qa_outputs")  # the reference's "head" (QuantizedBertFor*'s classifier / qa_outputs)
HEAD_START_STEP = 200  # bert-base-uncased.json "head": start_step 200 (float until then)
TABLES = (True, True, False)  # word and position tables quantized ("ema"); token_type "none"


def max_value(bits: int = BITS) -> int:
  """The largest symmetric quantized value, 2^(bits-1) - 1 (calc_max_quant_value)."""
  return 2 ** (bits - 1) - 1


def scale(threshold, bits: int = BITS):
  """s = (2^(bits-1) - 1) / threshold (get_scale)."""
  return max_value(bits) / threshold


def quantize(x, s, bits: int = BITS):
  """clip(round(x * s), -max, max) as float (the reference's `quantize`; round half to even, as torch)."""
  m = max_value(bits)
  return jnp.clip(jnp.round(x * s), -m, m)


def fake_quant(x, s, bits: int = BITS):
  """quantize(x, s) / s forward, identity gradient (FakeLinearQuantizationWithSTE); no gradient to `s`."""
  x32 = x.astype(jnp.float32)
  q = quantize(x32, jax.lax.stop_gradient(s), bits) / jax.lax.stop_gradient(s)
  return (x32 + jax.lax.stop_gradient(q - x32)).astype(x.dtype)


def weight_scale(w):
  """Per-tensor scale of a weight from max |w| (get_dynamic_scale, computed without gradient)."""
  return scale(jnp.max(jnp.abs(jax.lax.stop_gradient(w).astype(jnp.float32))))


def ema_update(ema, x, step, start: int = 0, decay: float = EMA_DECAY):
  """The range after one training step (QuantizedLinear._update_ema): max |x| on the first quantized step,
  else ema - (1 - decay) * (ema - max |x|)."""
  current = jnp.max(jnp.abs(jax.lax.stop_gradient(x).astype(jnp.float32)))
  return jnp.where(step == start, current, ema - (1 - decay) * (ema - current))


def _start(module) -> int:
  return HEAD_START_STEP if module.name in HEADS else 0


def _int8_product(x, kernel, bias, s_in, s_w, n_in: int):
  """inference_quantized_forward: int8 input and kernel, int32 accumulation and bias, dequantized."""
  qx = quantize(x.astype(jnp.float32), s_in).astype(jnp.int8)
  qk = quantize(kernel.astype(jnp.float32), s_w).astype(jnp.int8)
  lead, out_shape = x.shape[: x.ndim - n_in], kernel.shape[n_in:]
  k_in = int(np.prod(kernel.shape[:n_in]))
  acc = jax.lax.dot_general(qx.reshape(-1, k_in), qk.reshape(k_in, -1), (((1,), (0,)), ((), ())),
                            preferred_element_type=jnp.int32)
  qb = quantize(bias.astype(jnp.float32).reshape(-1), s_in * s_w, BIAS_BITS).astype(jnp.int32)
  return ((acc + qb).astype(jnp.float32) / (s_in * s_w)).reshape(*lead, *out_shape)


def _dense(module: Dense, next_fun, x, kernel, bias):
  """A Dense under Q8BERT: training (ranges mutable) fake-quantizes and updates the EMAs; inference reads
  them frozen and runs the int8 product."""
  start, requantize = _start(module), module.name in REQUANTIZE
  step = module.variable(QUANT_RANGES, "step", lambda: jnp.zeros((), jnp.int32))
  in_max = module.variable(QUANT_RANGES, "input_max", lambda: jnp.zeros((), jnp.float32))
  out_max = module.variable(QUANT_RANGES, "output_max", lambda: jnp.zeros((), jnp.float32)) if requantize else None
  if module.is_initializing():
    return next_fun(x, kernel, bias)
  if module.is_mutable_collection(QUANT_RANGES):  # quantization-aware training
    on = step.value >= start
    new_in = ema_update(in_max.value, x, step.value, start)
    y = next_fun(fake_quant(x, scale(new_in)), fake_quant(kernel, weight_scale(kernel)), bias)
    if requantize:
      new_out = ema_update(out_max.value, y, step.value, start)
      y = fake_quant(y, scale(new_out))
      out_max.value = jnp.where(on, new_out, out_max.value)
    in_max.value = jnp.where(on, new_in, in_max.value)
    step.value = step.value + 1
    return y if start == 0 else jnp.where(on, y, next_fun(x, kernel, bias))
  # Inference: the ranges as training left them.
  y = _int8_product(x, kernel, bias, scale(in_max.value), weight_scale(kernel), len(module.in_shape))
  if requantize:
    y = fake_quant(y, scale(out_max.value))  # dequantize(quantize(out, output_scale))
  y = y.astype(module.cfg.dtype)
  return y if start == 0 else jnp.where(step.value > start, y, next_fun(x, kernel, bias))


def _intercept(next_fun, args, kwargs, context):
  module = context.module
  if isinstance(module, Dense) and context.method_name == "product":
    return _dense(module, next_fun, *args, **kwargs)
  if isinstance(module, Embeddings) and context.method_name == "tables":
    tables = next_fun(*args, **kwargs)
    return tuple(fake_quant(t, weight_scale(t)) if on and t is not None else t for t, on in zip(tables, TABLES))
  return next_fun(*args, **kwargs)


@functools.cache
def _quantized_class(cls):
  """`cls` with its __call__ run under the Q8BERT interceptor (the way qwix.quantize_model wraps a model)."""
  call = cls.__call__
  raw = getattr(call, "__wrapped__", call) if hasattr(call, "method_handler_wrapped") else call

  @functools.wraps(raw)
  def __call__(self, *args, **kwargs):
    with nn.intercept_methods(_intercept):
      return raw(self, *args, **kwargs)

  return type(cls.__name__, (cls,), {"__call__": __call__, "_unquantized_type": cls})


def model(float_model: nn.Module) -> nn.Module:
  """The model under Q8BERT, with the same params. Applied with `encoder.QUANT_RANGES` mutable it trains
  (fake quantization, EMA ranges updated); applied with the ranges as plain input it is the int8 model."""
  cls = type(float_model)
  if hasattr(cls, "_unquantized_type"):
    return float_model
  fields = {f: getattr(float_model, f) for f in cls.__dataclass_fields__ if f not in ("parent", "name")}
  return _quantized_class(cls)(**fields)


def init_ranges(q_model: nn.Module, *inputs) -> dict:
  """Fresh ranges (all zero, step 0) of `q_model` for example `inputs` (shapes only): {QUANT_RANGES: ...}."""
  shapes = jax.eval_shape(lambda: q_model.init(jax.random.key(0), *inputs))[QUANT_RANGES]
  return {QUANT_RANGES: jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)}


RANGES_FILE = "q8bert_ranges.npz"


def save_ranges(directory: str, ranges: dict) -> None:
  """Writes the learned ranges beside a saved model (directory/q8bert_ranges.npz, keys are module paths
  such as encoder/layers/attention/query/input_max, per-layer values stacked as in the params)."""
  os.makedirs(directory, exist_ok=True)
  flat = traverse_util.flatten_dict(jax.device_get(ranges[QUANT_RANGES]), sep="/")
  np.savez(os.path.join(directory, RANGES_FILE), **{k: np.asarray(v) for k, v in flat.items()})


def load_ranges(directory: str) -> dict:
  """The ranges `save_ranges` wrote, as the collection dict that `model(...).apply` takes beside the params."""
  with np.load(os.path.join(directory, RANGES_FILE)) as saved:
    flat = {k: jnp.asarray(saved[k]) for k in saved.files}
  return {QUANT_RANGES: traverse_util.unflatten_dict(flat, sep="/")}
