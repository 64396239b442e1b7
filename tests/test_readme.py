"""Every `python -m bertjax.*` command README.md shows runs, with CPU-sized overrides where it is full-size."""

import importlib.util
import json
import os
import random
import re
import shlex
import subprocess
import sys
import time

import pytest

from conftest import REPO, toy_graphs

README = os.path.join(REPO, "README.md")

# Shortens a tiny pretraining run to a few steps (eval and checkpoint at the end, so later commands find them).
SHORT_RUN = ("--config.total_steps=20", "--config.log_every=10", "--config.eval_every=20",
             "--config.checkpoint_every=20")

# What each README command runs with here, keyed by (module, subcommand, --config): (replacements made in the
# command, flags appended). A README command missing from this table fails the test: add it with overrides
# that keep it CPU-sized. Absl takes the last occurrence of a flag, so appended flags win.
OVERRIDES = {
    ("bertjax.train", None, "configs/bert.py:tiny"): ({}, SHORT_RUN),
    ("bertjax.train", None, "configs/roberta.py:tiny"): ({}, SHORT_RUN),
    ("bertjax.train", None, "configs/albert.py:tiny"): ({}, SHORT_RUN),
    ("bertjax.train", None, "configs/electra.py:tiny"): ({}, SHORT_RUN),
    ("bertjax.train", None, "configs/spanbert.py:tiny"): ({}, SHORT_RUN),
    ("bertjax.train", None, "configs/structbert.py:tiny"): ({}, SHORT_RUN),
    ("bertjax.train", None, "configs/modernbert.py:tiny"): ({}, SHORT_RUN),
    ("bertjax.train", None, "configs/lite.py:tiny"): ({}, SHORT_RUN),
    ("bertjax.train", None, "configs/reformer.py:tiny"): ({}, SHORT_RUN),
    # The toy CoNLL file (task_data) is 150 sentences: a SentencePiece vocabulary that small text can fill.
    ("bertjax.train", None, "configs/ernie.py:tiny"): ({}, SHORT_RUN + ("--config.model.vocab_size=400",)),
    ("bertjax.train", None, "configs/wklm.py:tiny"): ({}, SHORT_RUN + ("--config.model.vocab_size=400",)),
    ("bertjax.train", None, "configs/tree.py:tiny"): ({}, SHORT_RUN),
    ("bertjax.compress.trees", None, None): ({}, ()),
    ("bertjax.train", None, "configs/tree.py:parsed_tiny"): ({}, SHORT_RUN),
    ("bertjax.train", None, "configs/complex_order.py:tiny"): ({}, SHORT_RUN),
    ("bertjax.summary", None, "configs/modernbert.py:base"): ({}, ()),
    # ModernBERT-base for a v4-32 compiles for about 17 minutes here: the same command for the tiny preset on a v4-8.
    ("bertjax.aot", None, "configs/modernbert.py:base"): (
        {"configs/modernbert.py:base": "configs/modernbert.py:tiny", "v4-32": "v4-8"}, ()),
    ("bertjax.finetune", None, "configs/finetune.py:tiny"): ({}, ("--config.total_steps=10",)),
    ("bertjax.finetune", None, "configs/finetune.py:sst2"): ({}, ("--config.total_steps=10", "--config.seeds=1")),
    ("bertjax.finetune.suite", None, "configs/finetune.py:tiny"): (
        {}, ("--config.task.max_train_examples=64", "--config.task.max_eval_examples=32", "--config.total_steps=5")),
    ("bertjax.finetune", None, "configs/finetune.py:squad2"): (
        {}, ("--config.seq_len=128", "--config.task.doc_stride=64", "--config.task.max_query_length=32",
             "--config.total_steps=10", "--config.seeds=1")),
    ("bertjax.finetune.squad.evaluate", "/data/squad/dev-v2.0.json", None): ({}, ()),
    # One entry for every family's predict command (they differ only in their flags).
    ("bertjax.finetune.predict", None, None): ({}, ()),
    ("bertjax.finetune", None, "configs/finetune.py:ner"): ({}, ("--config.total_steps=10", "--config.seeds=1")),
    ("bertjax.finetune", None, "configs/finetune.py:swag"): (
        {}, ("--config.seq_len=64", "--config.total_steps=10", "--config.seeds=1")),
    ("bertjax.finetune", None, "configs/xh.py:tiny"): ({}, ("--config.total_steps=10",)),
    ("bertjax.distill", None, "configs/distill.py:tiny"): ({}, SHORT_RUN),
    ("bertjax.summary", None, "configs/bert.py:base"): ({}, ()),
    ("bertjax.train", None, "configs/xlnet.py:tiny"): ({}, SHORT_RUN),
    ("bertjax.train", None, "configs/mobilebert.py:ib_bert_tiny"): ({}, SHORT_RUN),
    # Four phases of 2 steps, then 4 steps of pre-training distillation.
    ("bertjax.distill", None, "configs/mobilebert.py:tiny_transfer"): (
        {}, ("--config.transfer.steps=8", "--config.total_steps=4", "--config.log_every=2", "--config.eval_every=4",
             "--config.checkpoint_every=4")),
    ("bertjax.data.prepare", None, "configs/bert.py:tiny"): ({}, ("--workers=1",)),
    ("bertjax.hf", "fill_mask", None): ({}, ()),
    ("bertjax.hf", "export", None): ({}, ()),
    ("bertjax.hf", "import", None): ({}, ()),
    ("bertjax.compress.prune", "importance", None): ({}, ()),
    ("bertjax.compress.prune", "prune", None): ({}, ()),
    ("bertjax.compress.analysis", None, None): ({}, ("--max_texts=20",)),
    # BERT-large for a v4-32 slice compiles for minutes: the same command for tiny BERT on a v4-8.
    ("bertjax.aot", None, "configs/bert.py:large"): (
        {"configs/bert.py:large": "configs/bert.py:tiny", "v4-32": "v4-8", "--config.batch_size=256": "--config.batch_size=32",
         "--config.seq_len=512": "--config.seq_len=128"}, ()),
    ("bertjax.train.bench", None, "configs/bert.py:base"): (
        {"configs/bert.py:base": "configs/bert.py:tiny"}, ("--steps=2", "--warmup=1")),
}
# Commands cheap enough for the normal tier (no training, no TPU compile).
CHEAP = {("bertjax.summary", None, "configs/bert.py:base"), ("bertjax.summary", None, "configs/modernbert.py:base")}


