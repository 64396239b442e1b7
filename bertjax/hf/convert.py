"""HF checkpoint directory <-> (bertjax config, Pretrainer params), and bertjax workdirs in and out.

Import reads config.json, the weights and the tokenizer of an HF directory into a bertjax config and the
parameter tree of bertjax's own `Pretrainer` (layers stacked for the scan); heads the checkpoint lacks are
freshly initialized and listed. Export writes HF's layout back (config.json, model.safetensors, tokenizer
files), one directory per network for ELECTRA (`discriminator/`, `generator/`), so `transformers` loads it.
"""

import dataclasses
import json
import os
import shutil
import zlib

import jax
import ml_collections
import numpy as np

from bertjax.core import config as config_lib
from bertjax.core.errors import UserError
from bertjax.data.tokenizer import SentencePieceTokenizer, SpecialIds, Tokenizer, WordPieceTokenizer
from bertjax.hf import configs, mobilebert as MOB, modernbert as MB, reformer as RF, safetensors_io, tokenizers as hf_tokenizers, weights as W
from bertjax.hf import xlnet as XL
from bertjax.model import config as model_config
from bertjax.train import build

# HF tensors that are copies of others (tied decoders) or buffers: never "unused".
_TIED = ("decoder.weight", "decoder.bias", "generator_lm_head.weight", "position_ids", "token_type_ids")


@dataclasses.dataclass
class Imported:
  """An imported checkpoint: bertjax config and Pretrainer params (numpy), its tokenizer, and notes."""

  config: ml_collections.ConfigDict
  params: dict
  tokenizer: Tokenizer | None
  family: str
  fresh: list  # bertjax parameter paths the checkpoint did not have (freshly initialized)
  unused: list  # HF tensors that went nowhere
  pooler: dict | None = None  # a pooler without a sentence classifier (BertModel): kept for fine-tuning
  kind: str = ""  # XLNet: which model the checkpoint holds (bertjax.hf.xlnet: lm, base, classifier, span)
  task_params: dict | None = None  # XLNet: the params of that model, its head included


def _read_json(path: str, what: str) -> dict:
  if not os.path.isfile(path):
    raise UserError(f"no {what} at {path}; point --hf_dir at an HF checkpoint directory")
  with open(path) as f:
    return json.load(f)


def _prefix(family: str, tensors: dict) -> str:
  """"bert." etc. when the weights come from a model with heads, "" for a bare BertModel."""
  p = W.PREFIX[family]
  return p if any(k.startswith(p) for k in tensors) else ""


def _modern_names(tensors: dict) -> dict:
  """Old TF-converted checkpoints name LayerNorm parameters gamma/beta; transformers renames them on load."""
  rename = lambda k: k[:-6] + ".weight" if k.endswith(".gamma") else k[:-5] + ".bias" if k.endswith(".beta") else k
  return {rename(k): v for k, v in tensors.items()}


def _heads(family: str, tensors: dict) -> set:
  heads = set()
  if W.MLM_BIAS[family] in tensors:
    heads.add("mlm")
  if family in W.SENTENCE_CLASSIFIER and W.SENTENCE_CLASSIFIER[family] + ".weight" in tensors:
    heads.add("sentence")
  if family == "electra" and "mlm" not in heads:
    heads.add("rtd")  # ElectraForPreTraining, or a bare ElectraModel (its discriminator body)
  return heads


def _body(family: str, config, prefix: str, scope: str = "encoder", generator: bool = False) -> list:
  """Entries of the embeddings-to-last-layer body of one network."""
  enc = model_config.encoder_config(config.model, generator=generator)
  if family == "albert":
    shared = config.model.sharing == "all"
    return W.albert_encoder(prefix, enc.num_groups if shared else enc.num_layers, shared)
  return W.encoder(prefix, enc.num_layers, scope, projection=enc.embedding_size != enc.hidden_size)


def distilbert_entries(prefix: str, num_layers: int) -> list:
  """DistilBERT's embeddings (no segment table) and layers (`transformer.layer.{i}`)."""
  return [e for e in W.embeddings(prefix) if e.path != "embeddings/type"] + W.distilbert_encoder(prefix, num_layers)


def fresh_leaf(path: str, shape, std: float, seed: int) -> np.ndarray:
  """A new value for the parameter at `path`, as bertjax's initializers make it (LayerNorm scale 1, biases
  0, the rest truncated normal), without compiling the model's init; seeded by (seed, path)."""
  name = path.rsplit("/", 1)[-1]
  rng = jax.random.fold_in(jax.random.key(seed), zlib.crc32(path.encode()))
  if name in ("scale", "bias"):
    return np.full(shape, 1.0 if name == "scale" else 0.0, np.float32)
  # flax's truncated_normal: cut at 2 standard deviations, rescaled so the std is `std`.
  return np.asarray(jax.random.truncated_normal(rng, -2.0, 2.0, shape) * (std / 0.87962566103423978), np.float32)


