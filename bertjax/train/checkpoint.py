"""Orbax checkpoints of the train state (params, optimizer state, step) plus a reproducibility manifest, and
the lock that makes one run the only writer of a workdir.

A thin layer over `ocp.CheckpointManager`, which already gives async saves, keep-last-N and atomic
finalization (a save killed midway leaves a temporary directory that is never listed as a step). The data
position is not saved: batches are a pure function of (seed, step), so the step is the position.
"""

import errno
import fcntl
import os
import socket
import sys

import jax
import orbax.checkpoint as ocp

from bertjax.core.errors import UserError


class Checkpointer:
  """Saves and restores TrainStates under `workdir/checkpoints`; every process must call save."""

  def __init__(self, workdir: str, keep: int = 3, async_save: bool = True):
    self.directory = os.path.join(os.path.abspath(workdir) if "://" not in workdir else workdir, "checkpoints")
    quiet_disk_full_noise()
    options = ocp.CheckpointManagerOptions(max_to_keep=keep, enable_async_checkpointing=async_save, create=True)
    self.manager = ocp.CheckpointManager(self.directory, options=options, item_names=("state", "manifest"))

  def latest_step(self):
    return self.manager.latest_step()

  def save(self, step: int, state, manifest: dict, force: bool = False) -> bool:
    """Starts an (async) save of `state` at `step`; returns whether one was started."""
    args = ocp.args.Composite(state=ocp.args.StandardSave(_stored(state)), manifest=ocp.args.JsonSave(manifest))
    return self.manager.save(step, args=args, force=force)

  def restore(self, abstract_state, step=None):
    """The state at `step` (default: latest), laid out with the shardings of `abstract_state`
    (jax.ShapeDtypeStruct leaves with .sharding), so a checkpoint moves to another mesh."""
    step = self.latest_step() if step is None else step
    target = _stored(abstract_state)
    restored = self.manager.restore(step, args=ocp.args.Composite(state=ocp.args.StandardRestore(target)))["state"]
    return abstract_state.replace(**restored) if target is not abstract_state else restored

  def manifest(self, step=None) -> dict:
    step = self.latest_step() if step is None else step
    return self.manager.restore(step, args=ocp.args.Composite(manifest=ocp.args.JsonRestore()))["manifest"]

  def wait(self):
    """Blocks until async saves are on disk; an error in one surfaces here, loudly."""
    self.manager.wait_until_finished()

  def close(self):
    self.manager.wait_until_finished()
    self.manager.close()


def _stored(state):
  """What a checkpoint holds of a TrainState: step, params, opt_state, and the memory only where the model has one,
  so checkpoints written before the state carried a memory restore as they are. Any other tree (a workdir of one
  model: bertjax.hf.workdir) as it is."""
  if not hasattr(state, "opt_state"):
    return state
  out = dict(step=state.step, params=state.params, opt_state=state.opt_state)
  if getattr(state, "memory", None) is not None:
    out["memory"] = state.memory
  return out


# How a full disk reads, from Python (errno) and from orbax / tensorstore writers (their message text).
_DISK_FULL_ERRNOS = {errno.ENOSPC: "no space left on device", errno.EDQUOT: "disk quota exceeded",
                     errno.EFBIG: "file too large"}
_DISK_FULL_TEXT = ("No space left on device", "Disk quota exceeded", "File too large", "OS error 28",
                   "OS error 122", "OS error 27")


def is_disk_full(error: BaseException) -> str:
  """What says `error` (or an error it was raised from) is a full disk, in words; "" if it is not one."""
  seen = set()
  while error is not None and id(error) not in seen:
    seen.add(id(error))
    if isinstance(error, OSError) and error.errno in _DISK_FULL_ERRNOS:
      return _DISK_FULL_ERRNOS[error.errno]
    text = str(error)
    for marker in _DISK_FULL_TEXT:
      if marker in text:
        return marker[0].lower() + marker[1:]
    error = error.__cause__ or error.__context__
  return ""