def _fenced_blocks(text):
  return re.findall(r"```bash\n(.*?)```", text, re.S)


def readme_commands(text):
  """Every `python -m bertjax.*` command in README.md, in order of appearance, once each: from ```bash blocks
  (continuation lines joined, trailing `# comments` dropped) and from inline code spans (tables)."""
  found = []
  for block in _fenced_blocks(text):
    for line in block.replace("\\\n", " ").splitlines():
      line = re.sub(r"\s+#\s.*$", "", line).strip()
      if line.startswith("python -m bertjax."):
        found.append(" ".join(line.split()))
  found += [" ".join(c.split()) for c in re.findall(r"`(python -m bertjax\.[^`]+)`", text)]
  return list(dict.fromkeys(found))


def setup_scripts(text):
  """The README's inline Python scripts (`python - <<'EOF' ... EOF`) that make a command's input data."""
  return re.findall(r"^(python - <<'EOF'\n.*?\nEOF)$", text, re.S | re.M)


def command_key(command):
  """(module, subcommand or None, --config value or None): what the overrides table is keyed by."""
  args = shlex.split(command)
  module, rest = args[2], args[3:]
  sub = rest[0] if rest and not rest[0].startswith("-") else None
  config = next((a.split("=", 1)[1] for a in rest if a.startswith("--config=")), None)
  return module, sub, config


