"""Bad input gives a one-line error and exit code 2 (or a counted warning), and leaves a workdir intact."""

import os

import pytest

from conftest import devices, read_metrics, train_cli

SHORT = ("--config.total_steps=2", "--config.log_every=2", "--config.eval_every=2", "--config.checkpoint_every=2")


def _one_line_error(proc, fragment):
  assert proc.returncode == 2, (proc.returncode, proc.stderr[-3000:])
  lines = [l for l in proc.stderr.splitlines() if l.strip()]
  assert len(lines) == 1 and lines[0].startswith("error: ") and fragment in lines[0], proc.stderr[-3000:]


def _corpus(path, n_docs=60, extra=b""):
  """Real English text in google-research/bert's format, from Python's own docs (the demo source)."""
  from bertjax.data import sources

  lines = []
  for doc in list(sources.documents("demo", sources.SourceStats()))[:n_docs]:
    lines += doc + [""]
  path.write_bytes("\n".join(lines).encode() + extra)
  return path


@pytest.mark.slow  # 11-19 s cold: the normal tier keeps under 8 minutes on 2 cores
def test_invalid_utf8_lines_are_skipped_and_counted(tmp_path):
  corpus = _corpus(tmp_path / "c.txt", extra=b"\nbad \xff\xfe bytes here.\nanother \xc3\x28 one.\n")
  proc = train_cli(tmp_path / "w", f"--config.data.source=text:{corpus}", "--config.model.vocab_size=500", *SHORT)
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert "2 lines of invalid UTF-8 skipped" in proc.stdout


def test_vocabulary_lacking_special_tokens(tmp_path):
  vocab = tmp_path / "vocab.txt"
  vocab.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]"] + [f"w{i}" for i in range(50)]) + "\n")
  proc = train_cli(tmp_path / "w", f"--config.data.tokenizer=wordpiece:{vocab}", *SHORT)
  _one_line_error(proc, "[MASK]")


def test_tokenizer_size_disagreeing_with_the_config(tmp_path):
  vocab = tmp_path / "vocab.txt"
  vocab.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + [f"w{i}" for i in range(95)]) + "\n")
  proc = train_cli(tmp_path / "w", f"--config.data.tokenizer=wordpiece:{vocab}", *SHORT)
  _one_line_error(proc, "--config.model.vocab_size=100")


def test_batch_not_divisible_by_the_devices(tmp_path):
  proc = train_cli(tmp_path / "w", "--config.batch_size=12", *SHORT,
                   env=devices(8))
  _one_line_error(proc, "not divisible by the 8 devices")


def test_unwritable_workdir(tmp_path):
  blocker = tmp_path / "file"
  blocker.write_text("not a directory")
  proc = train_cli(blocker / "w", *SHORT)
  _one_line_error(proc, "not writable")


def test_bad_input_leaves_an_existing_run_intact(tmp_path):
  corpus = _corpus(tmp_path / "c.txt")
  flags = (f"--config.data.source=text:{corpus}", "--config.model.vocab_size=500", *SHORT)
  assert train_cli(tmp_path / "w", *flags).returncode == 0
  before = {p: os.path.getmtime(os.path.join(r, p)) for r, _, fs in os.walk(tmp_path / "w") for p in fs}
  records = read_metrics(tmp_path / "w")
  corpus.unlink()  # the same command, but the corpus is gone
  _one_line_error(train_cli(tmp_path / "w", *flags), "no files match")
  after = {p: os.path.getmtime(os.path.join(r, p)) for r, _, fs in os.walk(tmp_path / "w") for p in fs}
  assert before == after and read_metrics(tmp_path / "w") == records


@pytest.mark.parametrize("spec, flag, fragment", [
    ("configs/bert.py:huge", (), "unknown bert variant 'huge'; use one of tiny, tiny_two_phase, base, large, large_lamb"),
    ("configs/nope.py", (), "cannot load the config file"),
    ("configs/bert.py:tiny", ("--config.model.hiden_size=64",), "no config key 'hiden_size'; did you mean 'hidden_size'?"),
    ("configs/bert.py:tiny", ("--config.batch_size=many",), "--config.batch_size=many"),
    ("configs/xlnet.py:tiny", ("--config.data.perm_size=40",), "data.perm_size=40 must divide both halves of the row"),
])
def test_command_line_errors_are_one_line(tmp_path, spec, flag, fragment):
  proc = train_cli(tmp_path / "w", *flag, spec=spec)
  _one_line_error(proc, fragment)
  assert not (tmp_path / "w").exists()


