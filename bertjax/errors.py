"""The one exception type for user errors, and the CLI wrapper that turns it into a one-line message."""

import functools
import sys


class UserError(Exception):
  """A problem the user can fix (bad config, missing corpus, ...): message names the problem and the fix."""


def cli(main):
  """Wraps a CLI `main(argv)` so that a UserError prints `error: ...` on stderr and exits with code 2."""

  @functools.wraps(main)
  def wrapped(argv):
    from absl import logging

    logging.set_verbosity(logging.WARNING)  # absl INFO lines (JAX probing backends) drown our output
    try:
      return main(argv)
    except UserError as e:
      print(f"error: {e}", file=sys.stderr, flush=True)
      sys.exit(2)

  return wrapped
