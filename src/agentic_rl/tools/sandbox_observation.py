"""The observation: how one sandboxed run becomes the text the policy reads and is trained on.

    from agentic_rl.tools.sandbox_observation import format_observation
    format_observation(result, 4096)   # "120\\n", or stdout + traceback tail + "[notes]"

Design:
  - The text is a pure function of the `SandboxResult`: no timing, no paths that vary by run
    (the worker's files live at fixed paths, see sandbox_supervisor.py), so the same program
    gives the same observation tokens on every run and machine.
  - At most `max_bytes` bytes of program output reach the policy, counted in UTF-8 bytes and
    cut at whole characters. Anything cut is announced by a "[output truncated ...]" line,
    never silent. Bracketed notes (that marker, "[timed out after 5 s]") come on top of the
    budget, so a note is never what gets cut.
  - A failure's traceback gets the budget first, from its tail (the last line names the
    error), less up to a quarter kept for stdout's head, which gets whatever is left.
  - A successful run that printed nothing says so, so the model can tell it from a hang.

Whether the call counts as a failure (a ToolError) is the tool's decision (python_sandbox.py);
this module only renders the text.
"""

from __future__ import annotations

from agentic_rl.tools.sandbox_result import SandboxResult


def format_observation(result: SandboxResult, max_bytes: int) -> str:
    """One observation string: stdout, then the error, with at most `max_bytes` of program
    output. Anything cut is announced by a "[output truncated ...]" line, never silent;
    bracketed notes (the marker, "[timed out after 5 s]") come on top of the budget.
    """
    if result.ok:
        text, cut = _head(result.stdout, max_bytes)
        if not text:
            return "[no output; use print() to show values]"
        return f"{text.rstrip()}\n[output truncated after {max_bytes} bytes]" if cut else text
    if result.exit_reason == "output_truncated":
        text, _ = _head(result.stdout or result.stderr, max_bytes)
        return f"{text.rstrip()}\n[output truncated after {max_bytes} bytes]"
    traceback_text = result.stderr.strip("\n") if result.exit_reason in ("error", "memory") else ""
    # The traceback's last lines name the error, so it gets the budget first (its tail),
    # less up to a quarter kept for stdout (its head), which gets what is left.
    stdout_share = min(len(result.stdout.encode("utf-8")), max_bytes // 4)
    traceback_text, traceback_cut = _tail(traceback_text, max_bytes - stdout_share)
    room = max_bytes - len(traceback_text.encode("utf-8"))
    stdout_text, stdout_cut = _head(result.stdout.rstrip("\n"), room)
    parts = [stdout_text] if stdout_text else []
    if stdout_cut or traceback_cut:
        parts.append(f"[output truncated: only {max_bytes} bytes of output are shown]")
    if traceback_text:
        parts.append(traceback_text)
    if result.exit_reason != "error" or not traceback_text:
        parts.append(f"[{result.error}]")
    return "\n".join(parts)


def _head(text: str, max_bytes: int) -> tuple[str, bool]:
    """The first `max_bytes` bytes of `text` (whole characters only), and whether it was cut."""
    encoded = text.encode("utf-8")
    if len(encoded) <= max_bytes:
        return text, False
    return encoded[: max(0, max_bytes)].decode("utf-8", errors="ignore"), True


def _tail(text: str, max_bytes: int) -> tuple[str, bool]:
    """The last `max_bytes` bytes of `text` (whole characters only), and whether it was cut."""
    encoded = text.encode("utf-8")
    if len(encoded) <= max_bytes:
        return text, False
    return encoded[len(encoded) - max_bytes :].decode("utf-8", errors="ignore"), True
