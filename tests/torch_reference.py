"""The transformers (PyTorch) side of a parity check: a bertjax model exported to HF and trained with the
same masked batches, optimizer settings and schedule, written as transformers users write it.

Used by tests/test_parity.py, test_finetune_parity.py, test_optim.py and benchmarks/*_parity.py (which put
tests/ on their path); not part of the package. Needs the `test` extra (torch,
transformers). Nothing here imports bertjax's optimizer: the schedules are transcribed from their
sources, so a bertjax schedule that drifts from them shows up as a parity failure.
"""

import numpy as np
import torch
import transformers

# Learning-rate factor of step t (0-based), warmup w, total T, as the reference implementations write it.
SCHEDULES = {
    # google-research/bert and albert optimization.py: polynomial_decay(power 1) over T, warmup overriding.
    "linear": lambda t, w, T: t / w if t < w else 1 - t / T,
    # fairseq polynomial_decay (RoBERTa), transformers get_linear_schedule_with_warmup: decay over T - w.
    "linear_after_warmup": lambda t, w, T: t / w if t < w else (T - t) / (T - w),
    # google-research/electra model/optimization.py: the decay times min(1, t / w).
    "electra": lambda t, w, T: (1 - t / T) * min(1.0, t / w),
    # NVIDIA DeepLearningExamples BERT schedulers.py PolyWarmUpScheduler, degree 0.5 (their LAMB recipe).
    "poly_sqrt": lambda t, w, T: t / w if t < w else (1 - t / T) ** 0.5,
}
# HF classes of the pretraining network per bertjax family (ELECTRA: the discriminator; its generator is
# ElectraForMaskedLM).
PRETRAINING_CLASSES = {"bert": "BertForPreTraining", "roberta": "RobertaForMaskedLM",
                       "albert": "AlbertForPreTraining", "electra": "ElectraForPreTraining",
                       "modernbert": "ModernBertForMaskedLM", "mobilebert": "MobileBertForPreTraining"}


def reference_semantics(model, dropout: bool = False):
  """Removes two HF details that google-research's BERT/ALBERT/ELECTRA (and bertjax) do not have: dropout
  in ALBERT's SOP head (classifier_dropout_prob), and nn.Embedding's padding_idx, which keeps the [PAD]
  row from learning through lookups (ELECTRA's generator can sample [PAD] into a real position; the TF
  references train that row like any other). `dropout=False` also switches every other dropout off."""
  for name, m in model.named_modules():
    if isinstance(m, torch.nn.Dropout) and (not dropout or "sop_classifier" in name):
      m.p = 0.0
    if isinstance(m, torch.nn.Embedding):
      m.padding_idx = None
  return model.train()


def load_pretraining(family: str, dirs, dropout: bool = False, attn_implementation: str = "eager") -> dict:
  """The exported network(s) of `convert.write_hf` in transformers, name -> model ("" for one network;
  ELECTRA: "discriminator" and "generator", the generator taking the discriminator's embeddings as
  bertjax's ELECTRA and the paper share them)."""
  kw = dict(attn_implementation=attn_implementation)
  if family == "electra":
    disc = transformers.ElectraForPreTraining.from_pretrained(dirs[0], **kw)
    gen = transformers.ElectraForMaskedLM.from_pretrained(dirs[1], **kw)
    gen.electra.embeddings = disc.electra.embeddings
    gen.generator_lm_head.weight = disc.electra.embeddings.word_embeddings.weight
    return {"discriminator": reference_semantics(disc, dropout), "generator": reference_semantics(gen, dropout)}
  model = getattr(transformers, PRETRAINING_CLASSES[family]).from_pretrained(dirs[0], **kw)
  return {"": reference_semantics(model, dropout)}


def no_decay(name: str) -> bool:
  """transformers' usual exclusion from weight decay: biases and LayerNorm weights (ModernBERT's norms are
  `norm`, `attn_norm`, `mlp_norm`, `final_norm`)."""
  return name.endswith("bias") or name.endswith(("LayerNorm.weight", "layer_norm.weight", "norm.weight"))


class AdamWeightDecay(torch.optim.Optimizer):
  """google-research/bert optimization.py AdamWeightDecayOptimizer in torch: m / (sqrt(v) + eps) from moments
  without bias correction, plus weight_decay x w, times the rate (optimizer.bias_correction=False)."""

  def __init__(self, params, lr, betas, eps, weight_decay=0.0):
    super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay))

  @torch.no_grad()
  def step(self):
    for group in self.param_groups:
      b1, b2 = group["betas"]
      for p in group["params"]:
        if p.grad is None:
          continue
        state = self.state[p]
        if not state:
          state["m"], state["v"] = torch.zeros_like(p), torch.zeros_like(p)
        state["m"].mul_(b1).add_(p.grad, alpha=1 - b1)
        state["v"].mul_(b2).addcmul_(p.grad, p.grad, value=1 - b2)
        update = state["m"] / (state["v"].sqrt() + group["eps"]) + group["weight_decay"] * p
        p.sub_(group["lr"] * update)


