"""transformers' DistilBERT in and out: DistilBertModel / DistilBertForMaskedLM import (through
`python -m bertjax.hf import`) with transformers' hidden states and logits, DistilBertForSequenceClassification
with its pre_classifier + ReLU head, and the one-line refusals."""

import os

os.environ["HF_HUB_OFFLINE"] = "1"  # nothing here may download
os.environ["TRANSFORMERS_OFFLINE"] = "1"

import jax
import numpy as np
import pytest
from absl import flags

from bertjax.core.errors import UserError
from bertjax.hf import __main__ as hf_cli, configs as hf_configs, convert, inference

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
SIZES = dict(vocab_size=40, dim=32, n_layers=2, n_heads=2, hidden_dim=64, max_position_embeddings=24)
IDS = np.array([[2, 5, 9, 4, 7, 3, 0], [2, 11, 12, 13, 3, 0, 0]], np.int64)
MASK = (np.arange(IDS.shape[1]) < np.array([[6], [5]])).astype(np.int64)


def _save(cls, path, **extra):
  """A randomly initialized transformers DistilBERT of class `cls` (biases and LayerNorms perturbed, so a
  swapped tensor shows), saved as safetensors; returns the model."""
  torch.manual_seed(0)
  model = cls(transformers.DistilBertConfig(**SIZES, **extra)).eval()
  with torch.no_grad():
    for name, p in model.named_parameters():
      if name.endswith(("bias", "LayerNorm.weight", "layer_norm.weight")):
        p.add_(torch.randn_like(p) * 0.1)
  model.save_pretrained(str(path))
  return model


def _run_cli(command, **values):
  """`python -m bertjax.hf COMMAND --k=v ...` in this process."""
  flags.FLAGS.unparse_flags()
  flags.FLAGS(["bertjax.hf"] + [f"--{k}={v}" for k, v in values.items()])
  try:
    hf_cli.main(["bertjax.hf", command])
  finally:
    flags.FLAGS.unparse_flags()


def test_distilbert_for_masked_lm_imports_through_the_cli_with_transformers_hidden_states(tmp_path, capsys):
  model = _save(transformers.DistilBertForMaskedLM, tmp_path / "hf")
  _run_cli("import", hf_dir=tmp_path / "hf", workdir=tmp_path / "w")
  n = sum(p.numel() for p in model.parameters())
  assert f"imported distilbert ({n:,} parameters)" in capsys.readouterr().out  # exact count, decoder tied
  loaded = inference.load(workdir=str(tmp_path / "w"))
  assert loaded.config.model.type_vocab_size == 0 and not loaded.fresh
  ids = IDS[:1, :6]
  with torch.no_grad():
    out = model(input_ids=torch.tensor(ids), output_hidden_states=True)
  ours = inference.hidden_states(loaded.config, loaded.params, ids, np.zeros_like(ids))
  np.testing.assert_allclose(ours, out.hidden_states[-1].numpy(), atol=1e-4)
  # The MLM head: every tensor found (nothing fresh, above); the same name map, read the other way, gives
  # DistilBertForMaskedLM its logits in tests/test_distill.py's export test.


def test_a_bare_distilbert_model_imports_its_encoder_with_a_fresh_mlm_head(tmp_path):
  """DistilBertModel's layout (no prefix, no head; made here from a DistilBertForMaskedLM's tensors, which the
  test above compares with transformers): every tensor lands, only the MLM head is fresh, the count is exact."""
  from bertjax.hf import safetensors_io

  model = _save(transformers.DistilBertForMaskedLM, tmp_path / "mlm")
  bare = {k[len("distilbert."):]: v for k, v in safetensors_io.read_dir(str(tmp_path / "mlm")).items()
          if k.startswith("distilbert.")}
  (tmp_path / "hf").mkdir()
  config = model.config.to_dict() | {"architectures": ["DistilBertModel"]}
  (tmp_path / "hf" / "config.json").write_text(__import__("json").dumps(config))
  safetensors_io.write_file(str(tmp_path / "hf" / safetensors_io.SINGLE), bare, {"format": "pt"})
  imported = convert.read_hf(str(tmp_path / "hf"))
  assert imported.family == "distilbert" and not imported.unused
  assert sorted({p.split("/")[0] for p in imported.fresh}) == ["mlm"]
  base = sum(x.size for k in ("embeddings", "encoder") for x in jax.tree.leaves(imported.params[k]))
  assert base == sum(v.size for v in bare.values())
  q = imported.params["encoder"]["layers"]["attention"]["query"]["kernel"]  # [layers, H, heads, head_dim]
  np.testing.assert_array_equal(q[1].reshape(32, 32).T, bare["transformer.layer.1.attention.q_lin.weight"])


def test_distilbert_configs_bertjax_cannot_run_are_one_line_errors():
  base = dict(model_type="distilbert", **SIZES)
  with pytest.raises(UserError, match="sinusoidal_pos_embds"):
    hf_configs.model_section(dict(base, sinusoidal_pos_embds=True), "distilbert")
  with pytest.raises(UserError, match="activation 'relu'"):
    hf_configs.model_section(dict(base, activation="relu"), "distilbert")
  m = hf_configs.model_section(base, hf_configs.family_of(base))
  assert (m["hidden_size"], m["num_layers"], m["intermediate_size"], m["type_vocab_size"]) == (32, 2, 64, 0)