def init_params(config, seed: int = 0) -> dict:
  """A fresh random Pretrainer params tree (numpy) for the config, leaf by leaf (see fresh_leaf)."""
  shapes = build.param_shapes(config)
  leaf = lambda p, s: fresh_leaf("/".join(k.key for k in p), s.shape, config.model.init_std, seed)
  return jax.tree_util.tree_map_with_path(leaf, shapes)


def _paths(tree, prefix=""):
  for k, v in tree.items():
    if isinstance(v, dict):
      yield from _paths(v, f"{prefix}{k}/")
    else:
      yield f"{prefix}{k}"


def _albert_identity(tensors, prefix, hidden):
  """ALBERT with E == H still has an E->H mapping, which bertjax (no projection when E == H) can only
  take when it is the identity."""
  name = prefix + "encoder.embedding_hidden_mapping_in"
  w, b = tensors.get(name + ".weight"), tensors.get(name + ".bias")
  if w is not None and not (np.allclose(w, np.eye(hidden), atol=1e-6) and np.allclose(b, 0, atol=1e-6)):
    raise UserError("this ALBERT checkpoint has embedding_size == hidden_size with a non-identity "
                    "embedding_hidden_mapping_in, which bertjax cannot represent")


def read_hf(hf_dir: str, generator_dir: str = "", seed: int = 0) -> Imported:
  """Imports an HF checkpoint directory (config.json, model.safetensors or pytorch_model.bin, tokenizer).

  Args:
    hf_dir: the checkpoint. ELECTRA: a discriminator (ElectraForPreTraining) becomes a bertjax ELECTRA model
      whose generator comes from `generator_dir` or is fresh; a generator alone (ElectraForMaskedLM)
      becomes a plain bertjax MLM model.
    generator_dir: ELECTRA only: the generator checkpoint that goes with the discriminator.
    seed: seeds the initialization of what the checkpoint lacks.
  """
  hf = _read_json(os.path.join(hf_dir, "config.json"), "config.json")
  family = configs.family_of(hf)
  if family == "xlnet":
    return read_xlnet(hf_dir, hf, seed)
  tensors = _modern_names(safetensors_io.read_dir(hf_dir))
  if family == "modernbert":
    tensors = MB.split_qkv(tensors)
  prefix, heads = _prefix(family, tensors), _heads(family, tensors)
  gen_hf = gen_tensors = None
  if generator_dir:
    if family != "electra" or "rtd" not in heads:
      raise UserError("--generator_dir goes with an ELECTRA discriminator in --hf_dir")
    gen_hf = _read_json(os.path.join(generator_dir, "config.json"), "generator config.json")
    gen_tensors = _modern_names(safetensors_io.read_dir(generator_dir))
  config = configs.from_hf(hf, family, heads, gen_hf)
  config.seed = seed
  shapes = build.param_shapes(config)
  enc = model_config.encoder_config(config.model)
  if family == "albert" and enc.embedding_size == enc.hidden_size:
    _albert_identity(tensors, prefix, enc.hidden_size)
  if family == "reformer":  # its own weight map, both ways (bertjax.hf.reformer)
    params = RF.params_from_hf(tensors, enc)
    unused = sorted(set(tensors) - set(RF.params_to_hf(params, enc)))
    return Imported(config, params, _tokenizer(hf_dir, config), family, [], unused, None)
  if family == "modernbert":
    entries = MB.body(prefix, enc.num_layers, enc.use_bias) + (MB.mlm_head(enc.use_bias) if "mlm" in heads else [])
  elif family == "distilbert":  # no segment embeddings; layers under transformer.layer.{i}
    entries = distilbert_entries(prefix, enc.num_layers)
  elif family == "mobilebert":  # bottleneck layers, stacked FFNs, its own heads (bertjax.hf.mobilebert)
    entries = MOB.body(prefix, enc) + MOB.heads(enc, prefix, "mlm" in heads, "sentence" in heads)
  else:
    entries = W.embeddings(prefix) + [e for e in _body(family, config, prefix)
                                      if not (e.path.startswith("encoder/embedding_projection")
                                              and enc.embedding_size == enc.hidden_size)]
  if "mlm" in heads and family not in ("modernbert", "mobilebert"):
    entries += W.mlm_head(family)
  if "sentence" in heads and family != "mobilebert":
    entries += W.sentence_head(family, prefix)
  if "rtd" in heads:
    entries += W.rtd_head()
  params, missing = W.import_tensors(entries, tensors, shapes)
  used = {n for e in entries for n in e.hf}
  if gen_tensors is not None:
    gp = _prefix(family, gen_tensors)
    gen_entries = _body(family, config, gp, scope="generator_encoder", generator=True) + W.mlm_head("electra", "generator_mlm")
    gen_params, gen_missing = W.import_tensors(gen_entries, gen_tensors, shapes)
    params.update(gen_params)
    missing += gen_missing
    emb = gen_tensors.get(gp + "embeddings.word_embeddings.weight")
    if emb is not None and not np.allclose(emb, params["embeddings"]["word"], atol=1e-5):
      raise UserError("the generator's embeddings differ from the discriminator's; bertjax's ELECTRA shares "
                      "one table, so import the networks separately")
  essential = [n for n in missing if "embeddings." in n or ".layer." in n or "albert_layer" in n
               or (family == "modernbert" and not n.startswith(("head.", "decoder.")))]
  if essential:
    raise UserError(f"{hf_dir} lacks {len(essential)} encoder tensors (e.g. {essential[0]}); is it a {family} "
                    "checkpoint matching its config.json?")
  pooler = None
  pooler_name = prefix + ("pooler" if family == "albert" else "pooler.dense")
  if family == "modernbert" and "mlm" not in heads and "head.dense.weight" in tensors:
    # ModernBertForSequenceClassification's head (dense, act, norm): fine-tuning starts its pooler from it.
    head = [e for e in MB.classifier_head(enc.use_bias) if e.path.startswith("pooler/")]
    h = enc.hidden_size
    target = {"pooler": {"dense": {"kernel": np.zeros((h, h)), "bias": np.zeros(h)},
                         "ln": {"scale": np.zeros(h), "bias": np.zeros(h)}}}
    pooler = W.import_tensors(head, tensors, target)[0]["pooler"]
    used |= {n for e in head for n in e.hf}
  elif "sentence" not in heads and pooler_name + ".weight" in tensors:
    target = {"pooler": {"kernel": np.zeros((enc.hidden_size,) * 2), "bias": np.zeros(enc.hidden_size)}}
    pooler = W.import_tensors(W.entries_of("pooler", pooler_name), tensors, target)[0]["pooler"]
    used |= {pooler_name + ".weight", pooler_name + ".bias"}
  fresh = [path for path in _paths(shapes) if not W.has(params, path)]
  for path in fresh:
    W.put(params, path, fresh_leaf(path, W.get(shapes, path).shape, config.model.init_std, seed))
  # (a fused Wqkv is used through its q, k, v thirds, the "NAME:q" names of MB.split_qkv)
  unused = sorted(n for n in tensors if n not in used and not n.endswith(_TIED) and ":" not in n
                  and n + ":q" not in used)
  return Imported(config, params, _tokenizer(hf_dir, config), family, fresh, unused, pooler)


