"""Errors that end a command with a message, not a traceback, and how they quote user input.

`agentic-rl` prints `error: <message>` for these and exits with status 3 (2 is a bad config or
argument). Raise a subclass where the run itself has to stop for a reason the user must read,
e.g. `training.loop.NonFiniteError`.

An error that quotes what the user gave quotes it through `quoted`: a 500 MB `--set` value or
file line once came back as a 522 MB error message.
"""

QUOTE_LIMIT = 200
"""Characters of a user's value an error message quotes; the rest is counted, not shown."""


class ConfigError(ValueError):
    """A config file or override is invalid; the message names the key and the fix."""


class RunStopped(RuntimeError):
    """The run stopped on purpose; the message says why and what to do."""


def quoted(value: object, limit: int = QUOTE_LIMIT) -> str:
    """`repr(value)`, cut to `limit` characters with the number left out, e.g.
    `'aaaa…' (+9999796 characters)`: enough to recognise the value, never megabytes of it."""
    text = repr(value) if not isinstance(value, str) or len(value) <= limit else repr(value[:limit])
    if isinstance(value, str):
        return text if len(value) <= limit else f"{text[:-1]}…{text[-1]} (+{len(value) - limit} characters)"
    return text if len(text) <= limit else f"{text[:limit]}… (+{len(text) - limit} characters)"


def capped(message: str, limit: int = 20 * QUOTE_LIMIT) -> str:
    """`message` with its middle cut when longer than `limit`: the start names the problem and the
    end says what to do, so both are kept (the last resort for a message that quoted too much)."""
    if len(message) <= limit:
        return message
    half = limit // 2
    return f"{message[:half]} …({len(message) - 2 * half} characters cut)… {message[-half:]}"
