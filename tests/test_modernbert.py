"""ModernBERT: transformers' ModernBertModel / ForMaskedLM / ForSequenceClassification in and out (hidden states
and logits within 1e-4, sequences longer than the local window, padding), the configs bertjax refuses, the BPE
tokenizer through hf:DIR, the parameter counts, the attention implementations on local layers, and 20 training
steps against ModernBertForMaskedLM on packed rows (bertjax) and the same sequences one per padded row (torch)."""

import json
import os

os.environ["HF_HUB_OFFLINE"] = "1"  # nothing here may download
os.environ["TRANSFORMERS_OFFLINE"] = "1"

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bertjax.core import sharding
from bertjax.core.errors import UserError
from bertjax.data.tokenizer import SPM_SPECIAL
from bertjax.data.tokenizer_spec import load_tokenizer
from bertjax.finetune import task_models
from bertjax.hf import configs as hf_configs, convert, modernbert
from bertjax.model import config as model_config
from bertjax.train import build, step as step_lib
from conftest import encoder_only, load_config, micro

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
import torch_reference as ref  # noqa: E402

SEQ, WINDOW = 24, 8  # sequences three times the local window


def hf_config(**kw):
  """A micro ModernBertConfig: 3 layers (global, local, local), a window of 8, nonzero biases off."""
  base = dict(vocab_size=120, hidden_size=32, intermediate_size=24, num_hidden_layers=3, num_attention_heads=2,
              local_attention=WINDOW, max_position_embeddings=64, pad_token_id=0, bos_token_id=1, eos_token_id=2,
              cls_token_id=1, sep_token_id=2)
  return transformers.ModernBertConfig(**dict(base, **kw))


def _perturb_norms(model):
  """LayerNorm weights away from 1, so that a mapping that mixes up norms shows."""
  torch.manual_seed(1)
  with torch.no_grad():
    for name, p in model.named_parameters():
      if "norm" in name:
        p.add_(torch.randn_like(p) * 0.2)
  return model.eval()


def _bpe_tokenizer(directory: str):
  """A ModernBERT-style tokenizer.json: byte-level BPE with [CLS] A [SEP] templates and [MASK]/[PAD]/[UNK]."""
  import tokenizers
  from tokenizers import decoders, models, pre_tokenizers, processors, trainers

  tok = tokenizers.Tokenizer(models.BPE())
  tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
  tok.decoder = decoders.ByteLevel()
  specials = ["[PAD]", "[CLS]", "[SEP]", "[UNK]", "[MASK]"]
  text = ["The quick brown fox jumps over the lazy dog.", "Rotary positions restart in every packed example."] * 20
  tok.train_from_iterator(text, trainers.BpeTrainer(vocab_size=120, special_tokens=specials, show_progress=False))
  tok.post_processor = processors.TemplateProcessing(single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B [SEP]",
                                                     special_tokens=[("[CLS]", 1), ("[SEP]", 2)])
  tok.save(os.path.join(directory, "tokenizer.json"))
  with open(os.path.join(directory, "tokenizer_config.json"), "w") as f:
    json.dump(dict(tokenizer_class="PreTrainedTokenizerFast", cls_token="[CLS]", sep_token="[SEP]",
                   pad_token="[PAD]", unk_token="[UNK]", mask_token="[MASK]"), f)


def _inputs():
  rng = np.random.default_rng(0)
  ids = rng.integers(5, 120, (2, SEQ))
  mask = np.ones_like(ids)
  ids[1, 17:], mask[1, 17:] = 0, 0  # a padded row
  return ids, mask


@pytest.fixture(scope="module")
def mlm_dir(tmp_path_factory):
  out = str(tmp_path_factory.mktemp("modernbert") / "mlm")
  torch.manual_seed(0)
  _perturb_norms(transformers.ModernBertForMaskedLM(hf_config())).save_pretrained(out)
  _bpe_tokenizer(out)
  return out


