"""Fine-tuning: metrics, layer-wise decay, TSV reading, and a tiny model learning a generated pair task."""

import json
import os
import random

import numpy as np
import pytest
import tokenizers

from bertjax.data import sources
from bertjax.finetune import train as ft_train
from bertjax.finetune.classification import data as task_data, metrics
from bertjax.finetune.model import layer_multipliers
from bertjax.hf import convert
from bertjax.model.hparams import EncoderConfig
from conftest import load_config, micro


def test_metrics_match_their_definitions():
  pred, label = np.array([1, 1, 0, 0, 1]), np.array([1, 0, 0, 1, 1])
  assert metrics.accuracy(pred, label) == pytest.approx(0.6)
  assert metrics.f1(pred, label) == pytest.approx(2 * 2 / (2 * 2 + 1 + 1))
  assert metrics.mcc(pred, label) == pytest.approx((2 * 1 - 1 * 1) / np.sqrt(3 * 3 * 2 * 2))
  assert metrics.spearman(np.array([0.1, 0.5, 0.3]), np.array([1.0, 3.0, 2.0])) == pytest.approx(1.0)
  s = ft_train.summarize([{"accuracy": 0.5}, {"accuracy": 0.7}, {"accuracy": 0.9}])["accuracy"]
  assert (s["median"], s["mean"]) == (pytest.approx(0.7), pytest.approx(0.7))
  assert s["std"] == pytest.approx(np.std([0.5, 0.7, 0.9]))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_metrics_match_scikit_learn_and_scipy(seed):
  sklearn_metrics = pytest.importorskip("sklearn.metrics")
  import scipy.stats

  rng = np.random.default_rng(seed)
  label = rng.integers(0, 2, 200)
  pred = np.where(rng.random(200) < 0.7, label, 1 - label)  # correlated, imbalanced by chance
  assert metrics.accuracy(pred, label) == pytest.approx(sklearn_metrics.accuracy_score(label, pred))
  assert metrics.f1(pred, label) == pytest.approx(sklearn_metrics.f1_score(label, pred))
  assert metrics.mcc(pred, label) == pytest.approx(sklearn_metrics.matthews_corrcoef(label, pred))
  scores, gold = rng.normal(size=100), rng.normal(size=100)
  gold = gold + scores  # correlated
  scores[:10] = scores[0]  # ties, which Spearman ranks by their average
  assert metrics.pearson(scores, gold) == pytest.approx(scipy.stats.pearsonr(scores, gold).statistic)
  assert metrics.spearman(scores, gold) == pytest.approx(scipy.stats.spearmanr(scores, gold).statistic)
  # The task-level entry point: logits -> argmax, a single column -> regression scores.
  logits = np.stack([1 - pred, pred], 1).astype(np.float32)
  assert metrics.compute(["accuracy", "f1"], logits, label) == pytest.approx(
      {"accuracy": sklearn_metrics.accuracy_score(label, pred), "f1": sklearn_metrics.f1_score(label, pred)})


def test_layerwise_decay_follows_electra():
  cfg = EncoderConfig(vocab_size=10, hidden_size=8, num_layers=3, num_heads=2, intermediate_size=16, embedding_size=8)
  params = {"embeddings": {"word": np.zeros((10, 8))}, "encoder": {"layers": {"k": np.zeros((3, 8, 8))}},
            "pooler": {"kernel": np.zeros((8, 8))}, "classifier": {"kernel": np.zeros((8, 2))}}
  m = layer_multipliers(params, cfg, 0.5)
  assert float(m["embeddings"]["word"]) == 0.5 ** 5  # depth 0 of L + 2 = 5
  np.testing.assert_allclose(np.asarray(m["encoder"]["layers"]["k"]).ravel(), [0.5 ** 4, 0.5 ** 3, 0.5 ** 2])
  assert float(m["pooler"]["kernel"]) == 0.5 and float(m["classifier"]["kernel"]) == 1.0


def test_tsv_reader_maps_labels_and_skips_bad_rows(tmp_path):
  (tmp_path / "train.tsv").write_text("index\tsentence1\tsentence2\tlabel\n0\tA b.\tC d.\tnot_entailment\n"
                                      "1\tE.\tF.\tentailment\n2\tshort row\n3\tG.\tH.\t-\n")
  task = load_config("configs/finetune.py:rte").task
  ex = task_data.read_tsv(str(tmp_path / "train.tsv"), task)
  assert ex.a == ["A b.", "E."] and ex.b == ["C d.", "F."] and ex.skipped == 2
  assert ex.labels.tolist() == [1, 0]


