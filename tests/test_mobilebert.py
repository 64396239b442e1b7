"""MobileBERT: parameter counts of the released configs (transformers' and the reference code's), transformers'
MobileBertModel / ForPreTraining / ForMaskedLM / ForSequenceClassification in and out (every layer's hidden state
and the logits within 1e-5 on padded batches with token types, the default and the tiny structure), trigram inputs
that never cross packed examples, the configs bertjax refuses, and 20 training steps against
MobileBertForPreTraining."""

import json
import os

os.environ["HF_HUB_OFFLINE"] = "1"  # nothing here may download
os.environ["TRANSFORMERS_OFFLINE"] = "1"

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bertjax import summary
from bertjax.core import sharding
from bertjax.core.errors import UserError
from bertjax.data.tokenizer import SPM_SPECIAL
from bertjax.hf import configs as hf_configs, convert, mobilebert_classifier
from bertjax.model import config as model_config, trigram
from bertjax.model.heads import SentenceHead
from bertjax.model.layer import sown_by_layers
from bertjax.train import build, step as step_lib
from conftest import load_config

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
import torch_reference as ref  # noqa: E402
from test_parity import host_batch  # noqa: E402

V, S = 100, 12
# The released structure (shared key/query bottleneck, 4 FFNs, no pooler) and the tiny one (bottleneck
# attention, 2 FFNs; here with a pooler, so that both pooler settings are covered).
STRUCTURES = {
    "default": dict(key_query_shared_bottleneck=True, use_bottleneck_attention=False, num_feedforward_networks=4,
                    classifier_activation=False),
    "tiny": dict(key_query_shared_bottleneck=False, use_bottleneck_attention=True, num_feedforward_networks=2,
                 classifier_activation=True),
}


