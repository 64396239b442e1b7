"""Pretraining objectives by name: a config lists `objectives = {name: weight}` and the loss is the sum.

Each objective module has `loss(outputs, batch) -> (loss_sum, metrics)` (float32 sum over its targets;
metrics a flat dict of bertjax.core.metrics types, computed only when reported) and `count(batch)`, the number of
its targets, known before the forward pass. Dividing each sum by the count of the *whole* batch makes a
step with gradient accumulation exactly the large-batch step. Adding one is a module plus a line here.
"""

from bertjax.core.config import active_objectives, check
from bertjax.core.metrics import Mean
from bertjax.objectives import distill, mlm, plm, rtd, sbo, sentence, transfer, wklm, wso

REGISTRY = {
    "mlm": mlm,
    "nsp": sentence.nsp,
    "sop": sentence.sop,
    "rtd": rtd,
    "sbo": sbo,
    "wso": wso,
    "sso": sentence.sso,
    "wklm": wklm,  # WKLM's entity replacement (configs/wklm.py)
    "plm": plm,  # XLNet's permutation LM (configs/xlnet.py), alone: it reads a token stream (bertjax.data.plm)
    # Against a frozen teacher (configs/distill.py; the model is then a bertjax.model.distill.Distiller).
    "distill_ce": distill.ce,
    "distill_ce_masked": distill.ce_masked,
    "distill_cos": distill.cos,
    "distill_embedding": distill.embedding,
    "distill_hidden": distill.hidden,
    "distill_attention": distill.attention,
    # MobileBERT's progressive knowledge transfer (configs/mobilebert.py:transfer; bertjax.model.transfer.Transfer).
    "transfer_hidden": transfer.hidden,
    "transfer_attention": transfer.attention,
    "transfer_mean": transfer.mean,
    "transfer_variance": transfer.variance,
}
SENTENCE_OBJECTIVES = ("nsp", "sop", "sso")  # each trains on its own pairs (data.instances' format of its name)
SENTENCE_CLASSES = {"nsp": 2, "sop": 2, "sso": 3}


def counts(objectives: dict, batch) -> dict:
  """Targets per objective in `batch` (the normalizers of the losses)."""
  return {name: REGISTRY[name].count(batch) for name in objectives}


def total_loss(objectives: dict, outputs, batch, denominators=None):
  """Weighted sum of the objectives' mean losses (sums over `denominators`, default: this batch's
  counts), and all their metrics (plus `loss`)."""
  import jax.numpy as jnp

  denominators = counts(objectives, batch) if denominators is None else denominators
  total, metrics = 0.0, {}
  for name, weight in objectives.items():
    loss_sum, m = REGISTRY[name].loss(outputs, batch)
    total = total + weight * loss_sum / jnp.maximum(denominators[name], 1e-8)
    metrics.update(m)
  metrics["loss"] = Mean(total, 1.0)
  return total, metrics


def validate(config):
  """Checks config.objectives: known names, at least MLM, the pairings some objectives need (rtd and a
  generator, sentence pairs and segment types, sbo/wso and an MLM head, wklm and its mentions, plm alone), and
  distillation's MLM-only student;
  raises UserError with the fix on the first problem."""
  m = config.model
  unknown = set(config.objectives) - set(REGISTRY)
  check(not unknown, f"unknown objectives {sorted(unknown)}; use {', '.join(REGISTRY)}")
  objectives = active_objectives(config)
  # MobileBERT's transfer (a `transfer` section) also trains NSP against ground truth, and its first stage no MLM.
  allowed = ("mlm", "nsp") if config.get("transfer") else ("mlm",)
  others = sorted(o for o in objectives if o not in allowed and not o.startswith(("distill_", "transfer_")))
  check(not config.get("teacher") or not others,
        f"distillation trains an MLM student: set the {', '.join(others)} weight{'s' if len(others) > 1 else ''} to 0")
  check(bool(objectives), "no objective has a nonzero weight; set e.g. --config.objectives.mlm=1")
  if "plm" in objectives:  # XLNet: no MLM, no NSP (the paper's §2.5); its rows are windows of a stream
    others = sorted(set(objectives) - {"plm"})
    check(not others, f"the plm objective trains alone (XLNet has no MLM or sentence objective); set the "
                      f"{', '.join(others)} weight{'s' if len(others) > 1 else ''} to 0")
    return
  check("mlm" in objectives or any(o.startswith("transfer_") for o in objectives),
        "every setup here trains an MLM head (ELECTRA's generator included); set --config.objectives.mlm")
  check(not any(o.startswith("transfer_") for o in objectives) or config.get("teacher"),
        "the transfer_* objectives need a teacher: set --config.teacher (python -m bertjax.distill)")
  check(("rtd" in objectives) == (m.generator_fraction > 0),
        "the rtd objective needs a generator and a generator needs rtd: set both "
        "--config.objectives.rtd and --config.model.generator_fraction, or neither")
  check(m.type_vocab_size >= 2 or not ({"nsp", "sop", "sso"} & set(objectives)),
        "NSP/SOP/SSO pairs need model.type_vocab_size >= 2")
  check("wklm" not in objectives or config.data.get("units", ""),
        "the wklm objective scores the mentions of data.units; set --config.data.units=conll:PATH or jsonl:PATH")
  check("wklm" not in objectives or "rtd" not in objectives,
        "the wklm objective reads the main encoder, which ELECTRA's corruption replaces; switch off one of them")
  check("wklm" not in objectives or 0 < config.wklm.replace_prob < 1,
        f"wklm.replace_prob={config.wklm.replace_prob} must be in (0, 1)")
  for name in ("sbo", "wso"):
    check(name not in objectives or "rtd" not in objectives,
          f"the {name} objective decodes through the MLM head on the main encoder, which ELECTRA's discriminator "
          f"lacks; switch off --config.objectives.{name} or --config.objectives.rtd")
