"""Distillation (bertjax.compress.distill): the DistilBERT shape and its HF export, the losses, the student's
initialization, and a micro run with a frozen teacher in the same step."""

import json
import os

os.environ["HF_HUB_OFFLINE"] = "1"

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bertjax.compress import distill  # noqa: F401 (plugs distillation into the model factory)
from bertjax.model import config as model_config, distill as distill_model
from bertjax.objectives import distill as objectives
from bertjax.train import build
from conftest import load_config, micro


def test_distilbert_variant_counts_as_transformers_distilbert_for_masked_lm():
  """summary's student count of configs/distill.py:distilbert is DistilBertForMaskedLM's; its embeddings and
  encoder are DistilBertModel's (distilbert-base-uncased: 66,362,880)."""
  torch = pytest.importorskip("torch")
  transformers = pytest.importorskip("transformers")
  from bertjax import summary

  c = load_config("configs/distill.py:distilbert")
  shapes = build.param_shapes(c)
  ours = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(shapes))
  base = sum(int(np.prod(x.shape)) for x in jax.tree.leaves({k: shapes[k] for k in ("embeddings", "encoder")}))
  hf = transformers.DistilBertConfig(vocab_size=30522, dim=768, n_layers=6, n_heads=12, hidden_dim=3072,
                                     max_position_embeddings=512)
  with torch.device("meta"):
    theirs = sum(p.numel() for p in transformers.DistilBertForMaskedLM(hf).parameters())
    theirs_base = sum(p.numel() for p in transformers.DistilBertModel(hf).parameters())
  assert ours == theirs == 66_985_530 and base == theirs_base == 66_362_880
  assert f"student params: {theirs}" in summary.summarize(c).splitlines()


def test_losses_on_hand_made_outputs():
  rng = np.random.default_rng(0)
  logits = rng.normal(size=(2, 3, 7)).astype(np.float32)
  batch = dict(mlm_weights=np.array([[1, 1, 0], [1, 0, 0]], np.float32), groups=np.array([[1, 1, 0], [1, 1, 1]]))
  same = dict(kd_student_logits=logits / 2, kd_teacher_logits=logits / 2, kd_scale=4.0,
              kd_masked_student_logits=logits / 2, kd_masked_teacher_logits=logits / 2)
  total, m = objectives.ce.loss(same, batch)
  assert abs(float(total)) < 1e-5 and float(m["distill_ce_loss"].count) == 5  # KL of a perfect copy is 0
  assert float(objectives.ce.count(batch)) == 5 and float(objectives.ce_masked.count(batch)) == 3
  other = dict(same, kd_student_logits=np.zeros_like(logits), kd_masked_student_logits=np.zeros_like(logits))
  p = jax.nn.softmax(logits / 2, axis=-1)
  kl = (p * (jnp.log(p) - jnp.log(1 / 7))).sum(-1)
  for objective, weights in ((objectives.ce, batch["groups"]), (objectives.ce_masked, batch["mlm_weights"])):
    expected = 4.0 * float((kl * weights).sum())  # x T^2
    assert float(objective.loss(other, batch)[0]) == pytest.approx(expected, rel=1e-5)
  emb = rng.normal(size=(2, 3, 4)).astype(np.float32)
  out = dict(student_embedding=emb, teacher_embedding=emb + 2.0)
  assert float(objectives.embedding.loss(out, batch)[0]) == pytest.approx(4.0 * 5)  # (2.0)^2 x 5 real tokens
  h = rng.normal(size=(2, 3, 4)).astype(np.float32)
  assert float(objectives.cos.loss(dict(student_hidden=h, teacher_hidden=2 * h), batch)[0]) == pytest.approx(0, abs=1e-5)
  assert float(objectives.cos.loss(dict(student_hidden=h, teacher_hidden=-h), batch)[0]) == pytest.approx(2 * 5)
  layers = rng.normal(size=(2, 2, 3, 4)).astype(np.float32)
  out = dict(student_layers=layers, teacher_layers=layers + 1.0)
  assert float(objectives.hidden.loss(out, batch)[0]) == pytest.approx(2 * 5)  # 2 layers x 5 real tokens x 1.0
  att = np.full((1, 2, 1, 3, 3), 1 / 3, np.float32)
  assert float(objectives.attention.loss(dict(student_attention=att, teacher_attention=att), batch)[0]) == 0.0
  np.testing.assert_array_equal(distill_model.layer_map(3, 6), [1, 3, 5])  # TinyBERT: m -> m x L_t / L_s


