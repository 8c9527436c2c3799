"""Errors that end a command with a message, not a traceback.

`agentic-rl` prints `error: <message>` for these and exits with status 3 (2 is a bad config or
argument). Raise a subclass where the run itself has to stop for a reason the user must read,
e.g. `training.loop.NonFiniteError`.
"""


class RunStopped(RuntimeError):
    """The run stopped on purpose; the message says why and what to do."""
