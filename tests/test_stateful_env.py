"""An env's own methods as tools (per-episode state on the env), the episode-info contract, and
the env's step rewards in the return: the README's guess-the-number game, in-process and through
the CLI (its oracle, SFT from the oracle, a short GRPO on tiny-qwen3).

The game is exec'd from the README itself, so the tutorial a user copies is the one tested."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from agentic_rl.envs.base import EPISODE_INFO, Env, StepResult, Task, episode_info, list_envs, make_env, register_env
from agentic_rl.envs.oracle import run_oracle_episodes
from agentic_rl.envs.tool_env import ToolEnv
from agentic_rl.rewards.base import RewardComposer, RewardSpec
from agentic_rl.rollout.trajectory import Span, Trajectory
from agentic_rl.tools.parse import format_tool_call

REPO = Path(__file__).resolve().parent.parent
README = REPO / "README.md"


def _guess_block() -> str:
    (block,) = [
        b for b in re.findall(r"```python\n(.*?)```", README.read_text(), re.DOTALL) if '@register_env("guess")' in b
    ]
    return block


# In-process, the README's game is registered as "guess_readme" (no other change): test_readme.py
# registers every README block as written, "guess" included, in the same pytest process.
if "guess_readme" not in list_envs():
    exec(
        compile(_guess_block().replace('@register_env("guess")', '@register_env("guess_readme")'), str(README), "exec"),
        {},
    )


def guess(number) -> str:
    return format_tool_call("guess", {"number": number})


def test_the_readmes_game_is_a_short_env_with_no_copied_step_and_no_registry_edit():
    """The issue's bar: the stateful game is at most ~20 lines of logic (code lines, not imports,
    blank lines or the tool's docstring) and defines no `step` of its own."""
    block = _guess_block()
    body = block[block.index("@register_env") :]
    body = re.sub(r'"""(.*?)"""', "", body, flags=re.DOTALL)
    code = [line for line in body.splitlines() if line.strip()]
    assert len(code) <= 22, "\n".join(code)
    assert "def step" not in block and "_REGISTRY" not in block


def test_a_method_tool_reads_the_episodes_state_and_its_costs_and_payout_are_the_turn_rewards():
    """Guards against a method tool without the episode's state, or costs and the success payout lost from the turn rewards."""
    env = make_env("guess_readme")
    task = Task("t", "Guess my number.", "37")
    messages = env.reset(task)
    assert messages[0]["content"].startswith("Find the secret number")
    (schema,) = env.tool_schemas
    assert schema["function"]["name"] == "guess"
    assert schema["function"]["parameters"]["properties"]["number"] == {
        "type": "integer",
        "description": "A whole number from 1 to 100.",
    }
    first = env.step(guess(50))
    assert (first.observation, first.reward, first.done) == (
        [{"role": "tool", "name": "guess", "content": "lower"}],
        -0.05,
        False,
    )
    second = env.step(guess(25) + "\n" + guess(30))  # two calls in one turn: two costs, in order
    assert [m["content"] for m in second.observation] == ["higher", "higher"] and second.reward == pytest.approx(-0.10)
    last = env.step(guess(37) + "\n" + guess(38))  # the game ends at 37; the call after it is not run
    assert last.done and last.observation is None
    assert last.reward == pytest.approx(1.0 - 0.05)
    assert last.info["correct"] and last.info["finish"] == "solved" and last.info["format_ok"]
    assert (last.info["tool_calls"], last.info["tool_errors"], last.info["turns"]) == (5, 1, 3)


def test_a_bad_argument_is_an_error_observation_that_costs_nothing_and_the_game_goes_on():
    """Guards against a method tool whose bad arguments crash the episode or run the method (and charge it)."""
    env = make_env("guess_readme")
    env.reset(Task("t", "Guess my number.", "37"))
    result = env.step(guess("fifty"))
    assert not result.done and result.reward == 0.0
    assert result.observation[0]["content"] == "Error: argument 'number' of tool 'guess' must be integer, got str"


def test_a_turn_without_a_call_in_a_game_gives_up_and_is_never_graded_as_an_answer():
    """Guards against a game without final answers grading `Final Answer: 37` against its secret:
    a free shot at the answer without playing."""
    env = make_env("guess_readme")
    env.reset(Task("t", "Guess my number.", "37"))
    result = env.step("Final Answer: 37")
    assert result.done and result.reward == 0.0
    assert (result.info["correct"], result.info["finish"], result.info["format_ok"]) == (False, "no_call", False)