def test_attention_loss_where_the_maps_differ():
  """TinyBERT's attention loss on maps that differ everywhere, padding included: the squared differences
  summed over real (query, key) pairs, heads and layers, counted per real token; recomputed with loops."""
  rng = np.random.default_rng(1)
  groups = np.array([[1, 1, 1, 0], [1, 1, 0, 0]])  # 5 real tokens; padding queries and keys must not count
  maps = lambda: jax.nn.softmax(rng.normal(size=(2, 2, 3, 4, 4)) * 3, axis=-1)  # [L, B, H, S, S]
  student, teacher = np.array(maps(), np.float32), np.array(maps(), np.float32)
  teacher[..., 3] += 10.0  # padding keys differ wildly (row 0's key 3, row 1's keys 2-3 are padding)
  expected = 0.0
  for layer, b, h, q, k in np.ndindex(*student.shape):
    if groups[b, q] and groups[b, k]:
      expected += (float(student[layer, b, h, q, k]) - float(teacher[layer, b, h, q, k])) ** 2
  total, m = objectives.attention.loss(dict(student_attention=student, teacher_attention=teacher),
                                       dict(groups=groups))
  assert expected > 0.1
  assert float(total) == pytest.approx(expected, rel=1e-5)
  assert float(m["distill_attention_loss"].count) == 5
  assert float(objectives.attention.count(dict(groups=groups))) == 5


def test_student_starts_from_every_other_teacher_layer():
  teacher = micro(**{"model.num_layers": 4, "model.vocab_size": 40})
  student = micro("configs/distill.py:tiny", **{"model.num_layers": 2, "model.vocab_size": 40})
  t_params = jax.tree.map(lambda s: np.random.default_rng(s.size).normal(size=s.shape).astype(np.float32),
                          build.param_shapes(teacher))
  s_params = jax.tree.map(lambda s: np.zeros(s.shape, np.float32), build.param_shapes(student))
  t_cfg, s_cfg = model_config.encoder_config(teacher.model), model_config.encoder_config(student.model)
  out, copied = distill_model.student_from_teacher(s_params, t_params, s_cfg, t_cfg)
  q = out["encoder"]["layers"]["attention"]["query"]["kernel"]
  np.testing.assert_array_equal(q, t_params["encoder"]["layers"]["attention"]["query"]["kernel"][[0, 2]])
  np.testing.assert_array_equal(out["mlm"]["bias"], t_params["mlm"]["bias"])
  assert "type" not in out["embeddings"] and "encoder/layers <- teacher layers [0, 2]" in copied
  narrow = micro("configs/distill.py:tiny", **{"model.num_layers": 2, "model.vocab_size": 40, "model.hidden_size": 32})
  kept, none = distill_model.student_from_teacher("random", t_params, model_config.encoder_config(narrow.model), t_cfg)
  assert kept == "random" and none == []  # another width: the student keeps its own initialization


def _teacher_dir(tmp_path, layers=2):
  """A random micro BERT written as an HF checkpoint with a 24-piece WordPiece vocabulary; (dir, params)."""
  from bertjax.data.tokenizer_spec import load_tokenizer
  from bertjax.hf import convert

  words = "the a of to is in and for be with that this as are it on by or an".split()
  (tmp_path / "vocab.txt").write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + words) + "\n")
  teacher = micro(**{"model.vocab_size": 24, "model.num_layers": layers})
  params = convert.init_params(teacher, seed=0)
  convert.write_hf(teacher, params, str(tmp_path / "teacher"), load_tokenizer(f"wordpiece:{tmp_path / 'vocab.txt'}"))
  return str(tmp_path / "teacher"), params


def _student_config(teacher_dir, **overrides):
  c = micro("configs/distill.py:tiny", **{"model.vocab_size": 24, "model.num_layers": 1, "total_steps": 2,
                                         "warmup_steps": 1, "log_every": 2, "eval_every": 2, "checkpoint_every": 2,
                                         **overrides})
  c.teacher = teacher_dir
  return c