def test_tfds_tasks_are_read_as_pretraining_sources_are(monkeypatch):
  """glue/rte through tfds's random-access reader (no TensorFlow), tfds's label ids mapped to the task's
  label names, test-split rows (label -1) skipped."""
  import sys
  import types

  calls = []
  examples = [dict(sentence1=b"A b.", sentence2=b"C d.", label=1), dict(sentence1=b"E.", sentence2=b"F.", label=0),
              dict(sentence1=b"G.", sentence2=b"H.", label=-1)]
  fake = types.ModuleType("tensorflow_datasets")
  fake.data_source = lambda name, split, data_dir: calls.append((name, split)) or examples
  monkeypatch.setitem(sys.modules, "tensorflow_datasets", fake)
  task = load_config("configs/finetune.py:rte").task
  task.source = "tfds:glue/rte"
  ex = task_data.read_split(task, train=False)
  assert calls == [("glue/rte", task.eval_split)]
  assert ex.a == ["A b.", "E."] and ex.b == ["C d.", "F."] and ex.skipped == 1
  tf_names, names = task.tfds_labels.split(","), task.labels.split(",")
  assert ex.labels.tolist() == [names.index(tf_names[1]), names.index(tf_names[0])]
  assert "tensorflow" not in sys.modules


def _pair_task(directory, n_train=3000, n_eval=300):
  """"Is B a word-shuffled copy of A, or another sentence?" from Python's own docs (balanced labels)."""
  stats = sources.SourceStats()
  sents = sorted({s for doc in sources.documents("demo", stats) for s in doc if 4 <= len(s.split()) <= 10})
  rng = random.Random(0)
  rng.shuffle(sents)

  def rows(pool, n):
    out = []
    for i in range(n):
      a = pool[i % len(pool)]
      if rng.random() < 0.5:  # drawn, not alternated: a sentence's label must not give the answer away
        words = a.split()
        rng.shuffle(words)
        out.append((a, " ".join(words), "1"))
      else:
        out.append((a, rng.choice(pool), "0"))
    return out

  half = len(sents) // 2
  for name, data in (("train.tsv", rows(sents[:half], n_train)), ("dev.tsv", rows(sents[half:], n_eval))):
    with open(os.path.join(directory, name), "w") as f:
      f.write("sentence1\tsentence2\tlabel\n" + "".join(f"{a}\t{b}\t{y}\n" for a, b, y in data))
  words = set()
  pre = tokenizers.pre_tokenizers.BertPreTokenizer()
  for s in sents:
    words.update(w for w, _ in pre.pre_tokenize_str(s.lower()))
  return ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + sorted(words)


def pair_task_and_checkpoint(tmp_path, n_train=3000, **model):
  """(task dir, HF checkpoint dir): the generated pair task and a randomly initialized tiny BERT over its
  WordPiece vocabulary (`model`: other model keys), written as an HF checkpoint (fine-tuning reads it through the
  importer)."""
  from bertjax.data.tokenizer_spec import load_tokenizer

  task_dir, ckpt = tmp_path / "task", str(tmp_path / "hf")
  task_dir.mkdir()
  vocab = _pair_task(str(task_dir), n_train)
  (tmp_path / "vocab.txt").write_text("\n".join(vocab) + "\n")
  pre = micro("configs/bert.py:tiny")
  pre.model.vocab_size = len(vocab)
  pre.model.update(model)
  if pre.model.type_vocab_size < 2:  # no sentence pairs to pretrain on: no NSP head
    pre.objectives.nsp = 0.0
  convert.write_hf(pre, convert.init_params(pre, seed=0), ckpt, load_tokenizer(f"wordpiece:{tmp_path / 'vocab.txt'}"))
  return task_dir, ckpt


