"""`python -m bertjax.hf`: HF-format checkpoints in and out, hidden states and fill-mask, from the command line.

  python -m bertjax.hf import --hf_dir=DIR --workdir=W [--generator_dir=GEN]  # HF -> bertjax workdir
  python -m bertjax.hf export --workdir=W --out=DIR              # bertjax -> HF (ELECTRA: DIR/{discriminator,generator})
  python -m bertjax.hf encode --hf_dir=DIR --text="..." --out=FILE.npy        # final hidden states [tokens, hidden]
  python -m bertjax.hf fill_mask --hf_dir=DIR --text="Paris is the [MASK] of France." [--top_k=5]

Every command that reads a model takes an HF directory (--hf_dir) or a bertjax workdir (--workdir). The
imported weights run through bertjax's own `Pretrainer` (Embeddings + scanned Encoder + heads). The same as
library calls: bertjax.hf.convert (read_hf, write_hf) and bertjax.hf.inference (load, encode, fill_mask, logits).
"""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import jax
import numpy as np
from absl import flags

from bertjax.core import runtime
from bertjax.core.cli import cli, run
from bertjax.core.errors import UserError
from bertjax.hf import convert, workdir as wd
from bertjax.hf.convert import read_hf, write_hf
from bertjax.hf.inference import encode, fill_mask, load

COMMANDS = ("import", "export", "encode", "fill_mask")


# ---------------------------------------------------------------- CLI

_HF_DIR = flags.DEFINE_string("hf_dir", "", "an HF checkpoint directory (config.json, model.safetensors, tokenizer)")
_WORKDIR = flags.DEFINE_string("workdir", "", "a bertjax workdir (import: where to write it)")
_GENERATOR_DIR = flags.DEFINE_string("generator_dir", "", "import: the ELECTRA generator of the --hf_dir discriminator")
_TEXT = flags.DEFINE_string("text", "", "encode / fill_mask: the input text ([MASK] marks what to fill)")
_OUT = flags.DEFINE_string("out", "", "encode: the .npy file to write; export: the directory to write")
_TOP_K = flags.DEFINE_integer("top_k", 5, "fill_mask: predictions to print per [MASK]")


def _require(value, flag: str, command: str):
  if not value:
    raise UserError(f"{command} needs --{flag}")


def run_command(command: str):
  """Runs one CLI command with the flags' values."""
  if command == "import":
    _require(_HF_DIR.value, "hf_dir", command)
    _require(_WORKDIR.value, "workdir", command)
    imp = read_hf(_HF_DIR.value, _GENERATOR_DIR.value)
    spec = wd.save(imp, _WORKDIR.value, source=_HF_DIR.value)
    n = sum(np.size(x) for x in jax.tree.leaves(imp.params))
    print(f"imported {imp.family} ({n:,} parameters) into {_WORKDIR.value}; tokenizer {spec or 'none'}")
    if imp.fresh:
      print(f"freshly initialized (not in the checkpoint): {', '.join(sorted({p.rsplit('/', 1)[0] for p in imp.fresh}))}")
    if imp.unused:
      print(f"unused checkpoint tensors: {', '.join(imp.unused)}")
  elif command == "export":
    _require(_WORKDIR.value, "workdir", command)
    _require(_OUT.value, "out", command)
    loaded = load(workdir=_WORKDIR.value)
    for directory in write_hf(loaded.config, loaded.params, _OUT.value, loaded.tokenizer, pooler=loaded.pooler):
      print(f"wrote {directory}")
    missing = convert.heads_without_hf(loaded.config)
    if missing:
      print(f"not exported (no HF counterpart): {'; '.join(missing)}")
  elif command == "encode":
    _require(_TEXT.value, "text", command)
    _require(_OUT.value, "out", command)
    states = encode(load(_HF_DIR.value, _WORKDIR.value, _GENERATOR_DIR.value), _TEXT.value)
    np.save(_OUT.value, states)
    print(f"wrote {_OUT.value}: hidden states {states.shape[0]} tokens x {states.shape[1]}")
  else:
    _require(_TEXT.value, "text", command)
    for n, preds in enumerate(fill_mask(load(_HF_DIR.value, _WORKDIR.value, _GENERATOR_DIR.value), _TEXT.value,
                                        _TOP_K.value)):
      print(f"[MASK] #{n + 1}: " + "  ".join(f"{tok} {p:.3f}" for tok, p in preds))


@cli
def main(argv):
  if len(argv) != 2 or argv[1] not in COMMANDS:
    raise UserError(f"usage: python -m bertjax.hf {{{','.join(COMMANDS)}}} --FLAGS (got {' '.join(argv[1:]) or 'nothing'})")
  runtime.setup()
  run_command(argv[1])


if __name__ == "__main__":
  run(main)