def _tokenizer(hf_dir: str, config):
  """The checkpoint's tokenizer (None without one); one with more ids than the model is a UserError."""
  if not hf_tokenizers.has_tokenizer(hf_dir):
    return None
  tok = hf_tokenizers.from_dir(hf_dir)
  if tok.vocab_size > config.model.vocab_size:
    raise UserError(f"the tokenizer has {tok.vocab_size} ids but the model only {config.model.vocab_size}")
  return tok


def read_xlnet(hf_dir: str, hf: dict, seed: int = 0) -> Imported:
  """An XLNet checkpoint (XLNetLMHeadModel, XLNetModel, XLNetForSequenceClassification,
  XLNetForQuestionAnsweringSimple): `params` are the pretraining model's (XLNetLMHeadModel: a bias of zeros when
  the checkpoint has no LM head), `task_params` the checkpoint's own model's (bertjax.hf.xlnet.model_for)."""
  config, kind, params, _, unused = XL.read(hf, safetensors_io.read_dir(hf_dir))
  config.seed = seed
  fresh = [] if kind == "lm" else ["lm_loss/bias"]
  return Imported(config, XL.lm_params(params, config.model.vocab_size), _tokenizer(hf_dir, config), "xlnet", fresh,
                  unused, kind=kind, task_params=params)


