"""Data and job integrity (docs/integrity.md): tokenizer identity in caches and shards, shard checksums,
one writer per workdir."""

import os
import subprocess
import sys

import numpy as np
import pytest

from bertjax.data import pipeline, prepare_lib, shards
from bertjax.data.tokenizer import SPECIAL_TOKENS
from bertjax.core.errors import UserError
from conftest import MICRO_FLAGS, REPO, micro

WORDS = ("the cat sat on a mat and then it ran home . the dog was big , the bird was small . "
         "The Cat Sat On A Mat And Then It Ran Home The Dog Was Big The Bird Was Small").split()


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
  """A small text corpus (a paragraph a line, blank lines between documents) and a WordPiece vocab.txt of
  its words in both casings: cased and uncased tokenizers of it give different ids."""
  root = tmp_path_factory.mktemp("integrity")
  rng = np.random.default_rng(0)
  with open(root / "corpus.txt", "w") as f:
    for _ in range(60):
      for _ in range(int(rng.integers(2, 5))):
        words = [str(w) for w in rng.choice(WORDS, int(rng.integers(5, 14)))]
        f.write(" ".join(words).capitalize() + ". " + " ".join(rng.choice(WORDS, 6)).capitalize() + ".\n")
      f.write("\n")
  vocab = [*SPECIAL_TOKENS, *sorted(set(WORDS) | {"."})]
  (root / "vocab.txt").write_text("\n".join(vocab) + "\n")
  return dict(source=f"text:{root / 'corpus.txt'}", vocab=str(root / "vocab.txt"), vocab_size=len(vocab), root=root)


def _config(corpus, tokenizer, **overrides):
  return micro(**{"data.source": corpus["source"], "data.split_paragraphs": True, "data.tokenizer": tokenizer,
                  "model.vocab_size": corpus["vocab_size"], **overrides})


def _cli(workdir, corpus, *flags, timeout=300):
  """`python -m bertjax.train` on the micro config with the corpus's vocab size."""
  cmd = [sys.executable, "-m", "bertjax.train", "--config=configs/bert.py:tiny", f"--workdir={workdir}",
         *MICRO_FLAGS, f"--config.model.vocab_size={corpus['vocab_size']}", *flags]
  return subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=timeout)


def _errors(stderr: str) -> list:
  return [line for line in stderr.splitlines() if line.strip() and not line.startswith(("[Gloo]", "W0000", "I0000"))]


@pytest.fixture(scope="module")
def uncased_shards(corpus, tmp_path_factory):
  """The corpus prepared with the uncased tokenizer (`python -m bertjax.data.prepare`'s code, in this process)."""
  out = str(tmp_path_factory.mktemp("uncased"))
  prepare_lib.prepare(_config(corpus, f"wordpiece:{corpus['vocab']}"), out, workers=0, progress=None)
  return out


# ------------------------------------------------------------------ tokenizer identity


def test_cased_and_uncased_over_one_vocab_make_separate_cache_entries(corpus, tmp_path, capfd):
  cache = {"data.cache_dir": str(tmp_path)}
  uncased = pipeline.build(_config(corpus, f"wordpiece:{corpus['vocab']}", **cache))
  capfd.readouterr()
  cased = pipeline.build(_config(corpus, f"wordpiece:{corpus['vocab']}:cased", **cache))
  assert "data: preparing" in capfd.readouterr().err  # the log says new rows are made
  assert cased.tokenizer.fingerprint != uncased.tokenizer.fingerprint
  assert cased.train.directory != uncased.train.directory
  a, b = (pipeline.batch_at(d.train, 0, 8, 0)["input_ids"] for d in (uncased, cased))
  assert not np.array_equal(a, b)  # capitalized words get their own ids in the cased rows


def test_shards_of_the_other_casing_are_refused_naming_both_specs(corpus, uncased_shards):
  config = _config(corpus, f"wordpiece:{corpus['vocab']}:cased", **{"data.source": f"shards:{uncased_shards}"})
  with pytest.raises(UserError) as e:
    pipeline.build(config)
  message = str(e.value)
  assert f"wordpiece:{corpus['vocab']}:cased" in message and "(wordpiece:vocab.txt," in message
  assert "\n" not in message
  same = _config(corpus, f"wordpiece:{corpus['vocab']}", **{"data.source": f"shards:{uncased_shards}"})
  assert len(pipeline.build(same).train) > 0  # the same casing is accepted


# ------------------------------------------------------------------ shard checksums


def _copy(directory, to):
  import shutil

  shutil.copytree(directory, to)
  return str(to)


def test_shard_metadata_records_size_and_checksum(uncased_shards):
  meta = shards.read_metadata(uncased_shards)
  for split in ("train", "eval"):
    for shard in meta["splits"][split]["shards"]:
      path = os.path.join(uncased_shards, shard["file"])
      assert shard["bytes"] == os.path.getsize(path) > 0
      assert shard["sha256"] == shards.file_sha256(path)


