"""`python -m bertjax.distill` end to end, as documented: a configs/bert.py:tiny run as the teacher, the tiny
distillation config at micro sizes, a few steps. It once died in the checkpoint manifest (`Distiller` has no
`sbo`) before the first step, with a traceback."""

import json
import os
import string
import subprocess
import sys

import pytest

from bertjax.train import checkpoint, loop
from conftest import MICRO_FLAGS, REPO, micro, read_metrics


STEPS = ("--config.total_steps=4", "--config.log_every=2", "--config.eval_every=4", "--config.checkpoint_every=4")


def _character_vocab(path) -> int:
  """A WordPiece vocabulary in which every word splits into characters (so no SentencePiece is trained
  here); returns its size."""
  chars = string.ascii_lowercase + string.digits
  pieces = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *chars, *("##" + c for c in chars), *string.punctuation]
  path.write_text("\n".join(pieces) + "\n")
  return len(pieces)


@pytest.mark.slow  # 37 s cold; CI runs the slow tier, so the crash stays guarded there
def test_the_distill_command_trains_a_student_of_a_tiny_teacher_and_evaluates_it(tmp_path):
  teacher, work, vocab = tmp_path / "teacher", tmp_path / "w", tmp_path / "vocab.txt"
  size = _character_vocab(vocab)
  loop.train_and_evaluate(micro("configs/bert.py:tiny", total_steps=2, log_every=2, eval_every=2, checkpoint_every=2,
                                **{"data.tokenizer": f"wordpiece:{vocab}", "model.vocab_size": size}), str(teacher))
  done = subprocess.run(
      [sys.executable, "-m", "bertjax.distill", "--config=configs/distill.py:tiny", f"--config.teacher={teacher}",
       f"--workdir={work}", *MICRO_FLAGS, *STEPS, f"--config.model.vocab_size={size}",
       "--config.distill.compare=False"],
      cwd=REPO, capture_output=True, text=True, timeout=900)
  assert done.returncode == 0, done.stderr[-3000:]
  assert "Traceback" not in done.stderr
  evals = [m for m in read_metrics(work) if "eval/mlm_accuracy" in m]
  assert [m["step"] for m in evals] == [4] and 0 <= evals[0]["eval/mlm_accuracy"] <= 1
  networks = checkpoint.Checkpointer(str(work)).manifest()["networks"]
  assert networks == {"student": ["student"], "teacher": ["teacher"]}  # the Distiller says what it holds
  assert os.path.isfile(os.path.join(work, "student", "config.json"))  # the student alone, for export
  with open(os.path.join(work, "comparison.json")) as f:
    assert json.load(f)["distilled"]["eval/mlm_accuracy"] == evals[0]["eval/mlm_accuracy"]
