"""A recurrent model's memory as part of the training state: threaded through the step (microbatches too), kept
when a step is skipped, sharded by batch, checkpointed, and exact on resume. A toy model with XLNet's memory
layout (right-aligned rows with a validity mask, each step pushing its reuse part) stands in for any model that
reads batch["memory"] and returns outputs["memory"]; it plugs into the factory as distillation does."""

import os
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen as nn

from bertjax.train import build, loop, step as step_lib
from conftest import micro, read_metrics

MEM_LEN, REUSE, HIDDEN = 48, 32, 16


class ToyMemory(nn.Module):
  """Embeddings plus a projection of the mean of the memory's valid rows; logits at the targets
  (target_mapping). Its next memory: the old one with this row's reuse part pushed in, the last MEM_LEN kept."""

  vocab: int
  deterministic: bool = True
  networks = {"encoder": ["embed", "ctx", "out"]}

  def train_flops_per_token(self, *args):
    return 1.0

  @nn.compact
  def __call__(self, batch, memory=None):
    emb = nn.Embed(self.vocab, HIDDEN, name="embed")(batch["input_ids"])
    b = emb.shape[0]
    # batch second in `h`, as XLNet keeps its memory [layers, B, M, d]: the state follows each leaf's batch axis
    mem = memory or dict(h=jnp.zeros((MEM_LEN, b, HIDDEN)), valid=jnp.zeros((b, MEM_LEN)))
    h_mem = jnp.swapaxes(mem["h"], 0, 1)
    ctx = (h_mem * mem["valid"][..., None]).sum(1) / jnp.maximum(mem["valid"].sum(1, keepdims=True), 1)
    h = emb + nn.Dense(HIDDEN, name="ctx")(ctx)[:, None]
    logits = nn.Dense(self.vocab, name="out")(jnp.einsum("bps,bsh->bph", batch["target_mapping"], h))
    push = lambda old, new: jnp.concatenate([old, new], 1)[:, -MEM_LEN:]
    new = push(h_mem, jax.lax.stop_gradient(emb[:, :REUSE]))
    return {"logits": logits, "memory": dict(h=jnp.swapaxes(new, 0, 1), valid=push(mem["valid"], jnp.ones((b, REUSE))))}


PLUGIN = build.Plugin(applies=lambda c: c.model.get("toy_memory", False),
                      model=lambda c, model, platform: ToyMemory(c.model.vocab_size),
                      tx=lambda c, tx: tx, init=lambda init, c, shardings: init)


def _config(tmp, **overrides):
  import pydoc_data.topics

  text = tmp / "text.txt"
  if not text.exists():
    topics = sorted(pydoc_data.topics.topics.items())[:12]
    text.write_text("\n\n".join("\n".join(l for l in body.splitlines() if l.strip()) for _, body in topics))
  c = micro(**{"data.source": f"text:{text}", "data.cache_dir": str(tmp / "cache"), "objectives.plm": 1.0,
               "objectives.mlm": 0.0, "objectives.nsp": 0.0, "model.vocab_size": 400, "data.tokenizer_sentences": 2000,
               "data.eval_fraction": 0.2, "batch_size": 8, "total_steps": 6, "checkpoint_every": 3,
               "keep_checkpoints": 3, "log_every": 1, "eval_every": 6, **overrides})
  c.model.xlnet, c.model.toy_memory = dict(mem_len=MEM_LEN, reuse_len=REUSE), True
  return c


@pytest.fixture(autouse=True)
def _plugin():
  build.register(PLUGIN)
  yield
  build._PLUGINS.remove(PLUGIN)


def _first_step(tmp_path, **overrides):
  from bertjax.core import sharding
  from bertjax.data import pipeline

  config = _config(tmp_path, **overrides)
  data = pipeline.build(config)
  steps = build.make_steps(config, sharding.make_mesh(config.sharding), data.tokenizer.special)
  state = steps.init(jax.random.key(0))
  batch = loop.global_batch(data.train_batch(0, 8, config.seed), steps.batch_sharding)
  return steps, state, batch


