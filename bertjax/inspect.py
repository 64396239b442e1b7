"""Looking into a trained run: load its params and tokenizer, fill [MASK]s, recompute attention maps."""

import dataclasses

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from bertjax import checkpoint, config as config_lib, sharding
from bertjax.data.tokenizer import Tokenizer, load_tokenizer
from bertjax.errors import UserError
from bertjax.interop import convert, workdir as interop_workdir
from bertjax.model.encoder import Embeddings, Layer, attention_bias, dense, shared_blocks


@dataclasses.dataclass
class Run:
  """What a finished (or running) workdir holds, loaded for inference."""

  config: ml_collections.ConfigDict
  params: dict  # plain arrays, the Pretrainer's tree
  tokenizer: Tokenizer
  step: int


def load_run(workdir: str) -> Run:
  """The config, latest checkpointed params and tokenizer of a training workdir."""
  config = interop_workdir.load_config(workdir)
  ckpt = checkpoint.Checkpointer(workdir, async_save=False)
  step = ckpt.latest_step()
  if step is None:
    raise UserError(f"{workdir!r} holds no checkpoint yet; train longer or lower --config.checkpoint_every")
  manifest = ckpt.manifest(step)
  ckpt.close()
  shapes = convert.param_shapes(config)
  device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
  abstract = jax.tree.map(lambda s: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=device), shapes)
  params = checkpoint.restore_params(workdir, abstract)
  return Run(config, params, load_tokenizer(manifest["tokenizer"]["spec"]), int(step))


def encode_text(tokenizer: Tokenizer, text: str, pair: str = "") -> dict:
  """A one-example model batch for `[CLS] text [SEP] (pair [SEP])`; "[MASK]" in the text is the mask token."""
  sp = tokenizer.special
  a = tokenizer.encode(text)[0].tolist()
  ids, types = [sp.cls, *a, sp.sep], [0] * (len(a) + 2)
  if pair:
    b = tokenizer.encode(pair)[0].tolist()
    ids, types = ids + b + [sp.sep], types + [1] * (len(b) + 1)
  ids = np.asarray([ids], np.int32)
  return dict(input_ids=ids, original_ids=ids, type_ids=np.asarray([types], np.int32),
              groups=np.ones_like(ids))


def fill_mask(run: Run, text: str, top_k: int = 5) -> list:
  """For each [MASK] in `text`, the `top_k` (token, probability) pairs the MLM head predicts
  (ELECTRA: its generator's)."""
  from bertjax import loop

  batch = encode_text(run.tokenizer, text)
  positions = np.nonzero(batch["input_ids"][0] == run.tokenizer.special.mask)[0]
  if not len(positions):
    raise UserError(f"no [MASK] in {text!r}; write the token to fill as [MASK]")
  batch.update(mlm_positions=positions[None].astype(np.int32), mlm_weights=np.ones((1, len(positions)), np.float32))
  model = loop.make_model(run.config)
  logits = model.apply({"params": run.params}, batch, rngs={"sample": jax.random.key(0)})["mlm_logits"][0]
  probs = np.asarray(jax.nn.softmax(logits, axis=-1))
  out = []
  for p in probs:
    best = np.argsort(-p)[:top_k]
    out.append([(run.tokenizer.id_to_token(int(i)), float(p[i])) for i in best])
  return out


def _layer_params(cfg, encoder_params, index: int, block: str):
  """The parameters of `block` (attention | ffn) as layer `index` uses them (shared or its own)."""
  if block in shared_blocks(cfg.sharing):
    group = index * cfg.num_groups // cfg.num_layers
    return jax.tree.map(lambda p: p[group], encoder_params[block])
  return jax.tree.map(lambda p: p[index], encoder_params["layers"][block])


def attention_probs(params: dict, config, input_ids, type_ids=None, layer: int = 0) -> np.ndarray:
  """Attention probabilities [B, heads, S, S] of layer `layer` of the main encoder (no padding assumed).

  The layers below run as in training (deterministic); the probabilities are recomputed from that
  layer's query/key weights with the encoder's own math (scaled dot product, fp32 softmax).
  """
  cfg = config_lib.encoder_config(config.model)
  if not 0 <= layer < cfg.num_layers:
    raise UserError(f"layer={layer} is outside 0..{cfg.num_layers - 1}")
  ids = jnp.atleast_2d(jnp.asarray(input_ids, jnp.int32))
  types = jnp.zeros_like(ids) if type_ids is None else jnp.atleast_2d(jnp.asarray(type_ids, jnp.int32))
  enc = params["encoder"]
  x = Embeddings(cfg).apply({"params": params["embeddings"]}, ids, types, True)
  if "embedding_projection" in enc:
    proj = dense(cfg, cfg.embedding_size, cfg.hidden_size, (None, sharding.EMBED), "embedding_projection")
    x = proj.apply({"params": enc["embedding_projection"]}, x)
  bias = attention_bias(jnp.ones_like(ids))
  shared = {name: enc[name] for name in shared_blocks(cfg.sharing)}
  for i in range(layer):
    own = {b: _layer_params(cfg, enc, i, b) for b in ("attention", "ffn") if b not in shared}
    x, _ = Layer(cfg, True).apply({"params": own}, x, i, bias, shared)
  att = _layer_params(cfg, enc, layer, "attention")
  qk = [jnp.einsum("bsh,hnd->bsnd", x, att[n]["kernel"]) + att[n]["bias"] for n in ("query", "key")]
  scores = jnp.einsum("bqnd,bknd->bnqk", *qk, preferred_element_type=jnp.float32)
  return np.asarray(jax.nn.softmax(scores * cfg.head_dim**-0.5 + bias, axis=-1))
