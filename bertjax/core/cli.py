"""Command-line plumbing shared by every `python -m bertjax.<command>`: one-line errors (UserError, bad flags,
bad config keys) with exit code 2, the `--config/--workdir` main of the run commands, and `--phase`."""

import argparse
import functools
import re
import sys

from bertjax.core.errors import RESTARTABLE_EXIT, RestartableError, UserError




class ArgumentParser(argparse.ArgumentParser):
  """argparse for the small positional-argument CLIs (squad.evaluate, predict): a usage error is one `error: ...`
  line and exit 2, as a UserError is, instead of argparse's usage block."""

  def error(self, message):
    print(f"error: {message}; see --help", file=sys.stderr, flush=True)
    sys.exit(2)

  def parse_args(self, args=None, namespace=None):
    """An unknown flag is named first (argparse would first complain about missing positionals)."""
    known = {s for action in self._actions for s in action.option_strings}
    given = sys.argv[1:] if args is None else args
    unknown = [a.split("=", 1)[0] for a in given if a.startswith("--") and a.split("=", 1)[0] not in known]
    if unknown:
      self.error(f"unknown flag {unknown[0]}")
    return super().parse_args(args, namespace)


def cli(main):
  """Wraps a CLI `main(argv)` so that a UserError prints `error: ...` on stderr and exits with code 2 (a
  RestartableError: exit 75)."""

  @functools.wraps(main)
  def wrapped(argv):
    from absl import logging

    logging.set_verbosity(logging.WARNING)  # absl INFO lines (JAX probing backends) drown our output
    try:
      return main(argv)
    except UserError as e:
      print(f"error: {e}", file=sys.stderr, flush=True)
      sys.exit(2)
    except RestartableError as e:
      import os

      print(f"error: {e}", file=sys.stderr, flush=True)
      sys.stdout.flush()
      # Not sys.exit: jax.distributed's exit hook waits at a barrier for every process, the lost one too.
      os._exit(RESTARTABLE_EXIT)

  return wrapped


def script(main):
  """`sys.exit(main())` for an argparse script (benchmarks/*.py): a UserError it meets ends as it does in bertjax's
  own commands, `error: ...` in one line with exit code 2, no traceback. A main that returns a result rather than
  an exit status (a dict of figures) exits 0."""
  status = cli(lambda argv: main())(sys.argv)
  sys.exit(status if status is None or isinstance(status, int) else 0)


def flag_error_line(e: Exception) -> str:
  """One line for a command-line error: a bad flag value, a config file that raised, an unknown key."""
  lines = [line.strip() for line in str(e).splitlines() if line.strip()]
  last = lines[-1] if lines else type(e).__name__
  if isinstance(e, (AttributeError, KeyError)):  # ml_collections, for --config.<key> the config lacks
    key = re.search(r"(\w+)", str(e))
    hint = re.search(r'Did you mean "(\w+)"', str(e))
    return (f"no config key {key.group(1) if key else str(e)!r}"
            + (f"; did you mean {hint.group(1)!r}?" if hint else ": check the --config.* overrides against the config file"))
  if isinstance(e, OSError):  # ml_collections, for a --config file it cannot load
    return f"cannot load the config file: {last}"
  flag = re.match(r"flag (--\S+?): ", lines[0]) if lines else None
  return f"{flag.group(1)}: {last}" if flag and lines[0] != last else last


def parse_flags(argv):
  """absl's flag parsing with a one-line `error: ...` and exit code 2 instead of a traceback and usage."""
  from absl import flags

  try:
    argv = flags.FLAGS(argv)
    for name in flags.FLAGS:  # a config file that failed to load raises on first attribute access: now
      hasattr(flags.FLAGS[name].value, "keys")
    return argv
  except (flags.Error, AttributeError, KeyError, OSError, TypeError, ValueError) as e:
    print(f"error: {flag_error_line(e)}", file=sys.stderr, flush=True)
    sys.exit(2)


def run(main):
  """`absl.app.run(main)` for bertjax's CLIs: flag and config errors end in one line, like UserError."""
  from absl import app

  app.run(main, flags_parser=parse_flags)


def config_and_phase_flags(example: str, what: str):
  """--config (required, locked) and --phase, the phase whose shapes a one-shape CLI (aot, bench) `what`s;
  returns a function giving that phase's config once flags are parsed."""
  from absl import flags
  from ml_collections import config_flags

  config = config_flags.DEFINE_config_file("config", None, f"config file, e.g. {example}", lock_config=True)
  phase = flags.DEFINE_integer("phase", 0, f"the training phase whose shapes to {what} (configs with phases); "
                               "0: the phase at --config.seq_len, else the run's shapes as given")
  flags.mark_flags_as_required(["config"])

  def phase_config():
    from bertjax.core import config as config_lib

    return config_lib.phase_config(config.value, phase.value)

  return phase_config


def default_workdir(config_spec: str) -> str:
  """A fresh workdir for a run started without --workdir (one process only: the processes of a multi-host
  run must agree on one): TMPDIR/bertjax/<config>-<variant>-<time>, printed so the user can find it."""
  import datetime
  import os
  import tempfile

  import jax

  if jax.process_count() > 1:
    raise UserError("a multi-host run needs --workdir (one directory all processes share, e.g. gs://BUCKET/run)")
  path, _, variant = config_spec.partition(":")
  name = "-".join(p for p in (os.path.splitext(os.path.basename(path))[0], variant) if p)
  stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
  base = os.path.join(tempfile.gettempdir(), "bertjax")
  os.makedirs(base, exist_ok=True)
  workdir = tempfile.mkdtemp(prefix=f"{name}-{stamp}-", dir=base)  # empty, and no other run's
  print(f"workdir: {workdir} (no --workdir given)", flush=True)
  return workdir


def run_config_workdir(example: str, workdir_help: str, entry: str):
  """The whole of a `--config=... --workdir=...` CLI (train, finetune): defines both flags (--config
  required; without --workdir a one-process run gets a fresh one, `default_workdir`), parses them with
  one-line errors, sets up the process (`runtime.setup()`), then imports `entry` ("module:function") and calls
  it with (config, workdir)."""
  import importlib
  import os

  from bertjax.core import supervisor

  if supervisor.wanted():  # one process of several: run under a parent that reports a lost peer in one line
    sys.exit(supervisor.supervise([sys.executable, *sys.orig_argv[1:]]))
  os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # TensorFlow (tfds), if present, stays quiet
  from absl import flags
  from ml_collections import config_flags

  config = config_flags.DEFINE_config_file("config", None, f"config file, e.g. {example}", lock_config=True)
  workdir = flags.DEFINE_string("workdir", None, workdir_help + " (default: a new directory under the temp dir)")
  flags.mark_flags_as_required(["config"])

  @cli
  def main(argv):
    del argv
    from bertjax.core import runtime

    c = config.value  # platform, allocator, JAX flags, jax.distributed.initialize() on multi-host jobs:
    runtime.setup(c.get("startup_timeout", 300.0), c.get("heartbeat_timeout", 100.0),
                  runtime.step_timeout(c, workdir.value))
    where = workdir.value or default_workdir(flags.FLAGS["config"].config_filename)
    module, _, function = entry.partition(":")
    try:
      getattr(importlib.import_module(module), function)(config.value, where)
    except Exception as e:
      if not workdir.value and not os.listdir(where):  # the run's own fresh workdir, still empty: leave nothing
        os.rmdir(where)
      supervisor.await_lost_peer_report(e, c.get("heartbeat_timeout", 100.0))
      raise

  run(main)
