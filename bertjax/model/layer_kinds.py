"""Layer kinds (`model.layer`): the structure of one layer of the scanned stack. Importing this module registers
every built-in kind of every family (bertjax.model.layer imports the attention, position, norm and FFN kinds).

- `bert`: the BERT layer (bertjax.model.layer.Layer): the attention kind's block, then the FFN block, with the norm
  kind placing residuals and norms; ALBERT's sharing.
- `mobilebert`: MobileBERT's bottleneck block (bertjax.model.mobilebert).
- `reformer`: the Reformer's reversible layer over two streams (bertjax.model.reformer), stacked under one custom
  VJP (bertjax.model.reversible).

A layer kind answers the flax module the encoder scans (`module`, called as Layer is: carry, layer index, the
attention kind's mask, shared blocks, head gates, position tables, query positions; it returns (carry, None)),
its forward FLOPs (`forward_flops`), and its config checks. `stack` gives the flax module of the whole stack (every
built-in kind but reformer: `module` under nn.scan with stacked parameters, `scanned`; bertjax.model.reversible's
stack runs its layers under one custom VJP instead).
"""

from bertjax.core.config import check
from bertjax.model import axial, kinds, layer, mobilebert, nonorm, reformer, reversible  # noqa: F401  (each registers its kinds)
from bertjax.model import layer as layer_lib


class LayerKind(kinds.Kind):
  """The interface."""

  module = None  # the flax module of one layer
  scanned = True  # the stack is `module` under nn.scan (Encoder.split_stack may then run it in two parts)

  def stack(self, c, layer):
    """The flax module class of the whole layer stack, built as `cls(c, deterministic, name="layers")` and called
    as nn.scan's (carry, layer indices, mask, shared, head gates, position tables) -> (carry, None); `layer`:
    `module` under the remat policy."""
    return layer_lib.scan_layers(layer, c, c.num_layers)

  def forward_flops(self, c, seq_len: int, index: int) -> float:
    """Forward matmul FLOPs per token of layer `index`."""
    raise NotImplementedError

  def pretrainer(self, config, cfg):
    """The pretraining model of a run config whose layers are this kind's own model (XLNet), built from the
    EncoderConfig `cfg`; None (every built-in kind): bertjax.model.pretrain.Pretrainer."""
    return None


@kinds.register("layer", "bert")
class Bert(LayerKind):
  """The BERT layer: its parts are the attention, FFN and norm kinds'."""

  module = layer.Layer

  def check(self, m):
    check(m.num_ffn == 1 and not m.bottleneck_size,
          f"model.num_ffn={m.num_ffn} and model.bottleneck_size={m.bottleneck_size} are options of "
          "model.layer=mobilebert; set it, or num_ffn=1 and bottleneck_size=0")

  def forward_flops(self, c, seq_len, index):
    return kinds.of(c, "attention").forward_flops(c, seq_len, index) + kinds.of(c, "ffn").forward_flops(c)


@kinds.register("layer", "mobilebert")
class MobileBert(LayerKind):
  """MobileBERT's bottleneck layer."""

  module = mobilebert.MobileBertLayer
  hf_family = "mobilebert"

  def check(self, m):
    mobilebert.check(m)

  def forward_flops(self, c, seq_len, index):
    return mobilebert.forward_flops(c, seq_len)


@kinds.register("layer", "reformer")
class Reformer(LayerKind):
  """The Reformer's layer over two streams, in a reversible stack (model.reversible) that ends in the norm of both."""

  module = reformer.ReformerLayer
  scanned = False
  hf_family = "reformer"

  def stack(self, c, layer):
    return reversible.stack_of(reformer.ReformerLayer, reformer.ReformerAttention, reformer.ReformerFeedForward)

  def check(self, m):
    reformer.check_model(m)

  def forward_flops(self, c, seq_len, index):
    return reformer.forward_flops(c, seq_len, index)
