"""Saved configs (a workdir's config.json) read against today's defaults: keys added since a run was saved take
their defaults, or, where the default changed what such a run ran under (PREDATED), the value it ran under."""

import ml_collections

from bertjax.core.config import defaults

PREDATED = {
    # 7e491a3 (optimizer.bias_correction): before it, adamw was optax's (bias-corrected) and lamb was ALBERT's
    # (uncorrected); today's default (True) would turn an old LAMB run into NVIDIA's.
    ("optimizer", "bias_correction"): lambda section: section.get("name", "adamw") != "lamb",
    # 7e491a3 (optimizer.decay_mask): before it, every optimizer left biases and LayerNorm undecayed.
    ("optimizer", "decay_mask"): lambda section: "bert",
    # model.dropout_rng: before it, every run drew its dropout masks with threefry (a resumed run keeps its masks).
    ("model", "dropout_rng"): lambda section: "threefry",
}


def predated(saved: dict) -> dict:
  """{(section, key): value} for each PREDATED key a saved config (a workdir's config.json) lacks: the value
  the run it holds ran under."""
  return {(section, key): value(saved[section]) for (section, key), value in PREDATED.items()
          if isinstance(saved.get(section), dict) and key not in saved[section]}


def from_saved(saved: dict) -> ml_collections.ConfigDict:
  """A saved config (a workdir's config.json) over today's defaults, so that a run saved before a key
  existed reads with that key's default, or, for a key whose default differs from what such a run ran under
  (PREDATED), with the value it ran under."""

  def merge(base: ml_collections.ConfigDict, values: dict):
    for key, value in values.items():
      if isinstance(value, dict) and isinstance(base.get(key), ml_collections.ConfigDict):
        merge(base[key], value)
      else:
        base[key] = value
    return base

  config = merge(defaults(), saved)
  for (section, key), value in predated(saved).items():
    config[section][key] = value
  return config
