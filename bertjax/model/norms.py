"""Norm kinds (`model.norm`): where each layer normalizes, and with what.

- `post`: BERT's post-LayerNorm, LN(x + block(x)) after attention and after the FFN; the layer carries x.
- `pre`: x + block(LN(x)) (ModernBERT). The layer carries (x, LN(x)): each layer owns `out_ln`, the norm of its
  output, which is the next layer's attention-input norm and, for the last layer, the encoder's final norm. So
  the stack holds ModernBERT's parameters exactly (no attention norm in the first layer, whose input is the
  already normalized embeddings) while every layer stays alike for the scan.

The attention block calls `attention_output`, the FFN block `ffn`, and the layer the rest, each inside the
calling module's scope, so that parameter names (`ln`, `out_ln`) stay where checkpoints expect them. A kind with
another normalization and post placement (MobileBERT's NoNorm) overrides `norm` only.
"""

from bertjax.core import sharding as sh
from bertjax.model import kinds
from bertjax.model.layers import layer_norm


class Post(kinds.Kind):
  """BERT's post-LayerNorm."""

  def norm(self, c, name: str, names=(sh.EMBED,)):
    """The normalization module named `name` in the calling scope (float32 LayerNorm); `names`: the logical
    axis name of the normalized axis."""
    return layer_norm(c, name, names)

  def start(self, x):
    """The layer scan's carry from the embeddings."""
    return x

  def stream(self, carry):
    """The residual stream in a carry."""
    return carry

  def attention_input(self, carry):
    """What attention reads."""
    return carry

  def attention_output(self, c, xq, out):
    """The attention block's result from its residual input `xq` and its output projection `out`."""
    return self.norm(c, "ln")(xq + out).astype(c.dtype)

  def add_attention(self, x, y):
    """The stream after attention from the stream `x` (at the computed rows) and the block's result `y`."""
    return y

  def ffn(self, c, x, fn):
    """The FFN block's result: `fn` is the FFN kind's transform."""
    return self.norm(c, "ln")(x + fn(x)).astype(c.dtype)

  def finish(self, c, x, constrain):
    """The carry a layer hands on from its output stream (`constrain`: the activation sharding)."""
    return x

  def output(self, carry):
    """The encoder's output from the last carry."""
    return carry


kinds.register("norm", "post")(Post)


@kinds.register("norm", "pre")
class Pre(Post):
  """Pre-LayerNorm with a final norm (ModernBERT)."""

  hf_family = "modernbert"

  def start(self, x):
    return (x, x)  # the first layer's attention reads the (already normalized) embeddings as they are

  def stream(self, carry):
    return carry[0]

  def attention_input(self, carry):
    return carry[1]

  def attention_output(self, c, xq, out):
    return out.astype(c.dtype)

  def add_attention(self, x, y):
    return x + y

  def ffn(self, c, x, fn):
    return (x + fn(self.norm(c, "ln")(x).astype(c.dtype))).astype(c.dtype)

  def finish(self, c, x, constrain):
    return (x, constrain(self.norm(c, "out_ln")(x).astype(c.dtype)))

  def output(self, carry):
    return carry[1]