def test_one_step_trains_the_student_against_the_frozen_teacher(tmp_path):
  """The teacher runs inside the jitted train step (every loss on), and only the student moves; the student
  starts from the teacher layers distill.student_layers names, and a frozen position table stays as it began."""
  from bertjax.core import sharding
  from bertjax.data.tokenizer import SpecialIds

  teacher_dir, teacher_params = _teacher_dir(tmp_path)
  c = _student_config(teacher_dir, **{"objectives.distill_hidden": 1.0, "objectives.distill_attention": 1.0,
                                      "objectives.distill_embedding": 1.0, "objectives.distill_ce_masked": 1.0,
                                      "distill.student_layers": (1,), "distill.freeze_position_embeddings": True,
                                      "warmup_steps": 0})  # a nonzero learning rate at step 0
  steps = build.make_steps(c, sharding.make_mesh("dp", jax.devices()[:1]), SpecialIds(0, 1, 2, 3, 4))
  state = steps.init(jax.random.key(0))
  layer0 = lambda p, i=0: np.asarray(p["encoder"]["layers"]["ffn"]["output"]["kernel"][i])
  np.testing.assert_array_equal(layer0(state.params["student"]), layer0(teacher_params, 1))  # teacher layer 1
  rng = np.random.default_rng(0)
  spec = build.host_batch_spec(c, c.batch_size)
  batch = {k: np.ones(v.shape, v.dtype) for k, v in spec.items()}
  batch["input_ids"] = rng.integers(5, 24, spec["input_ids"].shape).astype(np.int32)
  batch["input_ids"][:, 0] = 2
  before = jax.device_get(state.params)
  new, metrics = steps.train(state, batch)  # donates state
  for name in ("mlm_accuracy", "distill_ce_loss", "distill_ce_masked_loss", "distill_cos_loss",
               "distill_embedding_loss", "distill_hidden_loss", "distill_attention_loss"):
    assert np.isfinite(metrics[name].compute()), name
  assert metrics["distill_ce_loss"].compute() > 0 and metrics["skipped"].compute() == 0
  assert float(metrics["distill_ce_loss"].count) == float((batch["groups"] > 0).sum())  # every real token
  after = jax.device_get(new.params)
  jax.tree.map(np.testing.assert_array_equal, after["teacher"], before["teacher"])
  np.testing.assert_array_equal(after["student"]["embeddings"]["position"], before["student"]["embeddings"]["position"])
  assert not np.array_equal(after["student"]["embeddings"]["word"], before["student"]["embeddings"]["word"])
  assert not np.array_equal(layer0(after["student"]), layer0(before["student"]))


def test_distillers_kl_and_cosine_as_transformers_distiller_computes_them():
  """distill_ce and distill_cos divided by their counts equal distiller.py's loss_ce (KLDivLoss(batchmean) of
  the logits over the attention mask at temperature T, x T^2) and loss_cos (CosineEmbeddingLoss over the
  mask), transcribed in torch (examples/research_projects/distillation/distiller.py, Distiller.step)."""
  torch = pytest.importorskip("torch")
  rng = np.random.default_rng(3)
  s_logits, t_logits = (rng.normal(size=(2, 5, 11)).astype(np.float32) * 3 for _ in range(2))
  s_hidden, t_hidden = (rng.normal(size=(2, 5, 6)).astype(np.float32) for _ in range(2))
  attention_mask = np.array([[1, 1, 1, 1, 0], [1, 1, 0, 0, 0]])
  T = 2.0
  mask = torch.tensor(attention_mask, dtype=torch.bool)
  pick = lambda x: torch.tensor(x)[mask]  # (tokens, dim), as masked_select + view
  loss_ce = torch.nn.KLDivLoss(reduction="batchmean")(
      torch.log_softmax(pick(s_logits) / T, -1), torch.softmax(pick(t_logits) / T, -1)) * T ** 2
  s, t = pick(s_hidden), pick(t_hidden)
  loss_cos = torch.nn.CosineEmbeddingLoss(reduction="mean")(s, t, torch.ones(s.shape[0]))
  batch = dict(groups=attention_mask)
  out = dict(kd_student_logits=s_logits / T, kd_teacher_logits=t_logits / T, kd_scale=T * T,
             student_hidden=s_hidden, teacher_hidden=t_hidden)
  ce = float(objectives.ce.loss(out, batch)[0]) / float(objectives.ce.count(batch))
  cos = float(objectives.cos.loss(out, batch)[0]) / float(objectives.cos.count(batch))
  assert ce == pytest.approx(float(loss_ce), rel=1e-5) and cos == pytest.approx(float(loss_cos), rel=1e-5)


