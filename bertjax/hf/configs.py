"""HF config.json <-> bertjax run config, per family (bert, roberta, albert, electra, distilbert; modernbert in
hf.modernbert, mobilebert in hf.mobilebert, reformer in hf.reformer)."""

from bertjax.core import config as config_lib
from bertjax.core.errors import UserError
from bertjax.hf import mobilebert, modernbert, reformer
from bertjax.model import config as model_config, kinds

FAMILIES = ("bert", "roberta", "albert", "electra", "modernbert", "distilbert", "mobilebert", "xlnet", "reformer")
# HF hidden_act -> bertjax model.activation (gelu_pytorch_tanh is the same tanh approximation).
ACTIVATIONS = {"gelu": "gelu", "gelu_new": "gelu_new", "gelu_pytorch_tanh": "gelu_new", "gelu_fast": "gelu_new"}
HF_ACTIVATION = {"gelu": "gelu", "gelu_new": "gelu_new"}
# hidden_act when a config.json leaves it out: the transformers config class's default (AlbertConfig's is
# gelu_new, ALBERT's tanh approximation; the others' gelu).
DEFAULT_HF_ACTIVATION = {"albert": "gelu_new"}
DEFAULT_GENERATOR_FRACTION = 0.25  # an ELECTRA discriminator imported without its generator gets a fresh one


def family_of(hf: dict) -> str:
  """The family of an HF config (its model_type), or a UserError naming the ones bertjax reads."""
  family = hf.get("model_type", "")
  if family in ("xlm-roberta", "camembert"):
    family = "roberta"
  if family not in FAMILIES:
    raise UserError(f"config.json has model_type {family!r}; bertjax imports {', '.join(FAMILIES)}")
  return family


def model_section(hf: dict, family: str) -> dict:
  """bertjax `model` keys of an HF config (one network: for ELECTRA, the one this config.json describes)."""
  if family == "modernbert":
    return modernbert.model_section(hf)
  if family == "mobilebert":
    return mobilebert.model_section(hf)
  if family == "reformer":
    return reformer.model_section(hf)
  if family == "distilbert":
    return distilbert_model_section(hf)
  act = hf.get("hidden_act", DEFAULT_HF_ACTIVATION.get(family, "gelu"))
  if act not in ACTIVATIONS:
    raise UserError(f"config.json has hidden_act {act!r}; bertjax supports {', '.join(ACTIVATIONS)}")
  if hf.get("position_embedding_type", "absolute") != "absolute":
    raise UserError(f"config.json has position_embedding_type {hf['position_embedding_type']!r}; bertjax "
                    "only has absolute positions")
  hidden = hf["hidden_size"]
  embedding = hf.get("embedding_size", hidden)
  m = dict(
      vocab_size=hf["vocab_size"], hidden_size=hidden, num_layers=hf["num_hidden_layers"],
      num_heads=hf["num_attention_heads"], intermediate_size=hf["intermediate_size"],
      embedding_size=0 if embedding == hidden and family != "albert" else embedding,
      max_positions=hf.get("max_position_embeddings", 512), type_vocab_size=hf.get("type_vocab_size", 2),
      dropout=hf.get("hidden_dropout_prob", 0.1), attention_dropout=hf.get("attention_probs_dropout_prob", 0.1),
      layer_norm_eps=hf.get("layer_norm_eps", 1e-12), init_std=hf.get("initializer_range", 0.02),
      activation=ACTIVATIONS[act],
      # HF RoBERTa numbers positions from padding_idx + 1 (pad_token_id is its padding_idx).
      position_offset=hf.get("pad_token_id", 1) + 1 if family == "roberta" else 0,
  )
  if family == "albert":
    if hf.get("inner_group_num", 1) != 1:
      raise UserError(f"config.json has inner_group_num {hf['inner_group_num']}; bertjax's ALBERT has one layer "
                      "per group (inner_group_num 1, as every released ALBERT)")
    m.update(sharing="all", num_hidden_groups=hf.get("num_hidden_groups", 1))
  return m