class _DiskFullNoise:
  """Keeps a full disk's echoes off stderr, so that the run's own one-line error says it: orbax logs each of
  its failed background writes with a traceback, asyncio reports their futures' unread exceptions, and
  tensorstore's callbacks raise "Event loop is closed" into the closed event loops of those writes. Other
  errors pass untouched.

  The echoes race the news: tensorstore may report a closed loop before orbax logs the failed write, so an
  "Event loop is closed" report that comes before any sign of a full disk is held, not printed, and printed at
  exit only if no full disk was noticed by then (by orbax's log or by the run's own handler: `noticed`)."""

  def __init__(self):
    self.seen = False
    self.held = []

  def filter(self, record) -> bool:  # logging.Filter protocol, on absl's logger (orbax logs through absl)
    text = record.getMessage() + (str(record.exc_info[1]) if record.exc_info else "")
    if any(marker in text for marker in _DISK_FULL_TEXT):
      self.seen = True
      return False
    return True

  def noticed(self):
    """The run found a full disk itself (a checkpoint write's error reached it): its echoes are noise."""
    self.seen = True

  def wrap(self, hook, exc_of):
    def quiet(*args):
      if "Event loop is closed" not in str(exc_of(*args)):
        hook(*args)
      elif not self.seen:
        self.held.append((hook, args))
    return quiet

  def release(self):
    """At exit: the held reports, unless a full disk explained them."""
    if not self.seen:
      for hook, args in self.held:
        hook(*args)
    self.held = []

  def install(self):
    """Installs the filter and the hooks for the rest of the process (a run ends its process, or is a test's)."""
    import atexit
    import logging
    import threading

    for name in ("absl", "asyncio"):  # orbax logs through absl; asyncio reports the writes' unread failures
      logging.getLogger(name).addFilter(self)
    sys.excepthook = self.wrap(sys.excepthook, lambda t, value, tb: value)
    threading.excepthook = self.wrap(threading.excepthook, lambda args: args.exc_value)
    sys.unraisablehook = self.wrap(sys.unraisablehook, lambda args: args.exc_value)
    atexit.register(self.release)


_NOISE = []


def quiet_disk_full_noise():
  """Installs _DiskFullNoise once per process; returns it."""
  if not _NOISE:
    _NOISE.append(_DiskFullNoise())
    _NOISE[0].install()
  return _NOISE[0]


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


LOCK = "run.lock"


def _alive(pid: int) -> bool:
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  except PermissionError:  # someone else's process: alive
    pass
  return True


class WorkdirLock:
  """One writer per workdir: `workdir/run.lock`, flock'ed for as long as the run lives and holding its pid.

  The kernel drops an flock when its process ends however it ends (SIGKILL included), so a lock whose pid is
  gone is free to take; its pid is left in the file (never deleted: deleting races with a starting run) and
  taken over with a note. On a file system without flock the pid alone decides (a live pid holds the lock).
  A context manager; UserError naming the other pid when the workdir is in use."""

  def __init__(self, workdir: str, note=lambda line: print(line, file=sys.stderr, flush=True)):
    self.path = os.path.join(workdir, LOCK)
    self.note = note
    self._fd = None

  def __enter__(self):
    fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
    previous = os.read(fd, 256).decode("utf-8", "replace").split()
    pid = int(previous[0]) if previous and previous[0].isdigit() else None
    host = previous[1] if len(previous) > 1 else ""
    try:
      fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
      held = False
    except OSError as e:
      if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
        held = True
      else:  # no flock here (some network file systems): a live pid on this host holds the lock
        held = pid is not None and host == socket.gethostname() and _alive(pid) and pid != os.getpid()
    if held:
      os.close(fd)
      where = f" on {host}" if host and host != socket.gethostname() else ""
      raise UserError(f"workdir {os.path.dirname(self.path)!r} is in use by another run (pid {pid}{where}; "
                      f"{self.path}); wait for it to end, stop it, or use another --workdir")
    if pid is not None and pid != os.getpid():
      self.note(f"note: took over {self.path} from pid {pid}{' on ' + host if host else ''}, which ended without "
                "releasing it (killed or crashed)")
    os.lseek(fd, 0, os.SEEK_SET)
    os.ftruncate(fd, 0)
    os.write(fd, f"{os.getpid()} {socket.gethostname()}\n".encode())
    os.fsync(fd)
    self._fd = fd
    return self

  def __exit__(self, *exc):
    if self._fd is not None:
      os.ftruncate(self._fd, 0)  # a clean end: nothing to take over
      fcntl.flock(self._fd, fcntl.LOCK_UN)
      os.close(self._fd)
      self._fd = None
