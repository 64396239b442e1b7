"""Attention-head importance and pruning of a fine-tuned classifier (Michel et al. 2019, "Are Sixteen Heads
Really Better than One?"), as library calls and a thin CLI.

  python -m bertjax.compress.prune importance --workdir=FT [--out=DIR]     # per-head importance on the task's dev set
  python -m bertjax.compress.prune prune --workdir=FT [--out=DIR] [--step_fraction=0.1] [--save_dir=P --save_at=0.5]

FT is a fine-tuning workdir run with `--config.save_model=True` (its config.json names the task and the
pretrained checkpoint; `seed_S/model` holds the fine-tuned classifier; `--model=DIR` takes another, e.g. a
pruned one). Every head has a gate (the encoder's `head_gates`, 1 = on) multiplying its context vectors
before the output projection. Importance is the dev-set expectation of |dL(x)/d gate| over examples x (Michel
et al. eq. 3: the absolute value of each example's own gradient, then the mean; per-example gradients come from
one jax.vmap of jax.grad per batch), normalized per layer by its L2 norm (their §4.2).
`prune` removes the lowest-scored remaining heads, `step_fraction` of all heads at a time, re-scoring the
remaining heads and re-evaluating after each step; it writes the metric against the share of heads removed
(prune_curve.json, prune_curve.png) and, with --save_dir, the model pruned at --save_at.

A pruned model is physically smaller: the stacked q/k/v and output-projection weights keep only the
remaining heads. Layers run under one nn.scan, which needs one head count for all layers, so the stored
count is the largest number any layer keeps; a layer that keeps fewer fills its other slots with all-zero
heads. A zero head contributes exactly 0 (its values are 0) and is a fixed point of training (every
gradient into it is 0, so AdamW never moves it), so the pruned model needs no saved mask and fine-tunes on
as it is. Pruning equally per layer would waste nothing but cannot follow the importance ranking, which
removes many heads from some layers and few from others (Michel et al. §5).
"""

import dataclasses
import functools
import json
import math
import os

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from bertjax.core.errors import UserError

COMMANDS = ("importance", "prune")


# ---------------------------------------------------------------- library


@functools.lru_cache(maxsize=8)
def _jitted(model, regression: bool):
  """(outputs fn, per-example gate-gradient fn) of a deterministic Classifier, jitted once per model. The
  second maps (gates, params, batch) to [batch, layers, heads]: row i is d loss(example i) / d gates, from
  jax.vmap over the rows of jax.grad of a one-row batch's loss (a padding row, example_weight 0, gives 0)."""
  from bertjax.finetune import train

  predict = jax.jit(lambda p, b, g: model.apply({"params": p}, b["input_ids"], b["type_ids"], b["groups"], g))

  def one(g, p, row):  # the loss of one example, as a batch of one
    return train._loss(p, jax.tree.map(lambda x: x[None], row), None, model, regression, head_gates=g)

  return predict, jax.jit(jax.vmap(jax.grad(one), in_axes=(None, None, 0)))


def _batches(arrays, batch_size: int):
  from bertjax.data import pipeline

  return pipeline.eval_batches(pipeline.ArrayRows(arrays), batch_size)


def evaluate(model, params, arrays, gates, metric_names, batch_size: int = 64) -> dict:
  """The task metrics of the model with `gates` [layers, heads] on `arrays` (an encoded split)."""
  from bertjax.finetune.classification import metrics

  predict, _ = _jitted(model, model.num_outputs == 1)
  outs = []
  for b in _batches(arrays, batch_size):
    out = np.asarray(predict(params, b, jnp.asarray(gates, jnp.float32)))
    outs.append(out[b["example_weight"] > 0])
  return metrics.compute(metric_names, np.concatenate(outs), arrays["label"])


