"""What the CLI tells a newcomer: where a finished run is and a next command that runs (parsed by the
CLI's own parser and its config loaded, so a renamed key or command in the advice fails here, not in
a user's terminal), and which tools there are."""

from __future__ import annotations

import re
import shlex

import pytest

from agentic_rl import cli
from agentic_rl.config import load_config
from agentic_rl.train_commands import config_class, next_step
from agentic_rl.validation import load_and_validate

TINY = {
    "sft": ["sources=[{kind: oracle, env: {name: arith, options: {difficulty: 1}}, n: 4}]"],
    "rm": [],
    "grpo": ["env.name=plan"],
    "ppo": ["env.name=memory"],
}


@pytest.mark.parametrize("command", sorted(TINY))
def test_a_finished_run_names_its_folder_and_a_next_command_that_loads(command, tmp_path):
    """Guards against a run that ends with `{"final": ...}` and nothing about where its results are or
    what to run next, and against advice naming a key or command that no longer exists."""
    cfg = load_config(
        config_class(command), None, overrides=["model.name=tiny-qwen3", f"train.output_dir={tmp_path}", *TINY[command]]
    )
    final = tmp_path / "final"
    final.mkdir()
    message = next_step(command, cfg, {"final": str(final)})
    done, advice = message.splitlines()
    assert done.startswith(f"done: {tmp_path} holds the run (metrics.jsonl, tb/ for TensorBoard, final/ the model)")
    assert advice.startswith("next: agentic-rl ")
    argv = shlex.split(advice.removeprefix("next: agentic-rl ").split("   (")[0])
    args = cli.build_parser().parse_args(argv)
    if args.command == "eval":
        assert args.model == str(final) and args.env == cfg.env.name
        return
    suggested = load_config(config_class(args.command), None, overrides=args.set)
    if command == "rm":
        assert suggested.reward_model.path == str(final) and suggested.reward_model.weight == 0.5
    else:
        assert suggested.model.name == str(final) and suggested.env.name == "arith"


def test_tools_list_names_every_tool_and_shows_each_ones_arguments(capsys):
    """Guards against a toolkit with `envs list` and `rewards list` but no way to see its tools."""
    assert cli.main(["tools", "list"]) == 0
    assert capsys.readouterr().out.splitlines() == ["calculator", "python"]
    assert cli.main(["tools", "list", "-v"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "calculator" and out[2].startswith("    expression (string): ")
    assert "python" in out and any(line.startswith("    code (string): ") for line in out)


def _register_no_oracle_env() -> str:
    from agentic_rl.envs.base import Task, list_envs, register_env
    from agentic_rl.envs.tool_env import ToolEnv

    if "no_oracle" not in list_envs():

        @register_env("no_oracle")
        class NoOracle(ToolEnv):
            name = "no_oracle"

            def __init__(self):
                super().__init__(tools=["calculator"], max_turns=2)

            def tasks(self, split, n=None, seed=0):
                return [Task(f"no_oracle/{split}/{i}", f"What is {i} + 1?", str(i + 1)) for i in range(n or 4)]

    return "no_oracle"


@pytest.mark.parametrize(
    "command, overrides, where",
    [
        ("sft", ["sources=[{kind: oracle, env: {name: no_oracle}, n: 4}]"], "sft.sources[].kind: oracle"),
        ("grpo", ["env.name=no_oracle", "guidance.enabled=true"], "guidance.enabled"),
        ("audit", ["model=tiny-qwen3", "env.name=no_oracle"], "audit"),
    ],
)
def test_a_setting_that_needs_an_oracle_names_the_env_without_one_when_the_config_is_read(command, overrides, where):
    """Guards against an env without an oracle reaching a raw NotImplementedError after the model loaded
    (sft with kind: oracle, guidance.enabled) or in `envs oracle`: each is refused by name first."""
    from agentic_rl.config import ConfigError

    _register_no_oracle_env()
    with pytest.raises(
        ConfigError,
        match=rf"{re.escape(where)}: env 'no_oracle' has no oracle \(its class does not define oracle_actions",
    ):
        load_and_validate(
            config_class(command),
            None,
            overrides=[*(["model.name=tiny-qwen3"] if command != "audit" else []), *overrides],
        )


def test_envs_oracle_on_an_env_without_one_is_an_error_naming_it(capsys):
    """Guards against `envs oracle` on an env without an oracle ending in a raw NotImplementedError."""
    _register_no_oracle_env()
    assert cli.main(["envs", "oracle", "no_oracle", "--n", "2"]) == 2
    assert "error: envs oracle: env 'no_oracle' has no oracle" in capsys.readouterr().err
