"""Config validation and the CLIs' handling of user errors: one line on stderr, exit code 2, no traceback."""

import os
import subprocess
import sys

import numpy as np
import pytest

from bertjax.core import config as config_lib
from bertjax.core.errors import UserError
from bertjax.train import build, optim
from conftest import REPO, load_config

BAD = [
    ({"model.num_heads": 7}, "not divisible by model.num_heads"),
    ({"seq_len": 1024}, "exceeds the position table"),
    ({"model.sharing": "some"}, "model.sharing"),
    ({"model.num_hidden_groups": 5}, "must divide model.num_layers"),
    ({"masking.scheme": "words"}, "masking.scheme"),
    ({"objectives.rtd": 50.0}, "needs a generator"),
    ({"objectives.mlm": 0.0, "objectives.nsp": 0.0}, "no objective"),
    ({"optimizer.name": "sgd"}, "optimizer.name"),
    ({"batch_size": 30, "grad_accum_steps": 4}, "not a positive multiple of grad_accum_steps=4"),
    ({"warmup_steps": 10, "total_steps": 5}, "warmup_steps=10 exceeds total_steps=5"),
    ({"masking.max_predictions": 129}, "masking.max_predictions=129 must be between 1 and seq_len=128"),
    ({"masking.max_predictions": -1}, "masking.max_predictions=-1"),
    ({"phases": (config_lib.phase(0.5), config_lib.phase(0.4))}, "add up to 0.9"),
    ({"phases": (config_lib.phase(0.5), config_lib.phase(0.5, seq_len=1024))}, "phases.1..seq_len=1024 exceeds"),
    ({"phases": (config_lib.phase(0.5), config_lib.phase(0.5, seq_len=64, max_predictions=65))},
     "phases.1..max_predictions=65 must be between 1 and seq_len=64"),
    ({"phases": (config_lib.phase(0.9999), config_lib.phase(0.0001))}, "phase 2 has no steps"),
    ({"phases": ({"fraction": 1.0, "seq_len": 64},)}, "make each phase with bertjax.core.config.phase"),
    ({"data.format": "electra2"}, "use auto, electra, single"),
    ({"data.format": "electra", "objectives.nsp": 0.0, "model.type_vocab_size": 1}, "type_vocab_size=2"),
    ({"objectives.span": 1.0}, "use mlm, nsp, sop, rtd, sbo, wso, sso"),
    ({"objectives.sbo": 1.0, "objectives.rtd": 50.0, "model.generator_fraction": 0.25}, "ELECTRA's discriminator"),
    ({"objectives.wso": 1.0, "masking.wso_share": 0.0}, "masking.wso_share=0.0 must be in"),
]


def _set(c, key, value):
  node = c
  *parents, leaf = key.split(".")
  for p in parents:
    node = node[p]
  node[leaf] = value


@pytest.mark.parametrize("overrides,message", BAD)
def test_invalid_configs_are_refused_with_the_fix(overrides, message):
  c = load_config("configs/bert.py:tiny")
  for k, v in overrides.items():
    _set(c, k, v)
  with pytest.raises(UserError, match=message):
    build.validate(c)


@pytest.mark.parametrize("spec", ["configs/bert.py:tiny", "configs/bert.py:base", "configs/albert.py:xxlarge",
                                  "configs/electra.py:large", "configs/roberta.py:base", "configs/bert.py:large_lamb",
                                  "configs/bert.py:tiny_two_phase", "configs/spanbert.py:tiny",
                                  "configs/spanbert.py:large", "configs/structbert.py:tiny",
                                  "configs/structbert.py:large"])
def test_shipped_configs_are_valid(spec):
  build.validate(load_config(spec))


# SpanBERT and StructBERT have no HF pretraining class: their counts are HF's for what maps (the encoder and MLM
# head: BertForMaskedLM; with StructBERT's pooler, BertForPreTraining) plus the heads HF lacks, counted by hand.
def _sbo_head(h, vocab):  # position table 15 x 200 (--max-pair-targets 15); (2H + 200) -> H, LN, H -> H, LN; output bias
  return 15 * 200 + (2 * h + 200) * h + h + 2 * h + h * h + h + 2 * h + vocab


