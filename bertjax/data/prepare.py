"""`python -m bertjax.data.prepare --config=configs/bert.py:base --config.data.source=text:GLOB --out=DIR [--workers=N]`.

Turns the corpus named by --config.data.source into pre-tokenized shards for that config (seq_len,
instance format and tokenizer come from it), streaming, on every core; then train with
`python -m bertjax.train --config=<same> --config.data.source=shards:DIR`. A config whose phases train at
several seq_lens gets DIR/seq_len_N for each, made with one tokenizer (the first's); `shards:DIR` then
serves every phase its own. `--config.data.tokenizer=hf:DIR` (or `--config.init_from=hf:DIR`) prepares with a
published checkpoint's own tokenizer, for continued pretraining.
"""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from absl import flags
from ml_collections import config_flags

from bertjax.core.cli import cli, run

_CONFIG = config_flags.DEFINE_config_file("config", None, "config file, e.g. configs/bert.py:base", lock_config=True)
_OUT = flags.DEFINE_string("out", None, "directory to write the shards, metadata.json and tokenizer to")
_WORKERS = flags.DEFINE_integer("workers", os.cpu_count() or 1,
                                "processes that tokenize and make instances (0: all in this process)")
_OVERWRITE = flags.DEFINE_bool("overwrite", False, "replace a preparation already in --out")
flags.mark_flags_as_required(["config", "out"])


@cli
def main(argv):
  del argv
  from bertjax.core import config as config_lib
  from bertjax.data import prepare_lib
  from bertjax.hf import init_from
  from bertjax.train import build

  out = os.path.abspath(os.path.expanduser(_OUT.value))
  # --config.init_from=hf:DIR: the checkpoint's tokenizer and vocabulary, as training will take them.
  config = init_from.resolve(_CONFIG.value, frozenset(config_flags.get_override_values(flags.FLAGS["config"])))
  build.validate(config)  # what training would refuse, prepare refuses before reading the corpus
  by_seq_len = config_lib.configs_by_seq_len(config)
  tokenizer = ""
  for seq_len, config in sorted(by_seq_len.items()):
    directory = out if len(by_seq_len) == 1 else os.path.join(out, f"seq_len_{seq_len}")
    meta = prepare_lib.prepare(config, directory, workers=_WORKERS.value, overwrite=_OVERWRITE.value,
                               tokenizer=tokenizer)
    tokenizer = tokenizer or prepare_lib.absolute_spec(meta["tokenizer"]["spec"], directory)
    print(prepare_lib.summary(meta, directory), flush=True)


if __name__ == "__main__":
  run(main)