def test_the_oracle_finds_every_number_by_binary_search_within_the_turn_limit():
    """Guards against an oracle that SFT would learn a wrong or overlong game from."""
    env = make_env("guess_readme")
    summary = run_oracle_episodes(env, [Task(f"t{n}", "Guess my number.", str(n)) for n in range(1, 101)])
    assert summary["accuracy"] == 1.0 and summary["tool_errors"] == 0
    assert summary["tool_calls"] == 580  # Σ over 1..100 of binary search's probes in [1, 100]; at most 7 each


class _Counter(ToolEnv):
    """Two method tools and a registered one: the schema of each, and calls run in order."""

    name = "counter_test"

    def __init__(self):
        super().__init__(tools=["calculator", self.add, self.total], max_turns=3)

    def reset(self, task):
        self.count = 0
        return super().reset(task)

    def add(self, amount: int) -> str:
        """Add to the counter.

        Args:
            amount: How much to add.
        """
        self.count += amount
        return str(self.count)

    def total(self) -> str:
        """The counter's value."""
        return str(self.count)


def test_method_tools_sit_beside_registered_ones_and_a_turns_calls_run_in_order():
    """Guards against stateful calls of one turn run concurrently (out of order) or registered tools lost beside them."""
    env = _Counter()
    assert [s["function"]["name"] for s in env.tool_schemas] == ["calculator", "add", "total"]
    env.reset(Task("t", "count", "3"))
    calls = [
        format_tool_call("add", {"amount": 1}),
        format_tool_call("add", {"amount": 2}),
        format_tool_call("total", {}),
        format_tool_call("calculator", {"expression": "2*3"}),
    ]
    result = env.step("\n".join(calls))
    assert [m["content"] for m in result.observation] == ["1", "3", "3", "6"]


def test_a_tool_that_is_not_a_method_of_the_env_or_lacks_a_docstring_is_refused_when_the_env_is_built():
    """Guards against a tool the schema cannot describe, or a stray function mistaken for per-episode state, reaching a run."""

    def loose(x: int) -> str:
        """Loose.

        Args:
            x: X.
        """
        return ""

    class Bad(ToolEnv):
        def __init__(self, tool):
            super().__init__(tools=[tool], max_turns=2)

        def undocumented(self, x: int) -> str:
            return ""

    with pytest.raises(ValueError, match="neither a registered name nor a method of this env"):
        Bad(loose)
    with pytest.raises(ValueError, match="'undocumented' cannot be a tool"):
        _build_with_method(Bad, "undocumented")
    with pytest.raises(TypeError, match="`tool_names` is now `tools`"):
        ToolEnv(tool_names=["calculator"], max_turns=2)


def _build_with_method(cls, name):
    env = cls.__new__(cls)
    ToolEnv.__init__(env, tools=[getattr(env, name)], max_turns=2)


# ---------------------------------------------------------------------- the episode-info contract


@register_env("terse_test")
class _Terse(Env):
    """Reports only `correct` at the end: every other EPISODE_INFO key is left out."""

    name = "terse_test"

    def tasks(self, split, n=None, seed=0):
        return [Task(f"terse/{i}", "Say go.", "go") for i in range(n or 2)]

    def reset(self, task):
        return [{"role": "system", "content": "s"}, {"role": "user", "content": task.question}]

    def step(self, action_text):
        return StepResult(None, 1.0, True, {"correct": action_text == "go"})

    def oracle_actions(self, task):
        return ["go"]


def test_an_env_that_reports_only_correct_is_read_with_the_documented_defaults():
    """Guards against `envs oracle` dying with KeyError: 'tool_errors' on an env that leaves it out."""
    summary = run_oracle_episodes(make_env("terse_test"), make_env("terse_test").tasks("test", 3))
    assert (summary["accuracy"], summary["tool_calls"], summary["tool_errors"], summary["failures"]) == (1.0, 0, 0, [])
    filled = episode_info({"correct": True})
    assert filled == {**{key: default for key, (default, _) in EPISODE_INFO.items()}, "correct": True}


# ---------------------------------------------------------------------- step rewards in the return


def _episode(turn_rewards: list[float], correct: bool, env: str = "guess") -> Trajectory:
    ids = [1] + [2] * len(turn_rewards)
    spans = [Span("prompt", 0, 1)] + [Span("policy", 1 + i, 2 + i) for i in range(len(turn_rewards))]
    return Trajectory(
        ids,
        [0] + [1] * len(turn_rewards),
        [0.0] * len(ids),
        spans,
        turn_rewards=turn_rewards,
        env=env,
        task_id="t",
        info={"correct": correct},
    )