def test_a_narrower_student_learns_through_tinyberts_projection(tmp_path):
  """A student narrower than the teacher: its embedding output and layers reach the teacher's width through one
  learned projection (TinyBERT's fit_dense), trained with it; without a projection the widths could not meet."""
  from bertjax.compress import distill

  teacher_dir, _ = _teacher_dir(tmp_path)
  c = _student_config(teacher_dir, **{"model.hidden_size": 32, "model.intermediate_size": 64,
                                      "objectives.distill_cos": 0.0, "objectives.distill_embedding": 1.0,
                                      "objectives.distill_hidden": 1.0})
  model = build.make_model(c)
  assert model.project and model.networks["projection"] == ["projection"]
  shapes = build.param_shapes(c)
  assert shapes["projection"]["kernel"].shape == (32, 64)
  frozen = distill.is_frozen(c)
  assert not frozen(("projection", "kernel")) and frozen(("teacher", "embeddings", "word"))
  batch = {k: np.ones(v.shape, v.dtype) for k, v in build.host_batch_spec(c, 2).items()}
  batch.update(input_ids=np.full((2, c.seq_len), 7, np.int32), mlm_positions=np.zeros((2, 3), np.int32),
               mlm_weights=np.ones((2, 3), np.float32), original_ids=np.ones((2, c.seq_len), np.int32))
  out = jax.eval_shape(lambda p, b: model.apply({"params": p}, b), shapes, batch)
  assert out["student_embedding"].shape == out["teacher_embedding"].shape == (2, c.seq_len, 64)
  assert out["student_layers"].shape == out["teacher_layers"].shape == (1, 2, c.seq_len, 64)
  with pytest.raises(distill.UserError, match="distill_cos compares final hidden states"):
    build.make_model(_student_config(teacher_dir, **{"model.hidden_size": 32}))
  with pytest.raises(distill.UserError, match="must name 1 teacher layers"):
    build.make_model(_student_config(teacher_dir, **{"distill.student_layers": (0, 1)}))
  with pytest.raises(distill.UserError, match="freeze_position_embeddings keeps the position table"):
    build.make_model(_student_config(teacher_dir, **{"model.hidden_size": 32, "objectives.distill_cos": 0.0,
                                                     "distill.freeze_position_embeddings": True}))


def test_a_distilbert_shaped_student_exports_to_distilbert_for_masked_lm(tmp_path):
  torch = pytest.importorskip("torch")
  transformers = pytest.importorskip("transformers")
  from bertjax.hf import convert, inference

  from bertjax.compress import distill

  c = distill.baseline_config(micro("configs/distill.py:tiny", **{"model.vocab_size": 40, "model.num_layers": 2}))
  params = convert.init_params(c, seed=1)
  (directory,) = convert.write_hf(c, params, str(tmp_path / "hf"))
  assert json.load(open(os.path.join(directory, "config.json")))["architectures"] == ["DistilBertForMaskedLM"]
  ids = np.array([[2, 5, 9, 4, 7, 3]], np.int32)
  ours = inference.logits(c, params, ids, np.zeros_like(ids))["mlm"]
  model = transformers.DistilBertForMaskedLM.from_pretrained(directory).eval()
  with torch.no_grad():
    theirs = model(input_ids=torch.tensor(ids, dtype=torch.long)).logits.numpy()
  np.testing.assert_allclose(ours, theirs, atol=1e-4)


@pytest.mark.slow  # two micro runs (distilled, baseline); the steps and the export are tested above
def test_the_distill_command_compares_with_the_student_alone_and_writes_the_student(tmp_path, capsys):
  from bertjax.compress import distill
  from bertjax.hf import inference
  from bertjax.train import checkpoint

  teacher_dir, teacher_params = _teacher_dir(tmp_path)
  c = _student_config(teacher_dir)
  w = str(tmp_path / "w")
  result = distill.run(c, w)
  out = capsys.readouterr().out
  assert "student initialized from the teacher: embeddings/word" in out and "no teacher" in out
  assert "eval/distill_ce_loss" in result["distilled"] and "eval/mlm_accuracy" in result["without_teacher"]
  assert json.load(open(os.path.join(w, "comparison.json"))) == json.loads(json.dumps(result))
  saved = checkpoint.restore_params(w, build.param_shapes(c))
  jax.tree.map(np.testing.assert_array_equal, saved["teacher"]["encoder"], teacher_params["encoder"])
  loaded = inference.load(workdir=os.path.join(w, "student"))  # the student alone, a plain workdir
  jax.tree.map(np.testing.assert_array_equal, loaded.params["encoder"], saved["student"]["encoder"])


def test_distill_without_a_teacher_is_a_one_line_error(tmp_path):
  from bertjax.compress import distill
  from bertjax.core.errors import UserError

  with pytest.raises(UserError, match="set --config.teacher"):
    distill.run(micro("configs/distill.py:tiny"), str(tmp_path / "w"))
  assert not (tmp_path / "w").exists()  # nothing written
