"""`python -m bertjax.finetune.suite` (bertjax.finetune.suite, .glue) on tiny GLUE-layout TSVs made here: the
table and its averages, a missing task folder, resuming, the learning-rate grid, one-line errors."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from bertjax.core.errors import UserError
from bertjax.finetune import suite
from bertjax.finetune.classification import glue
from conftest import load_config, micro

WORDS = "the a cat dog sat ran on under mat rug big small red blue happy sad film movie good bad".split()


def _glue_dir(root, n=24):
  """SST-2 (sentence, label) and RTE (index, sentence1, sentence2, label) folders of n train / 8 dev rows."""
  rng = np.random.default_rng(0)
  sent = lambda: " ".join(rng.choice(WORDS, rng.integers(3, 9)))
  for folder, header, row in (
      ("SST-2", "sentence\tlabel", lambda i: f"{sent()}\t{i % 2}"),
      ("RTE", "index\tsentence1\tsentence2\tlabel",
       lambda i: f"{i}\t{sent()}\t{sent()}\t{('entailment', 'not_entailment')[i % 2]}")):
    os.makedirs(root / folder)
    for name, rows in (("train.tsv", n), ("dev.tsv", 8)):
      (root / folder / name).write_text(header + "\n" + "".join(row(i) + "\n" for i in range(rows)))


def _checkpoint(path):
  """A random micro BERT written as an HF checkpoint with a WordPiece vocabulary of WORDS."""
  from bertjax.data.tokenizer_spec import load_tokenizer
  from bertjax.hf import convert

  vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + sorted(WORDS)
  (path.parent / "vocab.txt").write_text("\n".join(vocab) + "\n")
  pre = micro("configs/bert.py:tiny")
  pre.model.vocab_size = len(vocab)
  convert.write_hf(pre, convert.init_params(pre, seed=0), str(path), load_tokenizer(f"wordpiece:{path.parent / 'vocab.txt'}"))
  return str(path)


@pytest.mark.slow  # a long compile or CLI run: the normal tier stays under 8 minutes cold
def test_the_suite_writes_the_table_reports_a_missing_task_and_resumes(tmp_path, capsys):
  _glue_dir(tmp_path / "glue")
  base = load_config("configs/finetune.py:tiny")
  overrides = {"init.checkpoint": _checkpoint(tmp_path / "hf"), "seq_len": 32, "total_steps": 3, "batch_size": 8,
               "eval_batch_size": 8, "task.max_train_examples": 16}
  base.init.checkpoint = overrides["init.checkpoint"]
  work = tmp_path / "w"
  rows = suite.run_suite(base, overrides, str(work), ["sst2", "cola", "rte"], "bert", "tsv", str(tmp_path / "glue"), 1)
  out = capsys.readouterr().out
  assert "[2/3] cola: missing: no" in out and "suite ETA" in out
  table = json.load(open(work / "glue.json"))
  assert list(table["tasks"]) == ["sst2", "cola", "rte"] and "missing" in table["tasks"]["cola"]["note"]
  for task in ("sst2", "rte"):
    saved = json.load(open(work / task / "results.json"))
    assert saved["steps"] == 3 and saved["train_examples"] == 16 and saved["learning_rate"] == 2e-5  # bert recipe
    assert rows[task]["metrics"]["accuracy"] == saved["summary"]["accuracy"]["median"]
  md = (work / "glue.md").read_text()
  assert "| SST-2 | Acc |" in md and "| RTE | Acc |" in md and "| CoLA |" in md and "missing" in md
  bert = table["averages"]["bert"]
  assert bert["covers"] == ["rte", "sst2"] and "cola" in bert["missing"]
  assert bert["value"] == pytest.approx(50 * (rows["sst2"]["metrics"]["accuracy"] + rows["rte"]["metrics"]["accuracy"]))
  assert "average as BERT computes it" in md and "partial" in md

  suite.run_suite(base, overrides, str(work), ["sst2", "rte"], "bert", "tsv", str(tmp_path / "glue"), 1)
  out = capsys.readouterr().out
  assert "sst2: finished earlier" in out and "rte: finished earlier" in out and "task sst2:" not in out
  assert json.load(open(work / "glue.json"))["tasks"]["rte"]["metrics"] == rows["rte"]["metrics"]


def test_task_configs_layer_file_recipe_overrides_and_suite_settings():
  base = load_config("configs/finetune.py:tiny")
  c = suite.task_config(base, {"learning_rate": 7e-5, "task.max_eval_examples": 5}, "rte", "electra", "tsv", "/g", 4, None)
  assert c.task.labels == "entailment,not_entailment" and c.task.source == "tsv:/g/RTE" and c.seeds == 4
  assert c.epochs == 10.0 and c.optimizer.layerwise_decay == 0.8  # ELECTRA: 10 epochs for RTE
  assert c.learning_rate == 7e-5 and c.task.max_eval_examples == 5  # --config.* wins over the recipe
  c = suite.task_config(base, {}, "mnli", "bert", "tfds", "", 0, 3e-5)
  assert (c.task.source, c.learning_rate, c.epochs, c.seeds) == ("tfds:glue/mnli", 3e-5, 3.0, base.seeds)
  assert c.task.extra_eval == "mismatched"


def test_the_grid_keeps_the_best_rate_on_dev_and_resumes(tmp_path, monkeypatch):
  from bertjax.finetune import train

  base = load_config("configs/finetune.py:tiny")
  configs = [suite.task_config(base, {}, "rte", "bert", "tsv", "/g", 1, lr) for lr in (2e-5, 5e-5)]
  ran = []

  def fake(config, workdir):
    ran.append(config.learning_rate)
    os.makedirs(workdir, exist_ok=True)
    with open(os.path.join(workdir, "config.json"), "w") as f:
      f.write(config.to_json())
    acc = 0.6 if config.learning_rate == 5e-5 else 0.5
    results = dict(per_seed=[{"accuracy": acc}], summary={"accuracy": {"median": acc}})
    with open(os.path.join(workdir, "results.json"), "w") as f:
      json.dump(results, f)
    return results

  monkeypatch.setattr(train, "finetune", fake)
  results, grid = suite.run_task(configs, str(tmp_path / "rte"))
  assert results["learning_rate"] == 5e-5 and grid == {"2e-05": 0.5, "5e-05": 0.6} and ran == [2e-5, 5e-5]
  assert json.load(open(tmp_path / "rte" / "config.json"))["learning_rate"] == 5e-5
  suite.run_task(configs, str(tmp_path / "rte"))
  assert ran == [2e-5, 5e-5]  # both grid points finished: nothing reruns


def test_averages_follow_the_papers():
  rows = {t: {"metrics": {m: 0.5 for _, m in glue.TASKS[t].columns}} for t in glue.DEFAULT_TASKS}
  rows["mnli"]["metrics"]["accuracy_mismatched"] = 0.8  # counted by BERT's average only
  avg = glue.averages(rows)
  assert avg["bert"]["cells"] == 9 and avg["bert"]["value"] == pytest.approx(100 * (8 * 0.5 + 0.8) / 9)
  assert avg["electra"]["cells"] == 8 and avg["electra"]["value"] == pytest.approx(50.0) and not avg["electra"]["missing"]


def test_unknown_tasks_are_a_one_line_error():
  with pytest.raises(UserError, match="unknown task.*squad"):
    suite.parse_tasks("sst2,squad")
  proc = subprocess.run([sys.executable, "-m", "bertjax.finetune.suite", "--tasks=sst2,nope", "--workdir=/tmp/unused"],
                        capture_output=True, text=True, timeout=300, env={**os.environ, "PYTHONPATH": os.getcwd()})
  assert proc.returncode == 2 and proc.stderr.strip().startswith("error: unknown task(s) nope")
  assert len(proc.stderr.strip().splitlines()) == 1
