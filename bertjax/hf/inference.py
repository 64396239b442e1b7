"""The one inference module: load a training run's workdir or an HF checkpoint, then encode, score,
fill [MASK]s and read attention maps.

Everything runs through bertjax's own `Pretrainer` (Embeddings + scanned Encoder + heads), jitted once per
model shape and function; attention maps are the probabilities the encoder itself computes (sown by its
attention layers), not a second implementation. `bertjax.hf` is the CLI over these calls; the notebook
uses them too.
"""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np

from bertjax.core.errors import UserError
from bertjax.hf import convert, tokenizers as hf_tokenizers, workdir as wd
from bertjax.model import unstacked
from bertjax.model.layer import sown_by_layers
from bertjax.train import build


@dataclasses.dataclass
class Loaded:
  """A model ready to run: config, Pretrainer params (jax arrays: a numpy tree would be copied to the device
  on every call), tokenizer, the imported pooler if any, the parameter paths that were freshly initialized
  (absent from the checkpoint), and a workdir's step."""

  config: object
  params: dict
  tokenizer: object
  pooler: dict | None = None
  fresh: tuple = ()
  step: int = 0

  @functools.cached_property
  def run_params(self) -> dict:
    """`params` in the layout the model runs many calls in fastest on this backend (pass it to the functions
    below for repeated calls): split per layer where every layer runs unrolled (the CPU's default), so no call
    copies each layer's weights out of the stacked arrays; a second copy of the layer weights, made on first use
    (`unstacked.for_calls`). `params` itself elsewhere."""
    return unstacked.for_calls(self.params, build.make_model(self.config).cfg)


def load(hf_dir: str = "", workdir: str = "", generator_dir: str = "") -> Loaded:
  """Loads an HF checkpoint directory or a bertjax workdir (a training run's latest checkpoint, or an
  import): exactly one of them."""
  if bool(hf_dir) == bool(workdir):
    raise UserError("give exactly one of --hf_dir (an HF checkpoint) and --workdir (a bertjax workdir)")
  if hf_dir:
    imp = convert.read_hf(hf_dir, generator_dir)
    return Loaded(imp.config, on_device(imp.params), imp.tokenizer, imp.pooler, tuple(imp.fresh))
  config, params, tok, fresh = wd.load(workdir)
  pooler = params.pop("pooler", None)
  return Loaded(config, on_device(params), tok, pooler, fresh, wd.latest_step(workdir))


def on_device(params) -> dict:
  """`params` as jax arrays, put on the device once: numpy params passed to a jitted function are copied to the
  device on every call (MiniLM's 90 MB: about 3x a small batch's forward on a 2-core CPU)."""
  return jax.tree.map(jnp.asarray, params)


@functools.lru_cache(maxsize=16)
def _jitted(model, method, mutable: tuple):
  return jax.jit(lambda p, *a: model.apply({"params": unstacked.join(p)}, *a, method=method,
                                           mutable=list(mutable) or False))


def _apply(config, method, params, input_ids, type_ids, mutable: tuple = (), *more):
  """The config's Pretrainer's `method` (a method name, or a function of the module and the inputs) on
  `params` (stacked, or a Loaded's `run_params`) and unpadded int32 inputs (inference: no dropout), jitted once
  per model and method; with `mutable` collections, (output, their values). `more` are further int32 inputs of
  `method`."""
  ids, types = jnp.asarray(input_ids, jnp.int32), jnp.asarray(type_ids, jnp.int32)
  more = tuple(jnp.asarray(x, jnp.int32) for x in more)
  return _jitted(build.make_model(config), method, mutable)(params, ids, types, *more)


def _encode_fn(m, ids, types, groups=None):
  return m.encode(ids, types, jnp.ones_like(ids) if groups is None else groups)


def hidden_states(config, params, input_ids, type_ids, groups=None) -> np.ndarray:
  """Final hidden states [B, S, H] of the main encoder (Embeddings + Encoder) for unpadded inputs, or inputs
  padded with `groups` [B, S] (1 = real token; padding positions' states are meaningless)."""
  more = () if groups is None else (groups,)
  return np.asarray(_apply(config, _encode_fn, params, input_ids, type_ids, (), *more))