@pytest.mark.slow  # > 15 s cold: the normal tier stays under 8 minutes (README)
def test_tiny_model_learns_a_generated_pair_task(tmp_path, capsys):
  from bertjax.finetune import train

  task_dir, ckpt = pair_task_and_checkpoint(tmp_path)

  config = load_config("configs/finetune.py:tiny")
  config.task.name, config.task.text_a, config.task.text_b = "pairs", "sentence1", "sentence2"
  config.task.metrics = "accuracy,f1,mcc"
  config.task.source, config.init.checkpoint = f"tsv:{task_dir}", ckpt
  config.seeds, config.total_steps, config.seq_len, config.learning_rate = 2, 300, 32, 2e-3
  config.model.dropout = config.model.attention_dropout = 0.0  # a random-init encoder learns faster without
  # A positive pair repeats its sentence, so here length predicts the label: batches grouped by length would
  # be label-skewed. Buckets stay on (seq_len 32 is one bucket; tests/test_finetune_batches.py covers them).
  config.length_window = 0
  config.save_model = True
  results = train.finetune(config, str(tmp_path / "ft"))
  out = capsys.readouterr().out
  assert "task pairs: 3000 train / 300 eval examples" in out and "pairs accuracy: median" in out
  accs = [m["accuracy"] for m in results["per_seed"]]
  assert len(accs) == 2 and min(accs) > 0.8, accs  # chance is 0.5
  assert results["summary"]["accuracy"]["median"] == pytest.approx(np.median(accs))
  saved = json.load(open(tmp_path / "ft" / "results.json"))
  assert saved["per_seed"] == results["per_seed"]
  assert os.path.exists(tmp_path / "ft" / "seed_1" / "metrics.jsonl")
  # save_model: each seed's fine-tuned classifier loads back and scores what the run reported.
  from bertjax.finetune import model as ft_model
  from bertjax.finetune.classification import model as cls_model

  _, model, params = cls_model.load_model(str(tmp_path / "ft" / "seed_1" / ft_model.MODEL_DIR))
  evals = train.prepare(config)["eval"]
  assert train.predict(params, evals, model, 64).argmax(-1).__eq__(evals["label"]).mean() == accs[1]


def test_checkpointed_fine_tuning_resumes_exactly_and_reuses_finished_seeds(tmp_path, monkeypatch, capsys):
  """A seed killed mid-run resumes from its last checkpoint and trains on as if never stopped (same losses step by
  step, same result); a finished seed is reused; another recipe in the same workdir is a one-line error."""
  from bertjax.core.errors import UserError

  task_dir, ckpt = pair_task_and_checkpoint(tmp_path, n_train=64)
  config = load_config("configs/finetune.py:tiny")
  config.task.name, config.task.text_a, config.task.text_b = "pairs", "sentence1", "sentence2"
  config.task.source, config.init.checkpoint = f"tsv:{task_dir}", ckpt
  config.total_steps, config.seq_len, config.log_every = 10, 32, 1  # dropout on: its draws must resume too
  setup = ft_train.prepare(config)  # shared, as finetune() shares it between seeds: one compiled step for all runs
  other = config.copy_and_resolve_references()
  other.learning_rate *= 2

  def run(name, config=config):
    return ft_train.run_seed(config, 0, setup, str(tmp_path / name))

  def losses(name):
    rows = [json.loads(line) for line in open(tmp_path / name / "seed_0" / "metrics.jsonl")]
    return {r["step"]: r["train/loss"] for r in rows if "train/loss" in r}

  straight = run("straight")
  config.checkpoint_every = 4
  original = ft_train.train_batch

  def killed_at_step_6(arrays, step, *a, **k):
    if step == 6:
      raise KeyboardInterrupt
    return original(arrays, step, *a, **k)

  monkeypatch.setattr(ft_train, "train_batch", killed_at_step_6)
  with pytest.raises(KeyboardInterrupt):
    run("resumed")
  monkeypatch.setattr(ft_train, "train_batch", original)
  assert os.listdir(tmp_path / "resumed" / "seed_0" / "checkpoints") == ["4"]  # keeps the last
  other.checkpoint_every = 4
  with pytest.raises(UserError, match=r"the checkpoint at step 4 in .* is another fine-tuning recipe's; pass a new"):
    run("resumed", other)
  capsys.readouterr()
  resumed = run("resumed")
  assert "seed 0: resumed at step 4" in capsys.readouterr().out
  ours, reference = losses("resumed"), losses("straight")
  assert sorted(ours) == list(range(1, 11))  # steps 1-6 before the kill, 5-10 after it (the later line counts)
  for step in range(5, 11):
    assert ours[step] == pytest.approx(reference[step], rel=1e-6, abs=1e-7), step
  assert resumed == pytest.approx(straight)
  assert not os.path.exists(tmp_path / "resumed" / "seed_0" / "checkpoints")  # done: result.json stands for them
  assert run("resumed") == resumed and "seed 0: finished earlier" in capsys.readouterr().out
  with pytest.raises(UserError, match=r"result.json is another fine-tuning recipe's; pass a new --workdir"):
    run("resumed", other)
  with pytest.raises(UserError, match="another fine-tuning recipe's"):  # the command refuses before writing anything
    ft_train.finetune(other, str(tmp_path / "resumed"))
  assert sorted(os.listdir(tmp_path / "resumed")) == ["seed_0"]  # no config.json of the refused recipe


