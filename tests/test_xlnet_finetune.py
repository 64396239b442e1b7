"""Fine-tuning from an imported XLNet (a tiny random XLNetLMHeadModel and XLNet's SentencePiece tokenizer saved
here): XLNet's conventions through the classification family (A <sep> B <sep> <cls>, segment id 2 for <cls>, the
summary read at <cls> though bertjax pads on the right and cuts length buckets), a model that learns, results.json,
and the fine-tuned classifier's logits equal to transformers' XLNetForSequenceClassification on left-padded rows."""

import os

os.environ["HF_HUB_OFFLINE"] = "1"  # nothing here may download
os.environ["TRANSFORMERS_OFFLINE"] = "1"

import json
import shutil

import jax
import numpy as np
import pytest

from bertjax.finetune import train
from bertjax.hf import xlnet as hx
from conftest import load_config

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

WORDS = "good bad film plot actor scene music story the a was is very".split()


def xlnet_dir(tmp_path, words=WORDS, vocab=40):
  """A tiny random XLNetLMHeadModel with a SentencePiece tokenizer of XLNet's special symbols over `words`."""
  import sentencepiece as spm

  rng = np.random.default_rng(1)
  lines = [" ".join(rng.choice(words, 8)) for _ in range(400)]
  spm.SentencePieceTrainer.train(
      sentence_iterator=iter(lines), model_prefix=str(tmp_path / "sp"), vocab_size=vocab, character_coverage=1.0,
      control_symbols=["<cls>", "<sep>", "<pad>", "<mask>", "<eod>", "<eop>"], pad_id=-1, minloglevel=2,
      hard_vocab_limit=False)
  d = tmp_path / "xlnet"
  torch.manual_seed(0)
  hf = transformers.XLNetConfig(vocab_size=vocab, d_model=32, n_layer=2, n_head=4, d_inner=64, dropout=0.0)
  transformers.XLNetLMHeadModel(hf).save_pretrained(str(d))
  shutil.copy(tmp_path / "sp.model", d / "spiece.model")
  (d / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "XLNetTokenizer"}))
  return d


def sentiment_task(tmp_path, n_train=400, n_eval=100):
  rng = np.random.default_rng(0)
  task = tmp_path / "task"
  task.mkdir()
  for name, n in (("train.tsv", n_train), ("dev.tsv", n_eval)):
    rows = []
    for _ in range(n):
      label = int(rng.integers(2))
      body = list(rng.choice(WORDS[2:], size=int(rng.integers(2, 7))))
      body.insert(int(rng.integers(len(body) + 1)), "good" if label else "bad")
      rows.append(f"{' '.join(body)}\t{label}")
    (task / name).write_text("sentence\tlabel\n" + "\n".join(rows) + "\n")
  return task


def test_sst2_from_an_imported_xlnet_learns_and_matches_transformers(tmp_path):
  hf_dir, task = xlnet_dir(tmp_path), sentiment_task(tmp_path)
  config = load_config("configs/finetune.py:sst2")
  config.task.source, config.init.checkpoint = f"tsv:{task}", str(hf_dir)
  config.seeds, config.total_steps, config.seq_len, config.learning_rate, config.batch_size = 1, 100, 16, 2e-3, 32
  config.model.dropout = config.model.attention_dropout = 0.0
  results = train.finetune(config, str(tmp_path / "ft"))
  assert results["per_seed"][0]["accuracy"] > 0.9, results  # chance is 0.5
  assert os.path.isfile(tmp_path / "ft" / "results.json")

  setup = train.prepare(config)
  evals = setup["eval"]
  ids, groups, types = evals["input_ids"], evals["groups"], evals["type_ids"]
  n = groups.sum(1)
  tok = setup["loaded"].tokenizer
  assert all(ids[i, n[i] - 1] == tok.special.cls and types[i, n[i] - 1] == 2 for i in range(len(n)))  # <cls> last
  assert all(ids[i, n[i] - 2] == tok.special.sep for i in range(len(n)))

  # The classifier reads <cls> where transformers reads it: XLNetForSequenceClassification (summary_type last)
  # on the same rows padded on the left gives the same logits.
  model = setup["task"].model(config, setup["cfg"], setup["data"], deterministic=True)
  params, fresh = setup["task"].init_params(model, jax.random.key(3), setup["loaded"])
  assert sorted(fresh) == ["logits_proj", "summary"]
  ours = train.predict(params, evals, model, 64)
  hf, tensors = hx.export(setup["loaded"].config, jax.tree.map(np.asarray, params), "classifier")
  reference = transformers.XLNetForSequenceClassification(
      transformers.XLNetConfig(**{k: v for k, v in hf.items() if k != "architectures"})).eval()
  reference.load_state_dict({k: torch.tensor(v) for k, v in tensors.items()})
  s = ids.shape[1]
  left = lambda x, fill: np.stack([np.concatenate([np.full(s - k, fill), row[:k]]) for row, k in zip(x, n)])
  with torch.no_grad():
    theirs = reference(input_ids=torch.tensor(left(ids, tok.special.pad)),
                       token_type_ids=torch.tensor(left(types, 3)),  # transformers' pad_token_type_id
                       attention_mask=torch.tensor(left(groups, 0))).logits.numpy()
  np.testing.assert_allclose(ours, theirs, atol=1e-4)


