"""The Reformer against transformers (bertjax.hf.reformer): tiny random ReformerForMaskedLM and ReformerModelWithLMHead
([local, lsh] layers, 2 hash rounds, a fixed hash_seed whose rotations both sides share, axial positions, a padded
row) give transformers' logits after import, export back to a state dict transformers loads strictly, and train 20
AdamW steps (train mode: transformers' reversible backward against bertjax's custom VJP, dropout 0) along the same
losses."""

from unittest import mock

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import torch
from transformers import ReformerConfig, ReformerForMaskedLM, ReformerModelWithLMHead
from transformers.models.reformer import modeling_reformer as hf_reformer

from bertjax.hf import convert, reformer as hf_lib
from bertjax.model import config as model_config, lsh
from bertjax.model.pretrain import Pretrainer

V, S, B = 40, 32, 2


def _hf_config(causal: bool) -> ReformerConfig:
  return ReformerConfig(
      vocab_size=V, hidden_size=16, num_attention_heads=2, attention_head_size=8, attn_layers=["local", "lsh"],
      feed_forward_size=32, hidden_act="gelu", axial_pos_shape=[4, 8], axial_pos_embds_dim=[8, 8],
      max_position_embeddings=S, local_attn_chunk_length=8, lsh_attn_chunk_length=8, num_hashes=2, num_buckets=4,
      hash_seed=3, is_decoder=causal, local_num_chunks_after=0 if causal else 1,
      lsh_num_chunks_after=0 if causal else 1, hidden_dropout_prob=0.0, local_attention_probs_dropout_prob=0.0,
      lsh_attention_probs_dropout_prob=0.0, pad_token_id=0)


def _ours(hf_model, directory):
  """(run config, EncoderConfig, params) of transformers' model saved to `directory` and imported (read_hf)."""
  hf_model.save_pretrained(directory)
  imported = convert.read_hf(str(directory))
  assert imported.family == "reformer" and not imported.unused and imported.config.seq_len == S
  enc = model_config.encoder_config(imported.config.model, platform="cpu")
  return imported.config, enc, jax.tree.map(jnp.asarray, imported.params)


def _inputs():
  rng = np.random.default_rng(0)
  ids = rng.integers(1, V, (B, S))
  mask = np.ones((B, S), np.int64)
  mask[1, S - 5:] = 0
  ids[1, S - 5:] = 0
  return ids, mask


def _rotations(enc):
  """transformers' torch.randn draw replaced by bertjax's hash_seed rotations (the generators differ)."""
  r = torch.from_numpy(np.array(lsh.seeded_rotations(enc, S)))
  return mock.patch.object(hf_reformer.torch, "randn", lambda *a, **k: r.clone())


def _batch(ids, mask, positions):
  return dict(input_ids=jnp.asarray(ids), type_ids=jnp.zeros((B, S), jnp.int32), groups=jnp.asarray(mask),
              mlm_positions=jnp.asarray(positions))


@pytest.mark.parametrize("cls,causal", [(ReformerForMaskedLM, False), (ReformerModelWithLMHead, True)])
def test_import_gives_transformers_logits_and_export_loads_strictly(cls, causal, tmp_path):
  torch.manual_seed(0)
  model = cls(_hf_config(causal)).eval()
  config, enc, params = _ours(model, tmp_path / "hf")
  ids, mask = _inputs()
  with _rotations(enc), torch.no_grad():
    want = model(input_ids=torch.from_numpy(ids), attention_mask=torch.from_numpy(mask)).logits.numpy()
  every = np.broadcast_to(np.arange(S), (B, S))
  got = jax.jit(lambda p, b: Pretrainer(enc).apply({"params": p}, b))(params, _batch(ids, mask, every))["mlm_logits"]
  real = mask.astype(bool)
  np.testing.assert_allclose(np.asarray(got)[real], want[real], atol=1e-5, rtol=0)
  # Export (write_hf): the class of the same architecture loads every tensor it holds, and gives the same logits.
  (out,) = convert.write_hf(config, params, str(tmp_path / "out"))
  again, info = cls.from_pretrained(out, output_loading_info=True)
  assert not any(info.values()), info
  assert set(hf_lib.params_to_hf(jax.tree.map(np.asarray, params), enc)) == set(model.state_dict())
  again.eval()
  with _rotations(enc), torch.no_grad():
    np.testing.assert_array_equal(
        again(input_ids=torch.from_numpy(ids), attention_mask=torch.from_numpy(mask)).logits.numpy(), want)


def test_twenty_adamw_steps_follow_transformers(tmp_path):
  torch.manual_seed(0)
  model = ReformerForMaskedLM(_hf_config(False)).train()
  _, enc, params = _ours(model, tmp_path)
  ids, mask = _inputs()
  ids[1, S - 5:], mask[1] = 1, 1  # transformers' training pads nothing (axial positions: exactly d1 x d2)
  positions = np.stack([np.arange(0, S, 4), np.arange(1, S, 4)])
  labels = np.take_along_axis(ids, positions, 1)
  masked = ids.copy()
  np.put_along_axis(masked, positions, 3, 1)
  torch_labels = np.full((B, S), -100)
  np.put_along_axis(torch_labels, positions, labels, 1)
  opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
  tx = optax.adamw(1e-3, weight_decay=0.01)
  state = tx.init(params)
  batch = _batch(masked, mask, positions)

  def loss_fn(p):
    logits = Pretrainer(enc, deterministic=False).apply({"params": p}, batch, rngs={"dropout": jax.random.key(0)})
    return optax.softmax_cross_entropy_with_integer_labels(logits["mlm_logits"], jnp.asarray(labels)).mean()

  @jax.jit
  def step(p, s):
    loss, grads = jax.value_and_grad(loss_fn)(p)
    updates, s = tx.update(grads, s, p)
    return optax.apply_updates(p, updates), s, loss

  theirs, ours = [], []
  with _rotations(enc):
    for _ in range(20):
      opt.zero_grad()
      out = model(input_ids=torch.from_numpy(masked), attention_mask=torch.from_numpy(mask),
                  labels=torch.from_numpy(torch_labels))
      out.loss.backward()
      opt.step()
      theirs.append(float(out.loss))
      params, state, loss = step(params, state)
      ours.append(float(loss))
  np.testing.assert_allclose(ours, theirs, rtol=1e-3)
  assert theirs[-1] < theirs[0]
