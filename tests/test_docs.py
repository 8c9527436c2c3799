"""The documentation site (mkdocs.yml over docs/): it builds strictly, and its reference pages are
what the code generates, so a key or metric added to the code cannot be missing from the site."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from agentic_rl.cli import main

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize(
    "page, argv", [("config.md", ["config", "--markdown"]), ("metrics.md", ["metrics", "--markdown"])]
)
def test_the_reference_pages_are_what_the_code_generates(page, argv, capsys):
    """Guards against a reference page that drifts from the code (a key added, a default changed, a
    metric renamed): regenerate with `agentic-rl config --markdown > docs/config.md` (or `metrics`)."""
    assert main(argv) == 0
    generated = capsys.readouterr().out
    assert (REPO / "docs" / page).read_text() == generated, (
        f"docs/{page} is stale: agentic-rl {' '.join(argv)} > docs/{page}"
    )
    assert generated.count("\n- **`") + generated.count("\n| `") >= 60  # every key, not a header alone


def test_the_site_builds_strictly_with_every_page_in_its_nav(tmp_path):
    """Guards against a broken link between pages, a link to a missing anchor, or a page left out of
    the nav (mkdocs.yml is strict: each is an error), which a reader would meet as a dead end."""
    completed = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
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


def test_the_extending_guides_env_tool_and_reward_behave_as_it_says(tmp_path):
    """Guards against a guide whose worked example drifted from the API or from its own prose: the
    page's blocks, run as the file it says to save, register an env whose splits are disjoint, whose
    oracle solves every test word with one hint (return 1 − 0.2 = 0.8), whose wrong answer earns the
    share of letters in place (3/5) without counting as correct, whose hint count reaches the
    episode's info and the page's reward term, and whose tool checks its argument; its EPISODE_INFO
    table is the code's."""
    import json
    import re

    code = "\n\n".join(_blocks("extending.md", "python"))
    (tmp_path / "unscramble.py").write_text(code)
    (config,) = _blocks("extending.md", "yaml")
    (tmp_path / "grpo.yaml").write_text(config)
    probe = """
import json, sys
from agentic_rl.train_commands import config_class
from agentic_rl.validation import load_and_validate
cfg = load_and_validate(config_class("grpo"), "grpo.yaml")  # imports unscramble.py, the config's plugin
out = {"config": [cfg.env.name, [(r.name, r.weight, r.params) for r in cfg.rewards]]}
from agentic_rl.envs.base import make_env
from agentic_rl.envs.oracle import run_oracle
from agentic_rl.rewards.base import RewardComposer, RewardSpec
from agentic_rl.rollout.trajectory import Span, Trajectory
from agentic_rl.tools.base import ToolError, get_tool
from agentic_rl.tools.parse import format_tool_call

env = make_env("unscramble")
train, test = env.tasks("train"), env.tasks("test")
out["splits"] = [len(train), len(test), len({t.answer for t in train} & {t.answer for t in test})]
out["scrambled"] = all(sorted(t.question) == sorted(t.answer) for t in train + test)
out["oracle"] = run_oracle("unscramble", n=8, split="test")["accuracy"]
task = next(t for t in test if t.answer == "bread")
env.reset(task)
hint = env.step(format_tool_call("hint", {}))
done = env.step("Final Answer: bread")
out["hint"] = [hint.observation[0]["content"], hint.reward, done.reward, done.info["correct"], done.info["hints_used"]]
env.reset(task)
out["hints"] = [env.step(format_tool_call("hint", {})).observation[0]["content"] for _ in range(2)]
env.reset(next(t for t in train if t.answer == "apple"))
wrong = env.step("Final Answer: appel")
out["partial"] = [wrong.reward, wrong.info["correct"], wrong.info["score"]]
cheap = make_env("unscramble", hint_cost=0.1)
cheap.reset(task)
out["cheap"] = cheap.step(format_tool_call("hint", {})).reward
spans = [Span("prompt", 0, 1), Span("policy", 1, 2)]
def traj(correct, hints):
    return Trajectory([1, 2], [0, 1], [0.0, 0.0], spans, info={"correct": correct, "hints_used": hints})
out["few_hints"] = RewardComposer([RewardSpec("few_hints", params={"free": 1})])([traj(True, 1), traj(True, 2), traj(False, 0)])
tool = get_tool("anagram_check")
out["tool"] = [tool.call({"word": "apple", "letters": "pleap"}), tool.call({"word": "apples", "letters": "pleap"})]
try:
    tool.call({"word": "ap ple", "letters": "pleap"})
except ToolError as exc:
    out["tool_error"] = str(exc)
print(json.dumps(out))
"""
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    done = subprocess.run(
        [sys.executable, "-c", probe], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.splitlines()[-1])
    assert out["splits"] == [8, 8, 0] and out["scrambled"] and out["oracle"] == 1.0
    assert out["hint"] == ["b", pytest.approx(-0.2), 1.0, True, 1] and out["hints"] == ["b", "br"]
    assert out["hint"][1] + out["hint"][2] == pytest.approx(0.8)  # the episode's return, as the page says
    assert out["partial"] == [pytest.approx(3 / 5), False, pytest.approx(3 / 5)]
    assert out["cheap"] == pytest.approx(-0.1)
    assert out["few_hints"] == [1.0, 0.0, 0.0]
    assert out["tool"] == ["yes", "no"] and out["tool_error"] == "word must be letters only"

    assert out["config"] == [
        "unscramble",
        [["env_steps", 1.0, {}], ["length_penalty", 0.5, {"alpha": 0.002, "target": 64}]],
    ]
    from agentic_rl.envs.base import EPISODE_INFO

    page = (REPO / "docs" / "extending.md").read_text()
    table = dict(re.findall(r"^\| `(\w+)` \| `([^`]*)` \|", page, re.M))

    def shown(default):  # as the page writes a default: Python's None and False, JSON's 0, "" and {}
        return repr(default) if default is None or default is False else json.dumps(default)

    assert table == {key: shown(default) for key, (default, _meaning) in EPISODE_INFO.items()}