@pytest.mark.slow  # one compile of XLNet's fine-tuning step and 20 torch steps (~20 s of CPU)
def test_finetuning_steps_match_transformers_xlnet_for_sequence_classification():
  """20 fine-tuning steps (bertjax's step and optimizer as python -m bertjax.finetune builds them) against
  XLNetForSequenceClassification from the same weights, dropout off: the loss per step to 1e-3 relative, the final
  parameters to 1e-3. Our rows are padded on the right (the summary gathers <cls>), transformers' on the left."""
  import functools

  import jax.numpy as jnp

  import torch_reference as ref
  from bertjax.finetune.classification.model import XLNetClassifier
  from bertjax.finetune.model import init_params
  from bertjax.model import config as model_config
  from test_xlnet_parity import no_decay

  torch.manual_seed(0)
  hf_lm = transformers.XLNetLMHeadModel(transformers.XLNetConfig(vocab_size=64, d_model=32, n_layer=2, n_head=4,
                                                                  d_inner=64, dropout=0.0))
  pre, _, imported, _, _ = hx.read(hf_lm.config.to_dict(), {k: v.numpy() for k, v in hf_lm.state_dict().items()})
  enc = model_config.encoder_config(pre.model)
  model = XLNetClassifier(enc, 2, summary_dropout=0.0, deterministic=False)
  params, fresh = init_params(model, jax.random.key(3), imported, None, parts=("transformer",))
  assert sorted(fresh) == ["logits_proj", "summary"]
  config = load_config("configs/finetune.py:tiny")
  config.model.classifier_dropout, config.learning_rate = 0.0, 3e-3  # two batches in turn: learnable in 20 steps
  steps, warmup = 20, 5
  tx = train.make_tx(config, params, enc, steps, warmup)
  step = jax.jit(functools.partial(train.train_step, model=model, tx=tx))
  hf, tensors = hx.export(pre, jax.tree.map(np.asarray, params), "classifier")
  reference = transformers.XLNetForSequenceClassification(
      transformers.XLNetConfig(**{k: v for k, v in hf.items() if k != "architectures"}))
  reference.load_state_dict({k: torch.tensor(v) for k, v in tensors.items()})
  reference = ref.reference_semantics(reference)
  o = config.optimizer
  opt = torch.optim.AdamW([{"params": [p], "weight_decay": 0.0 if no_decay(n) else o.weight_decay}
                           for n, p in reference.named_parameters()], lr=config.learning_rate, betas=(o.b1, o.b2),
                          eps=o.eps)
  factor = ref.SCHEDULES[o.schedule]
  sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda t: factor(t, warmup, steps))
  assert o.bias_correction and o.layerwise_decay == 1.0  # what the torch side above writes

  b, s, sep, cls = 8, 16, 4, 3
  ours, theirs = [], []
  state = tx.init(params)
  for t in range(steps):
    rng = np.random.default_rng(t % 2)
    n = rng.integers(6, s + 1, b)  # real tokens: A <sep> B <sep> <cls>
    ids, types, groups = np.full((b, s), 5), np.zeros((b, s), np.int64), np.zeros((b, s), np.int64)
    for i, k in enumerate(n):
      a = (k - 3) // 2
      ids[i, :k] = rng.integers(9, 64, k)
      ids[i, a], ids[i, k - 2], ids[i, k - 1] = sep, sep, cls
      types[i, a + 1:k - 1], types[i, k - 1], groups[i, :k] = 1, 2, 1
    label = (ids[:, 0] % 2).astype(np.int32)
    batch = dict(input_ids=ids.astype(np.int32), type_ids=types.astype(np.int32), groups=groups.astype(np.int32),
                 label=label, example_weight=np.ones(b, np.float32))
    params, state, loss = step(params, state, batch, jnp.uint32(0), jnp.int32(t))
    ours.append(float(loss))
    left = lambda x, fill: torch.tensor(np.stack([np.concatenate([np.full(s - k, fill), row[:k]])
                                                  for row, k in zip(x, n)]))
    out = reference(input_ids=left(ids, 5), token_type_ids=left(types, 3), attention_mask=left(groups, 0),
                    labels=torch.tensor(label, dtype=torch.long))
    theirs.append(ref.train_step(out.loss, opt, sched, list(reference.parameters()), o.clip_norm))
  np.testing.assert_allclose(ours, theirs, rtol=1e-3)
  assert np.mean(theirs[-5:]) < np.mean(theirs[:5])  # it learned
  _, final = hx.export(pre, jax.tree.map(np.asarray, params), "classifier")
  expected = reference.state_dict()
  for key, value in final.items():
    want = expected[key].detach().numpy()
    assert np.abs(value - want).max() / max(np.abs(want).max(), 1e-3) <= 1e-3, key