def test_a_one_segment_model_reads_a_pairs_second_segment_as_type_0(tmp_path):
  """RoBERTa's shape (one segment type) fine-tuned on pairs: the tokenizer gives segment B type 1, past the
  model's table (its embedding would be NaN, and so every loss); the trainer reads it as type 0, as RoBERTa's own
  tokenizer encodes a pair."""
  task_dir, ckpt = pair_task_and_checkpoint(tmp_path, n_train=64, type_vocab_size=1)
  config = load_config("configs/finetune.py:tiny")
  config.task.name, config.task.text_a, config.task.text_b = "pairs", "sentence1", "sentence2"
  config.task.source, config.init.checkpoint, config.seq_len = f"tsv:{task_dir}", ckpt, 32
  setup = ft_train.prepare(config)
  assert setup["cfg"].type_vocab_size == 1
  for arrays in (setup["train"], setup["eval"]):
    assert arrays["type_ids"].max() == 0 and arrays["groups"].sum(1).min() > 6  # pairs, all of type 0
  two = ft_train.fit_type_ids({"type_ids": np.array([[0, 0, 1, 1, 0]])}, 2)["type_ids"]
  np.testing.assert_array_equal(two, [[0, 0, 1, 1, 0]])  # a model with both types keeps them


def test_a_workdir_without_a_pooler_has_no_extra_pooler(tmp_path):
  """ELECTRA and RoBERTa checkpoints have no pooler: fine-tuning must start a fresh one, not an abstract one."""
  from bertjax.hf import workdir
  from bertjax.train import checkpoint

  ckpt = checkpoint.Checkpointer(str(tmp_path))
  params = {"pooler": {"kernel": np.ones((4, 4), np.float32), "bias": np.zeros(4, np.float32)}}
  ckpt.save(1, {"params": {"encoder": {"w": np.ones(3, np.float32)}}, "step": np.int32(1)}, {}, force=True)
  ckpt.wait()
  assert workdir._extra_pooler(str(tmp_path), 4) is None
  ckpt.save(2, {"params": {**params, "encoder": {"w": np.ones(3, np.float32)}}, "step": np.int32(2)}, {}, force=True)
  ckpt.close()
  np.testing.assert_array_equal(workdir._extra_pooler(str(tmp_path), 4)["kernel"], params["pooler"]["kernel"])


def test_epoch_modes_count_steps_and_batches_as_their_references():
  from bertjax.finetune import train as ft

  config = load_config("configs/finetune.py:sst2")
  config.batch_size, config.epochs, config.total_steps = 32, 3.0, 0
  assert ft.step_counts(config, 70) == (6, 0)  # bert: int(3 * 70 / 32), int(0.1 * 6)
  config.epoch_mode = "transformers"
  assert ft.step_counts(config, 70) == (9, 1)  # Trainer: ceil(70 / 32) * 3, ceil(0.9)
  arrays = {"input_ids": np.arange(70)[:, None].repeat(4, 1), "label": np.arange(70)}
  epochs = []
  for epoch in range(3):
    batches = [ft.train_batch(arrays, epoch * 3 + k, config, seed=5) for k in range(3)]
    weights = np.concatenate([b["example_weight"] for b in batches])
    assert [int(b["example_weight"].sum()) for b in batches] == [32, 32, 6]
    seen = np.concatenate([b["label"] for b in batches])[weights > 0]
    assert sorted(seen.tolist()) == list(range(70))  # every example exactly once an epoch
    epochs.append(seen)
  assert not np.array_equal(epochs[0], epochs[1])  # reshuffled every epoch
  config.epoch_mode = "epochs"
  with pytest.raises(Exception, match="epoch_mode"):
    ft.validate(dict_config(config, init={"checkpoint": "x"}, task={"source": "tsv:x"}))


def dict_config(config, **sections):
  c = config.copy_and_resolve_references()
  for name, values in sections.items():
    c[name].update(values)
  return c
