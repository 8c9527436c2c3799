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


def _blocks(page: str, language: str) -> list[str]:
    import re

    return re.findall(rf"```{language}\n(.*?)```", (REPO / "docs" / page).read_text(), re.DOTALL)


def test_the_sft_data_pages_examples_load_as_written(tmp_path):
    """Guards against a documented demonstration format the loader refuses (or reads otherwise):
    the page's JSONL lines load through SFT's own loader with SmolLM2's template, the tool call of
    the first one trained and its result not, and its `sources` list validates as an SFT config."""
    from agentic_rl.config import load_config
    from agentic_rl.models.chat_format import ChatFormat
    from agentic_rl.models.loader import load_tokenizer
    from agentic_rl.rollout.demos import load_jsonl_demos
    from agentic_rl.train_commands import config_class

    (jsonl,) = _blocks("sft-data.md", "jsonl")
    path = tmp_path / "demos.jsonl"
    path.write_text(jsonl)
    chat_format = ChatFormat.for_tokenizer(load_tokenizer("smollm2-135m-instruct"))
    first, second = load_jsonl_demos(path, chat_format)
    tokenizer = chat_format.tokenizer
    trained = tokenizer.decode([t for t, m in zip(first.input_ids, first.loss_mask) if m])
    assert '"expression": "12 * 7 + 5"' in trained and "Final Answer: 89" in trained and "89\n" not in trained
    assert tokenizer.decode([t for t, m in zip(second.input_ids, second.loss_mask) if m]).startswith("Final Answer: 11")
    (sources,) = _blocks("sft-data.md", "yaml")
    config = tmp_path / "sft.yaml"
    config.write_text(sources.replace("demos.jsonl", str(path)))
    cfg = load_config(config_class("sft"), config)
    assert [source.kind for source in cfg.sources] == ["oracle", "jsonl"] and cfg.sources[1].max_repeats == 4


def test_the_bridges_page_names_only_options_its_bridge_has():
    """Guards against a documented bridge config whose option keys the bridge no longer takes (the
    verifiers example cannot load here: its environment package is not installed, so its keys are
    checked against the bridge's options dataclass instead)."""
    import dataclasses

    import yaml

    from agentic_rl.envs.base import env_options_class

    (block,) = _blocks("bridges.md", "yaml")
    env = yaml.safe_load(block)["env"]
    fields = {field.name for field in dataclasses.fields(env_options_class(env["name"]))}
    assert set(env["options"]) <= fields and env["options"], (env, fields)