def importance(model, params, arrays, gates, batch_size: int = 64, normalize: bool = True) -> np.ndarray:
  """Michel et al.'s head importance [layers, heads] at `gates` (their eq. 3): the mean over the examples x of
  `arrays` of |d loss(x) / d gate|, the absolute value taken per example before averaging, so that examples
  pulling a head in opposite directions do not cancel. With `normalize`, each layer's scores are divided by
  their L2 norm (their §4.2, which makes layers comparable for global pruning; `normalize_by_layer`)."""
  _, grad = _jitted(model, model.num_outputs == 1)
  total = np.zeros(np.shape(gates), np.float64)
  g = jnp.asarray(gates, jnp.float32)
  for b in _batches(arrays, batch_size):
    total += np.abs(np.asarray(grad(g, params, b), np.float64)).sum(0)
  total /= len(arrays["label"])
  return normalize_by_layer(total) if normalize else total


def normalize_by_layer(scores: np.ndarray) -> np.ndarray:
  """Each layer's scores divided by their L2 norm (+1e-20, as Michel et al.'s and transformers' code)."""
  return scores / (np.linalg.norm(scores, axis=1, keepdims=True) + 1e-20)


def min_max(scores: np.ndarray) -> np.ndarray:
  """Scores rescaled to [0, 1] over all heads (transformers' run_bertology.py does this after the per-layer
  normalization unless --dont_normalize_global_importance; Michel et al.'s code does not). An increasing
  affine map: the ranking, and so the pruning order, is the same."""
  span = scores.max() - scores.min()
  return (scores - scores.min()) / span if span > 0 else np.zeros_like(scores)


def prune_curve(model, params, arrays, metric_names, step_fraction: float = 0.1, batch_size: int = 64,
                log=print) -> list:
  """Iterative pruning: from all heads on, remove the ceil(step_fraction x all) lowest-importance
  remaining heads (importance re-scored with the current gates), evaluate, repeat until one head is left.
  Returns one entry per step: heads_removed, share_removed, the metrics, and the gates [layers, heads]."""
  layers, heads = model.cfg.num_layers, model.cfg.num_heads
  total = layers * heads
  per_step = max(1, math.ceil(step_fraction * total))
  gates = np.ones((layers, heads), np.float32)
  curve = []
  while True:
    removed = int(total - gates.sum())
    scores = evaluate(model, params, arrays, gates, metric_names, batch_size)
    curve.append(dict(heads_removed=removed, share_removed=removed / total, **scores, gates=gates.tolist()))
    log(f"removed {removed}/{total} heads ({removed / total:.0%}): "
        + ", ".join(f"{k} {v:.4f}" for k, v in scores.items()))
    if removed >= total - 1:
      return curve
    score = importance(model, params, arrays, gates, batch_size)
    score = np.where(gates > 0, score, np.inf)  # removed heads stay removed
    n = min(per_step, total - 1 - removed)
    order = np.argsort(score, axis=None, kind="stable")[:n]
    gates = gates.copy()
    gates.reshape(-1)[order] = 0.0


def _attention_leaves(params):
  if "layers" not in params["encoder"]:
    raise UserError("this model shares its attention blocks across layers (ALBERT); head pruning needs "
                    "per-layer weights (model.sharing=none)")
  return params["encoder"]["layers"]["attention"]


def prune(run_config, params, gates) -> tuple:
  """(run config, params) with the heads whose gate is 0 physically removed. Every layer stores the largest
  number of heads any layer keeps (one count for the scanned layers); a layer's unused slots are all-zero
  heads, which contribute exactly nothing (see the module docstring)."""
  if run_config.model.sharing != "none":
    raise UserError("head pruning needs per-layer attention weights; this model shares them (model.sharing="
                    f"{run_config.model.sharing!r})")
  keep = np.asarray(gates) > 0
  layers, heads = keep.shape
  kept = max(1, int(keep.sum(1).max()))
  index, valid = np.zeros((layers, kept), np.int32), np.zeros((layers, kept), bool)
  for layer in range(layers):
    idx = np.flatnonzero(keep[layer])
    index[layer, :len(idx)], valid[layer, :len(idx)] = idx, True

  def take(x, axis):  # x: [layers, ...] with the heads on `axis`
    x = np.asarray(x)
    picked = np.take_along_axis(x, index.reshape((layers,) + (1,) * (axis - 1) + (kept,) + (1,) * (x.ndim - axis - 1)),
                                axis=axis)
    return np.where(valid.reshape((layers,) + (1,) * (axis - 1) + (kept,) + (1,) * (x.ndim - axis - 1)), picked, 0)

  attn = _attention_leaves(params)
  new = {name: dict(attn[name]) for name in attn}
  for name in ("query", "key", "value"):  # kernel [L, E, heads, D], bias [L, heads, D]
    new[name] = dict(kernel=take(attn[name]["kernel"], 2), bias=take(attn[name]["bias"], 1))
  new["output"] = dict(kernel=take(attn["output"]["kernel"], 1), bias=np.asarray(attn["output"]["bias"]))
  out = jax.tree.map(np.asarray, params)
  out["encoder"]["layers"]["attention"] = new
  config = ml_collections.ConfigDict(run_config.to_dict())
  config.model.head_size = int(np.shape(attn["query"]["kernel"])[-1])
  config.model.num_heads = kept
  return config, out


