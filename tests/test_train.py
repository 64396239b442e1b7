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
    # ALBERT, ELECTRA and RoBERTa: slow (35-45 s each cold; the normal tier keeps under 8 minutes). Their steps'
    # parity with transformers runs in the normal tier (test_parity), and the slow tier's README test trains each.
    pytest.param("configs/albert.py:tiny", ("eval/mlm_accuracy", "eval/sop_accuracy"), marks=pytest.mark.slow),
    pytest.param("configs/electra.py:tiny", ("eval/mlm_accuracy", "eval/rtd_accuracy", "eval/rtd_auc",
                                             "eval/rtd_precision", "eval/rtd_recall", "eval/replaced_fraction"),
                 marks=pytest.mark.slow),
    pytest.param("configs/roberta.py:tiny", ("eval/mlm_accuracy",), marks=pytest.mark.slow),
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
  # Packing efficiency (issue #37): real tokens / computed positions of the rows trained on, and the real tokens/s.
  assert 0.1 < train[-1]["packing_efficiency"] <= 1.0
  assert train[-1]["real_tokens_per_sec"] == pytest.approx(train[-1]["tokens_per_sec"] * train[-1]["packing_efficiency"])
  evals = [r for r in records if any(k.startswith("eval/") for k in r)]
  assert evals and evals[-1]["step"] == 30
  for key in eval_keys:
    assert key in evals[-1], key
  assert glob.glob(os.path.join(workdir, "events.out.tfevents.*")), "no TensorBoard event file"
  out = capsys.readouterr().out
  assert "ETA" in out and "step 30/30" in out
  assert "packing efficiency " in out


@pytest.mark.parametrize("spec,falling,chance", [
    pytest.param("configs/spanbert.py:tiny", ("mlm", "sbo"), (), marks=pytest.mark.slow),  # 18 s cold
    # SSO is a 3-way sentence classifier: 30 steps leave it at chance (ln 3), which is checked as such.
    pytest.param("configs/structbert.py:tiny", ("mlm", "wso"), ("sso",), marks=pytest.mark.slow),  # 31 s cold
])
def test_spanbert_and_structbert_train_and_their_losses_fall(spec, falling, chance, tmp_path):
  """Each objective of SpanBERT (MLM + SBO on span-masked single segments) and StructBERT (MLM + WSO + SSO)
  end to end on the demo corpus: every token-level loss falls, in training and against the initial level
  ln(vocab) on held-out data, and the total with them."""
  import math

  config = micro(spec)
  workdir = str(tmp_path / "run")
  loop.train_and_evaluate(config, workdir)
  records = _records(workdir)
  train = [r for r in records if "train/loss" in r]
  evals = [r for r in records if "eval/loss" in r]
  assert [r["step"] for r in train] == [10, 20, 30] and evals[-1]["step"] == 30
  assert train[-1]["train/loss"] < train[0]["train/loss"] - 0.6, "total loss did not fall"
  start = math.log(config.model.vocab_size)  # a fresh model's token loss
  for name in falling:
    first, last = train[0][f"train/{name}_loss"], train[-1][f"train/{name}_loss"]
    assert last < first - 0.3, (name, first, last)
    assert evals[-1][f"eval/{name}_loss"] < start - 0.5, (name, evals[-1][f"eval/{name}_loss"], start)
  for name in chance:
    assert abs(evals[-1][f"eval/{name}_loss"] - math.log(3)) < 0.15, (name, evals[-1])
