"""The one exception type for user errors: a problem the user can fix, which a CLI prints as one line
(`error: ...`, exit code 2; bertjax.core.cli)."""


class UserError(Exception):
  """A problem the user can fix (bad config, missing corpus, ...): message names the problem and the fix."""
