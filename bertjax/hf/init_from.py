"""Continued pretraining from a published checkpoint: `--config.init_from=hf:DIR` in the run's config and state.

`resolve` makes the config the checkpoint's: the architecture (sizes, activation, LayerNorm eps, position
offset, ALBERT sharing) from its config.json, and the tokenizer, unless `data.tokenizer` names one, its own
(`hf:DIR`). A size set on the command line that differs from the checkpoint's is a user error naming the
key; the recipe's other values (dropout, optimizer, schedule, masking, objectives) stay the config's.
`load_params` puts the checkpoint's weights into a freshly initialized state: every parameter the
checkpoint has, the rest (a head it lacks, ELECTRA's generator without its directory) keeps its fresh
initialization and is reported. `init_from` naming a bertjax workdir loads that run's parameters instead
(bertjax.train.loop, which takes `hf:` specs through this module: it registers itself on import).

Specs: `hf:DIR` (an HF checkpoint directory; for ELECTRA, a directory with discriminator/ and generator/
as `python -m bertjax.hf export` writes them, or a discriminator alone, whose generator is then fresh) and
`hf:DISCRIMINATOR,GENERATOR` (two directories).
"""

import json
import os
import sys

import jax

from bertjax.core import config as config_lib
from bertjax.core.errors import UserError
from bertjax.data import hf_tokenizer
from bertjax.hf import configs, convert, weights as W
from bertjax.train import loop

PREFIX = "hf:"
# Model keys the checkpoint decides (its architecture), with the config.json name each comes from.
ARCHITECTURE = dict(
    vocab_size="vocab_size", hidden_size="hidden_size", num_layers="num_hidden_layers",
    num_heads="num_attention_heads", intermediate_size="intermediate_size", embedding_size="embedding_size",
    max_positions="max_position_embeddings", type_vocab_size="type_vocab_size", layer_norm_eps="layer_norm_eps",
    activation="hidden_act", position_offset="pad_token_id", sharing="model_type",
    num_hidden_groups="num_hidden_groups", generator_fraction="the generator's hidden_size",
    # ModernBERT's options (bertjax.hf.modernbert); other families' checkpoints get the defaults (BERT's).
    position="model_type", rope_theta="rope_parameters", local_rope_theta="rope_parameters", ffn="model_type",
    norm="model_type", use_bias="attention_bias", local_window="local_attention", global_every="layer_types",
    layer_types="layer_types")
MODERN_KEYS = ("position", "rope_theta", "local_rope_theta", "ffn", "norm", "use_bias", "local_window",
               "global_every", "layer_types")


def is_hf(spec: str) -> bool:
  return spec.startswith(PREFIX)


def directories(spec: str) -> tuple[str, str]:
  """(checkpoint directory, ELECTRA generator directory or "") of an `hf:` spec, as absolute paths."""
  main, _, generator = spec[len(PREFIX):].partition(",")
  main, generator = (os.path.abspath(os.path.expanduser(d)) if d else "" for d in (main, generator))
  if (not generator and not os.path.isfile(os.path.join(main, "config.json"))
      and all(os.path.isfile(os.path.join(main, d, "config.json")) for d in ("discriminator", "generator"))):
    main, generator = os.path.join(main, "discriminator"), os.path.join(main, "generator")
  for d in filter(None, (main, generator)):
    if not os.path.isfile(os.path.join(d, "config.json")):
      raise UserError(f"no config.json in {d}; --config.init_from=hf:DIR names an HF checkpoint directory "
                      "(ELECTRA: hf:DISCRIMINATOR,GENERATOR)")
  return main, generator


def _read(directory: str) -> dict:
  with open(os.path.join(directory, "config.json")) as f:
    return json.load(f)