def distilbert_model_section(hf: dict) -> dict:
  """bertjax `model` keys of a DistilBertConfig: BERT's layer with DistilBERT's names, no segment embeddings,
  LayerNorm eps 1e-12 (hard-coded in modeling_distilbert.py), learned positions."""
  if hf.get("sinusoidal_pos_embds", False):
    raise UserError("config.json has sinusoidal_pos_embds true (a fixed, untrained position table); bertjax's "
                    "DistilBERT has a learned one: import a checkpoint with sinusoidal_pos_embds false")
  act = hf.get("activation", "gelu")
  if act != "gelu":
    raise UserError(f"config.json has activation {act!r}; bertjax's DistilBERT supports gelu")
  return dict(
      vocab_size=hf.get("vocab_size", 30522), hidden_size=hf.get("dim", 768), num_layers=hf.get("n_layers", 6),
      num_heads=hf.get("n_heads", 12), intermediate_size=hf.get("hidden_dim", 3072), embedding_size=0,
      max_positions=hf.get("max_position_embeddings", 512), type_vocab_size=0, dropout=hf.get("dropout", 0.1),
      attention_dropout=hf.get("attention_dropout", 0.1), layer_norm_eps=1e-12,
      init_std=hf.get("initializer_range", 0.02), activation="gelu", position_offset=0)


def from_hf(hf: dict, family: str, heads: set, generator: dict | None = None):
  """A full bertjax config for an imported checkpoint.

  Args:
    hf: the checkpoint's config.json.
    family: its family.
    heads: the pretraining heads present in the weights: "mlm", "sentence", "rtd".
    generator: for an ELECTRA discriminator, the generator's config.json (None: a fresh generator of
      DEFAULT_GENERATOR_FRACTION; its weights will be freshly initialized).
  """
  c = config_lib.defaults()
  c.model.update(model_section(hf, family))
  c.seq_len = min(128, c.model.max_positions - c.model.position_offset)
  c.objectives = dict(mlm=1.0, nsp=0.0, sop=0.0, rtd=0.0)
  if "sentence" in heads:
    c.objectives["sop" if family == "albert" else "nsp"] = 1.0
  if "rtd" in heads:
    c.objectives.rtd = 50.0
    c.masking.mask_token_prob, c.masking.random_token_prob = 0.85, 0.0
    fraction = DEFAULT_GENERATOR_FRACTION
    if generator is not None:
      fraction = generator["hidden_size"] / hf["hidden_size"]
      g = model_config.encoder_config(_with(c.model, fraction), generator=True)
      want = (generator["hidden_size"], generator["num_attention_heads"], generator["intermediate_size"],
              generator["num_hidden_layers"], generator.get("embedding_size", generator["hidden_size"]))
      have = (g.hidden_size, g.num_heads, g.intermediate_size, g.num_layers, g.embedding_size)
      if want != have:
        raise UserError(f"the generator (hidden, heads, ffn, layers, embedding) {want} is not the discriminator's "
                        f"scaled by {fraction:g} {have}; bertjax ties them that way: import the networks separately")
    c.model.generator_fraction = fraction
  if family == "roberta":
    c.optimizer.b2 = 0.98
  if family == "albert":
    c.optimizer.name = "lamb"
  if family == "modernbert":  # configs/modernbert.py's data and masking (packed rows restart RoPE positions)
    c.data.format, c.masking.mask_prob = "packed", 0.30
  if family == "reformer":  # configs/reformer.py's: axial positions train at exactly d1 x d2, unpacked
    c.data.format = "single"
    if c.model.position == "axial":
      c.seq_len = c.model.axial_pos_shape[0] * c.model.axial_pos_shape[1]
  return c


def _with(model, fraction):
  """A copy of the model section with another generator fraction."""
  m = model.copy_and_resolve_references()
  m.generator_fraction = fraction
  return m