def cpu_sized(command, tmp):
  """The command as the test runs it: overrides applied, /tmp/ paths moved under `tmp`, and the datasets
  the README calls /data/NAME replaced by the toy ones `task_data` writes to `tmp`/data/NAME."""
  replace, extra = OVERRIDES[command_key(command)]
  for old, new in replace.items():
    command = command.replace(old, new)
  args = shlex.split(command.replace("/tmp/", f"{tmp}/").replace("/data/", f"{tmp}/data/"))
  return [sys.executable, *args[1:], *extra]


def _run(args, timeout=900):
  """Runs from the repository root, as README's relative `configs/` paths expect."""
  env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
  return subprocess.run(args, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)


TEXT = open(README).read()
COMMANDS = readme_commands(TEXT)


def test_readme_commands_are_found_and_each_has_cpu_overrides():
  assert len(COMMANDS) >= 15, COMMANDS  # the extractor sees the blocks and the tables
  assert "python -m bertjax.train --config=configs/bert.py:tiny --workdir=/tmp/bert-tiny" in COMMANDS
  unknown = [c for c in COMMANDS if command_key(c) not in OVERRIDES]
  assert not unknown, f"README commands without an entry in OVERRIDES (add CPU-sized overrides): {unknown}"
  stale = set(OVERRIDES) - {command_key(c) for c in COMMANDS}
  assert not stale, f"OVERRIDES entries for commands README no longer shows: {stale}"
  assert len(setup_scripts(TEXT)) == 1  # the toy task the fine-tuning commands read


def test_ci_runs_the_readme_install_and_test_commands_then_the_slow_tier():
  section = TEXT.split("## Install and test", 1)[1]
  commands = [l.strip() for l in _fenced_blocks(section)[0].splitlines() if l.strip()]
  assert commands == ['pip install -e ".[test]"', "pytest"], commands
  ci = [l.strip() for l in open(os.path.join(REPO, ".ci", "run")) if l.strip() and not l.lstrip().startswith("#")]
  assert "set -euo pipefail" in ci
  at = [ci.index(c) for c in commands]
  assert at == sorted(at) and any(l.startswith("pytest -m slow") for l in ci[at[-1] + 1:]), ci


def _exists(module):
  try:
    return importlib.util.find_spec(module) is not None
  except ModuleNotFoundError:  # a parent that is a module, not a package
    return False


def test_readme_command_modules_exist():
  missing = sorted({command_key(c)[0] for c in COMMANDS if not _exists(command_key(c)[0])})
  assert not missing, f"README names modules that do not exist: {missing}"


@pytest.mark.parametrize("command", [c for c in COMMANDS if command_key(c) in CHEAP])
def test_cheap_readme_commands_run(command, tmp_path):
  proc = _run(cpu_sized(command, tmp_path))
  assert proc.returncode == 0, f"{command}\n{proc.stderr[-3000:]}"


def _sentences():
  import pydoc_data.topics as topics

  text = " ".join(" ".join(v.split()) for v in topics.topics.values())
  return [s for s in re.split(r"(?<=[.!?])\s+", text) if 6 <= len(s.split()) <= 20]