def _ours(config, params, ids, mask):
  """(final hidden states, MLM logits at every position) of bertjax's Pretrainer, padding as groups."""
  def fn(m, ids, groups):
    hidden = m.encode(ids, jnp.zeros_like(ids), groups)
    return hidden, m.mlm(hidden, jnp.broadcast_to(jnp.arange(ids.shape[1]), ids.shape), m.embeddings)
  apply = jax.jit(lambda p, i, g: build.make_model(config).apply({"params": p}, i, g, method=fn))
  return [np.asarray(x) for x in apply(params, jnp.asarray(ids), jnp.asarray(mask))]


def test_masked_lm_and_model_import_export_match_transformers(mlm_dir, tmp_path):
  ids, mask = _inputs()
  real = mask.astype(bool)
  theirs = transformers.ModernBertForMaskedLM.from_pretrained(mlm_dir).eval()
  with torch.no_grad():
    out = theirs(torch.tensor(ids), attention_mask=torch.tensor(mask), output_hidden_states=True)
    base = transformers.ModernBertModel.from_pretrained(mlm_dir).eval()(torch.tensor(ids), attention_mask=torch.tensor(mask))
  imp = convert.read_hf(mlm_dir)
  assert imp.family == "modernbert" and not imp.fresh and not imp.unused
  m = imp.config.model
  assert (m.position, m.ffn, m.norm, m.use_bias, m.local_window, m.global_every) == ("rope", "geglu", "pre", False, 8, 3)
  hidden, logits = _ours(imp.config, imp.params, ids, mask)
  assert np.abs(hidden - base.last_hidden_state.numpy())[real].max() < 1e-4
  assert np.abs(logits - out.logits.numpy())[real].max() < 1e-4
  # The tokenizer came along (hf:DIR): ids and special tokens as AutoTokenizer has them.
  auto = transformers.AutoTokenizer.from_pretrained(mlm_dir)
  assert imp.tokenizer.encode_pair("The quick fox", "jumps", 32)[0] == auto("The quick fox", "jumps")["input_ids"]
  assert (imp.tokenizer.special.mask, imp.tokenizer.special.pad) == (auto.mask_token_id, auto.pad_token_id)

  # Export: transformers loads it as ModernBertForMaskedLM and as ModernBertModel, with our outputs.
  (out_dir,) = convert.write_hf(imp.config, imp.params, str(tmp_path / "out"), imp.tokenizer)
  with open(os.path.join(out_dir, "config.json")) as f:
    written = json.load(f)
  assert written["layer_types"] == ["full_attention", "sliding_attention", "sliding_attention"]
  assert os.path.isfile(os.path.join(out_dir, "tokenizer.json"))
  with torch.no_grad():
    again = transformers.AutoModelForMaskedLM.from_pretrained(out_dir).eval()(torch.tensor(ids), attention_mask=torch.tensor(mask))
    base2 = transformers.AutoModel.from_pretrained(out_dir).eval()(torch.tensor(ids), attention_mask=torch.tensor(mask))
  assert type(transformers.AutoModel.from_pretrained(out_dir)).__name__ == "ModernBertModel"
  assert np.abs(again.logits.numpy() - logits)[real].max() < 1e-4
  assert np.abs(base2.last_hidden_state.numpy() - hidden)[real].max() < 1e-4
  # A bare ModernBertModel directory imports too (no "model." prefix; a fresh MLM head).
  base_dir = str(tmp_path / "base")
  transformers.ModernBertModel.from_pretrained(mlm_dir).save_pretrained(base_dir)
  bare = convert.read_hf(base_dir)
  assert sorted({p.split("/")[0] for p in bare.fresh}) == ["mlm"]
  jax.tree.map(np.testing.assert_array_equal, bare.params["encoder"], imp.params["encoder"])


