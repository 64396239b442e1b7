"""Early exit for sequence classification as a task module of the fine-tuning trainer: what
`--config.early_exit=deebert|pabee|fastbert|depth` runs (classification.task.variant picks it). Reading and
encoding the data are the classification task's; the model is early_exit.EarlyExitClassifier; training is one
or two stages (below); evaluation applies the method's exit rule (exit_rules) per example and reports the
task metrics at the exits, the mean exit layer, the FLOPs saved, the full-depth metrics, and a threshold sweep
(seed_S/exit_sweep.json).

Training, as the references do it:
  deebert   stage 1: the backbone and the last layer's head, CE of the last layer; stage 2: the other exits only
            (backbone frozen), sum of their CEs, unweighted (castorini/DeeBERT run_highway_glue.py).
  pabee     one stage, every exit with the backbone: sum_j j CE_j / sum_j j (JetRunner/PABEE).
  fastbert  stage 1: the backbone and the teacher (last layer's) classifier, CE; stage 2: the students only,
            sum over i < L of KL(p_L || p_i), learning rate x 10 (autoliuweijie/FastBERT). No labels used.
  depth     one stage: every exit with uniform weights (Elbayad et al.'s aligned training) plus the depth
            classifier's CE against the likelihood oracle argmax_n [log p_n(y | x) - depth_cost * n].
"""

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import optax

from bertjax.core.errors import UserError
from bertjax.finetune import tasks
from bertjax.finetune.classification import data as task_data, early_exit as ee, exit_rules
from bertjax.finetune.classification import metrics as task_metrics, task as base
from bertjax.finetune.model import init_params as pretrained_init
from bertjax.model import config as model_config

OUTPUT_POSITION_AXIS = None
read = base.read
# the thresholds the sweep tries when exit.sweep is empty
SWEEPS = {"entropy": (0.0, 0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7), "uncertainty": tuple(np.arange(11) / 10),
          "depth": (0.1, 0.3, 0.5, 0.7, 0.9, 1.0)}
STAGE2_LR_SCALE = {"deebert": 1.0, "fastbert": 10.0}  # DeeBERT reuses the lr; FastBERT distils at lr x 10


def _check(ok: bool, message: str):
  if not ok:
    raise UserError(message)


def validate(config):
  """The classification task's checks, then one-line errors for early-exit settings that cannot run."""
  base.validate(config)
  method = config.early_exit
  _check(method in ee.METHODS, f"early_exit={method!r}; use one of {', '.join(ee.METHODS)} (or leave it empty)")
  _check(not config.get("pack_train", False), "early_exit does not pack rows; set --config.pack_train=False")
  _check(not config.model.quantize, "early_exit runs the float model; leave --config.model.quantize empty")
  _check(bool(task_data.label_names(config.task)) or method == "pabee",
         f"early_exit={method} needs class labels (its exit rule reads probabilities); regression runs with pabee")
  _check(method != "fastbert" or config.model.get("pooling", "auto") in ("auto", "cls"),
         "early_exit=fastbert's students attend over every token themselves; leave --config.model.pooling auto")
  sweep_of(config)


def threshold(config) -> float:
  """The exit rule's threshold: exit.threshold, or the method's default when it is negative."""
  value = config.exit.threshold
  return float(exit_rules.DEFAULT_THRESHOLD[exit_rules.RULES[config.early_exit]] if value < 0 else value)


def sweep_of(config, num_layers: int = 12) -> list:
  """The thresholds of the sweep: exit.sweep (comma-separated), else the rule's list (patience: 1 .. L - 1)."""
  text = config.exit.get("sweep", "")
  try:
    if text:
      return [float(v) for v in text.split(",")]
  except ValueError:
    raise UserError(f"exit.sweep={text!r} is not a comma-separated list of numbers") from None
  rule = exit_rules.RULES[config.early_exit]
  return list(range(1, num_layers)) if rule == "patience" else list(SWEEPS[rule])


def prepare(config, loaded, raw=None) -> tasks.TaskData:
  """The classification task's encoded splits, with the encoder's sizes (for the FLOPs) in `extra`."""
  data = base.prepare(config, loaded, raw)
  enc = model_config.encoder_config(loaded.config.model)
  data.extra = dict(hidden=enc.hidden_size, intermediate=enc.intermediate_size, layers=enc.num_layers)
  data.info.update(early_exit=config.early_exit, head="early_exit", exit_threshold=threshold(config),
                   exit_pooling=pooling(config))
  return data