def task_data(tmp):
  """Toy datasets in the layouts the README's task commands read (/data/NAME there, tmp/data/NAME here), made
  from Python's own docs: a GLUE root (SST-2 as the README's toy task, RTE: is B the sentence after A?),
  SQuAD v2.0 (which word follows X?, some unanswerable), CoNLL (capitalized words as entities),
  multiple-choice JSONL (the true next sentence among three), graphs of linked sentences (conftest.toy_graphs)
  and bracketed trees (tree attention)."""
  sents, rng, root = _sentences(), random.Random(0), f"{tmp}/data"

  def write(path, text):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    open(path, "w").write(text)

  for name in ("train.tsv", "dev.tsv"):
    write(f"{root}/glue/SST-2/{name}", open(f"{tmp}/toy-sst2/{name}").read())
    rows = [f"{i}\t{a}\t{b if y else rng.choice(sents)}\t{'entailment' if y else 'not_entailment'}\n"
            for i, (a, b, y) in enumerate((a, b, rng.random() < 0.5) for a, b in zip(sents[:120], sents[1:121]))]
    write(f"{root}/glue/RTE/{name}", "index\tsentence1\tsentence2\tlabel\n" + "".join(rows))
  for name, part in (("train-v2.0.json", sents[:60]), ("dev-v2.0.json", sents[60:90])):
    qas = []
    for i, s in enumerate(part):
      words = s.split()
      k = rng.randrange(len(words) - 1)
      answerable = i % 3 != 0
      qas.append({"context": s, "qas": [{"id": f"{name}-{i}", "question": f"Which word follows {words[k]}?",
                                          "answers": [{"text": words[k + 1], "answer_start": s.index(words[k + 1], len(" ".join(words[:k + 1])))}] if answerable else [],
                                          "is_impossible": not answerable}]})
    write(f"{root}/squad/{name}", json.dumps({"version": "v2.0", "data": [{"title": "toy", "paragraphs": qas}]}))
  for name, part in (("train.txt", sents[:150]), ("dev.txt", sents[150:200])):
    lines = []
    for s in part:
      prev = "O"
      for w in s.split():
        tag = "O" if not w[:1].isupper() else ("I-CAP" if prev != "O" else "B-CAP")
        lines.append(f"{w} {tag}")
        prev = tag
      lines.append("")
    write(f"{root}/conll/{name}", "\n".join(lines) + "\n")
  for name, part in (("train.jsonl", range(0, 80)), ("dev.jsonl", range(80, 110))):
    rows = []
    for i in part:
      choices = [sents[i + 1], sents[rng.randrange(len(sents))], sents[rng.randrange(len(sents))]]
      order = rng.sample(range(3), 3)
      rows.append(json.dumps({"context": sents[i], "question": "", "choices": [choices[j] for j in order],
                              "label": order.index(0)}))
    write(f"{root}/mc/{name}", "\n".join(rows) + "\n")
  for name, n, seed in (("train.jsonl", 60, 0), ("dev.jsonl", 20, 1)):  # Transformer-XH: graphs of sentences
    write(f"{root}/graphs/{name}", "\n".join(toy_graphs(sents, n, "classification", seed)) + "\n")
  # Bracketed trees (tree attention on given parses): short sentences, words paired into NPs, the first half of
  # the phrases under a VP when there are enough of them; classified by whether that VP is there.
  short = [s.replace("(", "-LRB-").replace(")", "-RRB-").split() for s in sents if len(s.split()) <= 10]
  parsed = []
  for words in short[:300]:
    phrases = [w[0] if len(w) == 1 else f"(NP {' '.join(w)})" for w in (words[i:i + 2] for i in range(0, len(words), 2))]
    half = len(phrases) // 2
    parsed.append(f"(S (VP {' '.join(phrases[:half])}) {' '.join(phrases[half:])})" if half > 1 and rng.random() < 0.5
                  else f"(S {' '.join(phrases)})")
  write(f"{root}/trees/train.txt", "\n".join(parsed) + "\n")
  for name, part in (("train.tsv", parsed[:200]), ("dev.tsv", parsed[200:])):
    write(f"{root}/trees/{name}", "sentence\tlabel\n" + "".join(f"{t}\t{int('(VP' in t)}\n" for t in part))


@pytest.mark.slow
def test_every_readme_command_runs_in_order(tmp_path):
  """The README's commands in its own order (later ones read what earlier ones wrote), CPU-sized."""
  for script in setup_scripts(TEXT):
    subprocess.run(["bash", "-c", script.replace("/tmp/", f"{tmp_path}/")], cwd=tmp_path, check=True)
  task_data(str(tmp_path))
  failures = []
  for command in COMMANDS:
    start = time.time()
    proc = _run(cpu_sized(command, tmp_path))
    print(f"{time.time() - start:6.1f} s  rc {proc.returncode}  {command}")
    if proc.returncode != 0:
      failures.append(f"{command}\n  exit {proc.returncode}: {proc.stderr.strip()[-2000:]}")
  assert not failures, "README commands that failed:\n" + "\n".join(failures)


PREDICT = [c for c in COMMANDS if command_key(c)[0] == "bertjax.finetune.predict"]