def num_params(params) -> int:
  return int(sum(np.size(x) for x in jax.tree.leaves(params)))


def plot_curve(curve: list, metric: str, path: str, title: str = ""):
  """The metric against the share of heads removed (Michel et al.'s Figure 3), as a PNG."""
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  fig, ax = plt.subplots(figsize=(5, 3.5))
  ax.plot([100 * p["share_removed"] for p in curve], [p[metric] for p in curve], "o-")
  ax.set_xlabel("heads removed (%)")
  ax.set_ylabel(f"dev {metric}")
  ax.set_title(title or "iterative head pruning")
  ax.grid(alpha=0.3)
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)


def plot_importance(scores: np.ndarray, path: str):
  """A [layers x heads] heatmap of the importance scores."""
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  layers, heads = scores.shape
  fig, ax = plt.subplots(figsize=(1 + 0.5 * heads, 1 + 0.4 * layers))
  im = ax.imshow(scores, cmap="viridis", aspect="auto")
  ax.set_xlabel("head")
  ax.set_ylabel("layer")
  ax.set_xticks(range(heads))
  ax.set_yticks(range(layers))
  fig.colorbar(im, ax=ax, label="importance (per-layer normalized)")
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)


# ---------------------------------------------------------------- a fine-tuning workdir


def load_finetuned(workdir: str, seed: int = -1, model_dir: str = "") -> dict:
  """What the commands need from a fine-tuning workdir: its config, the encoded dev set (as fine-tuning
  evaluated it), and the seed's saved model (or the one at `model_dir`)."""
  from bertjax.finetune import model as ft_model, train
  from bertjax.finetune.classification import model as cls_model

  path = os.path.join(workdir, "config.json")
  if not os.path.isfile(path):
    raise UserError(f"no config.json in {workdir!r}; point --workdir at a fine-tuning workdir "
                    "(python -m bertjax.finetune ... --config.save_model=True)")
  with open(path) as f:
    config = ml_collections.ConfigDict(json.load(f))
  seed = config.seed if seed < 0 else seed
  model_dir = model_dir or os.path.join(workdir, f"seed_{seed}", ft_model.MODEL_DIR)
  run_config, model, params = cls_model.load_model(model_dir)
  setup = train.prepare(config)
  return dict(config=config, run_config=run_config, model=model, params=params, eval=setup["eval"],
              metrics=config.task.metrics.split(","), model_dir=model_dir)


