"""Orbax checkpoints of the train state (params, optimizer state, step) plus a reproducibility manifest.

A thin layer over `ocp.CheckpointManager`, which already gives async saves, keep-last-N and atomic
finalization (a save killed midway leaves a temporary directory that is never listed as a step). The data
position is not saved: batches are a pure function of (seed, step), so the step is the position.
"""

import os

import jax
import orbax.checkpoint as ocp

from bertjax.core.errors import UserError


class Checkpointer:
  """Saves and restores TrainStates under `workdir/checkpoints`; every process must call save."""

  def __init__(self, workdir: str, keep: int = 3, async_save: bool = True):
    self.directory = os.path.join(os.path.abspath(workdir) if "://" not in workdir else workdir, "checkpoints")
    options = ocp.CheckpointManagerOptions(max_to_keep=keep, enable_async_checkpointing=async_save, create=True)
    self.manager = ocp.CheckpointManager(self.directory, options=options, item_names=("state", "manifest"))

  def latest_step(self):
    return self.manager.latest_step()

  def save(self, step: int, state, manifest: dict, force: bool = False) -> bool:
    """Starts an (async) save of `state` at `step`; returns whether one was started."""
    args = ocp.args.Composite(state=ocp.args.StandardSave(state), manifest=ocp.args.JsonSave(manifest))
    return self.manager.save(step, args=args, force=force)

  def restore(self, abstract_state, step=None):
    """The state at `step` (default: latest), laid out with the shardings of `abstract_state`
    (jax.ShapeDtypeStruct leaves with .sharding), so a checkpoint moves to another mesh."""
    step = self.latest_step() if step is None else step
    restored = self.manager.restore(step, args=ocp.args.Composite(state=ocp.args.StandardRestore(abstract_state)))
    return restored["state"]

  def manifest(self, step=None) -> dict:
    step = self.latest_step() if step is None else step
    return self.manager.restore(step, args=ocp.args.Composite(manifest=ocp.args.JsonRestore()))["manifest"]

  def wait(self):
    """Blocks until async saves are on disk; an error in one surfaces here, loudly."""
    self.manager.wait_until_finished()

  def close(self):
    self.manager.wait_until_finished()
    self.manager.close()


def restore_params(path: str, abstract_params):
  """Only the params of the checkpoint at `path` (a checkpoints dir, a workdir or a step dir): init_from."""
  for candidate in (path, os.path.join(path, "checkpoints")):
    if os.path.isdir(candidate) and any(d.isdigit() for d in os.listdir(candidate)):
      mgr = ocp.CheckpointManager(os.path.abspath(candidate), item_names=("state", "manifest"))
      step = mgr.latest_step()
      target = {"params": abstract_params}
      restored = mgr.restore(step, args=ocp.args.Composite(state=ocp.args.PyTreeRestore(
          item=target, restore_args=ocp.checkpoint_utils.construct_restore_args(target), partial_restore=True)))
      return restored["state"]["params"]
  raise UserError(f"no checkpoint under {path!r}; point --config.init_from at a workdir or its checkpoints/")
