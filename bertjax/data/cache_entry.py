"""A prepared-data cache entry made once, however many processes of a run ask for it at the same time.

The process that claims an entry (an `ENTRY.claim` file created exclusively, naming its process, host and pid)
makes it, into a temporary sibling renamed into place when complete: the entry directory appearing is the
completion marker. Process 0 claims at once; the others first give it a head start, then wait for the entry.
So where the cache is shared (one path on every host) process 0 prepares and the others read what it made, and
where each host has a cache of its own the first process of each host to claim one prepares it there. The
preparer touches its claim every few seconds: a claim untouched for long (its preparer was killed), or whose
preparer on this host is gone, is taken over. No JAX: processes coordinate through the file system only.
"""

import json
import os
import shutil
import socket
import sys
import tempfile
import threading
import time

from bertjax.core.errors import UserError

HEAD_START_S = 30.0  # process 0 claims first; another process claims only when process 0 has not by then
HEARTBEAT_S = 5.0  # the preparer touches its claim this often
STALE_S = 120.0  # a claim untouched this long is abandoned
POLL_S = 0.5
WAIT_S = 86400.0  # how long a process waits for another to prepare an entry, when the config does not say


def _make(final: str, make) -> None:
  """`make(directory)` into a temporary sibling of `final`, renamed into place when complete, so a crash leaves
  no half-made `final`; should another process have renamed its copy first, this one is dropped (the rows
  are a function of the key: the copies are equal)."""
  tmp = tempfile.mkdtemp(prefix=os.path.basename(final) + ".tmp-", dir=os.path.dirname(final))
  try:
    make(tmp)
    try:
      os.rename(tmp, final)
    except OSError:
      if not os.path.isdir(final):
        raise
  finally:
    shutil.rmtree(tmp, ignore_errors=True)  # gone after a successful rename; a loser's or a failure's copy


def _claim(path: str, process_index: int) -> bool:
  """Whether this process created the claim at `path` (exclusively: of processes racing, one does)."""
  try:
    fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
  except FileExistsError:
    return False
  with os.fdopen(fd, "w") as f:
    json.dump(dict(process=process_index, host=socket.gethostname(), pid=os.getpid()), f)
  return True


def _holder(path: str) -> dict:
  """The claim's {process, host, pid}, or {} when it is gone or not yet written."""
  try:
    with open(path) as f:
      return json.load(f)
  except (OSError, ValueError):
    return {}


def _name(holder: dict, process_index: int = 0) -> str:
  if not holder:
    return f"process {process_index}"
  return f"process {holder.get('process')} (host {holder.get('host')}, pid {holder.get('pid')})"


def _abandoned(path: str, stale_s: float) -> bool:
  """Whether the claim at `path` is left over: untouched for stale_s, or its preparer on this host is gone."""
  try:
    if time.time() - os.path.getmtime(path) > stale_s:
      return True
  except OSError:
    return False
  holder = _holder(path)
  if holder.get("host") != socket.gethostname() or not isinstance(holder.get("pid"), int):
    return False
  try:
    os.kill(holder["pid"], 0)
  except ProcessLookupError:
    return True
  except OSError:  # alive under another user
    return False
  return False


def _heartbeat(path: str, every: float, stop: threading.Event) -> None:
  while not stop.wait(every):
    try:
      os.utime(path)
    except OSError:
      return


def once(final: str, make, process_index: int = 0, wait_s: float = WAIT_S, *, head_start_s: float = HEAD_START_S,
         stale_s: float = STALE_S, heartbeat_s: float = HEARTBEAT_S) -> str:
  """`final`, made by `make(directory)` unless it exists, by one process only (see the module docstring).

  Args:
    final: the entry's directory.
    make: fills a directory with the entry.
    process_index: this process's index in the run (0 in a one-process run): process 0 claims first.
    wait_s: how long to wait for another process's entry before giving up with a UserError naming it.
    head_start_s, stale_s, heartbeat_s: the claim's timing (module constants; tests shorten them).

  Returns:
    `final`, complete.
  """
  parent, claim = os.path.dirname(final), final + ".claim"
  os.makedirs(parent, exist_ok=True)
  start, said = time.monotonic(), False
  while not os.path.isdir(final):
    waited = time.monotonic() - start
    if _abandoned(claim, stale_s):
      try:  # rename, so that of processes taking it over one removes it
        os.rename(claim, f"{claim}.abandoned-{os.getpid()}")
        os.remove(f"{claim}.abandoned-{os.getpid()}")
      except OSError:
        pass
    if (process_index == 0 or waited >= head_start_s) and _claim(claim, process_index):
      stop = threading.Event()
      beat = threading.Thread(target=_heartbeat, args=(claim, heartbeat_s, stop), daemon=True)
      beat.start()
      try:
        if not os.path.isdir(final):  # made while this process was not looking
          _make(final, make)
      finally:
        stop.set()
        beat.join()
        try:
          os.remove(claim)
        except OSError:  # taken over meanwhile
          pass
      return final
    holder = _name(_holder(claim))
    if waited > wait_s:
      raise UserError(f"process {process_index} waited {wait_s:.0f}s for {holder} to prepare the data cache entry "
                      f"{final}, which is still not there; see {holder}'s log, raise --config.data.prepare_wait_s, "
                      "or prepare the data once ahead (python -m bertjax.data.prepare --config=... --out=DIR) "
                      "and train with --config.data.source=shards:DIR")
    if not said:
      print(f"data: process {process_index} waits for {holder} to prepare {final}", file=sys.stderr, flush=True)
      said = True
    time.sleep(POLL_S)
  return final
