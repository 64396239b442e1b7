"""XLNet against transformers: XLNetLMHeadModel's logits and memory over three chained segments with perm_mask,
target_mapping, segment ids and padding (within 1e-4), the sequence-summary and simple span heads, import and
export of the four model directories, the configs bertjax refuses, and the published parameter counts."""

import os

os.environ["HF_HUB_OFFLINE"] = "1"  # nothing here may download
os.environ["TRANSFORMERS_OFFLINE"] = "1"

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bertjax.core import config as config_lib
from bertjax.core.errors import UserError
from bertjax.hf import convert, xlnet as hx
from bertjax.model import memory as memory_lib, xlnet_models
from bertjax.model.hparams import EncoderConfig

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

B, S, P, SEGMENTS = 2, 8, 3, 3
HF_TINY = dict(vocab_size=64, d_model=32, n_layer=2, n_head=4, d_inner=64, dropout=0.0, mem_len=6, reuse_len=4)


def tiny_cfg(**kw) -> EncoderConfig:
  return EncoderConfig(vocab_size=64, hidden_size=32, num_layers=2, num_heads=4, intermediate_size=64,
                       embedding_size=32, dropout=0.0, attention_dropout=0.0, **kw)


def segment_inputs(rng, attn_type="bi"):
  """One segment's inputs: ids, segment ids 0/1/2, a random perm_mask, P one-hot targets per row (row 1's last
  one a padding row of zeros), row 1 left-padded by two (uni: transformers cannot combine its causal mask with a data mask, so none)."""
  ids, types = rng.integers(0, 64, (B, S)), rng.integers(0, 3, (B, S))
  perm = (rng.random((B, S, S)) < 0.4).astype(np.float32)
  tm = np.zeros((B, P, S), np.float32)
  for b in range(B):
    tm[b, np.arange(P), rng.choice(S, P, replace=False)] = 1
  tm[1, -1] = 0  # a padding row: no prediction there
  mask = np.ones((B, S), np.float32)
  mask[1, :2] = 0
  if attn_type == "uni":
    perm, mask = None, None
  return dict(input_ids=ids, type_ids=types, perm_mask=perm, target_mapping=tm, groups=mask)


def run_both(hf_model, model, params, segments, memory):
  """(transformers' logits, ours, transformers' mems, our memory) per segment, memory carried."""
  apply = jax.jit(lambda p, batch, mem: model.apply({"params": p}, batch, mem))
  out, mems = [], None
  for seg in segments:
    t = lambda k: None if seg[k] is None else torch.tensor(seg[k])
    with torch.no_grad():
      ref = hf_model(t("input_ids"), attention_mask=t("groups"), mems=mems, perm_mask=t("perm_mask"),
                     target_mapping=t("target_mapping"), token_type_ids=t("type_ids"), use_mems=True)
    mems = ref.mems
    batch = {k: jnp.asarray(v) for k, v in seg.items() if v is not None}
    got = apply(params, batch, memory)
    memory = got["memory"]
    out.append((ref.logits.numpy(), np.asarray(got["logits"]), torch.stack(mems).numpy(), memory, got["cmem_loss"]))
  return out


@pytest.fixture(scope="module")
def tiny():
  """A tiny random XLNetLMHeadModel, its weights imported, and three chained segments through both."""
  torch.manual_seed(0)
  hf_model = transformers.XLNetLMHeadModel(transformers.XLNetConfig(**HF_TINY)).eval()
  state = {k: v.detach().numpy() for k, v in hf_model.state_dict().items()}
  config, kind, params, _, unused = hx.read(hf_model.config.to_dict(), state)
  mc = memory_lib.memory_config(config.model.xlnet)
  model = xlnet_models.XLNetLMHeadModel(tiny_cfg(), mc)
  rng = np.random.default_rng(0)
  segments = [segment_inputs(rng) for _ in range(SEGMENTS)]
  memory = memory_lib.empty(2, B, 32, mc)
  return dict(hf=hf_model, state=state, config=config, kind=kind, params=params, unused=unused, model=model,
              results=run_both(hf_model, model, params, segments, memory), mc=mc)