def pooling(config) -> str:
  """What the pooled exit heads read: --config.model.pooling (cls | mean), auto being the checkpoint's own
  (classification.task.pooling_of: cls unless its config.json says otherwise, as the references' [CLS])."""
  return "cls" if config.early_exit == "fastbert" else base.pooling_of(config)


def model(config, cfg, data: tasks.TaskData, deterministic: bool) -> ee.EarlyExitClassifier:
  """The early-exit classifier over the encoder `cfg`."""
  return ee.EarlyExitClassifier(cfg, data.model["num_outputs"], config.early_exit, config.model.classifier_dropout,
                                deterministic, pooling(config))


def init_params(model, rng, loaded) -> tuple[dict, list]:
  """Embeddings and encoder from the checkpoint, exit heads from `rng`; a pooled head (DeeBERT's highways,
  PABEE's and depth's shared pooler) starts from the checkpoint's BERT pooler where it has one (DeeBERT's
  init_highway_pooler copies it into every highway)."""
  params, fresh = pretrained_init(model, rng, loaded.params, None)
  pooler = base.pretrained_pooler(loaded)
  exits = dict(params["exits"])
  if pooler is not None and "pooler_kernel" in exits and set(pooler) == {"kernel", "bias"}:
    kernel, bias = jnp.asarray(pooler["kernel"]), jnp.asarray(pooler["bias"])
    if kernel.shape == exits["pooler_kernel"].shape[-2:]:
      exits["pooler_kernel"] = jnp.broadcast_to(kernel, exits["pooler_kernel"].shape)
      exits["pooler_bias"] = jnp.broadcast_to(bias, exits["pooler_bias"].shape)
  params["exits"] = exits
  return params, fresh


def _layer_losses(logits, label):
  """Per-layer losses [B, L]: softmax CE, or squared error for one output."""
  if logits.shape[-1] == 1:
    return (logits[..., 0] - label[:, None]) ** 2
  return optax.softmax_cross_entropy_with_integer_labels(logits, jnp.broadcast_to(label[:, None], logits.shape[:2]))


def pabee_loss(outputs, batch):
  """PABEE: sum_j j CE_j / sum_j j (weights 1..L)."""
  per = _layer_losses(outputs, batch["label"])
  w = jnp.arange(1, per.shape[1] + 1, dtype=jnp.float32)
  return (per * w).sum(-1) / w.sum()


def last_loss(outputs, batch):
  """Stage 1 of DeeBERT and FastBERT: the last layer's CE."""
  return _layer_losses(outputs, batch["label"])[:, -1]


def deebert_exit_loss(outputs, batch):
  """DeeBERT stage 2: sum over the exits below the last of their CEs, unweighted."""
  return _layer_losses(outputs, batch["label"])[:, :-1].sum(-1)


def fastbert_distill_loss(outputs, batch):
  """FastBERT stage 2: sum over i < L of KL(p_L || p_i), the teacher p_L held fixed; labels unused."""
  del batch
  teacher = jax.lax.stop_gradient(jax.nn.log_softmax(outputs[:, -1:]))
  students = jax.nn.log_softmax(outputs[:, :-1])
  return (jnp.exp(teacher) * (teacher - students)).sum(-1).sum(-1)


def depth_oracle(logits, label, cost: float):
  """The likelihood-based oracle (Elbayad et al.): the depth index argmax_n [log p_n(y | x) - cost * n], 0-based."""
  loglik = -_layer_losses(logits, label)
  return jnp.argmax(loglik - cost * jnp.arange(1, loglik.shape[1] + 1), -1)


def depth_loss(cost: float):
  """The depth method's loss: the exits' mean CE plus the depth classifier's CE against the oracle."""
  def loss(outputs, batch):
    logits, q = outputs[..., :-1], outputs[..., -1]
    per = _layer_losses(logits, batch["label"])
    oracle = jax.lax.stop_gradient(depth_oracle(logits, batch["label"], cost))
    return per.mean(-1) + optax.softmax_cross_entropy_with_integer_labels(q, oracle)
  return loss


def _trainable(exits_below_last: bool):
  """params -> 0/1 multipliers: only the exit heads below the last layer (`exits_below_last`), or everything
  but them (the backbone and the last layer's head)."""
  def masks(params):
    def one(path, leaf):
      keys = [getattr(k, "key", None) for k in path]
      if keys[0] != "exits":
        return jnp.float32(0.0 if exits_below_last else 1.0)
      below = (jnp.arange(leaf.shape[0]) < leaf.shape[0] - 1).astype(jnp.float32)
      below = below if exits_below_last else 1 - below
      return below.reshape((-1,) + (1,) * (leaf.ndim - 1))
    return jax.tree_util.tree_map_with_path(one, params)
  return masks


