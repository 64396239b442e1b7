"""Running imported or bertjax checkpoints: load either kind, final hidden states, head logits, fill-mask.

Everything runs through bertjax's own `Pretrainer` (Embeddings + scanned Encoder + heads), jitted once per
model shape. `bertjax.hf` is the CLI over these calls.
"""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np

from bertjax.errors import UserError
from bertjax.interop import convert, tokenizers as hf_tokenizers, workdir as wd


@dataclasses.dataclass
class Loaded:
  """A model ready to run: config, Pretrainer params (numpy), tokenizer, the imported pooler if any,
  and the parameter paths that were freshly initialized (absent from the checkpoint)."""

  config: object
  params: dict
  tokenizer: object
  pooler: dict | None = None
  fresh: tuple = ()


def load(hf_dir: str = "", workdir: str = "", generator_dir: str = "") -> Loaded:
  """Loads an HF checkpoint directory or a bertjax workdir (exactly one of them)."""
  if bool(hf_dir) == bool(workdir):
    raise UserError("give exactly one of --hf_dir (an HF checkpoint) and --workdir (a bertjax workdir)")
  if hf_dir:
    imp = convert.read_hf(hf_dir, generator_dir)
    return Loaded(imp.config, imp.params, imp.tokenizer, imp.pooler, tuple(imp.fresh))
  config, params, tok, fresh = wd.load(workdir)
  pooler = params.pop("pooler", None)
  return Loaded(config, params, tok, pooler, fresh)


@functools.lru_cache(maxsize=16)
def _jitted(cfg, generator, sentence_head, fn):
  from bertjax.model.pretrain import Pretrainer

  model = Pretrainer(cfg=cfg, generator=generator, sentence_head=sentence_head)
  return jax.jit(lambda p, *a: model.apply({"params": p}, *a, method=fn))


def _apply(config, fn, params, *args):
  """fn(module, *args) run on the config's Pretrainer with `params`, jitted once per model shape and
  function (inference: no dropout)."""
  from bertjax import loop

  m = loop.make_model(config)
  return _jitted(m.cfg, m.generator, m.sentence_head, fn)(params, *args)


def _encode_fn(m, ids, types):
  return m.encode(ids, types, jnp.ones_like(ids))


def _logits_fn(m, ids, types):
  groups = jnp.ones_like(ids)
  positions = jnp.broadcast_to(jnp.arange(ids.shape[1]), ids.shape)
  hidden = m.encode(ids, types, groups)
  out = {}
  if m.generator is None:
    out["mlm"] = m.mlm(hidden, positions, m.embeddings)
  else:
    gen_hidden = m.generator_encoder(m.embeddings(ids, types, True), groups)
    out["mlm"] = m.generator_mlm(gen_hidden, positions, m.embeddings)
    out["rtd"] = m.rtd(hidden)
  if m.sentence_head:
    out["sentence"] = m.sentence(hidden)
  return out


def hidden_states(config, params, input_ids, type_ids) -> np.ndarray:
  """Final hidden states [B, S, H] of the main encoder (Embeddings + Encoder) for unpadded inputs."""
  ids = jnp.asarray(input_ids, jnp.int32)
  return np.asarray(_apply(config, _encode_fn, params, ids, jnp.asarray(type_ids, jnp.int32)))


def encode(loaded: Loaded, text: str) -> np.ndarray:
  """Final hidden states [tokens, hidden] of `text` (batch 1), with the checkpoint's own special tokens."""
  if loaded.tokenizer is None:
    raise UserError("this checkpoint has no tokenizer files (tokenizer.json, vocab.txt or spiece.model)")
  m = loaded.config.model
  ids, types = hf_tokenizers.encode_example(loaded.tokenizer, text, None, m.max_positions - m.position_offset)
  return hidden_states(loaded.config, loaded.params, [ids], [types])[0]


def logits(config, params, input_ids, type_ids) -> dict:
  """The pretraining heads' logits for unpadded inputs, every position scored: `mlm` [B, S, V] (ELECTRA:
  the generator's), and as the model has them `sentence` [B, 2] (NSP/SOP) and `rtd` [B, S]."""
  ids, types = jnp.asarray(input_ids, jnp.int32), jnp.asarray(type_ids, jnp.int32)
  return jax.tree.map(np.asarray, _apply(config, _logits_fn, params, ids, types))


def fill_mask(loaded: Loaded, text: str, top_k: int = 5) -> list:
  """For each [MASK] in `text`: [(token, probability), ...] of the top_k predictions."""
  if any(p.startswith(("mlm/", "generator_mlm/")) for p in loaded.fresh):
    raise UserError("this checkpoint has no MLM head (e.g. a bare BertModel); fill-mask needs a *ForMaskedLM, "
                    "*ForPreTraining or ELECTRA generator checkpoint")
  tok = loaded.tokenizer
  if tok is None:
    raise UserError("this checkpoint has no tokenizer files (tokenizer.json, vocab.txt or spiece.model)")
  m = loaded.config.model
  ids, types = hf_tokenizers.encode_example(tok, text, None, m.max_positions - m.position_offset)
  where = [i for i, t in enumerate(ids) if t == tok.special.mask]
  if not where:
    raise UserError(f"no [MASK] in {text!r}; write [MASK] where the token to predict goes")
  scores = logits(loaded.config, loaded.params, [ids], [types])["mlm"][0]
  probs = np.asarray(jax.nn.softmax(scores[where, :tok.vocab_size], axis=-1))
  return [[(tok.id_to_token(int(i)), float(p[i])) for i in np.argsort(-p)[:top_k]] for p in probs]