def test_a_truncated_shard_is_refused_by_its_size_and_a_changed_byte_by_its_checksum(corpus, uncased_shards, tmp_path):
  directory = _copy(uncased_shards, tmp_path / "copy")
  meta = shards.read_metadata(directory)
  stamps = str(tmp_path / "stamps")
  path = os.path.join(directory, meta["splits"]["train"]["shards"][0]["file"])
  assert shards.verify(directory, meta, "first", stamps) != []  # first open: full checksums
  assert shards.verify(directory, meta, "first", stamps) == []  # then size only, for files as they were
  with open(path, "r+b") as f:  # one byte changed in place
    f.seek(100)
    byte = f.read(1)
    f.seek(100)
    f.write(bytes([byte[0] ^ 1]))
  assert shards.verify(directory, meta, "size", stamps) == []  # the size cannot see it
  for mode in ("full", "first"):  # "first": the write changed the file's mtime, so it is checked again
    with pytest.raises(UserError, match=rf"^shard {path} is corrupt: its sha256 is"):
      shards.verify(directory, meta, mode, stamps)
  with open(path, "r+b") as f:
    f.truncate(os.path.getsize(path) - 7)
  config = _config(corpus, "", **{"data.source": f"shards:{directory}"})
  with pytest.raises(UserError, match=rf"^shard {path} is \d+ bytes, metadata.json says \d+ \(truncated"):
    pipeline.build(config)


def test_train_stops_with_one_line_on_a_changed_shard_byte_or_the_other_casing(corpus, uncased_shards, tmp_path):
  """The CLI: exit 2 and one line, before any step, and the workdir is not created."""
  directory = _copy(uncased_shards, tmp_path / "copy")
  path = os.path.join(directory, "train-00000.rows")
  with open(path, "r+b") as f:
    f.seek(5)
    byte = f.read(1)
    f.seek(5)
    f.write(bytes([byte[0] ^ 0x10]))
  r = _cli(tmp_path / "run", corpus, f"--config.data.source=shards:{directory}", "--config.data.verify=full")
  assert r.returncode == 2, r.stderr[-2000:]
  assert _errors(r.stderr) == [next(l for l in _errors(r.stderr) if l.startswith(f"error: shard {path} is corrupt"))]
  assert not (tmp_path / "run" / "checkpoints").exists()
  r = _cli(tmp_path / "run2", corpus, f"--config.data.source=shards:{uncased_shards}",
           f"--config.data.tokenizer=wordpiece:{corpus['vocab']}:cased")
  assert r.returncode == 2, r.stderr[-2000:]
  errors = _errors(r.stderr)
  assert len(errors) == 1 and errors[0].startswith(f"error: config.data.tokenizer wordpiece:{corpus['vocab']}:cased"), errors


def test_cache_entries_of_another_row_builder_version_are_reported_with_their_size_and_never_read(
    corpus, tmp_path, capfd, monkeypatch):
  config = _config(corpus, f"wordpiece:{corpus['vocab']}", **{"data.cache_dir": str(tmp_path)})
  first = pipeline.build(config)
  capfd.readouterr()
  monkeypatch.setattr(prepare_lib, "ROWS_VERSION", prepare_lib.ROWS_VERSION + 1)  # the row-building code changed
  again = pipeline.build(config)
  err = capfd.readouterr().err
  assert again.train.directory != first.train.directory  # new rows, not the old entry
  old = first.train.directory
  assert "data: preparing" in err and "1 cache directories" in err and f"{old} (" in err and " MB)" in err
  with pytest.raises(UserError, match="row-builder version"):  # an old entry put where a new one belongs
    pipeline._open_shards(config, old, cached=True)


# ------------------------------------------------------------------ one writer per workdir


def _holder(workdir):
  """A process that holds workdir's lock (as a run does) until killed; returns (Popen, its pid)."""
  code = ("import sys, time; from bertjax.train.checkpoint import WorkdirLock; l = WorkdirLock(sys.argv[1]).__enter__(); "
          "print('held', flush=True); time.sleep(600)")
  proc = subprocess.Popen([sys.executable, "-c", code, str(workdir)], cwd=REPO, stdout=subprocess.PIPE, text=True,
                          env=dict(os.environ, PYTHONPATH=REPO))
  assert proc.stdout.readline().strip() == "held"
  return proc


def test_a_second_run_on_a_workdir_in_use_exits_2_naming_the_pid(corpus, uncased_shards, tmp_path):
  from bertjax.train.checkpoint import WorkdirLock

  workdir = tmp_path / "run"
  workdir.mkdir()
  holder = _holder(workdir)
  try:
    with pytest.raises(UserError, match=rf"is in use by another run \(pid {holder.pid};"):
      WorkdirLock(str(workdir)).__enter__()
    r = _cli(workdir, corpus, f"--config.data.source=shards:{uncased_shards}")
    assert r.returncode == 2, r.stderr[-2000:]
    errors = [line for line in r.stderr.splitlines() if line.startswith("error:")]
    assert "Traceback" not in r.stderr and len(errors) == 1 and errors[0].startswith(f"error: workdir {str(workdir)!r} is in use by another run "
                                                     f"(pid {holder.pid};"), errors
    assert not (workdir / "config.json").exists()  # the other run's workdir is left as it was
  finally:
    holder.kill()
    holder.wait()
  notes = []
  with WorkdirLock(str(workdir), note=notes.append):  # its holder was SIGKILLed: a stale lock
    assert open(workdir / "run.lock").read().split()[0] == str(os.getpid())
  assert len(notes) == 1 and f"from pid {holder.pid}" in notes[0] and "ended without releasing it" in notes[0]
  with WorkdirLock(str(workdir), note=notes.append):  # released cleanly: no note
    pass
  assert len(notes) == 1