def test_libtpu_without_a_tpu_prints_nothing(tmp_path):
  """The default install carries libtpu (for bertjax.aot); on a host without TPU chips it must not add
  its start-up warnings to every run's stderr (the one-line errors above depend on it)."""
  import importlib.util
  import subprocess
  import sys

  assert importlib.util.find_spec("libtpu") is not None, "the test extra installs jax[tpu]"
  code = "from bertjax.core import runtime; runtime.setup(); import jax; print(jax.devices()[0].platform)"
  proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                        env={k: v for k, v in os.environ.items() if k != "JAX_PLATFORMS"})
  assert proc.returncode == 0 and proc.stdout.strip() == "cpu" and not proc.stderr.strip(), proc.stderr


@pytest.mark.parametrize("module", ["train", "summary", "train.bench", "aot", "data.prepare", "finetune", "hf",
                                    "compress.prune", "compress.analysis", "distill", "finetune.suite",
                                    "finetune.squad.evaluate", "finetune.predict"])
def test_every_cli_parses_its_flags_into_one_line_errors(module):
  import subprocess
  import sys

  from conftest import REPO

  proc = subprocess.run([sys.executable, "-m", f"bertjax.{module}", "--no_such_flag=1"], cwd=REPO,
                        capture_output=True, text=True, timeout=300)
  _one_line_error(proc, "no_such_flag")


def test_a_benchmark_script_ends_a_user_error_in_one_line(capsys):
  from bertjax.core.cli import script
  from bertjax.core.errors import UserError

  def main():
    raise UserError("task.doc_stride=64 must be smaller than the 61 context tokens a window holds; lower it")

  with pytest.raises(SystemExit) as e:
    script(main)
  assert e.value.code == 2
  assert capsys.readouterr().err == "error: task.doc_stride=64 must be smaller than the 61 context tokens a window " \
                                    "holds; lower it\n"
  with pytest.raises(SystemExit) as e:  # a finished run's own status passes through
    script(lambda: 1)
  assert e.value.code == 1
  with pytest.raises(SystemExit) as e:  # a main that returns its figures is a success, not sys.exit(dict)'s 1
    script(lambda: {"f1": 50.0})
  assert e.value.code == 0


def test_every_benchmark_is_entered_through_the_cli():
  import glob
  import re

  from conftest import REPO

  entries = {}
  for path in glob.glob(os.path.join(REPO, "benchmarks", "*.py")):
    with open(path) as f:
      block = re.search(r'\nif __name__ == "__main__":\n(.*)\Z', f.read(), re.S)
    if block:
      entries[os.path.basename(path)] = block.group(1)
  assert len(entries) >= 20
  bare = [name for name, block in entries.items() if not re.search(r"cli\.(script|run)\(", block)]
  assert not bare, f"{bare} run main() without bertjax.core.cli: a UserError would print a traceback"


@pytest.mark.slow  # 11-19 s cold: the normal tier keeps under 8 minutes on 2 cores
def test_without_workdir_a_run_gets_a_fresh_one(tmp_path, monkeypatch):
  """No --workdir: a fresh directory under the temp dir, printed; never an earlier run's."""
  proc = train_cli("", "--config.total_steps=1", "--config.log_every=1", "--config.eval_every=1",
                   "--config.checkpoint_every=1", env={"TMPDIR": str(tmp_path)})
  assert proc.returncode == 0, proc.stderr[-3000:]
  workdir = next(l for l in proc.stdout.splitlines() if l.startswith("workdir: ")).split()[1]
  assert workdir.startswith(str(tmp_path / "bertjax" / "bert-tiny-"))
  assert os.path.exists(os.path.join(workdir, "metrics.jsonl"))
  # A run that stops at a user error leaves no empty directory behind.
  bad = train_cli("", "--config.model.attention=dot_product", env={"TMPDIR": str(tmp_path)})
  assert bad.returncode == 2 and bad.stderr.startswith("error: model.attention=dot_product"), bad.stderr[-2000:]
  assert os.listdir(tmp_path / "bertjax") == [os.path.basename(workdir)]
  import tempfile

  from bertjax.core.cli import default_workdir

  monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
  assert default_workdir("configs/bert.py:tiny") != default_workdir("configs/bert.py:tiny")


