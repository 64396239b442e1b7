"""Compressed memory on XLNet (the Compressive Transformer, Rae et al., ICLR 2020), the spec sheet's tests
(section 4.6): (a) the FIFO bookkeeping against a NumPy port of Algorithm 1 over five segments, (b) the compression
functions against their definitions and torch's Conv1d, (c) which parameters the attention-reconstruction loss
and the task loss train, (d) the reduction to transformers: rate 1 and identity compression over n_m + n_cm
slots is XLNetLMHeadModel with mem_len = n_m + n_cm over three chained segments, with a reconstruction loss of
0, and (e) most-used compression keeps the most-attended rows in their order."""

import dataclasses
import os

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
from flax import linen as nn

from bertjax.core.errors import UserError
from bertjax.hf import xlnet as hx
from bertjax.model import memory as memory_lib, xlnet_models
from bertjax.model.memory import MemoryConfig
from test_xlnet import B, HF_TINY, run_both, segment_inputs, tiny_cfg

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")


def algorithm_1(segments, n_m, n_cm, c):
  """The paper's Algorithm 1 for one layer in NumPy (zero-initialised memories, mean pooling as f_c, segment
  size n_s = rows pushed): the memory and compressed memory after each segment."""
  d = segments[0].shape[-1]
  m, cm, out = np.zeros((n_m, d)), np.zeros((n_cm, d)), []
  for h in segments:
    old = m[:len(h)]
    new_cm = old.reshape(-1, c, d).mean(1)
    m = np.concatenate([m, h])[-n_m:]
    cm = np.concatenate([cm, new_cm])[-n_cm:]
    out.append((m, cm))
  return out


