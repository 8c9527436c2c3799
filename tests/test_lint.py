"""The linter's rules and the formatter ([tool.ruff] in pyproject.toml) hold over every Python
file of the repository."""

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CHECKED = ["src", "tests", "benchmarks", "experiments"]


def _ruff(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "ruff", *args, *CHECKED], cwd=REPO, capture_output=True, text=True, timeout=120
    )


def test_ruff_finds_nothing_in_the_code_the_tests_the_benchmarks_and_the_experiments():
    """Guards against unused imports and variables, undefined names and statements crammed onto one
    line creeping back (19 had, across 14 files, before the linter ran here)."""
    completed = _ruff("check", "--output-format", "concise")
    assert completed.returncode == 0, completed.stdout[-3000:] + completed.stderr[-1000:]


def test_every_file_is_as_the_formatter_writes_it():
    """Guards against hand layout coming back (209 of 245 files differed from the formatter's
    output before it ran): `ruff format` fixes a file, `ruff format --check` names it."""
    completed = _ruff("format", "--check")
    assert completed.returncode == 0, completed.stdout[-3000:] + completed.stderr[-1000:]