def write_xlnet(config, params, out_dir: str, kind: str = "lm", tokenizer: Tokenizer | None = None,
                special: SpecialIds | None = None) -> str:
  """Writes an XLNet `kind` (lm, base, classifier, span; params of bertjax.hf.xlnet.model_for's model) as an HF
  directory that transformers loads; returns it."""
  special = special or (tokenizer.special if tokenizer else None)
  hf, tensors = XL.export(config, jax.tree.map(np.asarray, params), kind, special)
  return write_dir(out_dir, hf, tensors, tokenizer)


# ---------------------------------------------------------------- export


ARCHITECTURES = {  # (family, has sentence head) -> HF class of the exported network
    ("bert", False): "BertForMaskedLM", ("bert", True): "BertForPreTraining",
    ("roberta", False): "RobertaForMaskedLM",
    ("albert", False): "AlbertForMaskedLM", ("albert", True): "AlbertForPreTraining",
    ("distilbert", False): "DistilBertForMaskedLM",
    ("modernbert", False): "ModernBertForMaskedLM",  # its base model loads as ModernBertModel too
    ("mobilebert", False): "MobileBertForMaskedLM", ("mobilebert", True): "MobileBertForPreTraining",
}


def _shift_positions(table: np.ndarray, shift: int) -> np.ndarray:
  """The position table as HF RoBERTa indexes it when its first id (pad_token_id + 1) differs from
  bertjax's position_offset by `shift` rows (unused rows are zero)."""
  if shift == 0:
    return table
  out = np.zeros_like(table)
  if shift > 0:
    out[:-shift] = table[shift:]
  else:
    out[-shift:] = table[:shift]
  return out


def heads_without_hf(config) -> list:
  """The trained heads that transformers has no class for, which export leaves out (the encoder and the MLM
  head, which StructBERT's word-structural objective also trains, are exported)."""
  objectives = config_lib.active_objectives(config)
  out = []
  if "sbo" in objectives:
    out.append("sbo_head (SpanBERT's span-boundary head)")
  if "sso" in objectives:
    out.append("sentence (StructBERT's 3-way sentence-structural head; HF's NSP head has 2 classes)")
  return out


def encoder_tensors(config, params, family: str, special: SpecialIds, generator: bool = False) -> dict:
  """HF tensors of one network's embeddings and encoder layers (no heads), under HF's base-model prefix:
  what every HF class of the family shares (pretraining heads here, task heads such as qa_outputs in
  bertjax.finetune.squad.hf)."""
  prefix = W.PREFIX[family]
  enc = model_config.encoder_config(config.model, generator=generator)
  scope = "generator_encoder" if generator else "encoder"
  if family == "modernbert":  # fused q/k/v, per-layer norms shifted by one (bertjax.hf.modernbert)
    return MB.join_qkv(W.export_tensors(MB.body(prefix, enc.num_layers, enc.use_bias), params))
  if family == "mobilebert":
    return W.export_tensors(MOB.body(prefix, enc), params)
  if family == "distilbert":
    entries = distilbert_entries(prefix, enc.num_layers)
  else:
    entries = W.embeddings(prefix) + _body(family, config, prefix, scope, generator)
  if family == "albert" and enc.embedding_size == enc.hidden_size:
    entries = [e for e in entries if not e.path.startswith("encoder/embedding_projection")]
  tensors = W.export_tensors(entries, params)
  if family == "albert" and enc.embedding_size == enc.hidden_size:
    name = prefix + "encoder.embedding_hidden_mapping_in"
    tensors[name + ".weight"] = np.eye(enc.hidden_size, dtype=np.float32)
    tensors[name + ".bias"] = np.zeros(enc.hidden_size, np.float32)
  if family == "roberta":
    key = prefix + "embeddings.position_embeddings.weight"
    tensors[key] = _shift_positions(tensors[key], config.model.position_offset - (special.pad + 1))
  return tensors