def adamw(config, modules, lr_scale=None):
  """(optimizer, LambdaLR scheduler, parameters) for `modules` with the config's AdamW settings and
  schedule; clipping is the caller's (torch.nn.utils.clip_grad_norm_ before each step). `lr_scale`
  (parameter name -> factor) gives layer-wise rates. optimizer.bias_correction False: BERT's
  AdamWeightDecay above; decay_mask all: decay on every parameter."""
  named = dict(torch.nn.ModuleList(modules).named_parameters())  # shared and tied tensors once
  o = config.optimizer
  everything = o.get("decay_mask", "bert") == "all"
  groups = []
  for name, p in named.items():
    groups.append({"params": [p], "weight_decay": 0.0 if no_decay(name) and not everything else o.weight_decay,
                   "lr": config.learning_rate * (lr_scale(name) if lr_scale else 1.0)})
  kind = torch.optim.AdamW if o.get("bias_correction", True) else AdamWeightDecay
  opt = kind(groups, lr=config.learning_rate, betas=(o.b1, o.b2), eps=o.eps)
  factor = SCHEDULES[o.schedule]
  sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda t: factor(t, config.warmup_steps, config.total_steps))
  return opt, sched, list(named.values())


def set_linear(module: torch.nn.Linear, dense) -> None:
  """Copies a flax Dense's parameters ({"kernel": [in, out], "bias": [out]}, numpy or jax) into `module`."""
  with torch.no_grad():
    module.weight.copy_(torch.as_tensor(np.asarray(dense["kernel"]).T))
    module.bias.copy_(torch.as_tensor(np.asarray(dense["bias"])))


def copy_heads(model, params, names: dict) -> None:
  """A task head bertjax initialized, in the transformers `model` too: `names` maps each HF submodule name
  (`classifier`, `classifier.dense`, `qa_outputs`) to the bertjax Dense in `params` it takes."""
  for hf_name, ours in names.items():
    set_linear(model.get_submodule(hf_name), params[ours])


def long(x) -> torch.Tensor:
  return torch.tensor(np.asarray(x), dtype=torch.long)


def mlm_inputs(masked) -> dict:
  """HF keyword arguments of a bertjax masked batch: labels -100 except at the weighted masked slots."""
  b, s = masked["input_ids"].shape
  labels = np.full((b, s), -100, np.int64)
  rows, slots = np.nonzero(np.asarray(masked["mlm_weights"]) > 0)
  labels[rows, masked["mlm_positions"][rows, slots]] = masked["mlm_labels"][rows, slots]
  return dict(input_ids=long(masked["input_ids"]), attention_mask=long(np.asarray(masked["groups"]) > 0),
              token_type_ids=long(masked["type_ids"]), labels=long(labels))


def pretraining_loss(family: str, models: dict, masked, objectives: dict, corrupted=None):
  """The total pretraining loss on the torch side: the HF heads' losses weighted as bertjax's objectives
  (ELECTRA: generator MLM + rtd weight x discriminator BCE on `corrupted`, bertjax's generator samples)."""
  kw = mlm_inputs(masked)
  if family == "electra":
    generator = models["generator"](**kw).loss
    labels = long(np.asarray(corrupted) != np.asarray(masked["original_ids"]))
    disc = models["discriminator"](**dict(kw, input_ids=long(corrupted), labels=labels)).loss
    return objectives["mlm"] * generator + objectives["rtd"] * disc
  if any(w != 1.0 for w in objectives.values()):
    raise ValueError(f"HF's {family} loss adds its heads' losses with weight 1; objectives are {objectives}")
  sentence = long(masked["sentence_label"])
  extra = {"bert": {"next_sentence_label": sentence}, "albert": {"sentence_order_label": sentence},
           "mobilebert": {"next_sentence_label": sentence}}.get(family, {})
  return models[""](**kw, **extra).loss


def train_step(loss, opt, sched, params, clip_norm: float):
  """backward, clip by global norm, step, schedule step, zero grads; returns the loss as a float."""
  loss.backward()
  if clip_norm:
    torch.nn.utils.clip_grad_norm_(params, clip_norm)
  opt.step()
  sched.step()
  opt.zero_grad()
  return float(loss.detach())
