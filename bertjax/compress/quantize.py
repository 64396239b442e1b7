"""int8 quantization of the encoder's matmuls with Google's qwix (`model.quantize=int8`): quantization-aware
training (QAT) and int8 inference. Fine-tuning with fake int8 quantization and then running in int8 is Q8BERT's
workflow (Zafrir et al. 2019), but the scheme is qwix's, not Q8BERT's: Q8BERT itself (per-tensor weights,
EMA activation ranges, quantized embeddings and heads) is `model.quantize=q8bert`, bertjax.compress.q8bert.

qwix intercepts the `lax.dot_general` of every `Dense` (bertjax.model.encoder) under the matched module paths:
with `QtProvider` the forward pass quantizes weights (per output channel) and activations (per token,
dynamic range, absmax) to int8 and back, with straight-through gradients (QAT); with `PtqProvider` the
weights are stored as int8 with float scales and the matmuls run on int8 operands. Embedding lookups,
LayerNorm, softmax and the attention score/context products stay float (Q8BERT quantizes the word and
position tables, the pooler and the classifier too; here only the encoder's Dense matmuls are).

qwix computes how to quantize a weight inside one scanned layer, so `int8_params` quantizes the stacked
per-layer weights one layer at a time (vmap over the layer axis) instead of the stacked array as a whole.
"""

import dataclasses
import functools

import jax
import jax.numpy as jnp
from flax import linen as nn

from bertjax.core.errors import UserError

MODES = ("", "int8", "q8bert")  # model.quantize: float, qwix int8 (this module), Q8BERT (bertjax.compress.q8bert)
# Every Dense of the encoder (attention q/k/v/output, FFN in/out, the E->H projection); the heads stay float.
ENCODER_MATMULS = r"encoder/.*"


def _qwix():
  try:
    import qwix
  except ImportError:
    raise UserError("int8 needs qwix (Google's JAX quantization library): pip install qwix") from None
  return qwix


def _rule(qwix, cls):
  return cls(module_path=ENCODER_MATMULS, op_names=("dot_general",), weight_qtype=jnp.int8, act_qtype=jnp.int8)


def _quantizable(model: nn.Module) -> nn.Module:
  """The model with its Dense kernels contracted in their own shapes, which qwix matches to the parameters."""
  return model.clone(cfg=dataclasses.replace(model.cfg, quantizable=True))


def qat(model: nn.Module) -> nn.Module:
  """The model with int8 fake quantization of the encoder's matmuls in training and evaluation (QAT)."""
  qwix = _qwix()
  return qwix.quantize_model(_quantizable(model), qwix.QtProvider([_rule(qwix, qwix.QtRule)]))


def int8(model: nn.Module) -> nn.Module:
  """The model with int8 weights and int8 matmuls in the encoder (inference); its params come from
  `int8_params`."""
  qwix = _qwix()
  return qwix.quantize_model(_quantizable(model), qwix.PtqProvider([_rule(qwix, qwix.QuantizationRule)]))


def int8_params(int8_model: nn.Module, params, *inputs):
  """The float `params` quantized for `int8_model` (made by `int8`); `inputs` are example inputs of its
  __call__ (for shapes only)."""
  qwix = _qwix()
  abstract = jax.eval_shape(functools.partial(int8_model.init, jax.random.key(0)), *inputs)["params"]
  abstract = nn.unbox(abstract)
  params = jax.tree.map(jnp.asarray, params)
  layers = params.get("encoder", {}).get("layers")
  rest = {k: v for k, v in params.items() if k != "encoder"}
  if "encoder" in params:
    rest["encoder"] = {k: v for k, v in params["encoder"].items() if k != "layers"}
  out = qwix.quantize_params(rest, abstract)
  if layers is not None:
    one_layer = jax.tree.map(lambda s: jax.ShapeDtypeStruct(s.shape[1:], s.dtype), abstract["encoder"]["layers"])
    out.setdefault("encoder", {})["layers"] = jax.vmap(lambda p: qwix.quantize_params(p, one_layer))(layers)
  return out