BERT_FOR_MASKED_LM_CASED = {"base": 108_340_804, "large": 333_610_308}  # vocab 28996 (bert-*-cased)
BERT_FOR_PRETRAINING = {"base": 110_106_428, "large": 336_226_108}  # vocab 30522 (bert-*-uncased)
NEW_FAMILY_PARAMS = {
    "configs/spanbert.py:base": 110_300_480,
    "configs/spanbert.py:large": 336_998_976,
    "configs/spanbert.py:tiny": 817_880,
    "configs/structbert.py:base": 110_107_197,
    "configs/structbert.py:large": 336_227_133,
    "configs/structbert.py:tiny": 754_259,
}


@pytest.mark.parametrize("spec", sorted(NEW_FAMILY_PARAMS))
def test_spanbert_and_structbert_parameter_counts_from_summary(spec):
  from bertjax import summary

  text = summary.summarize(load_config(spec))
  assert f"params: {NEW_FAMILY_PARAMS[spec]}" in text.splitlines()
  variant = spec.rsplit(":", 1)[1]
  h = {"base": 768, "large": 1024, "tiny": 128}[variant]
  if "spanbert" in spec:
    sbo = _sbo_head(h, 28996 if variant != "tiny" else 2000)
    assert f"sbo head: {sbo:,} params" in text
    if variant != "tiny":
      assert NEW_FAMILY_PARAMS[spec] == BERT_FOR_MASKED_LM_CASED[variant] + sbo
  else:
    assert "wso: the MLM head (no params of its own)" in text and "sso head (pooler + 3-way classifier)" in text
    if variant != "tiny":
      assert NEW_FAMILY_PARAMS[spec] == BERT_FOR_PRETRAINING[variant] + h + 1  # a third class: one more row


# RoBERTa as published: Liu et al. 2019 (arXiv:1907.11692) Table 9, pretraining hyperparameters, and §3.1
# (sequences of at most 512 tokens); fairseq examples/roberta/README.pretraining.md trains with the same
# optimizer flags: --adam-betas '(0.9, 0.98)' --adam-eps 1e-6 --clip-norm 0.0 --weight-decay 0.01
# --lr-scheduler polynomial_decay.
ROBERTA_TABLE_9 = {"base": dict(peak_lr=6e-4, warmup=24_000), "large": dict(peak_lr=4e-4, warmup=30_000)}
ROBERTA_BOTH = dict(batch=8192, steps=500_000, seq_len=512, b1=0.9, b2=0.98, eps=1e-6, weight_decay=0.01,
                    dropout=0.1, attention_dropout=0.1)


def _adam_reference(params, grads_per_step, lrs, b1, b2, eps, wd):
  """Adam with bias correction and decoupled weight decay (fairseq's adam, torch's AdamW), no clipping, in
  NumPy float64: the updates it applies."""
  params = {k: p.astype(np.float64) for k, p in params.items()}
  m = {k: np.zeros_like(p) for k, p in params.items()}
  v = {k: np.zeros_like(p) for k, p in params.items()}
  updates = []
  for t, (grads, lr) in enumerate(zip(grads_per_step, lrs), start=1):
    step = {}
    for k, g in grads.items():
      g = g.astype(np.float64)
      m[k] = b1 * m[k] + (1 - b1) * g
      v[k] = b2 * v[k] + (1 - b2) * g * g
      m_hat, v_hat = m[k] / (1 - b1**t), v[k] / (1 - b2**t)
      step[k] = -lr * (m_hat / (np.sqrt(v_hat) + eps) + wd * params[k])
    updates.append(step)
  return updates