# A malformed task file for each family (the file fine-tuning reads first, and the line its error names).
BAD_TASK_FILES = {
    "sst2": ("tsv", "train.tsv", "text\tlabel\nfine\t1\n", "has no column 'sentence'"),
    "squad2": ("json", "train-v2.0.json", '{"data": [', "not valid JSON"),
    "ner": ("conll", "train.txt", "Anna B-PER\nSmith I-PER extra\n", ":2: 3 columns"),
    "swag": ("jsonl", "train.jsonl", '{"context": "a", "choices": ["b", "c"], "label": 0}\nnot json\n', ":2: not a JSON"),
}


def _bad_task(tmp_path, preset):
  from conftest import load_config

  kind, name, text, fragment = BAD_TASK_FILES[preset]
  (tmp_path / "data").mkdir()
  (tmp_path / "data" / name).write_text(text)
  config = load_config(f"configs/finetune.py:{preset}")
  config.task.source = f"{kind}:{tmp_path / 'data'}"
  if preset == "swag":
    config.task.train_file = name
  config.init.checkpoint = str(tmp_path / "no_checkpoint_here")  # absent: loading it would fail on its own
  return config, str(tmp_path / "data" / name), fragment


@pytest.mark.parametrize("preset", sorted(BAD_TASK_FILES))
def test_a_bad_task_file_fails_before_the_checkpoint_loads(tmp_path, monkeypatch, preset):
  """Every family reads and checks its task files first: the error names the file, and the checkpoint is never
  touched (the trainer's loader would raise if it were called)."""
  from bertjax.core.errors import UserError
  from bertjax.finetune import train

  config, path, fragment = _bad_task(tmp_path, preset)

  def never(init):
    raise AssertionError(f"the checkpoint {init.checkpoint} was loaded before the task file was checked")

  monkeypatch.setattr(train, "load_checkpoint", never)
  with pytest.raises(UserError) as e:
    train.finetune(config, str(tmp_path / "ft"))
  assert path in str(e.value) and fragment in str(e.value), str(e.value)


def test_finetune_cli_names_a_bad_task_file_in_one_line_without_loading_the_checkpoint(tmp_path):
  """The command line: exit 2 and one line naming the file (with an absent checkpoint, whose error would
  name the checkpoint instead if it were loaded first)."""
  import subprocess
  import sys

  from conftest import REPO

  _, path, fragment = _bad_task(tmp_path, "ner")
  proc = subprocess.run([sys.executable, "-m", "bertjax.finetune", "--config=configs/finetune.py:ner",
                         f"--config.task.source=conll:{tmp_path / 'data'}",
                         f"--config.init.checkpoint={tmp_path / 'no_checkpoint_here'}", f"--workdir={tmp_path / 'ft'}"],
                        cwd=REPO, capture_output=True, text=True, timeout=300)
  _one_line_error(proc, f"{path}{fragment}")


def test_predict_names_a_bad_input_file_before_loading_the_model(tmp_path, capsys):
  """`python -m bertjax.finetune.predict` reads its input before the model: a model directory with only its
  task.json (no weights: loading would fail) and a malformed CoNLL file give the input's one-line error."""
  import json

  from bertjax.finetune import predict

  model = tmp_path / "model"
  model.mkdir()
  (model / "task.json").write_text(json.dumps({"kind": "tagging", "labels": ["O"]}))
  bad = tmp_path / "in.conll"
  bad.write_text("Anna\nSmith I-PER\n")
  assert predict.main([f"--model={model}", f"--input={bad}"]) == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and err[0].startswith(f"error: {bad}:2: 2 columns"), err