def stages(config) -> list:
  """The training stages of config.early_exit (tasks.Stage: loss, trainable multipliers, lr scale)."""
  method = config.early_exit
  if method == "pabee":
    return [tasks.Stage(pabee_loss)]
  if method == "depth":
    return [tasks.Stage(depth_loss(config.exit.depth_cost))]
  second = deebert_exit_loss if method == "deebert" else fastbert_distill_loss
  return [tasks.Stage(last_loss, _trainable(False)),
          tasks.Stage(second, _trainable(True), STAGE2_LR_SCALE[method])]


def exit_report(config, outputs, data, thr: float) -> dict:
  """The metrics at each example's exit under threshold `thr`, the mean exit layer and the FLOPs saved."""
  method, extra = config.early_exit, data.extra
  c = data.model["num_outputs"]
  depth = outputs[..., c] if method == "depth" else None
  layer, chosen = exit_rules.exit_layers(exit_rules.RULES[method], thr, outputs[..., :c], depth, config.exit.delta)
  lengths = (np.asarray(data.eval["groups"])[:len(outputs)] > 0).sum(-1)
  share, per = exit_rules.flops_saved(method, layer, lengths, extra["hidden"], extra["intermediate"],
                                      extra["layers"], c)
  out = task_metrics.compute(config.task.metrics.split(","), chosen, np.asarray(data.eval["label"])[:len(outputs)])
  return dict(out, mean_exit_layer=float(layer.mean()), flops_saved=share, flops_saved_per_example=per)


def evaluate(outputs, data: tasks.TaskData, config, seed_dir: str) -> dict:
  """The metrics at the exits (exit.threshold), mean_exit_layer, flops_saved (share of the full model's),
  flops_saved_per_example, the full-depth model's metrics (full_depth_METRIC), over the first eval split;
  writes the threshold sweep and each exit's own metrics (`per_layer`) to seed_dir/exit_sweep.json."""
  split = data.eval.get("eval_split")
  if split is not None:
    outputs = outputs[split == 0]
  c = data.model["num_outputs"]
  names = config.task.metrics.split(",")
  result = exit_report(config, outputs, data, threshold(config))
  labels = np.asarray(data.eval["label"])[:len(outputs)]
  result.update({f"full_depth_{k}": v for k, v in task_metrics.compute(names, outputs[:, -1, :c], labels).items()})
  sweep = [dict(threshold=t, **exit_report(config, outputs, data, t))
           for t in sweep_of(config, data.extra["layers"])]
  # Each exit's own metrics, every example leaving there: an exit that learned nothing (the majority class) shows
  # here, where the sweep only shows the rule's mixture of exits.
  per_layer = [task_metrics.compute(names, outputs[:, j, :c], labels) for j in range(outputs.shape[1])]
  with open(os.path.join(seed_dir, "exit_sweep.json"), "w") as f:
    json.dump(dict(method=config.early_exit, rule=exit_rules.RULES[config.early_exit], sweep=sweep,
                   per_layer=per_layer, full_depth={k: v for k, v in result.items() if k.startswith("full_depth_")}),
              f, indent=2)
  return result


def save_model(directory: str, run_config, model, params) -> None:
  """A seed's early-exit model for this repository's own use (benchmarks/early_exit.py times it): its params as
  `exit_params.npz` (tree paths joined by "/") and `early_exit.json` (method, outputs). No transformers export."""
  del run_config
  os.makedirs(directory, exist_ok=True)
  flat = {"/".join(str(getattr(k, "key", k)) for k in path): np.asarray(v)
          for path, v in jax.tree_util.tree_leaves_with_path(params)}
  np.savez(os.path.join(directory, "exit_params.npz"), **flat)
  with open(os.path.join(directory, "early_exit.json"), "w") as f:
    json.dump(dict(method=model.method, num_outputs=model.num_outputs, pooling=model.pooling), f)


def load_params(directory: str, like: dict) -> dict:
  """The params `save_model` wrote, in the structure of `like` (an init of the same model)."""
  flat = np.load(os.path.join(directory, "exit_params.npz"))
  return jax.tree_util.tree_map_with_path(
      lambda path, _: jnp.asarray(flat["/".join(str(getattr(k, "key", k)) for k in path)]), like)