@pytest.mark.parametrize("zeros_visible", [False, True])
def test_a_fifo_bookkeeping_equals_algorithm_1(zeros_visible):
  n_m, n_cm, c, rows, d = 6, 4, 2, 4, 3
  mc = MemoryConfig(mem_len=n_m, cmem_len=n_cm, cmem_rate=c, reuse_len=rows, zeros_visible=zeros_visible)
  segments = [np.random.default_rng(t).normal(size=(rows, d)) for t in range(5)]
  state = memory_lib.empty(1, 1, d, mc)
  compress = memory_lib.Compress(mc, d)
  for t, (h, (m, cm)) in enumerate(zip(segments, algorithm_1(segments, n_m, n_cm, c)), 1):
    validity = memory_lib.next_validity(state, rows, mc)
    mem, evicted = memory_lib.fifo(state["mem"][0], jnp.asarray(h, jnp.float32)[None])
    cmem = memory_lib.fifo(state["cmem"][0], compress.apply({}, evicted))[0]
    state = dict(mem=mem[None], cmem=cmem[None], mem_valid=validity["mem_valid"], cmem_valid=validity["cmem_valid"])
    mem_n, cmem_n = int(state["mem_valid"].sum()), int(state["cmem_valid"].sum())
    if zeros_visible:  # the paper's behaviour: every slot counts, the buffers are Algorithm 1's
      assert (mem_n, cmem_n) == (n_m, n_cm)
    else:  # only rows that came from text, right-aligned; they saturate at n_m and n_cm
      assert (mem_n, cmem_n) == (min(n_m, rows * t), min(n_cm, max(0, rows * t - n_m) // c))
      assert state["mem_valid"][0, n_m - mem_n:].all() and state["cmem_valid"][0, n_cm - cmem_n:].all()
    np.testing.assert_allclose(np.asarray(mem[0, n_m - mem_n:]), m[n_m - mem_n:], atol=1e-6)
    np.testing.assert_allclose(np.asarray(cmem[0, n_cm - cmem_n:]), cm[n_cm - cmem_n:], atol=1e-6)
  axes = memory_lib.logical_axes(state)  # how a training state shards it: by batch, as the batch
  assert {k: len(v) for k, v in axes.items()} == {k: v.ndim for k, v in state.items()}


def test_b_compression_functions():
  rng = np.random.default_rng(0)
  c, r, d = 3, 6, 5
  rows = jnp.asarray(rng.normal(size=(2, r, d)), jnp.float32)
  windows = np.asarray(rows).reshape(2, r // c, c, d)
  for fn, want in (("mean", windows.mean(2)), ("max", windows.max(2))):
    got = memory_lib.Compress(MemoryConfig(cmem_rate=c, cmem_fn=fn), d).apply({}, rows)
    np.testing.assert_allclose(np.asarray(got), want, atol=1e-6)
  for fn, dilation in (("conv", 1), ("dilated_conv", 2)):
    module = memory_lib.Compress(MemoryConfig(cmem_rate=c, cmem_fn=fn), d)
    params = nn.unbox(module.init(jax.random.key(0), rows))["params"]
    conv = torch.nn.Conv1d(d, d, c, stride=c, dilation=dilation)
    with torch.no_grad():  # torch's kernel [out, in, k] is flax's [k, in, out] transposed
      conv.weight.copy_(torch.tensor(np.asarray(params["kernel"]).transpose(2, 1, 0)))
      conv.bias.copy_(torch.tensor(np.asarray(params["bias"])))
      x = torch.nn.functional.pad(torch.tensor(np.asarray(rows)).transpose(1, 2), ((c - 1) * (dilation - 1), 0))
      want = conv(x).transpose(1, 2).numpy()
    got = module.apply({"params": params}, rows)
    assert got.shape == (2, r // c, d)
    np.testing.assert_allclose(np.asarray(got), want, atol=1e-5, err_msg=fn)


def test_c_only_the_compression_learns_from_the_reconstruction_loss():
  mc = MemoryConfig(mem_len=4, reuse_len=4, cmem_len=4, cmem_rate=2, cmem_fn="conv")
  model = xlnet_models.XLNetLMHeadModel(dataclasses.replace(tiny_cfg(), num_layers=1), mc)
  batch = {k: jnp.asarray(v) for k, v in segment_inputs(np.random.default_rng(3)).items()}
  memory = memory_lib.empty(1, B, 32, mc)  # a full memory of text rows: this segment evicts and compresses them
  memory = {**memory, "mem": jax.random.normal(jax.random.key(1), memory["mem"].shape),
            "mem_valid": ~memory["mem_valid"], "cmem_valid": ~memory["cmem_valid"]}

  @jax.jit
  def grads():
    params = nn.unbox(model.init(jax.random.key(0), batch))["params"]
    out, back = jax.vjp(lambda p: model.apply({"params": p}, batch, memory), params)
    one = lambda name: {**jax.tree.map(jnp.zeros_like, out), name: jnp.ones_like(out[name])}  # d(sum of out[name])
    return back(one("cmem_loss"))[0], back(one("logits"))[0]

  flat = lambda tree: {jax.tree_util.keystr(k): np.abs(np.asarray(v)).max()
                       for k, v in jax.tree_util.tree_leaves_with_path(tree)}
  recon, task = map(flat, grads())
  assert {k for k, v in recon.items() if v > 0} == {k for k in recon if "compress" in k} != set()
  assert all(v == 0 for k, v in task.items() if "compress" in k)
  assert sum(v > 0 for v in task.values()) > 10


def test_d_rate_1_identity_compression_is_xlnet_with_the_summed_memory():
  torch.manual_seed(0)
  hf_model = transformers.XLNetLMHeadModel(transformers.XLNetConfig(**dict(HF_TINY, mem_len=8, reuse_len=4))).eval()
  state = {k: v.detach().numpy() for k, v in hf_model.state_dict().items()}
  _, _, params, _, _ = hx.read(hf_model.config.to_dict(), state)
  mc = MemoryConfig(mem_len=4, reuse_len=4, cmem_len=4, cmem_rate=1, cmem_fn="mean")  # mean of one row: identity
  model = xlnet_models.XLNetLMHeadModel(tiny_cfg(), mc)
  rng = np.random.default_rng(4)
  results = run_both(hf_model, model, params, [segment_inputs(rng) for _ in range(3)], memory_lib.empty(2, B, 32, mc))
  for i, (ref, got, _, memory, loss) in enumerate(results):
    np.testing.assert_allclose(got, ref, atol=1e-5, err_msg=f"segment {i}")
    assert float(loss) == 0.0
  assert int(memory["cmem_valid"].sum(1)[0]) == 4  # the third segment attended to compressed rows


def test_e_most_used_keeps_the_most_attended_rows_in_order():
  rng = np.random.default_rng(5)
  rows, scores = rng.normal(size=(2, 8, 3)), rng.random((2, 8))
  got = memory_lib.Compress(MemoryConfig(cmem_rate=2, cmem_fn="most_used"), 3).apply(
      {}, jnp.asarray(rows, jnp.float32), jnp.asarray(scores, jnp.float32))
  for b in range(2):
    keep = np.sort(np.argsort(-scores[b])[:4])
    np.testing.assert_allclose(np.asarray(got[b]), rows[b, keep], atol=1e-6)


def test_memory_lengths_that_do_not_divide_are_refused():
  section = lambda **kw: ml_collections.ConfigDict(memory_lib.section(**kw))
  with pytest.raises(UserError, match="cmem_rate"):
    memory_lib.validate(section(mem_len=6, reuse_len=4, cmem_len=4, cmem_rate=3))
  with pytest.raises(UserError, match="mem_len"):
    memory_lib.validate(section(cmem_len=4))