def _network(config, params, family: str, generator: bool, special: SpecialIds, pooler: dict | None = None):
  """(config.json dict, HF tensors) of one network of a bertjax model; `pooler` (an imported base model's,
  kept beside the Pretrainer params) is written under the base model's name when no sentence head holds one."""
  # StructBERT's 3-way sentence head has no HF class: the network exports as *ForMaskedLM.
  sentence = "sentence" in params and not generator and "sso" not in config_lib.active_objectives(config)
  if family == "reformer":  # ReformerForMaskedLM, or ReformerModelWithLMHead when causal (bertjax.hf.reformer)
    enc = configs.model_config.encoder_config(config.model)
    return configs.to_hf(config, family, "", special), RF.params_to_hf(params, enc)
  if family == "electra":
    arch = "ElectraForMaskedLM" if generator else "ElectraForPreTraining"
  else:
    if sentence and (family, True) not in ARCHITECTURES:
      raise UserError(f"HF {family} has no sentence-pair pretraining head; drop nsp/sop to export this model")
    arch = ARCHITECTURES[(family, sentence)]
  hf = configs.to_hf(config, family, arch, special, generator=generator)
  if family == "electra":
    entries = W.mlm_head("electra", "generator_mlm") if generator else W.rtd_head()
  elif family == "modernbert":
    entries = MB.mlm_head(configs.model_config.encoder_config(config.model).use_bias)
  elif family == "mobilebert":
    entries = MOB.heads(configs.model_config.encoder_config(config.model), W.PREFIX[family], True, sentence)
  else:
    entries = W.mlm_head(family) + (W.sentence_head(family, W.PREFIX[family]) if sentence else [])
  if pooler is not None and not sentence and not generator and family in ("bert", "roberta", "albert", "mobilebert"):
    # *ForMaskedLM has no pooler, but BertModel / RobertaModel / AlbertModel read it from the same file,
    # and a re-import keeps it for fine-tuning.
    entries += W.entries_of("pooler", W.PREFIX[family] + ("pooler" if family == "albert" else "pooler.dense"))
    params = {**params, "pooler": pooler}
  return hf, {**encoder_tensors(config, params, family, special, generator), **W.export_tensors(entries, params)}


def write_tokenizer(tok: Tokenizer | None, out_dir: str):
  """The tokenizer files transformers' AutoTokenizer reads: the HF files as they came, a WordPiece
  vocab.txt, or a SentencePiece model as spiece.model read with AlbertTokenizer's [CLS] A [SEP] template."""
  if tok is None:
    return
  if isinstance(tok, hf_tokenizers.HFTokenizer):
    for name in hf_tokenizers.TOKENIZER_FILES:
      src = os.path.join(tok.path, name)
      if os.path.isfile(src):
        shutil.copy(src, os.path.join(out_dir, name))
    return
  names = dict(pad_token="[PAD]", unk_token="[UNK]", cls_token="[CLS]", sep_token="[SEP]", mask_token="[MASK]")
  if isinstance(tok, WordPieceTokenizer):
    shutil.copy(tok.path, os.path.join(out_dir, "vocab.txt"))
    cfg = dict(tokenizer_class="BertTokenizer", do_lower_case=tok.lowercase, **names)
  elif isinstance(tok, SentencePieceTokenizer):
    shutil.copy(tok.path, os.path.join(out_dir, "spiece.model"))
    cfg = dict(tokenizer_class="AlbertTokenizer", do_lower_case=False, keep_accents=True, **names)
  else:
    return
  with open(os.path.join(out_dir, "tokenizer_config.json"), "w") as f:
    json.dump(cfg, f, indent=2)


def write_dir(directory: str, hf_config: dict, tensors: dict, tokenizer: Tokenizer | None) -> str:
  """One HF checkpoint directory: config.json, model.safetensors and the tokenizer files; returns it.
  Pretraining exports and the task heads' exports (QA, token classification, multiple choice) all end here."""
  os.makedirs(directory, exist_ok=True)
  with open(os.path.join(directory, "config.json"), "w") as f:
    json.dump(hf_config, f, indent=2)
  safetensors_io.write_file(os.path.join(directory, safetensors_io.SINGLE), tensors, {"format": "pt"})
  write_tokenizer(tokenizer, directory)
  return directory


def write_hf(config, params, out_dir: str, tokenizer: Tokenizer | None = None,
             special: SpecialIds | None = None, pooler: dict | None = None) -> list:
  """Exports a bertjax model to HF's layout; returns the directories written (ELECTRA: OUT/discriminator
  and OUT/generator, each a complete checkpoint). `pooler`: the pooler an import kept (inference.Loaded.pooler,
  from a BertModel / RobertaModel / AlbertModel checkpoint), exported with the MLM model so nothing is lost."""
  build.validate(config)
  family = configs.family_for(config)
  if family == "xlnet":  # its own model and names (bertjax.hf.xlnet)
    return [write_xlnet(config, params, out_dir, "lm", tokenizer, special)]
  special = special or (tokenizer.special if tokenizer else SpecialIds(0, 1, 2, 3, 4))
  params = jax.tree.map(np.asarray, params)
  networks = [("discriminator", False), ("generator", True)] if family == "electra" else [("", False)]
  written = []
  for name, generator in networks:
    directory = os.path.join(out_dir, name) if name else out_dir
    os.makedirs(directory, exist_ok=True)
    hf, tensors = _network(config, params, family, generator, special, pooler)
    written.append(write_dir(directory, hf, tensors, tokenizer))
  return written