def _finetune_command(workdir):
  """The README command that fine-tunes into `workdir` (the one whose saved model a predict command reads)."""
  return next(c for c in COMMANDS if command_key(c)[0] == "bertjax.finetune" and f"--workdir={workdir}" in c)


def _config_of(command, tmp):
  """The fine-tuning config a README command runs with (its --config file and --config.* overrides, CPU-sized)."""
  import ast

  from bertjax.core import config as config_lib

  args = cpu_sized(command, tmp)[3:]
  config = config_lib.load(os.path.join(REPO, next(a.split("=", 1)[1] for a in args if a.startswith("--config="))))
  for a in args:
    if a.startswith("--config."):
      key, value = a[len("--config."):].split("=", 1)
      *path, last = key.split(".")
      node = config
      for p in path:
        node = node[p]
      try:
        node[last] = type(node[last])(ast.literal_eval(value))
      except (ValueError, SyntaxError):
        node[last] = value
  return config


def _saved_model(command, tmp):
  """What the README's fine-tuning command saves as WORKDIR/seed_0/model, made without training (the
  checkpoint a micro BERT with the toy data's words): the model a predict command reads, and its workdir."""
  from bertjax.finetune import train
  from conftest import tiny_hf_checkpoint

  workdir = re.search(r"--model=(\S+)/seed_0/model", command).group(1)
  config = _config_of(_finetune_command(workdir), tmp)
  words = sorted({w for s in _sentences() for w in re.findall(r"\w+|[^\w\s]", s.lower())})
  config.init.checkpoint = tiny_hf_checkpoint(tmp, ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + words)
  config.eval_batch_size = 8
  config.task.max_train_examples = config.task.max_eval_examples = 8
  out = f"{tmp}/{workdir.removeprefix('/tmp/')}"
  os.makedirs(f"{out}/seed_0", exist_ok=True)
  with open(f"{out}/config.json", "w") as f:
    f.write(config.to_json())
  setup = train.prepare(config)
  model, params = train.seed_start(config, 0, setup)
  setup["task"].save_model(f"{out}/seed_0/model", setup["run_config"], model.clone(deterministic=True), params)
  return config


@pytest.mark.parametrize("command", PREDICT, ids=lambda c: re.search(r"ft-(\w+)", c).group(1))
def test_readme_predict_commands_run_for_every_family(command, tmp_path, capsys):
  """Each family's README predict command, in-process, over a model saved as its README fine-tuning command
  saves it: one JSON line per example (or the family's own files under --out=DIR)."""
  from bertjax.finetune import predict

  for script in setup_scripts(TEXT):
    subprocess.run(["bash", "-c", script.replace("/tmp/", f"{tmp_path}/")], cwd=tmp_path, check=True)
  task_data(str(tmp_path))
  config = _saved_model(command, tmp_path)
  args = cpu_sized(command, tmp_path)[3:]
  assert predict.main(args) == 0, capsys.readouterr().err
  lines = capsys.readouterr().out.splitlines()
  kind = config.task.get("kind", "classification")
  flags = dict(a[2:].split("=", 1) for a in args)
  if "out" in flags and not flags["out"].endswith(".jsonl"):  # squad: the fine-tuning run's prediction files
    preds = json.load(open(os.path.join(flags["out"], "predictions.json")))
    assert kind == "squad" and len(preds) == 30 and os.path.isfile(os.path.join(flags["out"], "null_odds.json"))
    return
  records = [json.loads(l) for l in (open(flags["out"]) if "out" in flags else lines)]
  if kind == "tagging":
    assert len(records) == 1 and len(records[0]["tags"]) == len(records[0]["words"]) == len(flags["text"].split())
  elif kind == "multiple_choice":
    assert len(records) == 30 and all(0 <= r["choice"] < 3 and len(r["scores"]) == 3 for r in records)
  else:
    n = sum(1 for l in open(flags.get("lines") or flags["input"]) if l.strip()) - (0 if "lines" in flags else 1)
    assert len(records) == n and all(r["label"] in ("0", "1") and len(r["scores"]) == 2 for r in records)
