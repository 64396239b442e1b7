"""The one exception type for user errors: a problem the user can fix, which a CLI prints as one line
(`error: ...`, exit code 2; bertjax.core.cli); and the one for a job that starting again resumes (exit 75)."""


class UserError(Exception):
  """A problem the user can fix (bad config, missing corpus, ...): message names the problem and the fix."""


class RestartableError(Exception):
  """A failure that starting the same job again resumes from (a peer that stopped answering): the CLI prints
  `error: ...` in one line and exits with RESTARTABLE_EXIT, the supervisor's and launchers' retry code."""


RESTARTABLE_EXIT = 75  # EX_TEMPFAIL; bertjax.core.supervisor.LOST_PEER_EXIT is the same code