def family_for(config) -> str:
  """The HF family a bertjax config exports to: ELECTRA with a generator, RoBERTa with shifted
  positions, ALBERT with sharing or factorized embeddings, else BERT."""
  m, objectives = config.model, config_lib.active_objectives(config)
  if "rtd" in objectives:
    return "electra"
  wanted = kinds.hf_family(m)  # the family the encoder's kinds demand (rope, pre-norm, GeGLU: ModernBERT)
  if wanted:
    return wanted
  if m.type_vocab_size == 0:  # no segment embeddings: DistilBERT's shape
    return "distilbert"
  if m.position_offset:
    return "roberta"
  if m.sharing != "none" or (m.embedding_size and m.embedding_size != m.hidden_size):
    return "albert"
  return "bert"


def family_if_any(config) -> str:
  """`family_for`, or "" for a model of a kind no transformers family holds (tree or constituent attention, LSRA):
  what a task asks to pick a family's own head or path, where such a model takes BERT's."""
  return "" if any(k.hf_family == "" for k in kinds.chosen(config.model).values()) else family_for(config)


def to_hf(config, family: str, architecture: str, special, generator: bool = False) -> dict:
  """config.json of one exported network (for ELECTRA, the discriminator or, with `generator`, the generator)."""
  m = config.model
  enc = model_config.encoder_config(m, generator=generator)
  if family == "modernbert":
    return modernbert.to_hf(config, enc, architecture, special)
  if family == "mobilebert":
    return mobilebert.to_hf(config, enc, architecture, special)
  if family == "reformer":
    return reformer.to_hf(enc, special.pad)
  if enc.activation not in HF_ACTIVATION:
    raise UserError(f"model.activation={enc.activation!r} has no HF name")
  if m.sharing in ("attention", "ffn"):
    raise UserError(f"model.sharing={m.sharing!r} has no HF equivalent (HF ALBERT shares whole layers); "
                    "export needs sharing all or none")
  if m.head_size and m.head_size * m.num_heads != m.hidden_size:
    raise UserError(f"a head-pruned model (model.head_size={m.head_size} x {m.num_heads} heads != hidden "
                    f"{m.hidden_size}) has no HF config; export the model before pruning")
  if family == "distilbert":
    if enc.layer_norm_eps != 1e-12 or enc.activation != "gelu" or enc.embedding_size != enc.hidden_size:
      raise UserError("DistilBERT has LayerNorm eps 1e-12, exact GELU and no factorized embeddings; this model "
                      "differs, so it has no DistilBertForMaskedLM export")
    return dict(architectures=[architecture], model_type="distilbert", vocab_size=enc.vocab_size, dim=enc.hidden_size,
                n_layers=enc.num_layers, n_heads=enc.num_heads, hidden_dim=enc.intermediate_size,
                activation="gelu", dropout=enc.dropout, attention_dropout=enc.attention_dropout,
                max_position_embeddings=enc.max_positions, initializer_range=enc.init_std, pad_token_id=special.pad,
                sinusoidal_pos_embds=False, tie_weights_=True, torch_dtype="float32")
  hf = dict(
      architectures=[architecture], model_type=family, vocab_size=enc.vocab_size, hidden_size=enc.hidden_size,
      num_hidden_layers=enc.num_layers, num_attention_heads=enc.num_heads, intermediate_size=enc.intermediate_size,
      hidden_act=HF_ACTIVATION[enc.activation], hidden_dropout_prob=enc.dropout,
      attention_probs_dropout_prob=enc.attention_dropout, max_position_embeddings=enc.max_positions,
      type_vocab_size=enc.type_vocab_size, initializer_range=enc.init_std, layer_norm_eps=enc.layer_norm_eps,
      pad_token_id=special.pad, position_embedding_type="absolute", torch_dtype="float32",
  )
  if family in ("albert", "electra"):
    hf["embedding_size"] = enc.embedding_size
  if family == "albert":
    hf.update(num_hidden_groups=enc.num_groups if m.sharing == "all" else enc.num_layers, inner_group_num=1,
              classifier_dropout_prob=0.1, bos_token_id=special.cls, eos_token_id=special.sep)
  if family == "roberta":
    hf.update(bos_token_id=special.cls, eos_token_id=special.sep)
  return hf
