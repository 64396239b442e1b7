"""Registries of the encoder's parts: attention, position, norm, feed-forward and layer kinds, looked up by config string.

A kind is an object of a small class that registers itself when its module is imported
(`@kinds.register("ffn", "geglu")`); the encoder, the FLOP counter, `summary`, the transformers converters and
the config checks ask the kind, and never test its name. Which config key selects a family's kind:

| family      | EncoderConfig / model key | built-in kinds (module)                         |
|-------------|---------------------------|-------------------------------------------------|
| `attention` | `attention_kind`          | `mha` (bertjax.model.mha), `lsra` (.lsra), `constituent` (.constituent), `complex_order` (.complex_order), `local` (.chunked), `lsh` (.lsh), `per_layer` (.per_layer), `tree` (.tree_attention) |
| `position`  | `position`                | `learned`, `rope` (bertjax.model.positions), `complex_order` (.complex_order), `axial` (.axial) |
| `norm`      | `norm`                    | `post`, `pre` (bertjax.model.norms), `nonorm` (.nonorm), `reversible` (.reformer) |
| `ffn`       | `ffn`                     | `mlp`, `geglu` (bertjax.model.ffn)              |
| `layer`     | `layer`                   | `bert`, `mobilebert`, `reformer` (bertjax.model.layer_kinds), `xlnet` (.xlnet_models) |

What a kind of each family answers is written in its base class below; docs/layout.md shows how to add one
(and tests/test_kinds.py registers a toy kind from outside the package and trains it).
"""

from bertjax.core.errors import UserError

KEYS = {"attention": "attention_kind", "position": "position", "norm": "norm", "ffn": "ffn", "layer": "layer"}
_REGISTRY: dict[str, dict[str, object]] = {family: {} for family in KEYS}


class Kind:
  """What every kind answers. `hf_family`: the transformers family whose models hold this kind (the export
  picks it; None: any family the rest of the model allows, `""`: none, so the model has no export)."""

  name = ""
  hf_family: str | None = None

  def check(self, m) -> None:
    """Checks the model section's values this kind reads; raises UserError with the fix."""

  def check_run(self, config) -> None:
    """Checks what this kind demands of the rest of the run config (axial positions: the training lengths and
    the data format); raises UserError with the fix. Default: nothing."""

  def family(self, m) -> str | None:
    """The transformers family of this kind for the model section `m`: `hf_family` (a kind made of other kinds,
    bertjax.model.per_layer, answers theirs)."""
    return self.hf_family


def register(family: str, name: str):
  """Class decorator: registers an instance of the class as `name` among the kinds of `family`."""
  if family not in KEYS:
    raise ValueError(f"no kind family {family!r}; families: {', '.join(KEYS)}")

  def add(cls):
    kind = cls()
    kind.name = name
    _REGISTRY[family][name] = kind
    return cls

  return add


def names(family: str) -> tuple[str, ...]:
  """The registered kinds of a family, in registration order."""
  return tuple(_REGISTRY[family])


def get(family: str, name: str):
  """The kind `name` of `family`, or a one-line UserError naming the config key and the kinds there are."""
  kind = _REGISTRY[family].get(name)
  if kind is None:
    raise UserError(f"model.{KEYS[family]}={name!r} is not a registered {family} kind; use one of "
                    f"{', '.join(names(family))}")
  return kind


def of(cfg, family: str):
  """The kind of `family` that an EncoderConfig (or a model config section) selects."""
  return get(family, getattr(cfg, KEYS[family]))


def chosen(cfg) -> dict:
  """{family: kind} of every family, as an EncoderConfig or a model config section selects them."""
  return {family: of(cfg, family) for family in KEYS}


def check(m) -> None:
  """Checks that every family's key names a registered kind, then each kind's own checks (model section)."""
  for kind in chosen(m).values():
    kind.check(m)


def check_run(config) -> None:
  """Each chosen kind's demands on the whole run config (Kind.check_run)."""
  for kind in chosen(config.model).values():
    kind.check_run(config)


def hf_family(m) -> str | None:
  """The transformers family the chosen kinds demand (None: they leave it to the rest of the model); a model
  whose kinds have no transformers family, or two different ones, gets a one-line UserError."""
  wanted = {k.family(m): f"model.{KEYS[f]}={k.name}" for f, k in chosen(m).items() if k.family(m) is not None}
  if "" in wanted:
    raise UserError(f"{wanted['']} has no transformers equivalent, so this model has no HF export")
  if len(wanted) > 1:
    raise UserError(f"{' and '.join(wanted.values())} belong to different transformers families "
                    f"({', '.join(wanted)}); this model has no HF export")
  return next(iter(wanted), None)

