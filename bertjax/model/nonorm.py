"""The `nonorm` norm kind (`model.norm=nonorm`): MobileBERT's NoNorm, an elementwise affine map x * scale + bias
with no statistics (transformers' NoNorm, TF's FakeLayerNorm), in BERT's post placement. Its parameters are named
as LayerNorm's (`scale`, `bias`), so checkpoints map them as they map a LayerNorm."""

import jax.numpy as jnp
from flax import linen as nn

from bertjax.core import sharding as sh
from bertjax.model import kinds
from bertjax.model.layers import ones_init, zeros_init
from bertjax.model.norms import Post


class NoNorm(nn.Module):
  """x * scale + bias over the last axis, in float32 (as LayerNorm returns)."""

  names: tuple  # logical axis name of the last axis

  @nn.compact
  def __call__(self, x):
    scale = self.param("scale", ones_init(self.names), (x.shape[-1],), jnp.float32)
    bias = self.param("bias", zeros_init(self.names), (x.shape[-1],), jnp.float32)
    return x.astype(jnp.float32) * scale + bias


@kinds.register("norm", "nonorm")
class NoNormPost(Post):
  """Post placement (the residual then the norm) with NoNorm in place of LayerNorm."""

  hf_family = "mobilebert"  # transformers has NoNorm in MobileBERT only

  def norm(self, c, name: str, names=(sh.EMBED,)):
    return NoNorm(tuple(names), name=name)