def test_sequence_classification_in_and_out(tmp_path):
  torch.manual_seed(0)
  theirs = _perturb_norms(transformers.ModernBertForSequenceClassification(hf_config(num_labels=3, classifier_pooling="mean")))
  theirs.save_pretrained(str(tmp_path / "cls"))
  ids, mask = _inputs()
  with torch.no_grad():
    expected = theirs(torch.tensor(ids), attention_mask=torch.tensor(mask)).logits.numpy()
  tm = task_models.load(str(tmp_path / "cls"))
  assert tm.kind == "classification" and tm.info["pooling"] == "mean" and tm.info["num_outputs"] == 3
  ours = np.asarray(jax.jit(tm.model.apply)({"params": tm.params}, ids, np.zeros_like(ids), mask))
  assert np.abs(ours - expected).max() < 1e-4
  back = transformers.AutoModelForSequenceClassification.from_pretrained(task_models.write_hf(tm, str(tmp_path / "out")))
  with torch.no_grad():
    assert np.abs(back.eval()(torch.tensor(ids), attention_mask=torch.tensor(mask)).logits.numpy() - expected).max() < 1e-6
  # For fine-tuning, an import keeps the classification head as the pooler the modernbert head starts from.
  imp = convert.read_hf(str(tmp_path / "cls"))
  np.testing.assert_array_equal(imp.pooler["dense"]["kernel"], tm.params["pooler"]["dense"]["kernel"])


def _pooling_run(tmp_path, logits=True, **model):
  """Fine-tuning's model (train.prepare, as `python -m bertjax.finetune` builds it) over a random micro
  ModernBertForSequenceClassification whose config.json says classifier_pooling=mean, and transformers' logits."""
  from bertjax.finetune import train

  torch.manual_seed(0)
  theirs = _perturb_norms(transformers.ModernBertForSequenceClassification(hf_config(num_labels=2, classifier_pooling="mean")))
  ckpt = str(tmp_path / "cls")
  theirs.save_pretrained(ckpt)
  _bpe_tokenizer(ckpt)
  (tmp_path / "task").mkdir()
  for name in ("train.tsv", "dev.tsv"):
    (tmp_path / "task" / name).write_text("sentence\tlabel\n" + "The quick brown fox.\t1\nThe lazy dog.\t0\n" * 4)
  config = load_config("configs/finetune.py:tiny")
  config.task.source, config.init.checkpoint, config.seq_len = f"tsv:{tmp_path / 'task'}", ckpt, 32
  for key, value in model.items():
    config.model[key] = value
  setup = train.prepare(config)
  ours = setup["task"].model(config, setup["cfg"], setup["data"], deterministic=True)
  if not logits:
    return ours, setup, None
  params, _ = setup["task"].init_params(ours, jax.random.key(0), setup["loaded"])
  params["classifier"] = task_models.load(ckpt).params["classifier"]  # the head init draws fresh; take theirs
  ids, mask = _inputs()
  with torch.no_grad():
    expected = theirs(torch.tensor(ids), attention_mask=torch.tensor(mask)).logits.numpy()
  got = np.asarray(jax.jit(ours.apply)({"params": params}, ids, np.zeros_like(ids), mask))
  return ours, setup, np.abs(got - expected).max()


def test_fine_tuning_pools_as_the_checkpoints_config_says_unless_told(tmp_path):
  """A ModernBERT checkpoint whose config.json says classifier_pooling=mean is fine-tuned with mean pooling (the
  model transformers builds from it), not [CLS] (46a1046 pooled [CLS] silently); --config.model.pooling=cls
  given explicitly still wins."""
  ours, setup, diff = _pooling_run(tmp_path / "auto")
  assert ours.pooling == "mean" and setup["info"]["pooling"] == "mean"
  assert diff < 1e-4, diff  # fine-tuning starts from transformers' function of the checkpoint
  ours, setup, _ = _pooling_run(tmp_path / "cls", logits=False, pooling="cls")
  assert ours.pooling == "cls" and setup["info"]["pooling"] == "cls"