def hf_config(structure="default", **kw):
  base = dict(vocab_size=V, hidden_size=64, embedding_size=16, intra_bottleneck_size=32, intermediate_size=48,
              num_hidden_layers=3, num_attention_heads=4, max_position_embeddings=32, pad_token_id=0,
              hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
  return transformers.MobileBertConfig(**dict(base, **STRUCTURES[structure], **kw))


def _perturb(model):
  """NoNorm / LayerNorm weights away from 1 and biases away from 0, so that a mapping that mixes them up shows."""
  torch.manual_seed(1)
  with torch.no_grad():
    for name, p in model.named_parameters():
      if "LayerNorm" in name or name.endswith("bias"):
        p.add_(torch.randn_like(p) * 0.2)
  return model.eval()


def _inputs():
  rng = np.random.default_rng(0)
  ids = rng.integers(5, V, (2, S))
  mask = np.ones_like(ids)
  ids[1, 8:], mask[1, 8:] = 0, 0  # a padded row
  types = np.zeros_like(ids)
  types[:, 5:] = 1
  types[1, 8:] = 0
  return ids, types, mask


def _ours(config, params, ids, types, mask):
  """(every layer's hidden states [L, B, S, H], MLM logits at every position, sentence logits or None)."""
  model = build.make_model(config)

  def fn(m, ids, types, groups):
    hidden = m.encode(ids, types, groups)
    logits = m.mlm(hidden, jnp.broadcast_to(jnp.arange(ids.shape[1]), ids.shape), m.embeddings)
    return logits, (m.sentence(hidden) if m.sentence_head else None)

  apply = jax.jit(lambda p, i, t, g: model.apply({"params": p}, i, t, g, method=fn, mutable="intermediates"))
  (logits, sentence), inter = apply(params, jnp.asarray(ids), jnp.asarray(types), jnp.asarray(mask))
  hidden = np.asarray(sown_by_layers(inter, "hidden"))
  return hidden, np.asarray(logits), None if sentence is None else np.asarray(sentence)


def _theirs(model, ids, types, mask):
  with torch.no_grad():
    return model(torch.tensor(ids), attention_mask=torch.tensor(mask), token_type_ids=torch.tensor(types),
                 output_hidden_states=True)


def _close(a, b, real, what):
  assert np.abs(np.asarray(a) - np.asarray(b))[real].max() < 1e-5, what


def test_parameter_counts_are_the_released_configs():
  """MobileBertForPreTraining 36,597,564 and MobileBertModel 24,581,888 (released config, no pooler);
  MobileBERT-tiny's MobileBertModel 15,485,696; IB-BERT-large as the reference code builds it (Q, K, V read the
  512-wide input), pooler on: 294,467,840. `summary` prints them."""
  text = summary.summarize(load_config("configs/mobilebert.py:mobilebert")).splitlines()
  assert "params: 36597564" in text and "base model params: 24581888" in text
  tiny = build.param_shapes(load_config("configs/mobilebert.py:tiny"))
  assert summary.count(tiny["embeddings"]) + summary.count(tiny["encoder"]) == 15_485_696
  teacher = load_config("configs/mobilebert.py:ib_bert_large")
  assert "base model params: 294467840" in summary.summarize(teacher).splitlines()
  shapes = build.param_shapes(teacher)["encoder"]["layers"]["attention"]
  assert shapes["query"]["kernel"].shape == (24, 512, 4, 256) and shapes["value"]["kernel"].shape == (24, 512, 4, 256)


@pytest.mark.parametrize("structure", sorted(STRUCTURES))
def test_pretraining_model_import_export_match_transformers(structure, tmp_path):
  torch.manual_seed(0)
  theirs = _perturb(transformers.MobileBertForPreTraining(hf_config(structure)))
  theirs.save_pretrained(str(tmp_path / "pt"))
  ids, types, mask = _inputs()
  real = mask.astype(bool)
  out = _theirs(theirs, ids, types, mask)
  imp = convert.read_hf(str(tmp_path / "pt"))
  assert imp.family == "mobilebert" and not imp.fresh and not imp.unused, (imp.fresh, imp.unused)
  assert imp.config.model.pooler_activation == STRUCTURES[structure]["classifier_activation"]
  hidden, logits, sentence = _ours(imp.config, imp.params, ids, types, mask)
  assert len(out.hidden_states) == 4  # the embeddings' output, then each layer's
  for i in range(3):
    _close(hidden[i], out.hidden_states[i + 1].numpy(), real, f"layer {i}")
  _close(logits, out.prediction_logits.numpy(), real, "MLM logits")
  assert np.abs(sentence - out.seq_relationship_logits.numpy()).max() < 1e-5

  # Export: the key set is transformers' (extra output weights as stored, no pooler unless configured), it loads
  # with nothing missing or unexpected, and gives our logits.
  (out_dir,) = convert.write_hf(imp.config, imp.params, str(tmp_path / "out"))
  written = json.load(open(os.path.join(out_dir, "config.json")))
  assert written["architectures"] == ["MobileBertForPreTraining"]
  assert written["classifier_activation"] == STRUCTURES[structure]["classifier_activation"]
  back, info = transformers.MobileBertForPreTraining.from_pretrained(out_dir, output_loading_info=True)
  assert not any(info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys")), info
  tied = ("cls.predictions.decoder.weight", "cls.predictions.decoder.bias")
  from safetensors.numpy import load_file

  assert set(load_file(os.path.join(out_dir, "model.safetensors"))) == set(theirs.state_dict()) - set(tied)
  again = _theirs(back.eval(), ids, types, mask)
  _close(again.prediction_logits.numpy(), logits, real, "exported MLM logits")

  # MobileBertModel and MobileBertForMaskedLM directories import too.
  base = transformers.MobileBertModel(hf_config(structure))
  base.load_state_dict(theirs.mobilebert.state_dict())
  base.save_pretrained(str(tmp_path / "base"))
  bare = convert.read_hf(str(tmp_path / "base"))
  jax.tree.map(np.testing.assert_array_equal, bare.params["encoder"], imp.params["encoder"])
  assert (bare.pooler is not None) == STRUCTURES[structure]["classifier_activation"]
  mlm = transformers.MobileBertForMaskedLM(hf_config(structure))
  mlm.load_state_dict(theirs.state_dict(), strict=False)
  mlm.save_pretrained(str(tmp_path / "mlm"))
  imp_mlm = convert.read_hf(str(tmp_path / "mlm"))
  _, logits_mlm, _ = _ours(imp_mlm.config, imp_mlm.params, ids, types, mask)
  _close(logits_mlm, _theirs(mlm.eval(), ids, types, mask).logits.numpy(), real, "MobileBertForMaskedLM logits")
  (mlm_out,) = convert.write_hf(imp_mlm.config, imp_mlm.params, str(tmp_path / "mlm_out"))
  assert type(transformers.AutoModelForMaskedLM.from_pretrained(mlm_out)).__name__ == "MobileBertForMaskedLM"


@pytest.mark.parametrize("structure", sorted(STRUCTURES))
def test_sequence_classification_in_and_out(structure, tmp_path):
  torch.manual_seed(0)
  theirs = _perturb(transformers.MobileBertForSequenceClassification(hf_config(structure, num_labels=3)))
  theirs.save_pretrained(str(tmp_path / "cls"))
  ids, types, mask = _inputs()
  with torch.no_grad():
    expected = theirs(torch.tensor(ids), attention_mask=torch.tensor(mask), token_type_ids=torch.tensor(types)).logits
  imp, head = mobilebert_classifier.read_classifier(str(tmp_path / "cls"))
  assert ("pooler" in head) == STRUCTURES[structure]["classifier_activation"]
  cfg = model_config.encoder_config(imp.config.model)
  hidden = build.make_model(imp.config).apply({"params": imp.params}, jnp.asarray(ids), jnp.asarray(types),
                                              jnp.asarray(mask), method="encode")
  ours = np.asarray(SentenceHead(cfg, 3).apply({"params": head}, hidden))
  assert np.abs(ours - expected.numpy()).max() < 1e-5
  out = mobilebert_classifier.write_classifier(imp.config, imp.params, head, str(tmp_path / "out"))
  back, info = transformers.MobileBertForSequenceClassification.from_pretrained(out, output_loading_info=True)
  assert not info["missing_keys"] and not info["unexpected_keys"]
  with torch.no_grad():
    again = back.eval()(torch.tensor(ids), attention_mask=torch.tensor(mask), token_type_ids=torch.tensor(types))
  assert np.abs(again.logits.numpy() - expected.numpy()).max() < 1e-6


def test_trigram_inputs_never_cross_packed_examples():
  """[next, current, previous]: zero outside the row and between packed examples; padding is a neighbour."""
  x = jnp.arange(1.0, 7.0)[None, :, None]  # one row of 6 tokens, E = 1
  groups = jnp.asarray([[1, 1, 1, 2, 2, 0]])
  out = np.asarray(trigram.trigram(x, groups))[0]
  np.testing.assert_array_equal(out[:, 1], [1, 2, 3, 4, 5, 6])
  np.testing.assert_array_equal(out[:, 0], [2, 3, 0, 5, 6, 0])  # next: none after example 1 nor the row's end
  np.testing.assert_array_equal(out[:, 2], [0, 1, 2, 0, 4, 5])  # previous: none before either example
  np.testing.assert_array_equal(np.asarray(trigram.trigram(x))[0, :, 0], [2, 3, 4, 5, 6, 0])


@pytest.mark.parametrize("change, key", [
    (dict(normalization_type="layer_norm"), "normalization_type"),
    (dict(use_bottleneck=False), "use_bottleneck"),
    (dict(hidden_act="silu"), "hidden_act"),
])
def test_configs_bertjax_cannot_represent_are_refused_naming_the_key(change, key):
  with pytest.raises(UserError, match=key) as err:
    hf_configs.model_section(dict(hf_config().to_dict(), **change), "mobilebert")
  assert "\n" not in str(err.value)


def test_the_teacher_has_no_transformers_export(tmp_path):
  """IB-BERT's queries and keys read the 512-wide input, which MobileBertSelfAttention cannot hold."""
  config = load_config("configs/mobilebert.py:ib_bert_large")
  assert hf_configs.family_for(config) == "mobilebert"
  with pytest.raises(UserError, match="model.norm='post'"):
    convert.write_hf(config, {}, str(tmp_path / "out"))


def test_training_steps_match_transformers(tmp_path):
  """20 AdamW steps, dropout off, float32, padded batches with token types: every step's MLM + NSP loss within
  1e-3 relative of MobileBertForPreTraining's on the same masked batches from the same exported weights."""
  config = load_config("configs/mobilebert.py:mobilebert")
  m = config.model
  m.vocab_size, m.hidden_size, m.embedding_size, m.bottleneck_size, m.intermediate_size = 300, 64, 16, 32, 48
  m.num_layers, m.dropout, m.attention_dropout, m.dtype = 2, 0.0, 0.0, "float32"
  config.optimizer.name, config.optimizer.bias_correction, config.learning_rate = "adamw", True, 2e-3
  config.batch_size, config.seq_len, config.total_steps, config.warmup_steps = 8, 32, 20, 5
  config.masking.max_predictions = 0
  assert hf_configs.family_for(config) == "mobilebert"
  steps = build.make_steps(config, sharding.make_mesh("dp", devices=jax.devices()[:1]), SPM_SPECIAL)
  state = steps.init(jax.random.key(config.seed))
  dirs = convert.write_hf(config, jax.tree.map(np.asarray, state.params), str(tmp_path / "hf"), special=SPM_SPECIAL)
  models = ref.load_pretraining("mobilebert", dirs)
  opt, sched, params = ref.adamw(config, list(models.values()))
  masked_fn = jax.jit(lambda b, t: step_lib.training_batch(b, t, steps.cfg))
  ours, theirs = [], []
  for t in range(config.total_steps):
    batch = host_batch(config, t)
    masked = jax.tree.map(np.asarray, masked_fn(batch, t))
    state, metrics = steps.train(state, batch)
    ours.append(metrics["loss"].compute())
    loss = ref.pretraining_loss("mobilebert", models, masked, {"mlm": 1.0, "nsp": 1.0})
    theirs.append(ref.train_step(loss, opt, sched, params, config.optimizer.clip_norm))
  np.testing.assert_allclose(ours, theirs, rtol=1e-3)
  assert theirs[-1] < theirs[0]  # it trained


@pytest.mark.parametrize("structure", sorted(STRUCTURES))
def test_the_fine_tuning_classifier_reads_and_writes_transformers_classifiers(structure, tmp_path):
  """What fine-tuning and predict build for a MobileBertForSequenceClassification (bertjax.finetune's
  classification family: the Classifier with the family's head, a pooler only with classifier_activation) gives
  transformers' logits, and its export loads back into transformers with the same weights."""
  from bertjax.finetune import task_models

  torch.manual_seed(0)
  theirs = _perturb(transformers.MobileBertForSequenceClassification(hf_config(structure, num_labels=3)))
  theirs.save_pretrained(str(tmp_path / "in"))
  tm = task_models.read_hf(str(tmp_path / "in"))
  assert ("pooler" in tm.params) == STRUCTURES[structure]["classifier_activation"]
  ids, types, mask = _inputs()
  ours = tm.model.apply({"params": tm.params}, jnp.asarray(ids), jnp.asarray(types), jnp.asarray(mask))
  with torch.no_grad():
    want = theirs(input_ids=torch.tensor(ids), token_type_ids=torch.tensor(types),
                  attention_mask=torch.tensor(mask)).logits.numpy()
  np.testing.assert_allclose(np.asarray(ours), want, atol=1e-5)
  back = transformers.MobileBertForSequenceClassification.from_pretrained(
      task_models.write_hf(tm, str(tmp_path / "out"))).state_dict()
  for name, value in theirs.state_dict().items():
    np.testing.assert_allclose(back[name].numpy(), value.numpy(), atol=1e-7, err_msg=name)


@pytest.mark.slow  # ~20 s of CPU cold (a fine-tuning run compiles its steps): the normal tier stays under 8 minutes
def test_fine_tuning_an_imported_mobilebert(tmp_path):
  """A transformers MobileBERT directory (the released structure: no pooler) as init.checkpoint: the trainer
  fine-tunes it on a sentence-pair task with MobileBertForSequenceClassification's head ([CLS] as it is, no tanh
  pooler), and the fine-tuned model, exported as a MobileBertForSequenceClassification, gives its logits."""
  import glob

  from bertjax.finetune import task_models, train as ft_train
  from test_finetune import _pair_task

  task_dir, ckpt = tmp_path / "task", str(tmp_path / "hf")
  task_dir.mkdir()
  vocab = _pair_task(str(task_dir), n_train=32, n_eval=16)
  (tmp_path / "vocab.txt").write_text("\n".join(vocab) + "\n")
  torch.manual_seed(0)
  transformers.MobileBertForPreTraining(hf_config(vocab_size=len(vocab))).save_pretrained(ckpt)
  transformers.BertTokenizerFast(vocab_file=str(tmp_path / "vocab.txt")).save_pretrained(ckpt)
  config = load_config("configs/finetune.py:tiny")
  config.task.name, config.task.text_a, config.task.text_b = "pairs", "sentence1", "sentence2"
  config.task.source, config.init.checkpoint = f"tsv:{task_dir}", ckpt
  config.seeds, config.total_steps, config.seq_len, config.batch_size, config.save_model = 1, 2, 16, 8, True
  results = ft_train.finetune(config, str(tmp_path / "ft"))
  assert 0.0 <= results["summary"]["accuracy"]["median"] <= 1.0
  (model_dir,) = glob.glob(str(tmp_path / "ft" / "seed_*" / "model"))
  tm = task_models.load(model_dir)
  assert tm.info["head"] == "pooler" and "pooler" not in tm.params  # classifier_activation false: no pooler
  out = task_models.write_hf(tm, str(tmp_path / "export"))
  theirs = transformers.MobileBertForSequenceClassification.from_pretrained(out).eval()
  ids, types, mask = _inputs()
  ids = np.minimum(ids, len(vocab) - 1)
  ours = tm.model.apply({"params": tm.params}, jnp.asarray(ids), jnp.asarray(types), jnp.asarray(mask))
  with torch.no_grad():
    want = theirs(input_ids=torch.tensor(ids), token_type_ids=torch.tensor(types),
                  attention_mask=torch.tensor(mask)).logits.numpy()
  np.testing.assert_allclose(np.asarray(ours), want, atol=1e-5)


@pytest.mark.slow  # two fine-tuning runs (~20 s of CPU each, cold)
@pytest.mark.parametrize("task", ["squad2", "ner"])
def test_fine_tuning_an_imported_mobilebert_on_squad_and_tagging(task, tmp_path):
  """An HF MobileBERT directory fine-tunes through the question-answering and tagging families (the README's
  toy SQuAD v2.0 and CoNLL data) and reports the families' metrics."""
  import re
  import subprocess

  import test_readme
  from bertjax.finetune import train as ft_train

  for script in test_readme.setup_scripts(test_readme.TEXT):
    subprocess.run(["bash", "-c", script.replace("/tmp/", f"{tmp_path}/")], cwd=tmp_path, check=True)
  test_readme.task_data(str(tmp_path))
  words = sorted({w for s in test_readme._sentences() for w in re.findall(r"\w+|[^\w\s]", s.lower())})
  (tmp_path / "vocab.txt").write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + words) + "\n")
  ckpt = str(tmp_path / "hf")
  torch.manual_seed(0)
  transformers.MobileBertForPreTraining(hf_config(vocab_size=len(words) + 5, max_position_embeddings=128)).save_pretrained(ckpt)
  transformers.BertTokenizerFast(vocab_file=str(tmp_path / "vocab.txt")).save_pretrained(ckpt)
  config = load_config(f"configs/finetune.py:{task}")
  config.init.checkpoint, config.seeds, config.total_steps = ckpt, 1, 4
  if task == "squad2":
    config.task.source, config.seq_len, config.task.doc_stride, config.task.max_query_length = (
        f"json:{tmp_path}/data/squad", 128, 64, 32)
  else:
    config.task.source, config.task.train_file, config.task.eval_file = f"conll:{tmp_path}/data/conll", "train.txt", "dev.txt"
  results = ft_train.finetune(config, str(tmp_path / "ft"))
  (metrics,) = results["per_seed"]
  assert "f1" in metrics and np.isfinite(metrics["f1"]), metrics  # SQuAD's and conlleval's F1
