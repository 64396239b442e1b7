"""Tree attention on given parses (bertjax.model.tree_attention, bertjax.data.trees): the spec sheet's toy-tree subtree
mask and hierarchical indices, the accumulation against a NumPy transcription of the authors' code (and a value
computed by hand), packed and padded rows against separate ones, MLM kept off the nodes, the fused kernels'
refusal, and the data side's reading of bracketed trees."""

import os
import re
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from conftest import load_config, REPO
from bertjax.core.errors import UserError
from bertjax.data import instances, trees
from bertjax.data.tokenizer import SpecialIds
from bertjax.model import config as model_config
from bertjax.model import tree_attention as ta

SPECIAL = SpecialIds(pad=0, unk=1, cls=2, sep=3, mask=4)


class CharTokenizer:
  """Each character its own piece (ids from 10): a leaf of two characters is two word pieces."""

  special = SPECIAL
  vocab_size = 200

  def encode(self, text):
    ids = np.array([10 + (ord(ch) % 150) for ch in text.replace(" ", "")], np.int32)
    return ids, np.arange(len(ids)) == 0


def reference_node_values(leaf_v, node_v, spans, w, hier):
  """The authors' `_compute_nstree_states` for one head (MergeStackNodesOnValueAttention, wnstack_up_norm=mean,
  wnstack_norm=mean; nstack_merge_tree_attention.py L642-752), transcribed: leaf_v [n, d], node_v [m, d], spans
  [m, 2] inclusive in bottom-up order, w [n] (dwstack_linear), hier [n, m, d]."""
  n = len(leaf_v)
  rg = np.arange(n)[:, None]
  mask = ((rg >= spans[None, :, 0]) ^ (rg > spans[None, :, 1])).astype(np.float64)[..., None]  # get_ntree_mask
  stack = np.concatenate([leaf_v[:, None], (node_v[None] + hier) * mask], 1)  # accumulate_upward
  states = np.cumsum(stack, 1)[:, 1:] / np.clip(np.cumsum(mask, 1), 1, 1e4) * mask
  states = states / np.clip(mask.sum(0, keepdims=True), 1, 1e4)  # accumulate_rightward
  return np.einsum("nmd,n->md", states, w)


def reference_indices(spans, n):
  """MergeHierarchicalEmbedding.forward's indices (before the clamp and the vertical offset): [n, m] each."""
  rg = np.arange(n)[:, None]
  mask = ((rg >= spans[None, :, 0]) ^ (rg > spans[None, :, 1])).astype(int)
  flipped = mask[:, ::-1]  # bottom-up node order flipped: top-down
  return np.cumsum(flipped, 0)[:, ::-1], np.cumsum(flipped, 1)[:, ::-1]


def row_of(line, seq_len):
  """One tree's row (CharTokenizer), as data preparation writes it: (groups, node_first, node_last) [1, S]."""
  arrays = trees.rows([trees.encode(CharTokenizer(), trees.parse(line))], seq_len, SPECIAL, False,
                      instances.InstanceStats())
  return arrays


def test_spec_sheet_toy_tree_mask_and_indices():
  parsed = trees.parse("(S (NP a b) c)")
  assert parsed.leaves == ("a", "b", "c") and parsed.nodes == (("NP", 0, 1), ("S", 0, 2))  # reverse BFS spans
  # Rows over [a b c | NP S] (no [CLS]/[SEP]: the spec sheet's layout), True = blocked.
  groups, first, last = jnp.ones((1, 5), jnp.int32), jnp.array([[-1, -1, -1, 0, 0]]), jnp.array([[-1, -1, -1, 1, 2]])
  node, inside, contains = ta.relations(groups, first, last)
  blocked = ~np.asarray(ta.subtree_allowed(groups, node, inside, contains))[0]
  assert blocked[3].tolist() == [0, 0, 1, 0, 1]  # NP
  assert blocked[4].tolist() == [0, 0, 0, 0, 0]  # S
  assert blocked[:3, 3:].all() and not blocked[:3, :3].any()  # leaves: every leaf, no node
  h, v = ta.hierarchical_indices(first, last, inside, contains, 100, 1024)
  h, v = np.asarray(h)[0, :3, 3:], np.asarray(v)[0, :3, 3:] - 101
  inside_ = np.asarray(inside)[0, :3, 3:]
  assert h.tolist() == [[1, 1], [2, 2], [2, 3]]  # every entry, as the code's cumulative count
  np.testing.assert_array_equal(np.where(inside_, v, 0), [[2, 1], [2, 1], [0, 1]])  # (c, NP) is masked downstream
  ref_h, ref_v = reference_indices(np.array([[0, 1], [0, 2]]), 3)
  np.testing.assert_array_equal(h, ref_h)
  np.testing.assert_array_equal(np.where(inside_, v, 0), np.where(inside_, ref_v, 0))
  _, path = ta.hierarchical_indices(first, last, inside, contains, 100, 1024, "path")  # the paper's reading
  np.testing.assert_array_equal(np.where(inside_, np.asarray(path)[0, :3, 3:] - 101, 0), [[1, 2], [1, 2], [0, 1]])
  h, v = ta.hierarchical_indices(first, last, inside, contains, 2, 1)  # clamped
  assert np.asarray(h).max() == 2 and np.asarray(v).max() == 1 + 1 + 2