@pytest.mark.parametrize("change, key", [
    (dict(rope_parameters={"full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e4},
                           "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}}),
     "rope_parameters.full_attention.rope_type"),
    (dict(rope_scaling={"rope_type": "dynamic", "factor": 2.0}), "rope_scaling"),
    (dict(attn_logit_softcapping=30.0), "attn_logit_softcapping"),
    (dict(layer_types=["full_attention", "chunked_attention", "sliding_attention"]), "layer_types"),
    (dict(mlp_bias=True), "mlp_bias"),
    (dict(decoder_bias=False), "decoder_bias"),
    (dict(classifier_activation="silu"), "classifier_activation"),
    (dict(embedding_dropout=0.1), "embedding_dropout"),
])
def test_configs_bertjax_cannot_represent_are_refused_naming_the_key(change, key, tmp_path):
  hf = dict(hf_config().to_dict(), **change)
  with pytest.raises(UserError, match=key.replace(".", r"\.")) as err:
    hf_configs.model_section(hf, "modernbert")
  assert "\n" not in str(err.value)


def test_parameter_counts_are_transformers():
  """configs/modernbert.py:base has ModernBertForMaskedLM's 149,655,232 parameters; the encoder alone (no MLM
  head: its dense, LayerNorm scale and decoder bias) ModernBertModel's 149,014,272."""
  config = load_config("configs/modernbert.py:base")
  shapes = build.param_shapes(config)
  count = lambda tree: sum(int(np.prod(x.shape)) for x in jax.tree.leaves(tree))
  assert count(shapes) == 149_655_232
  assert count(shapes) - count(shapes["mlm"]) == 149_014_272


def test_modernbert_init_scales_output_projections():
  """init=modernbert: output projections at init_std / sqrt(2 x layers), others at init_std, both cut at 2 std
  (transformers' ModernBertPreTrainedModel._init_weights)."""
  from bertjax.model.hparams import EncoderConfig
  from bertjax.model.layers import dense

  cfg = EncoderConfig(vocab_size=8, hidden_size=256, num_layers=8, num_heads=4, intermediate_size=256,
                      embedding_size=256, init="modernbert")
  draw = lambda out: np.asarray(dense(cfg, 256, 256, (None, None), "d", out=out).init(
      jax.random.key(0), jnp.zeros((1, 256)))["params"]["kernel"].unbox())
  inner, outer = draw(False), draw(True)
  assert np.abs(inner).max() <= 0.04 and np.abs(outer).max() <= 0.04 / 4
  assert outer.std() / inner.std() == pytest.approx(0.25, rel=0.02)
  bert = np.asarray(dense(dataclasses.replace(cfg, init="bert"), 256, 256, (None, None), "d", out=True).init(
      jax.random.key(0), jnp.zeros((1, 256)))["params"]["kernel"].unbox())
  np.testing.assert_array_equal(bert, inner)  # BERT's init is unchanged


def test_local_layers_agree_across_attention_implementations():
  """xla's additive band and dot_product's boolean one (a traced choice per scanned layer) agree, and a
  local window wider than the row changes nothing (the band really is the only difference)."""
  config = micro("configs/modernbert.py:tiny", **{"model.local_window": 6, "model.num_layers": 3,
                                                  "model.hidden_size": 32, "model.vocab_size": 200})
  cfg = model_config.encoder_config(config.model, platform="cpu")
  assert cfg.local_layers == (False, True, False)
  ids = jnp.asarray(np.random.default_rng(0).integers(5, 200, (2, 20)))
  groups = jnp.asarray(np.r_[[1] * 12 + [2] * 8, [1] * 16 + [0] * 4].reshape(2, 20))
  params = jax.jit(encoder_only(cfg).init)(jax.random.key(0), ids, groups)
  variants = [cfg, dataclasses.replace(cfg, attention="dot_product"), dataclasses.replace(cfg, local_window=64)]
  xla, dot, wide = (np.asarray(x) for x in jax.jit(lambda p: [encoder_only(c).apply(p, ids, groups) for c in variants])(params))
  real = np.asarray(groups) > 0
  assert np.abs(dot - xla)[real].max() < 1e-5
  assert np.abs(wide - xla)[real].max() > 1e-3


def _packed_batch(config, step: int) -> dict:
  """Two examples per row ([CLS] ... [SEP] each, positions restarting, groups 1 and 2), padding after them."""
  rng = np.random.default_rng(step)
  b, s = config.batch_size, config.seq_len
  ids, groups, positions = (np.zeros((b, s), np.int32) for _ in range(3))
  for r in range(b):
    n1 = int(rng.integers(10, 18))
    n2 = int(rng.integers(8, s - n1 + 1))
    at = 0
    for g, n in ((1, n1), (2, n2)):
      start = int(rng.integers(0, 200))
      ids[r, at:at + n] = 5 + (start + np.arange(n)) % (config.model.vocab_size - 5)
      ids[r, at], ids[r, at + n - 1] = SPM_SPECIAL.cls, SPM_SPECIAL.sep
      groups[r, at:at + n], positions[r, at:at + n] = g, np.arange(n)
      at += n
  ids[groups == 0] = SPM_SPECIAL.pad
  return dict(input_ids=ids, type_ids=np.zeros_like(ids), word_start=np.ones((b, s), bool), groups=groups,
              position_ids=positions, sentence_label=np.zeros(b, np.int32), example_weight=np.ones(b, np.float32))


def _unpacked(masked) -> dict:
  """The same examples one per row, padded (HF's attention_mask), labels where bertjax masked."""
  ids, groups = np.asarray(masked["input_ids"]), np.asarray(masked["groups"])
  labels = np.full(ids.shape, -100)
  rows, slots = np.nonzero(np.asarray(masked["mlm_weights"]) > 0)
  labels[rows, masked["mlm_positions"][rows, slots]] = masked["mlm_labels"][rows, slots]
  shape = (2 * len(ids), ids.shape[1])
  out_ids, out_labels, mask = np.zeros(shape, np.int64), np.full(shape, -100), np.zeros(shape, np.int64)
  for r in range(len(ids)):
    for g in (1, 2):
      cols = np.nonzero(groups[r] == g)[0]
      row = 2 * r + g - 1
      out_ids[row, :len(cols)], out_labels[row, :len(cols)], mask[row, :len(cols)] = ids[r, cols], labels[r, cols], 1
  return dict(input_ids=torch.tensor(out_ids), attention_mask=torch.tensor(mask), labels=torch.tensor(out_labels))


def test_training_steps_match_transformers_on_packed_rows(tmp_path):
  """20 AdamW steps, dropout off, float32: bertjax on packed rows (RoPE positions restarting, attention kept
  inside each example, local windows) against ModernBertForMaskedLM on the same examples one per padded row;
  every step's loss within 1e-3 relative, so packing computes the padded model exactly."""
  config = micro("configs/modernbert.py:tiny", **{
      "optimizer.name": "adamw", "optimizer.schedule": "linear", "optimizer.clip_norm": 1.0,
      "optimizer.weight_decay": 0.01, "learning_rate": 2e-3, "model.local_window": 8, "model.hidden_size": 32,
      "model.intermediate_size": 64})
  config.model.vocab_size, config.batch_size, config.seq_len = 300, 4, 32
  config.total_steps, config.warmup_steps = 20, 5
  assert hf_configs.family_for(config) == "modernbert"
  steps = build.make_steps(config, sharding.make_mesh("dp", devices=jax.devices()[:1]), SPM_SPECIAL)
  state = steps.init(jax.random.key(config.seed))
  dirs = convert.write_hf(config, jax.tree.map(np.asarray, state.params), str(tmp_path / "hf"), special=SPM_SPECIAL)
  models = ref.load_pretraining("modernbert", dirs)
  opt, sched, params = ref.adamw(config, list(models.values()))
  masked_fn = jax.jit(lambda b, t: step_lib.training_batch(b, t, steps.cfg))
  ours, theirs = [], []
  for t in range(config.total_steps):
    batch = _packed_batch(config, t)
    masked = jax.tree.map(np.asarray, masked_fn(batch, t))
    state, metrics = steps.train(state, batch)
    ours.append(metrics["loss"].compute())
    theirs.append(ref.train_step(models[""](**_unpacked(masked)).loss, opt, sched, params, config.optimizer.clip_norm))
  np.testing.assert_allclose(ours, theirs, rtol=1e-3)
  assert theirs[-1] < theirs[0]


@pytest.mark.slow  # Pallas' interpreter at 128 positions (splash's smallest block): ~20 s
def test_splash_local_and_global_layers_agree_with_xla(monkeypatch):
  """Splash attention (interpreted on the CPU) with a LocalMask kernel on local layers and a full one on global
  layers, picked by lax.cond inside the layer scan, gives xla's states and gradients on packed rows."""
  import functools

  from bertjax.model import attention as attention_lib

  monkeypatch.setattr(attention_lib, "fused", functools.partial(attention_lib.fused, interpret=True))
  config = micro("configs/modernbert.py:tiny", **{"model.local_window": 32, "model.num_layers": 3,
                                                  "model.hidden_size": 32, "model.intermediate_size": 32})
  cfg = model_config.encoder_config(config.model, platform="cpu")
  ids = jnp.asarray(np.random.default_rng(0).integers(5, 200, (2, 128)))
  groups = jnp.asarray(np.r_[[1] * 70 + [2] * 50 + [0] * 8, [1] * 100 + [0] * 28].reshape(2, 128))
  params = encoder_only(cfg).init(jax.random.key(0), ids, groups)
  real = np.asarray(groups) > 0

  def run(impl):
    model = encoder_only(dataclasses.replace(cfg, attention=impl))
    loss = lambda p: jnp.sum(jnp.where(jnp.asarray(real)[..., None], model.apply(p, ids, groups), 0.0) ** 2)
    flat = np.concatenate([np.ravel(g) for g in jax.tree.leaves(jax.grad(loss)(params))])
    return np.asarray(model.apply(params, ids, groups)), flat

  (ref_out, ref_grad), (out, grad) = run("xla"), run("splash")
  np.testing.assert_allclose(out[real], ref_out[real], atol=1e-5)
  assert np.linalg.norm(grad - ref_grad) <= 1e-5 * np.linalg.norm(ref_grad)


def _demo_checkpoint(directory: str, model_cls, **kw):
  """A random tiny ModernBERT checkpoint (model_cls) with a byte-level BPE tokenizer trained on the demo text."""
  import tokenizers
  from tokenizers import decoders, models, pre_tokenizers, processors, trainers

  from bertjax.data import sources

  text = [s for doc in sources.documents("demo", sources.SourceStats()) for s in doc][:3000]
  tok = tokenizers.Tokenizer(models.BPE())
  tok.pre_tokenizer, tok.decoder = pre_tokenizers.ByteLevel(add_prefix_space=False), decoders.ByteLevel()
  tok.train_from_iterator(text, trainers.BpeTrainer(vocab_size=1000, show_progress=False,
                                                    special_tokens=["[PAD]", "[CLS]", "[SEP]", "[UNK]", "[MASK]"]))
  tok.post_processor = processors.TemplateProcessing(single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B [SEP]",
                                                     special_tokens=[("[CLS]", 1), ("[SEP]", 2)])
  torch.manual_seed(0)
  model_cls(hf_config(vocab_size=tok.get_vocab_size(), hidden_size=64, intermediate_size=64,
                      max_position_embeddings=256, local_attention=16, **kw)).save_pretrained(directory)
  tok.save(os.path.join(directory, "tokenizer.json"))
  with open(os.path.join(directory, "tokenizer_config.json"), "w") as f:
    json.dump(dict(tokenizer_class="PreTrainedTokenizerFast", cls_token="[CLS]", sep_token="[SEP]",
                   pad_token="[PAD]", unk_token="[UNK]", mask_token="[MASK]"), f)
  return directory


@pytest.mark.slow  # a short training run: ~1 min
def test_continued_pretraining_from_a_modernbert_checkpoint(tmp_path, capsys):
  """`init_from=hf:DIR` with a ModernBertForMaskedLM: the architecture and tokenizer come from the checkpoint
  (even under BERT's config file), every weight goes in, eval MLM loss falls, and the export loads back."""
  from bertjax.hf import init_from  # noqa: F401  (registers hf: with the loop)
  from bertjax.train import loop
  from conftest import read_metrics

  ckpt = _demo_checkpoint(str(tmp_path / "hf"), transformers.ModernBertForMaskedLM)
  config = micro("configs/bert.py:tiny", **{"init_from": f"hf:{ckpt}", "objectives.nsp": 0.0, "seq_len": 128,
                                           "data.format": "packed", "total_steps": 60, "eval_every": 60})
  loop.train_and_evaluate(config, str(tmp_path / "work"))
  printed = capsys.readouterr()
  assert "initialized weights from hf:" in printed.out + printed.err and "freshly initialized" not in printed.out
  evals = [m for m in read_metrics(str(tmp_path / "work")) if "eval/mlm_loss" in m]
  assert evals[-1]["eval/mlm_loss"] < evals[0]["eval/mlm_loss"] - 0.05
  saved = json.load(open(tmp_path / "work" / "config.json"))
  assert (saved["model"]["position"], saved["model"]["norm"], saved["model"]["ffn"]) == ("rope", "pre", "geglu")
  from bertjax.hf import inference

  loaded = inference.load(workdir=str(tmp_path / "work"))
  (out,) = convert.write_hf(loaded.config, loaded.params, str(tmp_path / "export"), loaded.tokenizer)
  assert type(transformers.AutoModelForMaskedLM.from_pretrained(out)).__name__ == "ModernBertForMaskedLM"


@pytest.mark.slow  # fine-tuning runs: ~1-2 min
def test_fine_tuning_a_modernbert_classifier_and_exporting_it(tmp_path, capsys):
  """`python -m bertjax.finetune` from a ModernBertForSequenceClassification directory: the modernbert head
  (auto) starts from the checkpoint's head, learns the generated pair task, and the saved classifier exports as
  ModernBertForSequenceClassification whose logits are bertjax's."""
  from bertjax.finetune import model as ft_model, train
  from test_finetune import _pair_task

  (tmp_path / "task").mkdir()
  _pair_task(str(tmp_path / "task"), n_train=2000, n_eval=200)
  ckpt = _demo_checkpoint(str(tmp_path / "hf"), transformers.ModernBertForSequenceClassification, num_labels=2)
  config = load_config("configs/finetune.py:tiny")
  config.task.name, config.task.text_a, config.task.text_b = "pairs", "sentence1", "sentence2"
  config.task.metrics, config.task.source, config.init.checkpoint = "accuracy", f"tsv:{tmp_path / 'task'}", ckpt
  config.seeds, config.total_steps, config.seq_len, config.learning_rate = 1, 300, 64, 2e-3
  config.length_window, config.save_model = 0, True
  results = train.finetune(config, str(tmp_path / "ft"))
  assert "; pooler pretrained" in capsys.readouterr().out  # the checkpoint's head.dense / head.norm
  assert results["per_seed"][0]["accuracy"] > 0.7, results["per_seed"]  # chance is 0.5
  model_dir = str(tmp_path / "ft" / "seed_0" / ft_model.MODEL_DIR)
  tm = task_models.load(model_dir)
  assert tm.kind == "classification" and tm.info["head"] == "modernbert"
  hf_dir = task_models.write_hf(tm, str(tmp_path / "export"))
  theirs = transformers.AutoModelForSequenceClassification.from_pretrained(hf_dir).eval()
  ids, mask = _inputs()
  with torch.no_grad():
    expected = theirs(torch.tensor(ids), attention_mask=torch.tensor(mask)).logits.numpy()
  ours = np.asarray(tm.model.apply({"params": tm.params}, ids, np.zeros_like(ids), mask))
  assert np.abs(ours - expected).max() < 1e-4
