"""bertjax workdirs written by an import (config.json + an orbax checkpoint of the params at step 0 +
the tokenizer files) and read back by export, encode, fill-mask and fine-tuning."""

import json
import os
import shutil

import jax
import ml_collections
import numpy as np

from bertjax.core import saved as saved_config
from bertjax.core.errors import UserError
from bertjax.hf import tokenizers as hf_tokenizers
from bertjax.hf.convert import Imported
from bertjax.train import checkpoint
from bertjax.train.build import param_shapes


def save(imported: Imported, workdir: str, source: str = "") -> str:
  """Writes an imported checkpoint as a bertjax workdir that `--config.init_from` and
  `python -m bertjax.finetune` take. The tokenizer files are copied to workdir/tokenizer."""
  os.makedirs(workdir, exist_ok=True)
  if os.path.isdir(os.path.join(workdir, "checkpoints")) and os.listdir(os.path.join(workdir, "checkpoints")):
    raise UserError(f"{workdir} already holds a checkpoint; import into an empty --workdir")
  tok, spec = imported.tokenizer, ""
  if tok is not None:
    tok_dir = os.path.join(workdir, "tokenizer")
    os.makedirs(tok_dir, exist_ok=True)
    src = tok.path if os.path.isdir(tok.path) else os.path.dirname(tok.path)
    for name in hf_tokenizers.TOKENIZER_FILES:
      if os.path.isfile(os.path.join(src, name)):
        shutil.copy(os.path.join(src, name), os.path.join(tok_dir, name))
    tok = hf_tokenizers.from_dir(tok_dir)
    spec = tok.spec()
  config = imported.config
  config.data.tokenizer = spec
  params = dict(imported.params)
  if imported.pooler is not None:
    params["pooler"] = imported.pooler  # not part of the Pretrainer; fine-tuning starts its pooler from it
  manifest = dict(config=json.loads(config.to_json()), imported_from=source, family=imported.family,
                  fresh=imported.fresh, tokenizer=dict(spec=spec, vocab_size=tok.vocab_size if tok else 0))
  write(workdir, config, params, manifest)
  return spec


def write(directory: str, config: ml_collections.ConfigDict, params, manifest: dict) -> None:
  """A workdir of one model and no run: config.json and an orbax checkpoint of `params` at step 0 with
  `manifest`, what `load`, export, fine-tuning and init_from read (an import, a fine-tuned classifier, a
  distilled student)."""
  os.makedirs(directory, exist_ok=True)
  with open(os.path.join(directory, "config.json"), "w") as f:
    f.write(config.to_json(indent=2))
  ckpt = checkpoint.Checkpointer(directory, keep=1, async_save=False)
  ckpt.save(0, dict(step=np.int32(0), params=jax.tree.map(np.asarray, params)), manifest, force=True)
  ckpt.close()


def load_config(workdir: str) -> ml_collections.ConfigDict:
  path = os.path.join(workdir, "config.json")
  if not os.path.isfile(path):
    raise UserError(f"no config.json in {workdir!r}; point at a bertjax workdir (a training run or an import)")
  with open(path) as f:
    saved = json.load(f)
  # Over today's defaults, so that a run saved before a key existed still loads (with the default).
  return saved_config.from_saved(saved)


def load(workdir: str, with_tokenizer: bool = True):
  """(config, params, tokenizer or None, fresh) of a bertjax workdir's latest checkpoint; params are numpy
  and may hold an extra top-level `pooler` (an imported one); `fresh` lists the parameters an import
  initialized because its checkpoint lacked them."""
  config = load_config(workdir)
  shapes = param_shapes(config)
  params = checkpoint.restore_params(workdir, shapes)
  params = jax.tree.map(np.asarray, params)
  extra = _extra_pooler(workdir, config.model.hidden_size)
  if extra is not None:
    params["pooler"] = extra
  manifest = _manifest(workdir)
  tok = None
  spec = config.data.tokenizer or manifest.get("tokenizer", {}).get("spec", "")
  if with_tokenizer and spec:  # without one, export still works; encode and fill-mask say what is missing
    tok = hf_tokenizers.load_any(spec)
  return config, params, tok, tuple(manifest.get("fresh", ()))


def latest_step(workdir: str) -> int:
  """The step of a workdir's latest checkpoint (0 for an import)."""
  ckpt = checkpoint.Checkpointer(workdir, async_save=False)
  try:
    return int(ckpt.latest_step() or 0)
  finally:
    ckpt.close()


def _extra_pooler(workdir: str, hidden: int):
  """The imported pooler saved beside the Pretrainer params, if there is one."""
  target = {"pooler": {"kernel": jax.ShapeDtypeStruct((hidden, hidden), np.float32),
                       "bias": jax.ShapeDtypeStruct((hidden,), np.float32)}}
  try:
    pooler = checkpoint.restore_params(workdir, target)["pooler"]
  except Exception:  # orbax raises various types for a key the checkpoint lacks: no pooler saved
    return None
  if any(isinstance(x, jax.ShapeDtypeStruct) for x in jax.tree.leaves(pooler)):
    return None  # a partial restore leaves a key the checkpoint lacks abstract: no pooler saved
  return jax.tree.map(np.asarray, pooler)


def _manifest(workdir: str) -> dict:
  """The latest checkpoint's manifest ({} when it has none)."""
  ckpt = checkpoint.Checkpointer(workdir, async_save=False)
  try:
    return ckpt.manifest()
  except Exception:  # orbax raises various types for a missing item
    return {}
  finally:
    ckpt.close()
