"""`python -m bertjax.summary --config=configs/bert.py:base`: parameter table, FLOPs per token, `params: N`.

Nothing is allocated: shapes come from `jax.eval_shape`. For ELECTRA the generator and discriminator are
counted separately (the shared embeddings belong to both), the discriminator with its RTD head as HF's
ElectraForPreTraining counts it.
"""

import collections

import jax
from absl import flags
from ml_collections import config_flags

from bertjax import build, config as config_lib, flops, runtime
from bertjax.errors import cli, run

# Top-level modules of each network (ELECTRA); the rest of the models are one network.
GENERATOR = ("embeddings", "generator_encoder", "generator_mlm")
DISCRIMINATOR = ("embeddings", "encoder", "rtd", "sentence")


def count(tree) -> int:
  return sum(x.size for x in jax.tree.leaves(tree))


def table(params, depth: int = 2) -> list:
  """Rows (module path, parameter count) down to `depth` levels."""
  rows = collections.OrderedDict()
  for path, leaf in jax.tree_util.tree_leaves_with_path(params):
    keys = [getattr(k, "key", str(k)) for k in path][:depth]
    name = "/".join(keys)
    rows[name] = rows.get(name, 0) + leaf.size
  return list(rows.items())


def summarize(config) -> str:
  """The summary text of a config (what the CLI prints)."""
  config_lib.validate(config)
  model, params = build.make_model(config), build.param_shapes(config)
  predictions = config_lib.max_predictions(config)
  lines = [f"{'module':<48} {'params':>14}", "-" * 63]
  lines += [f"{name:<48} {n:>14,}" for name, n in table(params)]
  lines.append("-" * 63)
  fpt = flops.train_flops_per_token(model.cfg, config.seq_len, predictions, model.generator, model.sentence_head)
  lines.append(f"train FLOPs per token: {fpt:,.0f} (seq_len {config.seq_len}, {predictions} MLM predictions)")
  if model.generator is not None:
    pick = lambda names: {k: v for k, v in params.items() if k in names}
    lines.append(f"generator params: {count(pick(GENERATOR))}")
    lines.append(f"discriminator params: {count(pick(DISCRIMINATOR))}")
  lines.append(f"params: {count(params)}")
  return "\n".join(lines)


@cli
def main(argv):
  del argv
  runtime.setup()
  print(summarize(flags.FLAGS.config))


if __name__ == "__main__":
  # Flags are defined only when run as a program: importing this module (summarize) must
  # not add a required --config to the process's absl flags.
  config_flags.DEFINE_config_file("config", None, "config file, e.g. configs/bert.py:base", lock_config=True)
  flags.mark_flags_as_required(["config"])
  run(main)