@pytest.mark.slow  # 3 s; the slow fine-tuning test below checks the same head through its export
def test_distilbert_for_sequence_classification_in_and_out_with_transformers_logits(tmp_path):
  """Its pre_classifier + ReLU + classifier head on [CLS] is bertjax's `distilbert` Classifier head: imported,
  the logits are transformers' (padding included); exported, transformers reads back the same model."""
  from bertjax.finetune import task_models

  theirs = _save(transformers.DistilBertForSequenceClassification, tmp_path / "hf", num_labels=3)
  imported = task_models.read_hf(str(tmp_path / "hf"))
  model, params = imported.model, imported.params
  assert model.head == "distilbert" and model.num_outputs == 3 and model.classifier_dropout == 0.2
  ids, mask = IDS.astype(np.int32), MASK.astype(np.int32)
  ours = np.asarray(model.apply({"params": params}, ids, np.zeros_like(ids), mask))
  with torch.no_grad():
    expected = theirs(input_ids=torch.tensor(IDS), attention_mask=torch.tensor(MASK)).logits.numpy()
  np.testing.assert_allclose(ours, expected, atol=1e-4)
  task_models.write_hf(imported, str(tmp_path / "again"))
  again = transformers.DistilBertForSequenceClassification.from_pretrained(str(tmp_path / "again")).eval()
  with torch.no_grad():
    back = again(input_ids=torch.tensor(IDS), attention_mask=torch.tensor(MASK)).logits.numpy()
  np.testing.assert_allclose(back, expected, atol=1e-5)
  with pytest.raises(UserError, match="architectures"):
    task_models.read_hf(_plain_bert_dir(tmp_path))


def _plain_bert_dir(tmp_path) -> str:
  path = tmp_path / "bert"
  path.mkdir()
  (path / "config.json").write_text('{"model_type": "bert", "architectures": ["BertForMaskedLM"]}')
  return str(path)


@pytest.mark.slow  # a fine-tuning run (two compiles); the head's logits and its export are tested above
def test_fine_tuning_starts_from_an_imported_distilbert_and_exports_to_transformers(tmp_path, capsys):
  """A transformers DistilBertForMaskedLM directory (with its WordPiece vocabulary) fine-tunes on a task it can
  learn with DistilBERT's head (auto), and the saved classifier exports to DistilBertForSequenceClassification,
  which scores the dev rows as bertjax did."""
  from bertjax.finetune import model as ft_model, task_models, train
  from bertjax.finetune.classification import model as cls_model
  from conftest import load_config

  words = "good bad film plot actor scene music story the a was is very".split()
  vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + words
  hf_dir = tmp_path / "hf"
  torch.manual_seed(0)
  hf_config = transformers.DistilBertConfig(**dict(SIZES, vocab_size=len(vocab)))
  transformers.DistilBertForMaskedLM(hf_config).save_pretrained(str(hf_dir))
  (hf_dir / "vocab.txt").write_text("\n".join(vocab) + "\n")
  rng = np.random.default_rng(0)
  task = tmp_path / "task"
  task.mkdir()
  for name, n in (("train.tsv", 400), ("dev.tsv", 100)):
    rows = []
    for _ in range(n):
      label = int(rng.integers(2))
      body = list(rng.choice(words[2:], size=5))
      body.insert(int(rng.integers(6)), "good" if label else "bad")
      rows.append(f"{' '.join(body)}\t{label}")
    (task / name).write_text("sentence\tlabel\n" + "\n".join(rows) + "\n")
  config = load_config("configs/finetune.py:tiny")
  config.task.source, config.init.checkpoint = f"tsv:{task}", str(hf_dir)
  config.seeds, config.total_steps, config.seq_len, config.learning_rate = 1, 100, 16, 2e-3
  config.model.dropout = config.model.attention_dropout = 0.0
  config.save_model = True
  results = train.finetune(config, str(tmp_path / "ft"))
  assert results["per_seed"][0]["accuracy"] > 0.9, results  # chance is 0.5
  run_config, model, params = cls_model.load_model(str(tmp_path / "ft" / "seed_0" / ft_model.MODEL_DIR))
  assert model.head == "distilbert" and "pre_classifier" in params
  evals = train.prepare(config)["eval"]
  ours = train.predict(params, evals, model, 64)
  task_models.write_hf(task_models.load(str(tmp_path / "ft" / "seed_0" / ft_model.MODEL_DIR)), str(tmp_path / "out"))
  exported = transformers.DistilBertForSequenceClassification.from_pretrained(str(tmp_path / "out")).eval()
  with torch.no_grad():
    theirs = exported(input_ids=torch.tensor(evals["input_ids"], dtype=torch.long),
                      attention_mask=torch.tensor(evals["groups"] > 0, dtype=torch.long)).logits.numpy()
  np.testing.assert_allclose(ours, theirs, atol=1e-4)