def attention_probs(config, params, input_ids, type_ids, groups=None) -> np.ndarray:
  """Attention probabilities [layers, B, heads, S, S] of the main encoder: the softmax each layer computes
  in the forward pass (rows sum to 1): the xla attention, the only one that forms them, whatever
  model.attention says. Inputs are unpadded, or padded with `groups` [B, S] (1 = real token: padding keys
  then get no attention; padding query rows are meaningless)."""
  config = config.copy_and_resolve_references()
  config.model.attention = "xla"
  more = () if groups is None else (groups,)
  _, sown = _apply(config, _encode_fn, params, input_ids, type_ids, ("intermediates",), *more)
  return np.asarray(sown_by_layers(sown, "attention_probs"))


def layer_values(config, params, input_ids, type_ids, key: str, groups=None) -> np.ndarray:
  """[layers, B, ...]: what every layer of the main encoder sows under `key` in the forward pass (an attention
  kind's own, such as the constituent kind's `break_probs`), for inputs padded as `attention_probs` takes them."""
  more = () if groups is None else (groups,)
  _, sown = _apply(config, _encode_fn, params, input_ids, type_ids, ("intermediates",), *more)
  return np.asarray(sown_by_layers(sown, key))


def tokenizer_and_length(loaded: Loaded, max_len: int | None = None) -> tuple:
  """(tokenizer, tokens an input may have) of a loaded model: the length its position table takes, at most
  `max_len`; a one-line error where the checkpoint has no tokenizer."""
  if loaded.tokenizer is None:
    raise UserError("this checkpoint has no tokenizer files (tokenizer.json, vocab.txt or spiece.model)")
  m = loaded.config.model
  longest = m.max_positions - m.position_offset
  return loaded.tokenizer, longest if max_len is None else min(max_len, longest)


def _tokenized(loaded: Loaded, text: str, pair: str | None = None) -> tuple[list, list]:
  tok, max_len = tokenizer_and_length(loaded)
  return hf_tokenizers.encode_example(tok, text, pair, max_len)


def attention(loaded: Loaded, text: str, pair: str | None = None) -> tuple[list, np.ndarray]:
  """(tokens, attention probabilities [layers, heads, tokens, tokens]) of `text` (and `pair`) with the
  checkpoint's own special tokens."""
  ids, types = _tokenized(loaded, text, pair)
  tokens = [loaded.tokenizer.id_to_token(int(i)) for i in ids]
  return tokens, attention_probs(loaded.config, loaded.params, [ids], [types])[:, 0]


def encode(loaded: Loaded, text: str) -> np.ndarray:
  """Final hidden states [tokens, hidden] of `text` (batch 1), with the checkpoint's own special tokens."""
  ids, types = _tokenized(loaded, text)
  return hidden_states(loaded.config, loaded.params, [ids], [types])[0]


def logits(config, params, input_ids, type_ids) -> dict:
  """The pretraining heads' logits for unpadded inputs, every position scored: `mlm` [B, S, V] (ELECTRA:
  the generator's), and as the model has them `sentence` [B, 2] (NSP/SOP; [B, 3] SSO) and `rtd` [B, S]."""
  return jax.tree.map(np.asarray, _apply(config, "score", params, input_ids, type_ids))


def fill_mask(loaded: Loaded, text: str, top_k: int = 5) -> list:
  """For each [MASK] in `text`: [(token, probability), ...] of the top_k predictions."""
  if any(p.startswith(("mlm/", "generator_mlm/")) for p in loaded.fresh):
    raise UserError("this checkpoint has no MLM head (e.g. a bare BertModel); fill-mask needs a *ForMaskedLM, "
                    "*ForPreTraining or ELECTRA generator checkpoint")
  tok = loaded.tokenizer
  ids, types = _tokenized(loaded, text)
  where = [i for i, t in enumerate(ids) if t == tok.special.mask]
  if not where:
    raise UserError(f"no [MASK] in {text!r}; write [MASK] where the token to predict goes")
  scores = logits(loaded.config, loaded.params, [ids], [types])["mlm"][0]
  probs = np.asarray(jax.nn.softmax(scores[where, :tok.vocab_size], axis=-1))
  return [[(tok.id_to_token(int(i)), float(p[i])) for i in np.argsort(-p)[:top_k]] for p in probs]
