"""End to end on the demo corpus: each model family trains a few steps and writes its metrics."""

import glob
import json
import os

import pytest

from bertjax.train import loop
from conftest import micro


def _records(workdir):
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    return [json.loads(line) for line in f]


@pytest.mark.parametrize("spec,eval_keys", [
    ("configs/bert.py:tiny", ("eval/mlm_accuracy", "eval/nsp_accuracy")),
    ("configs/albert.py:tiny", ("eval/mlm_accuracy", "eval/sop_accuracy")),
    ("configs/electra.py:tiny", ("eval/mlm_accuracy", "eval/rtd_accuracy", "eval/rtd_auc",
                                 "eval/rtd_precision", "eval/rtd_recall", "eval/replaced_fraction")),
    ("configs/roberta.py:tiny", ("eval/mlm_accuracy",)),
    # StructBERT (SSO pairs from the instance builder, shuffled trigrams) with SpanBERT's spans and SBO added:
    # slow (its own corpus preparation); the parts run in the normal suite (test_objectives, test_instances,
    # test_sharding's spanbert_structbert model).
    pytest.param("configs/structbert.py:tiny", ("eval/mlm_accuracy", "eval/wso_accuracy", "eval/sso_accuracy",
                                                "eval/sbo_accuracy"), marks=pytest.mark.slow),
])
def test_tiny_models_train_and_log(spec, eval_keys, tmp_path, capsys):
  workdir = str(tmp_path / "run")
  # 30 micro steps: LAMB (ALBERT) needs a larger rate than the tiny recipe's 600-step one to move in 30.
  overrides = {"learning_rate": 5e-2} if "albert" in spec else {}
  if "structbert" in spec:
    overrides = {"objectives.sbo": 1.0, "masking.scheme": "span"}
  loop.train_and_evaluate(micro(spec, **overrides), workdir)
  records = _records(workdir)
  train = [r for r in records if "train/loss" in r]
  assert [r["step"] for r in train] == [10, 20, 30]
  assert train[-1]["train/loss"] < train[0]["train/loss"] - 0.3, "loss did not fall"
  for key in ("lr", "tokens_per_sec", "train/grad_norm", "train/mlm_accuracy"):
    assert key in train[-1]
  evals = [r for r in records if any(k.startswith("eval/") for k in r)]
  assert evals and evals[-1]["step"] == 30
  for key in eval_keys:
    assert key in evals[-1], key
  assert glob.glob(os.path.join(workdir, "events.out.tfevents.*")), "no TensorBoard event file"
  out = capsys.readouterr().out
  assert "ETA" in out and "step 30/30" in out
