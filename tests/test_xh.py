"""Transformer-XH's extra hop (bertjax.model.xh) and the graph fine-tuning family (bertjax.finetune.graph): the
released code's graph attention on hand-computed graphs, the paper's form against a transcription, isolated nodes
as the plain encoder, batch and padding independence, the bad-link line, and a tiny fine-tune's results.json."""

import dataclasses
import json
import os
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bertjax.core.errors import UserError
from bertjax.model import xh
from bertjax.model.encoder import Encoder
from bertjax.model.hparams import EncoderConfig
from conftest import load_config, tiny_hf_checkpoint, toy_graphs


def _hand_params():
  """One GAT hop of 1 head over E = 2: fc = I, a_l = [1, 0], a_r = [0, -3], res_fc = 0.5 I, merge = [I; I] + b."""
  eye = np.eye(2, dtype=np.float32)
  return dict(fc=eye, attn_l=np.array([[1.0, 0.0]], np.float32), attn_r=np.array([[0.0, -3.0]], np.float32),
              res_fc=0.5 * eye, merge_kernel=np.concatenate([eye, eye]), merge_bias=np.array([0.1, -0.1], np.float32))


def test_the_codes_graph_attention_on_hand_computed_graphs():
  """The spec sheet's two nodes with edges 0 -> 1 and 1 -> 0, plus a third node both link to (the softmax and the
  LeakyReLU's negative side). By hand, z = c (fc = I); source terms a_l.z = [1, 0, 1], target terms
  a_r.z = [0, -3, -3]. Node 0 hears node 1 only (alpha 1): ReLU([0, 1] + 0.5 [1, 0]) = [0.5, 1], merged with its
  [1, 0] and the bias: [1.6, 0.9]. Node 1: ReLU([1, 0] + [0, 0.5]) + [0, 1] + b = [1.1, 1.4]. Node 2: edge scores
  LeakyReLU(1 - 3) = -0.4 and LeakyReLU(0 - 3) = -0.6, alpha = [0.549834, 0.450166], message
  [0.549834, 0.450166] + [0.5, 0.5], merged with [1, 1] + b: [2.149834, 1.850166]."""
  cls = jnp.array([[[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]]])
  links = np.zeros((1, 3, 3), np.float32)  # links[g, to, from]
  for u, v in ((0, 1), (1, 0), (0, 2), (1, 2)):
    links[0, v, u] = 1.0
  out = np.asarray(xh.gat(_hand_params(), cls, jnp.asarray(links), heads=1))[0]
  np.testing.assert_allclose(out, [[1.6, 0.9], [1.1, 1.4], [2.149834, 1.850166]], atol=1e-5)
  two = np.asarray(xh.gat(_hand_params(), cls[:, :2], jnp.asarray(links[:, :2, :2]), heads=1))[0]
  np.testing.assert_allclose(two, out[:2], atol=1e-6)  # the spec's two-node graph alone