def run_command(command: str, workdir: str, out: str = "", seed: int = -1, model_dir: str = "",
                step_fraction: float = 0.1, save_dir: str = "", save_at: float = 0.5) -> dict:
  """Runs `importance` or `prune` on a fine-tuning workdir; writes its files under `out` (default
  WORKDIR/heads) and returns what it wrote."""
  if command not in COMMANDS:
    raise UserError(f"usage: python -m bertjax.compress.prune {{{','.join(COMMANDS)}}} --workdir=FT (got {command!r})")
  if not 0 < step_fraction < 1:
    raise UserError(f"--step_fraction={step_fraction} must be in (0, 1), e.g. 0.1 (Michel et al.)")
  if save_dir and os.path.exists(os.path.join(save_dir, "classifier.json")):
    raise UserError(f"{save_dir} already holds a model; choose an empty --save_dir")
  ft = load_finetuned(workdir, seed, model_dir)
  model, params, evals, names = ft["model"], ft["params"], ft["eval"], ft["metrics"]
  out = out or os.path.join(workdir, "heads")
  os.makedirs(out, exist_ok=True)
  bs = ft["config"].eval_batch_size
  gates = np.ones((model.cfg.num_layers, model.cfg.num_heads), np.float32)
  if command == "importance":
    raw = importance(model, params, evals, gates, bs, normalize=False)
    scores = normalize_by_layer(raw)
    result = dict(model=ft["model_dir"], task=ft["config"].task.name, examples=len(evals["label"]),
                  importance=scores.tolist(), raw_importance=raw.tolist(), importance_0_1=min_max(scores).tolist(),
                  ranking=[[int(i // scores.shape[1]), int(i % scores.shape[1])] for i in np.argsort(scores, axis=None)])
    with open(os.path.join(out, "importance.json"), "w") as f:
      json.dump(result, f, indent=2)
    plot_importance(scores, os.path.join(out, "importance.png"))
    for layer, row in enumerate(scores):
      print(f"layer {layer}: " + " ".join(f"{v:.3f}" for v in row))
    print(f"wrote {out}/importance.json and importance.png")
    return result
  curve = prune_curve(model, params, evals, names, step_fraction, bs)
  result = dict(model=ft["model_dir"], task=ft["config"].task.name, examples=len(evals["label"]),
                heads=int(gates.size), step_fraction=step_fraction, curve=curve)
  if save_dir:
    at = max((p for p in curve if p["share_removed"] <= save_at + 1e-9), key=lambda p: p["share_removed"])
    config, pruned = prune(ft["run_config"], params, np.asarray(at["gates"]))
    from bertjax.finetune.classification import model as cls_model

    cfg = dataclasses.replace(model.cfg, num_heads=config.model.num_heads, head_size=config.model.head_size)
    small = cls_model.Classifier(cfg, model.num_outputs, model.classifier_dropout, deterministic=True, head=model.head)
    cls_model.save_model(save_dir, config, small, pruned)
    result["saved"] = dict(path=save_dir, heads_removed=at["heads_removed"], share_removed=at["share_removed"],
                           stored_heads_per_layer=config.model.num_heads, params_before=num_params(params),
                           params_after=num_params(pruned), **{k: at[k] for k in names})
    print(f"saved the model with {at['heads_removed']} heads removed to {save_dir}: {config.model.num_heads} "
          f"heads stored per layer, {num_params(params):,} -> {num_params(pruned):,} parameters")
  with open(os.path.join(out, "prune_curve.json"), "w") as f:
    json.dump(result, f, indent=2)
  plot_curve(curve, names[0], os.path.join(out, "prune_curve.png"), f"{ft['config'].task.name}: iterative head pruning")
  print(f"wrote {out}/prune_curve.json and prune_curve.png")
  return result


def main():
  """The CLI: flags are defined here, not at import, so the library imports beside other CLIs' flags."""
  from absl import flags

  from bertjax.core.cli import cli, run

  workdir = flags.DEFINE_string("workdir", None, "a fine-tuning workdir (run with --config.save_model=True)")
  out = flags.DEFINE_string("out", "", "where to write the JSON and PNG files (default WORKDIR/heads)")
  seed = flags.DEFINE_integer("seed", -1, "whose seed_S/model to read (default: the config's first seed)")
  model_dir = flags.DEFINE_string("model", "", "a saved model directory to use instead (e.g. a pruned one)")
  step = flags.DEFINE_float("step_fraction", 0.1, "prune: share of all heads removed per step")
  save_dir = flags.DEFINE_string("save_dir", "", "prune: write the pruned model here")
  save_at = flags.DEFINE_float("save_at", 0.5, "prune: the share of heads removed in the saved model (at most)")
  flags.mark_flags_as_required(["workdir"])

  @cli
  def _main(argv):
    if len(argv) != 2:
      raise UserError(f"usage: python -m bertjax.compress.prune {{{','.join(COMMANDS)}}} --workdir=FT (got "
                      f"{' '.join(argv[1:]) or 'nothing'})")
    from bertjax.core import runtime

    runtime.setup()
    run_command(argv[1], workdir.value, out.value, seed.value, model_dir.value, step.value, save_dir.value,
                save_at.value)

  run(_main)


if __name__ == "__main__":
  main()