def test_the_default_reward_is_the_envs_return_with_every_step_reward():
    """Guards against a default reward that drops the env's step rewards (the seed's return is Σ γ^t r_t)."""
    from agentic_rl.training.grpo_config import GRPOConfig
    from agentic_rl.training.ppo_config import PPOConfig

    assert [spec.name for spec in GRPOConfig().rewards] == [spec.name for spec in PPOConfig().rewards] == ["env_steps"]
    composer = RewardComposer(GRPOConfig().rewards)
    assert composer([_episode([-0.05, -0.05, 0.95], True)]) == [pytest.approx(0.85)]


def test_a_reward_list_that_would_drop_step_rewards_is_refused_naming_env_steps():
    """Guards against a per-guess cost that silently counts for nothing because the config listed
    `accuracy` alone: the seed's MDP maximises Σ γ^t r_t, so a dropped step reward is a wrong answer."""
    with pytest.raises(ValueError, match=r"environment 'guess' paid step rewards \[-0.05, 0.95\].*env_steps"):
        RewardComposer([RewardSpec("accuracy")])([_episode([-0.05, 0.95], True)])


def test_step_rewards_that_are_only_the_success_payout_need_no_env_steps_and_weight_zero_leaves_any_out():
    """Guards against refusing every `accuracy` config (arith pays only its success) or ignoring an explicit opt-out."""
    assert RewardComposer([RewardSpec("accuracy")])([_episode([0.0, 1.0], True), _episode([0.0, 0.0], False)]) == [
        1.0,
        0.0,
    ]
    on_purpose = RewardComposer([RewardSpec("accuracy"), RewardSpec("env_steps", weight=0.0)])
    assert on_purpose([_episode([-0.05, 0.95], True)]) == [1.0]


# ---------------------------------------------------------------------- through the CLI


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "PYTHONPATH": str(REPO / "src")}
    return subprocess.run(
        [sys.executable, "-m", "agentic_rl.cli", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=600
    )


GUESS_SFT = """
plugins: [guess.py]
model: {{name: tiny-qwen3, lora: {{r: 4}}}}
sources: [{{kind: oracle, env: {{name: guess}}, n: 4}}]
batch_size: 4
micro_batch_size: 4
train: {{steps: 2, progress: false, output_dir: {out}}}
"""

GUESS_GRPO = """
plugins: [guess.py]
model: {{name: {model}, lora: {{r: 4}}}}
env: {{name: guess, task_pool: 4}}
rollout: {{batch_size: 4, group_size: 2, max_turn_tokens: 12, max_turns: 2, max_episode_tokens: 1024}}
micro_batch_size: 4
train: {{steps: 1, progress: false, output_dir: {out}}}
"""


def test_the_readmes_game_runs_through_the_cli_oracle_then_sft_then_grpo(tmp_path):
    """The README's game as a user runs it: `envs oracle guess`, SFT on the oracle's episodes, and
    GRPO from the SFT model with the default reward (the env's return) on tiny-qwen3."""
    (tmp_path / "guess.py").write_text(_guess_block())
    oracle = _cli("envs", "oracle", "guess", "--plugin", "guess.py", "--n", "20", cwd=tmp_path)
    assert oracle.returncode == 0, oracle.stderr[-2000:]
    summary = json.loads(oracle.stdout.splitlines()[-1])
    assert (summary["accuracy"], summary["tool_errors"]) == (1.0, 0)

    (tmp_path / "sft.yaml").write_text(GUESS_SFT.format(out=tmp_path / "sft"))
    sft = _cli("sft", "--config", "sft.yaml", cwd=tmp_path)
    assert sft.returncode == 0, sft.stderr[-3000:]
    assert (tmp_path / "sft" / "final" / "adapter_model.safetensors").is_file()

    (tmp_path / "grpo.yaml").write_text(GUESS_GRPO.format(model=tmp_path / "sft" / "final", out=tmp_path / "grpo"))
    grpo = _cli("grpo", "--config", "grpo.yaml", cwd=tmp_path)
    assert grpo.returncode == 0, grpo.stderr[-3000:]
    row = json.loads((tmp_path / "grpo" / "metrics.jsonl").read_text().splitlines()[0])
    # A random model rarely guesses in two turns: each episode's return is its guesses' costs, ≤ 0, and never below 2 turns x 8 calls.
    assert -0.05 * 16 <= row["reward/env_steps/mean"] <= 1.0
