"""The documentation site (mkdocs.yml over docs/): it builds strictly, and its reference pages are
what the code generates, so a key or metric added to the code cannot be missing from the site."""

import subprocess
import sys
from pathlib import Path

import pytest

from agentic_rl.cli import main

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("page, argv", [("config.md", ["config", "--markdown"]), ("metrics.md", ["metrics", "--markdown"])])
def test_the_reference_pages_are_what_the_code_generates(page, argv, capsys):
    """Guards against a reference page that drifts from the code (a key added, a default changed, a
    metric renamed): regenerate with `agentic-rl config --markdown > docs/config.md` (or `metrics`)."""
    assert main(argv) == 0
    generated = capsys.readouterr().out
    assert (REPO / "docs" / page).read_text() == generated, f"docs/{page} is stale: agentic-rl {' '.join(argv)} > docs/{page}"
    assert generated.count("\n- **`") + generated.count("\n| `") >= 60  # every key, not a header alone


def test_the_site_builds_strictly_with_every_page_in_its_nav(tmp_path):
    """Guards against a broken link between pages, a link to a missing anchor, or a page left out of
    the nav (mkdocs.yml is strict: each is an error), which a reader would meet as a dead end."""
    completed = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
                               cwd=REPO, capture_output=True, text=True, timeout=120)
    assert completed.returncode == 0, completed.stderr[-3000:]
    built = {path.relative_to(tmp_path / "site").parent.as_posix() for path in (tmp_path / "site").rglob("index.html")}
    pages = {path.stem for path in (REPO / "docs").glob("*.md")} - {"index"}
    assert pages <= built, pages - built