def test_memory_threads_through_the_step_and_survives_a_skipped_step(tmp_path):
  one, state, batch = _first_step(tmp_path)
  assert jax.tree.map(jnp.shape, state.memory) == dict(h=(MEM_LEN, 8, HIDDEN), valid=(8, MEM_LEN))
  assert state.memory["h"].sharding.spec[1] == one.batch_sharding.spec[0]  # split over devices as the batch is
  assert state.memory["valid"].sharding.spec[0] == one.batch_sharding.spec[0]
  table = np.asarray(state.params["embed"]["embedding"])
  after, metrics = one.train(state, batch)
  np.testing.assert_array_equal(after.memory["valid"][:, -REUSE:], 1)
  assert not np.asarray(after.memory["valid"][:, :MEM_LEN - REUSE]).any()
  pushed = np.swapaxes(table[np.asarray(batch["input_ids"])[:, :REUSE]], 0, 1)  # this step's reuse part, newest last
  np.testing.assert_array_equal(after.memory["h"][-REUSE:], pushed)
  kept = np.asarray(after.memory["h"])
  skipped, m = one.train(after.replace(params=jax.tree.map(lambda x: x * jnp.nan, after.params)), batch)
  assert float(m["skipped"].value) == 1
  np.testing.assert_array_equal(skipped.memory["h"], kept)  # the streams keep their memory


@pytest.mark.slow  # two more compiles (~5 s)
def test_microbatches_carry_their_rows_memory(tmp_path):
  one, state, batch = _first_step(tmp_path)
  after, metrics = one.train(state, batch)
  two, state2, _ = _first_step(tmp_path, grad_accum_steps=2)
  after2, metrics2 = two.train(state2, batch)
  np.testing.assert_array_equal(after2.memory["h"], after.memory["h"])  # each microbatch's rows in their place
  np.testing.assert_allclose(float(metrics2["loss"].total), float(metrics["loss"].total), rtol=1e-6)


@pytest.mark.slow  # two short runs of the whole loop (~20 s on two cores)
def test_a_run_killed_after_a_checkpoint_resumes_to_the_same_losses_and_memory(tmp_path):
  config = _config(tmp_path)
  whole = loop.train_and_evaluate(config, str(tmp_path / "whole"))
  cut = tmp_path / "cut"
  shutil.copytree(tmp_path / "whole", cut)
  shutil.rmtree(cut / "checkpoints" / "6")  # killed after step 3's checkpoint: step 6 never happened
  with open(cut / "metrics.jsonl") as f:
    kept = [line for line in f if '"step": ' not in line or int(line.split('"step": ')[1].split(",")[0]) <= 3]
  with open(cut / "metrics.jsonl", "w") as f:
    f.writelines(kept)
  os.remove(cut / "run.lock") if (cut / "run.lock").exists() else None
  resumed = loop.train_and_evaluate(config, str(cut))
  losses = lambda w: {r["step"]: r["train/plm_loss"] for r in read_metrics(w) if "train/plm_loss" in r}
  assert losses(cut) == losses(tmp_path / "whole") and len(losses(cut)) == 6
  for x, y in zip(jax.tree.leaves(whole.memory), jax.tree.leaves(resumed.memory)):
    np.testing.assert_array_equal(x, y)
  evals = [r["eval/plm_loss"] for r in read_metrics(cut) if "eval/plm_loss" in r]
  assert evals and np.isfinite(evals).all()


def test_checkpoints_hold_the_memory_and_those_written_before_it_existed_still_restore(tmp_path):
  from typing import Any

  import flax
  import orbax.checkpoint as ocp

  from bertjax.train import checkpoint

  @flax.struct.dataclass
  class Before:  # TrainState as it was before it carried a memory
    step: Any
    params: Any
    opt_state: Any

  sds = lambda *shape: jax.ShapeDtypeStruct(shape, jnp.float32)
  ckpt = checkpoint.Checkpointer(str(tmp_path), async_save=False)
  old = Before(step=jnp.int32(1), params={"w": jnp.ones(3)}, opt_state=(jnp.zeros(3),))
  ckpt.manager.save(1, args=ocp.args.Composite(state=ocp.args.StandardSave(old), manifest=ocp.args.JsonSave({})))
  ckpt.wait()
  target = step_lib.TrainState(step=jax.ShapeDtypeStruct((), jnp.int32), params={"w": sds(3)}, opt_state=(sds(3),))
  restored = ckpt.restore(target)
  assert restored.memory is None and int(restored.step) == 1
  memory = {"mem": jnp.arange(8.0).reshape(2, 4), "mem_valid": jnp.ones((2, 4))}
  ckpt.save(2, restored.replace(step=jnp.int32(2), memory=memory), {}, force=True)
  ckpt.wait()
  back = ckpt.restore(target.replace(memory={"mem": sds(2, 4), "mem_valid": sds(2, 4)}))
  np.testing.assert_array_equal(back.memory["mem"], memory["mem"])
  ckpt.close()