def test_rows_hold_leaf_pieces_then_nodes_with_their_spans():
  arrays = row_of("(S (NP (DT a) (NN bb)) (VP (VBD c)))", 12)  # POS tags and the unary VP are no nodes
  # [CLS] a b b c [SEP] NP S: NN's two pieces both belong to it.
  assert arrays["input_ids"][0, :6].tolist() == [2, 10 + ord("a") % 150, 10 + ord("b") % 150, 10 + ord("b") % 150,
                                                   10 + ord("c") % 150, 3]
  assert arrays["node_first"][0].tolist() == [-1] * 6 + [1, 1] + [-1] * 4
  assert arrays["node_last"][0].tolist() == [-1] * 6 + [3, 4] + [-1] * 4
  assert arrays["groups"][0].tolist() == [1] * 8 + [0] * 4
  stats = instances.InstanceStats()
  assert trees.rows([trees.encode(CharTokenizer(), trees.parse("(S (NP a b) c)"))], 6, SPECIAL, False, stats) is None
  assert stats.long_trees == 1  # 3 leaves + 2 nodes + [CLS] + [SEP] > 6


@pytest.mark.parametrize("line, problem", [
    ("S a b)", "does not start with '('"), ("(S (NP a b) c", "left open"), ("(S (NP a b)) c)", "text after"),
    ("(S (NP) c)", "no children"), ("(S ((NP a) b))", "without a label")])
def test_trees_that_do_not_parse_name_the_line(line, problem):
  with pytest.raises(UserError, match=re.escape("f.txt:7: the bracketed tree does not parse (") + ".*" + re.escape(problem)):
    trees.parse(line, "f.txt:7")


