"""`python -m bertjax.summary --config=configs/bert.py:base`: parameter table, FLOPs per token, `params: N`.

Nothing is allocated: shapes come from `jax.eval_shape`. For ELECTRA the generator and discriminator are
counted separately (the shared embeddings belong to both), the discriminator with its RTD head as HF's
ElectraForPreTraining counts it. A distillation config prints its student's count (`student params`: what
W/student holds) and, with a teacher set, the frozen teacher's and the projection's apart.
"""

import collections

import jax
from absl import flags
from ml_collections import config_flags

from bertjax.core import config as config_lib, runtime
from bertjax.core.cli import cli, run
from bertjax.model import flops, kinds
from bertjax.model.pretrain import Pretrainer
from bertjax.objectives import masking
from bertjax.train import build

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


def recipe(config, model) -> list:
  """The training recipe's lines: each phase's steps x batch x seq_len, masking budget, tokens and FLOPs per
  token, its learning rate, and the run's totals."""
  plan, lines, total = config_lib.phases(config), [], 0
  for phase in plan:
    c = phase.config
    tokens = phase.steps * c.batch_size * c.seq_len
    total += tokens
    fpt = flops.model_train_flops_per_token(model, c.seq_len, config_lib.max_predictions(c),
                                            masking.shuffle_slots(c.seq_len, c.masking.wso_share))
    lr = (f"lr {phase.learning_rate:g} restarted ({config.optimizer.schedule}, warmup "
          f"{phase.warmup_steps:,})" if phase.learning_rate else
          f"lr {config.learning_rate:g} ({config.optimizer.schedule}, warmup {config_lib.warmup_steps(config):,} of the "
          "run)")
    lines.append(f"phase {phase.index + 1}: {phase.steps:,} steps x batch {c.batch_size:,} x seq_len {c.seq_len}, "
                 f"max_predictions {config_lib.max_predictions(c)}: {tokens:,} tokens, {fpt:,.0f} train FLOPs/token; {lr}")
  lines.append(f"recipe: {len(plan)} phase{'s' if len(plan) > 1 else ''}, {config.total_steps:,} steps, {total:,} tokens")
  lines.append("kinds: " + ", ".join(f"{family} {kind.name}" for family, kind in kinds.chosen(config.model).items()))
  return lines


def heads(config, model, params) -> list:
  """A line for each head the BERT-family variants add (SpanBERT's SBO, StructBERT's WSO and SSO): its
  parameters and its share of the training FLOPs per token (of the first phase's shapes). A Distiller has
  none: its student is an MLM model."""
  if not isinstance(model, Pretrainer):
    return []
  c = config_lib.phases(config)[0].config
  p, q = config_lib.max_predictions(c), masking.shuffle_slots(c.seq_len, c.masking.wso_share)
  lines = []
  if model.sbo:
    fpt = 3 * flops.sbo_head_forward_flops(model.cfg, c.seq_len, p)
    lines.append(f"sbo head: {count(params['sbo_head']):,} params, {fpt:,.0f} train FLOPs/token")
  if model.wso:
    fpt = 3 * flops.mlm_head_forward_flops(model.cfg, c.seq_len, q)
    lines.append(f"wso: the MLM head (no params of its own) on {q} shuffled positions, {fpt:,.0f} train FLOPs/token")
  if model.sentence_head and model.sentence_classes == 3:
    lines.append(f"sso head (pooler + 3-way classifier): {count(params['sentence']):,} params")
  return lines


def base_model_params(model, params) -> int:
  """Embeddings, encoder and the pooler (when the sentence head has one): what transformers' *Model class of
  the family counts (BertModel, MobileBertModel with its config's pooler)."""
  pooler = params.get("sentence", {}).get("pooler", {})
  return count(params["embeddings"]) + count(params["encoder"]) + count(pooler)


def summarize(config) -> str:
  """The summary text of a config (what the CLI prints)."""
  if config.get("teacher"):  # a distillation config: the Distiller plugs into the factory from above
    from bertjax.compress import distill  # noqa: F401
  build.validate(config)
  model, params = build.make_model(config), build.param_shapes(config)
  lines = [f"{'module':<48} {'params':>14}", "-" * 63]
  lines += [f"{name:<48} {n:>14,}" for name, n in table(params)]
  lines.append("-" * 63)
  lines += recipe(config, model)
  lines += heads(config, model, params)
  if model.generator is not None:
    pick = lambda names: {k: v for k, v in params.items() if k in names}
    lines.append(f"generator params: {count(pick(GENERATOR))}")
    lines.append(f"discriminator params: {count(pick(DISCRIMINATOR))}")
  if "distill" in config:  # the student alone, as W/student holds it (and DistilBertForMaskedLM counts it)
    lines.append(f"student params: {count(params.get('student', params))}")
    if "teacher" in params:
      lines.append(f"teacher params (frozen): {count(params['teacher'])}")
    if "projection" in params:
      lines.append(f"projection params (TinyBERT's, trained, not part of the student): {count(params['projection'])}")
  if isinstance(model, Pretrainer) and model.generator is None:
    lines.append(f"base model params: {base_model_params(model, params)}")
  elif hasattr(model, "base_model"):  # a kind's own model (XLNet): what transformers' *Model counts
    lines.append(f"base model params: {count(model.base_model(params))}")
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