@pytest.mark.parametrize("variant", sorted(ROBERTA_TABLE_9))
def test_roberta_recipe_is_the_published_one(variant):
  c = load_config(f"configs/roberta.py:{variant}")
  want = dict(ROBERTA_BOTH, **ROBERTA_TABLE_9[variant])
  o = c.optimizer
  assert (c.batch_size, c.total_steps, c.seq_len) == (want["batch"], want["steps"], want["seq_len"])
  assert (c.learning_rate, c.warmup_steps) == (want["peak_lr"], want["warmup"])
  assert (o.name, o.b1, o.b2, o.eps, o.weight_decay) == ("adamw", want["b1"], want["b2"], want["eps"],
                                                          want["weight_decay"])
  assert o.clip_norm == 0.0  # Table 9: gradient clipping 0.0; fairseq --clip-norm 0.0
  assert (c.model.dropout, c.model.attention_dropout) == (want["dropout"], want["attention_dropout"])
  # fairseq polynomial_decay, power 1 to 0: peak * t / w during warmup, then peak * (T - t) / (T - w).
  lr, peak, w, T = optim.lr_schedule(c), want["peak_lr"], want["warmup"], want["steps"]
  for t in (w // 2, w, w + 1000, (w + T) // 2, T - 10_000):  # (optax counts steps in float32)
    assert float(lr(t)) == pytest.approx(peak * (t / w if t <= w else (T - t) / (T - w)), rel=1e-4), t
  # And the optimizer the config builds is that Adam, unclipped: over the first three steps, the first with a
  # gradient of norm 1e4, it applies Adam's updates (clipped to norm 1, that gradient would leave moments
  # 1e4 times smaller and every later update different).
  tx = optim.make(o, lr)
  params = {"w": np.linspace(-1, 1, 6).astype(np.float32)}
  grads = [np.full(6, 1e4 / np.sqrt(6)), np.linspace(0.5, -0.5, 6), np.linspace(-0.2, 0.3, 6)]
  grads = [{"w": g.astype(np.float32)} for g in grads]
  # (The rates are the schedule's, checked above: in float32 its first warmup steps are ~1e-3 off peak * t / w.)
  expected = _adam_reference(params, grads, [float(lr(t)) for t in range(3)], want["b1"], want["b2"], want["eps"],
                             want["weight_decay"])
  state = tx.init(params)
  for g, want_update in zip(grads, expected):
    update, state = tx.update(g, state, params)
    np.testing.assert_allclose(np.asarray(update["w"]), want_update["w"], rtol=1e-4, atol=1e-12)


def _run(module, *args, cwd=REPO, env=None):
  env = dict(os.environ, **(env or {}))
  return subprocess.run([sys.executable, "-m", module, *args], cwd=cwd, capture_output=True, text=True,
                        timeout=300, env=env)


def _assert_user_error(proc, fragment):
  assert proc.returncode == 2, proc.stderr[-2000:]
  lines = [l for l in proc.stderr.strip().splitlines() if l.strip()]
  assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr[-2000:]
  assert "Traceback" not in proc.stderr and fragment in lines[0]


def test_summary_cli_reports_config_errors_on_one_line():
  proc = _run("bertjax.summary", "--config=configs/bert.py:base", "--config.model.num_heads=7")
  _assert_user_error(proc, "num_heads")


def test_train_cli_missing_and_empty_corpus(tmp_path):
  proc = _run("bertjax.train", "--config=configs/bert.py:tiny", f"--workdir={tmp_path / 'w1'}",
              f"--config.data.source=text:{tmp_path}/missing/*.txt")
  _assert_user_error(proc, "no files match")
  empty = tmp_path / "empty.txt"
  empty.write_text("\n\n")
  proc = _run("bertjax.train", "--config=configs/bert.py:tiny", f"--workdir={tmp_path / 'w2'}",
              f"--config.data.source=text:{empty}")
  _assert_user_error(proc, "holds no text")


def test_train_cli_refuses_seq_len_beyond_positions(tmp_path):
  proc = _run("bertjax.train", "--config=configs/bert.py:tiny", f"--workdir={tmp_path}", "--config.seq_len=600")
  _assert_user_error(proc, "position table")