def resolve(config, overridden=()):
  """The config with the architecture (and, unless data.tokenizer is set, the tokenizer) of the checkpoint
  that `init_from` names; the config itself when init_from is no `hf:` spec.

  Args:
    config: the run's config.
    overridden: the keys set on the command line ("model.hidden_size", ...): one of ARCHITECTURE whose
      value differs from the checkpoint's is a UserError naming it; the config file's own values give way.
  """
  if not is_hf(config.init_from):
    return config
  main, generator = directories(config.init_from)
  hf = _read(main)
  family = configs.family_of(hf)
  arch = {k: v for k, v in configs.model_section(hf, family).items() if k in ARCHITECTURE}
  arch.setdefault("sharing", "none")
  arch.setdefault("num_hidden_groups", 1)
  default = config_lib.defaults().model
  for key in MODERN_KEYS:
    arch.setdefault(key, default[key])
  if generator and "rtd" in config_lib.active_objectives(config):
    arch["generator_fraction"] = _read(generator)["hidden_size"] / hf["hidden_size"]
  c = config.copy_and_resolve_references()
  for key, value in arch.items():
    if f"model.{key}" in overridden and c.model[key] != value:
      raise UserError(f"--config.model.{key}={c.model[key]} but the checkpoint {main} has {value} "
                      f"({ARCHITECTURE[key]} in its config.json); drop the override: continued pretraining "
                      "keeps the checkpoint's architecture")
    c.model[key] = type(c.model[key])(value)
  if not c.data.tokenizer:
    if not hf_tokenizer.has_tokenizer(main) and not c.data.source.startswith("shards:"):
      raise UserError(f"the checkpoint {main} has no tokenizer files (tokenizer.json, vocab.txt, spiece.model); "
                      "copy them there or name its tokenizer with --config.data.tokenizer")
    if hf_tokenizer.has_tokenizer(main):
      c.data.tokenizer = PREFIX + main
  return c


def _groups(paths, depth: int = 1) -> str:
  """"mlm, sentence" for parameter paths (their modules `depth` levels down), or "nothing"."""
  return ", ".join(sorted({"/".join(p.split("/")[:depth]) for p in paths})) or "nothing"


def load_params(config, params) -> tuple[dict, list]:
  """(params, report lines): the run's freshly initialized `params` (jax.Arrays, placed on the mesh) with
  every leaf the checkpoint of config.init_from has put in its place, on the leaf's sharding."""
  if not is_hf(config.init_from):
    return loop.load_init_params(config, params)
  main, generator = directories(config.init_from)
  imported = convert.read_hf(main, generator, seed=config.seed)
  have = dict(imported.params)
  if imported.pooler is not None:  # a bare BertModel's pooler starts the run's sentence head, if it has one
    have.setdefault("sentence", {})["pooler"] = imported.pooler
  not_had = set(imported.fresh) - ({"sentence/pooler/kernel", "sentence/pooler/bias"} if imported.pooler else set())
  loaded, fresh, taken = 0, [], set()

  def take(path, leaf):
    nonlocal loaded
    name = "/".join(k.key for k in path)
    if name in not_had or not W.has(have, name):
      fresh.append(name)
      return leaf
    value = W.get(have, name)
    if tuple(value.shape) != tuple(leaf.shape):
      raise UserError(f"the checkpoint's {name} has shape {tuple(value.shape)}, the run's {tuple(leaf.shape)}; "
                      "leave the model sizes to the checkpoint")
    taken.add(name)
    loaded += value.size
    return jax.device_put(value.astype(leaf.dtype), leaf.sharding)

  out = jax.tree_util.tree_map_with_path(take, params)
  total = sum(x.size for x in jax.tree.leaves(params))
  names = ("/".join(k.key for k in path) for path, _ in jax.tree_util.tree_flatten_with_path(have)[0])
  unused = [p for p in names if p not in taken and p not in not_had]
  lines = [f"initialized weights from {config.init_from} ({imported.family}, {loaded:,} of {total:,} parameters)"]
  if fresh:
    lines.append(f"freshly initialized (not in the checkpoint): {_groups(fresh)}")
  if unused or imported.unused:
    lines.append(f"checkpoint weights this run does not train: {_groups(unused, depth=2)}"
                 + (f"; unused tensors {', '.join(imported.unused)}" if imported.unused else ""))
  return out, lines


# The pretraining loop sits below this package: it takes `init_from=hf:...` through this module once imported.
loop.register_init_source(PREFIX, sys.modules[__name__])
