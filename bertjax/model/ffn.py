"""Feed-forward kinds (`model.ffn`) and the FFN block that places them between the layer's norms.

- `mlp`: BERT's dense, activation, dense, dropout.
- `geglu`: ModernBERT's gated form act(x W_in) * (x W_gate), dropout, W_out: one [H, 2, I] kernel, input half
  first as transformers' Wi chunks it (intermediate_size is the width of each half).

A kind's `__call__(block, h)` runs inside the block's scope (its dense layers are the block's `intermediate` and
`output`); the norm kind wraps it with the residual and the norm.
"""

from flax import linen as nn

from bertjax.core import sharding as sh
from bertjax.model import kinds
from bertjax.model.dropout import token_dropout
from bertjax.model.layers import activation, Block, dense


class FFNKind(kinds.Kind):
  """The interface: the transform, and its matmul FLOPs per token."""

  def __call__(self, block, h):
    raise NotImplementedError

  def forward_flops(self, c) -> float:
    """Forward matmul FLOPs per token of one layer's FFN."""
    raise NotImplementedError


@kinds.register("ffn", "mlp")
class Mlp(FFNKind):
  """dense -> activation -> dense -> dropout."""

  def __call__(self, block, h):
    c = block.cfg
    h = dense(c, c.hidden_size, c.intermediate_size, (sh.EMBED, sh.MLP), "intermediate", c.use_bias)(h)
    h = activation(c, h)
    h = dense(c, c.intermediate_size, c.hidden_size, (sh.MLP, sh.EMBED), "output", c.use_bias, out=True)(h)
    return token_dropout(c, c.dropout)(h, deterministic=block.deterministic)

  def forward_flops(self, c):
    return 2 * 2 * c.hidden_size * c.intermediate_size


@kinds.register("ffn", "geglu")
class GeGLU(FFNKind):
  """act(x W_in) * (x W_gate) -> dropout -> W_out."""

  hf_family = "modernbert"

  def __call__(self, block, h):
    c = block.cfg
    h = dense(c, c.hidden_size, (2, c.intermediate_size), (sh.EMBED, None, sh.MLP), "intermediate", c.use_bias)(h)
    h = activation(c, h[..., 0, :]) * h[..., 1, :]
    h = token_dropout(c, c.dropout)(h, deterministic=block.deterministic)
    return dense(c, c.intermediate_size, c.hidden_size, (sh.MLP, sh.EMBED), "output", c.use_bias, out=True)(h)

  def forward_flops(self, c):
    return 2 * 3 * c.hidden_size * c.intermediate_size  # input and gate projections, then the output


class FeedForward(Block):
  """The position-wise FFN of a layer with its residual and norm (the norm kind places them)."""

  @nn.compact
  def __call__(self, x):
    c = self.cfg
    ffn = kinds.of(c, "ffn")
    return kinds.of(c, "norm").ffn(c, x, lambda h: ffn(self, h))

  @staticmethod
  def init_args(c, x):
    """Arguments that initialize the block alone (ALBERT's shared blocks)."""
    return (x,)
