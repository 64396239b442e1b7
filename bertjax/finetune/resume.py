"""Resumable fine-tuning seeds (`config.checkpoint_every`): what a seed's checkpoint holds, the recipe it belongs
to, and what a finished seed leaves in place of its checkpoints.

Batches and dropout are pure functions of (seed, step), so a checkpoint's step is the seed's whole position: params
and optimizer state (orbax, through bertjax.train.checkpoint) are all a resumed seed needs to train on exactly.
"""

import hashlib
import json
import os
import shutil

from bertjax.core.errors import UserError
from bertjax.train import checkpoint

RESULT_FILE = "result.json"  # a finished seed's metrics and timing, under workdir/seed_S/
# Config keys that leave a seed's training as it is: a checkpoint written under other values of these still resumes.
BOOKKEEPING = ("seed", "seeds", "log_every", "eval_every", "checkpoint_every", "save_model")


def checkpointer(seed_dir: str) -> checkpoint.Checkpointer:
  """`seed_dir/checkpoints`, the last one kept; saves are synchronous, since the next step donates the saved arrays."""
  return checkpoint.Checkpointer(seed_dir, keep=1, async_save=False)


def recipe_digest(config) -> str:
  """A short hash of everything in `config` that decides a seed's training (all but BOOKKEEPING)."""
  recipe = {k: v for k, v in config.to_dict().items() if k not in BOOKKEEPING}
  return hashlib.sha1(json.dumps(recipe, sort_keys=True, default=str).encode()).hexdigest()[:12]


def saved_progress(config, seed_dir: str) -> dict:
  """What an earlier run with checkpoint_every left in `seed_dir`: a finished seed's result.json (with "result"), a
  started one's latest checkpoint manifest (with "step" and the time and tokens counted so far), or {}. Another
  recipe's is a one-line error: never resumed, never reused."""
  done_file, ckpt_dir = os.path.join(seed_dir, RESULT_FILE), os.path.join(seed_dir, "checkpoints")
  record = {}
  if os.path.exists(done_file):
    with open(done_file) as f:
      record, what = json.load(f), done_file
  elif os.path.isdir(ckpt_dir):
    ckpt = checkpointer(seed_dir)
    step = ckpt.latest_step()
    record, what = (ckpt.manifest(step) if step is not None else {}), f"the checkpoint at step {step} in {ckpt_dir}"
    ckpt.close()
  if record and record.get("recipe") != recipe_digest(config):
    raise UserError(f"{what} is another fine-tuning recipe's; pass a new --workdir, or delete {seed_dir} to run "
                    "this seed again")
  return record


def tree(params, opt_state, state) -> dict:
  """What a seed's checkpoint holds: params, optimizer state, and the forward pass's own state where there is one."""
  return dict(params=params, opt_state=opt_state, **({"state": state} if state is not None else {}))


def finish(ckpt, seed_dir: str, record: dict):
  """A seed is done: `record` (recipe, result, timing) becomes its result.json, and its checkpoints go."""
  path = os.path.join(seed_dir, RESULT_FILE)
  with open(path + ".tmp", "w") as f:
    json.dump(record, f, indent=1, default=lambda v: v.tolist())
  os.replace(path + ".tmp", path)  # a kill while writing leaves the checkpoints, not half a result
  ckpt.close()
  shutil.rmtree(ckpt.directory, ignore_errors=True)