def test_lm_logits_and_memory_equal_transformers_over_three_segments(tiny):
  assert tiny["kind"] == "lm" and tiny["unused"] == []
  assert (tiny["mc"].mem_len, tiny["mc"].reuse_len) == (6, 4)
  for i, (ref, got, mems, memory, _) in enumerate(tiny["results"]):
    assert got.shape == (B, P, 64)
    np.testing.assert_allclose(got, ref, atol=1e-4, err_msg=f"segment {i}")
    valid = np.asarray(memory["mem_valid"])
    mlen = mems.shape[1]  # transformers' growing memory: 4, then 6 (seq-first [L, mlen, B, d])
    assert mlen == min(6, 4 * (i + 1)) and (valid.sum(1) == mlen).all() and valid[:, -mlen:].all()
    np.testing.assert_allclose(np.asarray(memory["mem"])[:, :, -mlen:], mems.transpose(0, 2, 1, 3), atol=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("attn_type,bi_data,clamp_len", [("uni", False, -1), ("bi", True, 3), ("uni", True, 2)])
def test_attention_types_bi_data_and_clamp_equal_transformers(attn_type, bi_data, clamp_len):
  torch.manual_seed(0)
  hf_model = transformers.XLNetLMHeadModel(transformers.XLNetConfig(
      **dict(HF_TINY, attn_type=attn_type, bi_data=bi_data, clamp_len=clamp_len))).eval()
  state = {k: v.detach().numpy() for k, v in hf_model.state_dict().items()}
  config, _, params, _, _ = hx.read(hf_model.config.to_dict(), state)
  mc = memory_lib.memory_config(config.model.xlnet)
  assert (mc.attn_type, mc.bi_data, mc.clamp_len) == (attn_type, bi_data, clamp_len)
  rng = np.random.default_rng(1)
  results = run_both(hf_model, xlnet_models.XLNetLMHeadModel(tiny_cfg(), mc), params,
                     [segment_inputs(rng, attn_type) for _ in range(SEGMENTS)], memory_lib.empty(2, B, 32, mc))
  for i, (ref, got, *_) in enumerate(results):
    np.testing.assert_allclose(got, ref, atol=1e-4, err_msg=f"segment {i}")


def test_export_is_the_imported_state_dict(tiny, tmp_path):
  hf, tensors = hx.export(tiny["config"], tiny["params"], "lm")
  assert hf["architectures"] == ["XLNetLMHeadModel"] and hf["untie_r"] and hf["mem_len"] == 6
  assert set(tensors) == set(tiny["state"])
  for k, v in tiny["state"].items():
    np.testing.assert_array_equal(tensors[k], v, err_msg=k)
  # and through a directory transformers loads
  out = convert.write_xlnet(tiny["config"], tiny["params"], str(tmp_path / "lm"))
  back = transformers.XLNetLMHeadModel.from_pretrained(out).eval()
  ids = torch.tensor(np.arange(16).reshape(2, 8) % 64)
  with torch.no_grad():
    np.testing.assert_allclose(back(ids).logits.numpy(), tiny["hf"](ids).logits.numpy(), atol=1e-6)
  imported = convert.read_hf(out)
  assert imported.family == "xlnet" and imported.kind == "lm" and imported.config.model.layer == "xlnet"
  np.testing.assert_array_equal(imported.params["lm_loss"]["bias"], tiny["state"]["lm_loss.bias"])
  # as `python -m bertjax.hf import` then `export` do it: through a bertjax workdir
  from bertjax.hf import workdir

  workdir.save(imported, str(tmp_path / "w"))
  config, params, _, _ = workdir.load(str(tmp_path / "w"))
  (again,) = convert.write_hf(config, params, str(tmp_path / "again"))
  state = transformers.XLNetLMHeadModel.from_pretrained(again).state_dict()
  for k, v in tiny["state"].items():
    np.testing.assert_array_equal(state[k].numpy(), v, err_msg=k)


@pytest.mark.parametrize("kind", ["classifier", "span", "base"])
def test_task_heads_and_base_model_equal_transformers(tiny, kind, tmp_path):
  """XLNetForSequenceClassification (3 labels), XLNetForQuestionAnsweringSimple and XLNetModel saved by
  transformers, imported, run on left-padded rows with segment ids, exported and loaded back."""
  cls = {"classifier": transformers.XLNetForSequenceClassification, "span": transformers.XLNetForQuestionAnsweringSimple,
         "base": transformers.XLNetModel}[kind]
  torch.manual_seed(1)
  hf_model = cls(transformers.XLNetConfig(**dict(HF_TINY, num_labels=3 if kind == "classifier" else 2))).eval()
  hf_model.save_pretrained(tmp_path / "in")
  imported = convert.read_hf(str(tmp_path / "in"))
  assert imported.kind == kind and imported.unused == []
  model = hx.model_for(imported.config, kind, num_labels=3)
  seg = segment_inputs(np.random.default_rng(2))
  args = [jnp.asarray(seg[k]) for k in ("input_ids", "type_ids", "groups")]
  got = model.apply({"params": imported.task_params}, *args)
  with torch.no_grad():
    ref = hf_model(torch.tensor(seg["input_ids"]), token_type_ids=torch.tensor(seg["type_ids"]),
                   attention_mask=torch.tensor(seg["groups"]))
  if kind == "classifier":
    np.testing.assert_allclose(np.asarray(got), ref.logits.numpy(), atol=1e-4)
  elif kind == "span":
    np.testing.assert_allclose(np.asarray(got[0]), ref.start_logits.numpy(), atol=1e-4)
    np.testing.assert_allclose(np.asarray(got[1]), ref.end_logits.numpy(), atol=1e-4)
  else:
    np.testing.assert_allclose(np.asarray(got["hidden"]), ref.last_hidden_state.numpy(), atol=1e-4)
  out = convert.write_xlnet(imported.config, imported.task_params, str(tmp_path / "out"), kind)
  state = cls.from_pretrained(out).state_dict()
  for k, v in hf_model.state_dict().items():
    np.testing.assert_array_equal(state[k].numpy(), v.numpy(), err_msg=k)


@pytest.mark.parametrize("key,value", [("untie_r", False), ("same_length", True), ("ff_activation", "swish"),
                                       ("summary_type", "first")])
def test_refuses_what_it_cannot_represent(key, value):
  with pytest.raises(UserError, match=key) as e:
    hx.model_section(dict(HF_TINY, **{key: value}))
  assert "\n" not in str(e.value)


def test_published_parameter_counts():
  from bertjax.summary import count
  from bertjax.train import build

  for arg, lm, base in (("base", 116_750_336, 116_718_336), ("large", 360_300_800, 360_268_800)):
    config = config_lib.load(os.path.join(os.path.dirname(__file__), "..", "configs", "xlnet.py") + f":{arg}")
    shapes = build.param_shapes(config)
    assert (count(shapes), count(shapes["transformer"])) == (lm, base), arg


def test_sentencepiece_tokenizer_through_hf_dir(tmp_path):
  """XLNet's tokenizer (a SentencePiece model trained here on Python's docs, read as XLNetTokenizer) through
  hf:DIR: transformers' ids and segment ids (A <sep> B <sep> <cls>: 0, 1, 2) and special ids."""
  import json
  import shutil

  import pydoc_data.topics
  import sentencepiece as spm

  from bertjax.data.tokenizer_spec import load_tokenizer

  lines = "\n".join(list(pydoc_data.topics.topics.values())[:40]).splitlines()
  spm.SentencePieceTrainer.train(
      sentence_iterator=iter(lines), model_prefix=str(tmp_path / "sp"), vocab_size=300, character_coverage=1.0,
      control_symbols=["<cls>", "<sep>", "<pad>", "<mask>", "<eod>", "<eop>"], pad_id=-1, minloglevel=2)
  d = tmp_path / "hf"
  d.mkdir()
  shutil.copy(tmp_path / "sp.model", d / "spiece.model")
  (d / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "XLNetTokenizer"}))
  ref, tok = transformers.AutoTokenizer.from_pretrained(str(d)), load_tokenizer(f"hf:{d}")
  a, b = "The print statement writes text.", "Lists are mutable sequences."
  want = ref(a, b, return_token_type_ids=True)
  assert tok.encode_pair(a, b, 64) == (want["input_ids"], want["token_type_ids"])
  assert want["token_type_ids"][-1] == 2 and want["input_ids"][-1] == ref.cls_token_id
  s = tok.special
  assert (s.cls, s.sep, s.pad, s.mask, s.unk) == (ref.cls_token_id, ref.sep_token_id, ref.pad_token_id,
                                                  ref.mask_token_id, ref.unk_token_id)