def _dgl_transcription(p, cls, links, heads):
  """GraphAttention.forward (DGL message passing) edge by edge, then the merge Linear on [g; c], in NumPy."""
  n, e = cls.shape
  h = cls.reshape(n, heads, e // heads)
  ft = h @ p["fc"]
  a1, a2 = (ft * p["attn_l"]).sum(-1), (ft * p["attn_r"]).sum(-1)
  out = np.zeros_like(ft)
  for v in range(n):
    srcs = [u for u in range(n) if links[v, u]]
    if srcs:
      s = np.array([a1[u] + a2[v] for u in srcs])
      s = np.where(s > 0, s, 0.2 * s)
      alpha = np.exp(s - s.max(0)) / np.exp(s - s.max(0)).sum(0)  # [edges, heads]
      out[v] = sum(alpha[i][:, None] * ft[u] for i, u in enumerate(srcs))
  g = np.maximum(out + h @ p["res_fc"], 0).reshape(n, e)
  return np.concatenate([g, cls], -1) @ p["merge_kernel"] + p["merge_bias"]


def test_gat_matches_a_transcription_with_several_heads_and_dot_is_the_papers_form():
  rng = np.random.default_rng(0)
  cfg = EncoderConfig(vocab_size=10, hidden_size=8, num_layers=2, num_heads=2, intermediate_size=16, embedding_size=8)
  cls = rng.normal(size=(4, 8)).astype(np.float32)
  links = (rng.random((4, 4)) < 0.5).astype(np.float32) * (1 - np.eye(4, dtype=np.float32))
  links[0] = 1 - np.eye(4)[0]  # node 0 hears everyone
  for form in ("gat", "dot"):
    hop = xh.HopConfig(from_layer=1, form=form)
    p = {k: rng.normal(size=shape[1:]).astype(np.float32) * 0.5 for k, (shape, _) in xh.param_shapes(cfg, hop).items()}
    got = np.asarray(xh.extra_hop(p, jnp.asarray(cls[None]), jnp.asarray(links[None]),
                                  dataclasses.replace(hop, isolated="merge"), 2))[0]
    if form == "gat":
      want = _dgl_transcription(p, cls, links, 2)
    else:  # softmax_u(q_v . k_u / sqrt(d)) v_u per head, then Linear([c; h])
      q, k, v = ((cls @ p[f"{n}_kernel"] + p[f"{n}_bias"]).reshape(4, 2, 4) for n in ("query", "key", "value"))
      s = np.einsum("vhd,uhd->vuh", q, k) / 2.0
      w = np.where(links[..., None] > 0, np.exp(s - s.max(1, keepdims=True)), 0.0)
      hhat = np.einsum("vuh,uhd->vhd", w / np.maximum(w.sum(1, keepdims=True), 1e-30), v).reshape(4, 8)
      want = np.concatenate([cls, hhat], -1) @ p["merge_kernel"] + p["merge_bias"]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


CFG = EncoderConfig(vocab_size=40, hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64, embedding_size=32,
                    dropout=0.0, attention_dropout=0.0)
HOP = xh.HopConfig(from_layer=0)


@pytest.fixture(scope="module")
def stack():
  """(the hop encoder under jit, rows [3, 16, E] of random states with lengths 16, 12, 9, their groups, their plain
  encoder outputs): one compile of each encoder for these shapes."""
  rng = np.random.default_rng(0)
  x, groups = _graph(rng, 3, [16, 12, 9], 16)
  hops = xh.Hops(CFG, HOP).init(jax.random.key(1))["params"]
  enc = xh.HopEncoder(CFG, hop=HOP)
  params = enc.init(jax.random.key(2), x, groups, jnp.zeros((1, 3, 3)), hops)
  hop_fn = jax.jit(lambda x, g, l, h=hops: enc.apply(params, x, g, l, h))
  plain = np.asarray(jax.jit(lambda x, g: Encoder(CFG).apply(params, x, g))(x, groups))
  return hop_fn, x, groups, plain, hops


def _graph(rng, nodes, lengths, seq):
  """Rows [nodes, seq, E] of random states, `lengths` real tokens each, and their groups."""
  x = rng.normal(size=(nodes, seq, 32)).astype(np.float32)
  groups = (np.arange(seq)[None] < np.asarray(lengths)[:, None]).astype(np.int32)
  return x * groups[..., None], groups


def test_isolated_nodes_are_the_plain_encoder_and_linked_ones_are_not(stack):
  hop_fn, x, groups, plain, _ = stack
  none = np.asarray(hop_fn(x, groups, jnp.zeros((1, 3, 3))))
  np.testing.assert_allclose(none, plain, atol=2e-5)  # no links: no hop changes anything
  links = np.zeros((1, 3, 3), np.float32)
  links[0, 1, 0] = 1.0  # passage 0 links to passage 1: only 1 hears (directed)
  linked = np.asarray(hop_fn(x, groups, jnp.asarray(links)))
  np.testing.assert_allclose(linked[[0, 2]], plain[[0, 2]], atol=2e-5)
  assert np.abs(linked[1, :12] - plain[1, :12]).max() > 1e-2  # [CLS] changed after layer 0, so every token after


def test_a_graphs_nodes_do_not_depend_on_the_batch_or_its_padding(stack):
  """The fixture's graph A (3 nodes) alone equals A beside graph B in a batch of 5 nodes a graph, padding nodes
  (a lone [CLS]) included, its rows' padding positions holding other values."""
  hop_fn, xa, ga, _, _ = stack
  la = np.zeros((1, 3, 3), np.float32)
  la[0, 0, 1] = la[0, 0, 2] = la[0, 2, 1] = 1.0
  alone = np.asarray(hop_fn(xa, ga, jnp.asarray(la)))
  rng = np.random.default_rng(1)
  xb, gb = _graph(rng, 5, [16, 5, 8, 1, 1], 16)  # graph B: 3 real nodes and 2 padding nodes
  xa5 = np.concatenate([np.where(ga[..., None] > 0, xa, rng.normal(size=xa.shape)), rng.normal(size=(2, 16, 32))])
  ga5 = np.concatenate([ga, np.eye(16, dtype=np.int32)[[0, 0]]])  # A's padding nodes
  links = np.zeros((2, 5, 5), np.float32)
  links[0, :3, :3] = (rng.random((3, 3)) < 0.7) * (1 - np.eye(3))
  links[1, :3, :3] = la[0]
  both = np.asarray(hop_fn(jnp.asarray(np.concatenate([xb, xa5]), jnp.float32), jnp.asarray(np.concatenate([gb, ga5])),
                           jnp.asarray(links)))
  for k, n in enumerate([16, 12, 9]):
    np.testing.assert_allclose(both[5 + k, :n], alone[k, :n], atol=2e-5)


@pytest.mark.slow  # a backward compile of the encoder (3 s idle); the normal tier's tiny fine-tune trains through it
def test_each_hop_layer_trains_its_own_weights(stack):
  """Gradients reach both hop layers' entries of the stacked weights (the scan's broadcast argument, sliced per
  layer under lax.cond)."""
  hop_fn, x, groups, _, hops = stack
  links = jnp.zeros((1, 3, 3)).at[0, 2, 0].set(1.0)
  grads = jax.grad(lambda h: jnp.sum(hop_fn(x, groups, links, h)[:, 0] ** 2))(hops)
  for name in ("fc", "merge_kernel"):
    assert all(np.abs(np.asarray(grads[name][i])).max() > 0 for i in range(2)), name


def test_hop_settings_the_encoder_cannot_run_are_one_line_errors():
  for hop, fragment in ((xh.HopConfig(from_layer=2), "xh.from_layer=2 must name one of the encoder's 2 layers"),
                        (xh.HopConfig(form="sum"), "xh.form='sum'"), (xh.HopConfig(heads=3), "xh.heads=3")):
    with pytest.raises(UserError, match=re.escape(fragment)):
      xh.check(CFG, hop)
  with pytest.raises(UserError, match="model.norm=pre"):
    xh.check(dataclasses.replace(CFG, norm="pre"), HOP)


def test_a_link_to_a_missing_passage_is_one_line_naming_the_line_and_id_exit_2(tmp_path, capsys):
  """Read before the checkpoint (which does not exist here): `error: FILE:LINE: ... passage 'p9' ...`, exit 2."""
  from bertjax.core.cli import cli
  from bertjax.finetune import train

  data = tmp_path / "graphs"
  data.mkdir()
  good = '{"passages": [{"id": "p0", "text": "a b"}, {"id": "p1", "text": "c"}], "links": [["p0", "p1"]], "label": "1"}'
  (data / "train.jsonl").write_text(good + "\n" + good.replace('["p0", "p1"]', '["p0", "p9"]') + "\n")
  (data / "dev.jsonl").write_text(good + "\n")
  config = load_config("configs/xh.py:tiny")
  config.task.source, config.init.checkpoint = f"jsonl:{data}", str(tmp_path / "no_checkpoint_here")
  with pytest.raises(SystemExit) as e:
    cli(lambda argv: train.finetune(config, str(tmp_path / "ft")))([])
  err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
  assert e.value.code == 2 and len(err) == 1, err
  assert err[0].startswith(f"error: {data / 'train.jsonl'}:2: link ['p0', 'p9'] names passage 'p9'"), err


def _sentences():
  import pydoc_data.topics as topics

  text = " ".join(" ".join(v.split()) for v in topics.topics.values())
  return [s for s in re.split(r"(?<=[.!?])\s+", text) if 6 <= len(s.split()) <= 10][:200]


@pytest.mark.parametrize("preset", ["tiny", pytest.param("tiny_span", marks=pytest.mark.slow)])  # span: 10 s idle
def test_the_tiny_fine_tune_writes_results(tmp_path, preset):
  """configs/xh.py's tiny presets on generated graphs: a few steps through the trainer, results.json with the
  family's metrics, and the saved model read back."""
  from bertjax.finetune import task_models, train

  sents = _sentences()
  data = tmp_path / "graphs"
  data.mkdir()
  target = "span" if preset == "tiny_span" else "classification"
  for name, n, seed in (("train.jsonl", 24, 0), ("dev.jsonl", 8, 1)):
    (data / name).write_text("\n".join(toy_graphs(sents, n, target, seed)) + "\n")
  words = sorted({w for s in sents for w in re.findall(r"\w+|[^\w\s]", s.lower())})
  config = load_config(f"configs/xh.py:{preset}")
  config.init.checkpoint = tiny_hf_checkpoint(tmp_path, ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + words)
  config.task.source, config.total_steps, config.save_model = f"jsonl:{data}", 2, True
  config.bucket_lengths = "none"  # one compiled shape
  results = train.finetune(config, str(tmp_path / "ft"))
  on_disk = json.load(open(tmp_path / "ft" / "results.json"))
  metrics = {"accuracy"} if target == "classification" else {"exact_match", "f1", "node_accuracy"}
  assert set(on_disk["per_seed"][0]) == metrics and on_disk["summary"] == results["summary"]
  assert on_disk["kind"] == "graph" and on_disk["nodes"] == 4 and on_disk["hop"]["form"] == "gat"
  model = task_models.load(str(tmp_path / "ft" / "seed_0" / "model"))
  assert model.kind == "graph" and model.model.hop.from_layer == 0 and "hops" in model.params
  if target == "span":
    assert os.path.isfile(tmp_path / "ft" / "seed_0" / "predictions.json")


@pytest.mark.slow  # a minute or two cold on 2 cores
def test_only_the_hop_can_tell_which_passage_links_to_the_hub(tmp_path):
  """Every graph holds the same three passages ("hub ...", "red ...", "blue ..."); only which of red and blue links
  to the hub decides the label, so no passage's own tokens tell the classes apart: without the hop the model is at
  chance (0.5), with it the hub's [CLS] hears the linking passage."""
  import random

  from bertjax.finetune import train

  rng, data = random.Random(0), tmp_path / "graphs"
  data.mkdir()
  filler = ["one", "two", "three", "four", "five", "six"]
  for name, n in (("train.jsonl", 400), ("dev.jsonl", 60)):
    rows = []
    for i in range(n):
      texts = {p: " ".join([p] + rng.sample(filler, 3)) for p in ("hub", "red", "blue")}
      label = rng.randrange(2)
      passages = [dict(id=p, text=t) for p, t in rng.sample(sorted(texts.items()), 3)]
      rows.append(json.dumps(dict(id=str(i), passages=passages, links=[["red" if label else "blue", "hub"]],
                                  label=str(label))))
    (data / name).write_text("\n".join(rows) + "\n")
  config = load_config("configs/xh.py:tiny")
  config.init.checkpoint = tiny_hf_checkpoint(tmp_path, ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "hub", "red",
                                                         "blue"] + filler)
  config.task.source, config.total_steps, config.seq_len, config.bucket_lengths = f"jsonl:{data}", 150, 16, "none"
  config.model.dropout = config.model.attention_dropout = config.model.classifier_dropout = 0.0
  results = train.finetune(config, str(tmp_path / "ft"))
  assert results["per_seed"][0]["accuracy"] > 0.9, results["per_seed"]