@pytest.mark.slow  # compiles XLNet's span model and trains 60 steps (~15 s of CPU)
def test_squad_simple_span_head_from_an_imported_xlnet(tmp_path, capsys):
  """SQuAD v1.1 from an imported XLNet: windows in XLNet's template (question <sep> context <sep> <cls>), the
  simple span head (XLNetForQuestionAnsweringSimple's qa_outputs), predictions scored as the official script
  scores them, and a model that starts to learn."""
  from bertjax.finetune.squad import evaluate as ev
  from test_squad import _tiny_squad

  data = tmp_path / "data"
  data.mkdir()
  words = [w for w in _tiny_squad(str(data), 120, 40, "1.1") if not w.startswith("[")]
  hf_dir = xlnet_dir(tmp_path, words, vocab=64)
  config = load_config("configs/finetune.py:squad1")
  config.task.source, config.init.checkpoint = f"json:{data}", str(hf_dir)
  config.seq_len, config.task.doc_stride, config.task.max_query_length = 32, 8, 8
  config.seeds, config.total_steps, config.batch_size, config.learning_rate = 1, 60, 16, 2e-3
  config.model.dropout = config.model.attention_dropout = 0.0
  results = train.finetune(config, str(tmp_path / "ft"))
  setup = train.prepare(config)
  tok, ids, groups = setup["loaded"].tokenizer, setup["train"]["input_ids"], setup["train"]["groups"]
  n = groups.sum(1)
  assert all(ids[i, n[i] - 1] == tok.special.cls and ids[i, n[i] - 2] == tok.special.sep for i in range(len(n)))
  model = setup["task"].model(config, setup["cfg"], setup["data"], deterministic=True)
  _, fresh = setup["task"].init_params(model, jax.random.key(0), setup["loaded"])
  assert fresh == ["qa_outputs"]
  seed = tmp_path / "ft" / "seed_0"
  official = ev.score_files(str(data / "dev-v1.1.json"), str(seed / "predictions.json"), "")
  assert results["per_seed"][0] == pytest.approx(official)
  assert official["f1"] > 15, official  # chance (a random span of a 4-sentence context) is well under 10
