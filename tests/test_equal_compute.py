"""benchmarks/equal_compute.py end to end at its micro scale on text and a task made here from Python's own docs:
two methods pretrained at one FLOPs budget with one tokenizer, fine-tuned on a toy SST-2, one table; a rerun skips
every finished piece."""

import importlib.util
import os
import random
import re

import pytest
from pydoc_data.topics import topics

from conftest import REPO


def _module():
  spec = importlib.util.spec_from_file_location("equal_compute", os.path.join(REPO, "benchmarks", "equal_compute.py"))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def _data(root) -> str:
  """root laid out as ../shared/data: pretrain/{wiki,books}-00.txt (a document per topic, a paragraph a line) and
  glue/SST-2 (is the sentence in its own word order, 1, or shuffled, 0?)."""
  docs = ["\n".join(p for p in re.split(r"\n\s*\n", text) if p.strip()).replace("\n\n", "\n")
          for text in topics.values()]
  docs = ["\n".join(" ".join(line.split()) for line in d.splitlines() if line.strip()) for d in docs]
  os.makedirs(root / "pretrain")
  (root / "pretrain" / "wiki-00.txt").write_text("\n\n".join(docs[0::2]) + "\n")
  (root / "pretrain" / "books-00.txt").write_text("\n\n".join(docs[1::2]) + "\n")
  r = random.Random(0)
  sentences = [x for v in topics.values() for x in re.split(r"(?<=[.!?])\s+", " ".join(v.split()))
               if 5 <= len(x.split()) <= 25]

  def row(x):
    w, y = x.split(), r.random() < 0.5
    return " ".join(w if y else r.sample(w, len(w))) + f"\t{int(y)}\n"

  os.makedirs(root / "glue" / "SST-2")
  for name, part in (("train.tsv", sentences[:300]), ("dev.tsv", sentences[300:400])):
    (root / "glue" / "SST-2" / name).write_text("sentence\tlabel\n" + "".join(map(row, part)))
  return str(root)


@pytest.mark.slow  # two pretraining commands (a JAX start and a compile each) and fine-tuning: 26-164 s on 2 cores
def test_two_methods_at_equal_flops_then_a_rerun_skips_them(tmp_path):
  bench = _module()
  data = _data(tmp_path / "data")
  argv = ["--scale=micro", "--methods=bert,electra", "--tasks=sst2", "--seeds=1", f"--data_dir={data}",
          f"--workdir={tmp_path / 'work'}", "--quiet", "--buckets=none"]
  out = bench.main(argv)
  budget = bench.SCALES["micro"]["budget"]
  rows = out["rows"]
  assert list(rows) == ["bert", "electra"]
  for name, r in rows.items():
    p = r["pretrain"]
    # Equal compute: as many steps as the budget pays for at the method's own analytic FLOPs per step.
    assert p["steps"] == int(budget // p["flops_per_step"]) >= 1 and p["flops"] <= budget
    assert p["eval"] and not p.get("skipped")
    # One pretraining rate for every method (ELECTRA-Small's), whatever each tiny recipe's own.
    assert p["lr"] == bench.PRETRAIN_LR and f"--config.learning_rate={bench.PRETRAIN_LR!r}" in p["command"]
    sst2 = r["tasks"]["sst2"]
    assert 0 <= sst2["median"] <= 1 and sst2["seeds"][0]["eval_examples"] == 100
  # ELECTRA's step costs more (its generator counts), so it gets fewer steps of the same budget.
  assert rows["electra"]["pretrain"]["flops_per_step"] > rows["bert"]["pretrain"]["flops_per_step"]
  assert "RTD AUC" in out["table"] and "MLM" in out["table"]
  lines = {line.split()[0]: line for line in out["table"].splitlines() if line.split()}
  for name in rows:
    assert re.search(r"\d\.\d{4}$", lines[name]), lines[name]  # the sst2 median at the row's end

  again = bench.main(argv)  # every piece is finished: the rerun reads them back
  for name, r in again["rows"].items():
    assert r["pretrain"]["skipped"] and r["tasks"]["sst2"]["skipped"]
    assert r["tasks"]["sst2"]["median"] == rows[name]["tasks"]["sst2"]["median"]
  assert again["table"].splitlines()[-4:] == out["table"].splitlines()[-4:]
  with pytest.raises(SystemExit, match="--lr=0.0005, not .* and --lr=0.001; use another --workdir"):
    bench.main([*argv, "--lr=1e-3"])  # a finished piece of another rate is not reused