def test_accumulation_matches_the_authors_code_and_a_hand_computed_value():
  # Hand-computed: (S (NP a b) c), 1-dim values a=1 b=2 c=3 NP=10 S=20, w = 1, no embeddings:
  # NP = ((1 + 10) / 1 + (2 + 10) / 1) / 2 = 11.5; S = ((1 + 10 + 20) / 2 + (2 + 10 + 20) / 2 + (3 + 20) / 1) / 3.
  groups, first, last = jnp.ones((1, 5), jnp.int32), jnp.array([[-1, -1, -1, 0, 0]]), jnp.array([[-1, -1, -1, 1, 2]])
  node, inside, contains = ta.relations(groups, first, last)
  v = jnp.array([1.0, 2.0, 3.0, 10.0, 20.0]).reshape(1, 5, 1, 1)
  out = ta.accumulate(v, jnp.ones((1, 5, 1)), jnp.zeros((1, 5, 5, 1)), node, inside, contains)
  np.testing.assert_allclose(np.asarray(out).ravel(), [1, 2, 3, 11.5, 18.1666667], rtol=1e-6)
  # A deeper tree in a row with [CLS], [SEP] and padding, 2 heads, random values, weights and embeddings.
  arrays = row_of("(S (NP (NP a b) c) (VP d (NP e f)))", 16)
  groups, first, last = (jnp.asarray(arrays[k]) for k in ("groups", "node_first", "node_last"))
  node, inside, contains = ta.relations(groups, first, last)
  rng = np.random.default_rng(0)
  d, leaves = 4, np.arange(1, 7)  # leaf positions (after [CLS])
  v, w = rng.normal(size=(1, 16, 2, d)), rng.normal(size=(1, 16, 2))
  table = rng.normal(size=(1 + 100 + 1 + 50, d // 2))
  emb = ta.hierarchical_embedding(jnp.asarray(table), *ta.hierarchical_indices(first, last, inside, contains, 100, 50))
  out = np.asarray(ta.accumulate(jnp.asarray(v), jnp.asarray(w), emb, node, inside, contains))
  nodes = np.flatnonzero(arrays["node_first"][0] >= 0)
  spans = np.stack([arrays["node_first"][0, nodes], arrays["node_last"][0, nodes]], 1) - 1  # leaf indices
  h, vert = reference_indices(spans, 6)
  hier = np.stack([table[np.minimum(h, 100)], table[np.minimum(vert, 50) + 101]], -1).reshape(6, len(nodes), d)
  for head in range(2):
    ref = reference_node_values(v[0, leaves, head], v[0, nodes, head], spans, w[0, leaves, head], hier)
    np.testing.assert_allclose(out[0, nodes, head], ref, rtol=1e-5, atol=1e-5)
  others = np.setdiff1d(np.arange(16), nodes)
  np.testing.assert_array_equal(out[0, others], v[0, others].astype(np.float32))  # leaves keep their values


@pytest.fixture(scope="module")
def encoder():
  """The parsed_tiny encoder (hidden 32, 2 layers), its params, and one jitted apply."""
  from bertjax.model.encoder import Encoder

  cfg = model_config.encoder_config(load_config("configs/tree.py:parsed_tiny").model, platform="cpu")
  model = Encoder(cfg)
  x0 = jnp.zeros((1, 16, cfg.hidden_size))
  rows0 = tuple(jnp.asarray(a) for a in (np.ones((1, 16), np.int32), -np.ones((1, 16), np.int32),
                                         -np.ones((1, 16), np.int32)))
  params = model.init(jax.random.key(0), x0, rows0)
  apply = jax.jit(lambda x, g, f, l: model.apply(params, x, (g, f, l)))
  return cfg, apply


def test_packed_and_padded_rows_equal_separate_ones(encoder):
  cfg, apply = encoder
  lines = ["(S (NP a b) c)", "(S (VP d (NP e f)) g)"]
  encoded = [trees.encode(CharTokenizer(), trees.parse(line)) for line in lines]
  alone = trees.rows(encoded, 16, SPECIAL, False, instances.InstanceStats())  # each padded to 16
  packed = trees.rows(encoded, 16, SPECIAL, True, instances.InstanceStats())  # the second after the first
  assert len(packed["input_ids"]) == 1 and packed["groups"][0].max() == 2
  x = jax.random.normal(jax.random.key(1), (2, 16, cfg.hidden_size))
  n = (alone["groups"] > 0).sum(1)
  # The packed row's inputs: each example's vectors at its place (positions enter through x: none in the encoder).
  xp = jnp.zeros((16, cfg.hidden_size)).at[:n[0]].set(x[0, :n[0]]).at[n[0]:n.sum()].set(x[1, :n[1]])
  no_nodes = -np.ones((1, 16), np.int32)
  rows = {k: jnp.asarray(np.concatenate([alone[k], packed[k], alone[k][:1] if k == "groups" else no_nodes]))
          for k in ("groups", "node_first", "node_last")}  # one batch, one compile: alone x 2, packed, no nodes
  out = np.asarray(apply(jnp.concatenate([x, xp[None], x[:1]]), rows["groups"], rows["node_first"], rows["node_last"]))
  np.testing.assert_allclose(out[2, :n[0]], out[0, :n[0]], atol=2e-5)
  np.testing.assert_allclose(out[2, n[0]:n.sum()], out[1, :n[1]], atol=2e-5)
  # Without its nodes (plain text) the first tree's node positions compute something else.
  assert np.abs(out[3, 5:7] - out[0, 5:7]).max() > 1e-3


def test_task_trees_are_rows_and_pack_train_moves_their_spans():
  from bertjax.finetune import batches

  rows = trees.encode_rows(["(S (NP a b) c)", "(S (VP d (NP e f)) g)"], CharTokenizer(), 16)
  assert rows["node_first"][1].tolist() == [-1] * 6 + [2, 1, 1] + [-1] * 7  # NP(e f), VP, S: bottom-up
  batch = dict(rows, label=np.array([0, 1]), example_weight=np.ones(2, np.float32))
  packed = batches.packed(batch, 32)
  # First fit, longest first: the second tree at 0, the first at 9 ([CLS] a b c [SEP] NP S at 9..15).
  assert packed["node_first"][0].tolist() == [-1] * 6 + [2, 1, 1] + [-1] * 5 + [10, 10] + [-1] * 16
  assert packed["node_last"][0, 14:16].tolist() == [11, 12] and packed["cls_positions"][0, :2].tolist() == [0, 9]
  with pytest.raises(UserError, match="train example 1: its tree needs 9 positions"):
    trees.encode_rows(["(S (VP d (NP e f)) g)"], CharTokenizer(), 8, "train example")


def test_mlm_never_masks_a_node():
  from bertjax.objectives import masking
  from bertjax.train import step

  line = "(S (VP d (NP e f)) (NP g h) (NP i j) k)"
  arrays = row_of(line, 24)
  batch = {k: jnp.asarray(np.repeat(v, 8, 0)) for k, v in arrays.items() if k != "sentence_label"}
  batch["example_weight"] = jnp.ones(8)
  cfg = step.StepConfig(seed=0, masking=masking.MaskingConfig(SPECIAL.never_masked, SPECIAL.mask, 200, mask_prob=0.9,
                                                              max_predictions=12), objectives=(("mlm", 1.0),))
  out = jax.jit(step.training_batch, static_argnums=2)(batch, 0, cfg)
  chosen = np.asarray(out["mlm_positions"])[np.asarray(out["mlm_weights"]) > 0]
  nodes = set(np.flatnonzero(arrays["node_first"][0] >= 0))
  assert len(chosen) > 8 * 4 and not nodes & set(chosen.tolist())


def test_fused_kernels_are_refused_with_one_line():
  from bertjax.core.config import defaults

  c = defaults()
  c.model.attention_kind, c.model.attention, c.model.attention_dropout, c.model.dtype = "tree", "cudnn", 0.0, "bfloat16"
  with pytest.raises(UserError, match="tree masks each node's attention to its subtree, which model.attention=cudnn "
                     "cannot; use --config.model.attention=xla"):
    model_config.validate(c)
  c.model.attention = "auto"
  impl, notice = model_config.resolve_attention(c.model, "gpu")
  assert impl == "xla" and "attention_kind=tree runs on xla attention only" in notice
  assert model_config.encoder_config(c.model, platform="gpu").attention == "xla"


def test_a_tree_that_does_not_parse_stops_the_run_with_one_line_naming_it(tmp_path):
  path = tmp_path / "trees.txt"
  path.write_text("(S (NP a b) c)\n(S (NP d e) f)\n\n(S (NP g h) i\n")
  cmd = [sys.executable, "-m", "bertjax.train", "--config=configs/tree.py:parsed_tiny", f"--workdir={tmp_path / 'w'}",
         f"--config.data.source=text:{path}", f"--config.data.cache_dir={tmp_path / 'cache'}"]
  proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=600, env=dict(os.environ))
  lines = [l for l in proc.stderr.splitlines() if l.strip()]
  assert proc.returncode == 2 and len(lines) == 1, proc.stderr[-3000:]
  assert lines[0].startswith(f"error: {path}:4: the bracketed tree does not parse (1 '(' left open)"), lines


@pytest.mark.slow  # a pretraining run and a fine-tuning run: minutes on 2 cores
def test_pretraining_then_classification_over_given_parses_writes_results(tmp_path):
  import json

  from test_readme import task_data

  (tmp_path / "toy-sst2").mkdir()
  for name in ("train.tsv", "dev.tsv"):  # task_data copies the README's toy SST-2 too
    (tmp_path / "toy-sst2" / name).write_text("sentence\tlabel\nx\t0\n")
  task_data(str(tmp_path))
  env = dict(os.environ, BERTJAX_CACHE=str(tmp_path / "cache"))
  run = lambda *args: subprocess.run([sys.executable, "-m", *args], cwd=REPO, env=env, capture_output=True, text=True,
                                     timeout=1800)
  pre = run("bertjax.train", "--config=configs/tree.py:parsed_tiny", f"--workdir={tmp_path / 'pre'}",
            f"--config.data.source=text:{tmp_path}/data/trees/train.txt", "--config.total_steps=10",
            "--config.log_every=5", "--config.eval_every=10", "--config.checkpoint_every=10")
  assert pre.returncode == 0, pre.stderr[-3000:]
  ft = run("bertjax.finetune", "--config=configs/finetune.py:tiny", f"--config.init.checkpoint={tmp_path / 'pre'}",
           f"--config.task.source=tsv:{tmp_path}/data/trees", "--config.seq_len=96", "--config.total_steps=10",
           f"--workdir={tmp_path / 'ft'}")
  assert ft.returncode == 0, ft.stderr[-3000:]
  results = json.load(open(tmp_path / "ft" / "results.json"))
  assert results["eval_examples"] == 100 and 0 <= results["summary"]["accuracy"]["median"] <= 1
