"""The bridges to environment libraries others wrote: reasoning-gym's datasets and textarena's
single-player games as envs (the `[reasoning-gym]` and `[textarena]` extras, which `make test`
installs). What a user relies on: the library's own verifier and rules decide, splits never share
a generator seed, what would need a download fails before a model loads, and a short GRPO runs
through each on tiny-qwen3 (one evaluation through each on the embedded model is a slow test)."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

from agentic_rl.config import ConfigError, load_config
from agentic_rl.envs.base import make_env
from agentic_rl.envs.oracle import run_oracle
from agentic_rl.training.grpo_config import GRPOConfig

REPO = Path(__file__).resolve().parent.parent


def _cli(*args: str, cwd: Path, env: dict[str, str] | None = None, timeout: int = 600) -> subprocess.CompletedProcess:
    environ = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "PYTHONPATH": str(REPO / "src"), **(env or {})}
    return subprocess.run([sys.executable, "-m", "agentic_rl.cli", *args], cwd=cwd, env=environ, capture_output=True, text=True,
                          timeout=timeout)


# ---------------------------------------------------------------------- reasoning-gym


def test_reasoning_gym_tasks_are_the_datasets_own_items_from_disjoint_generator_seeds():
    """Guards against tasks that are not reasoning-gym's own items, splits sharing a generator seed, or draws that are not reproducible."""
    import reasoning_gym

    env = make_env("reasoning_gym", dataset="chain_sum", config={"min_terms": 2, "max_terms": 3})
    train, test = env.tasks("train", n=3, seed=1), env.tasks("test", n=3, seed=1)
    reference = reasoning_gym.create_dataset("chain_sum", seed=2 * 1_000_000_000, size=3, min_terms=2, max_terms=3)
    assert [(t.question, t.answer) for t in train] == [(e["question"], e["answer"]) for e in reference]
    train_seeds = {t.meta["split_base"] + t.meta["index"] for t in env.tasks("train", n=200, seed=1)}
    test_seeds = {t.meta["split_base"] + t.meta["index"] for t in env.tasks("test", n=200, seed=1)}
    assert not train_seeds & test_seeds and len(train_seeds) == len(test_seeds) == 200
    assert [t.question for t in test] == [t.question for t in make_env("reasoning_gym", dataset="chain_sum",
                                                                         config={"min_terms": 2, "max_terms": 3}).tasks("test", n=3, seed=1)]


def test_reasoning_gym_datasets_that_draw_every_item_when_built_are_built_at_the_splits_size():
    """Guards against building gsm_symbolic (which draws its whole item list in its constructor)
    at a billion items (it never returns), and against grading a task of such a dataset with an
    item drawn at another size: acre shuffles its items by the size, so item 1 of 5 is not item 1 of 50."""
    import reasoning_gym

    env = make_env("reasoning_gym", dataset="gsm_symbolic")
    tasks = env.tasks("test", n=5, seed=2)
    reference = reasoning_gym.create_dataset("gsm_symbolic", seed=5 * 1_000_000_000, size=5)
    assert [(t.question, t.answer) for t in tasks] == [(e["question"], e["answer"]) for e in reference]

    acre = make_env("reasoning_gym", dataset="acre")
    small, large = acre.tasks("test", n=5), acre.tasks("test", n=50)  # the same ids, other problems
    assert [t.id for t in small] == [t.id for t in large[:5]] and [t.question for t in small] != [t.question for t in large[:5]]
    for grader in (acre, make_env("reasoning_gym", dataset="acre")):
        for task in small:
            grader.reset(task)
            assert grader.step(f"Final Answer: {task.answer}").info["correct"], task


def test_reasoning_gym_grades_with_its_own_verifier_partial_credit_kept_as_the_reward():
    """Guards against grading a non-numeric answer with our numeric matcher, or rounding the
    verifier's partial credit to 0/1 (the `env_steps` reward pays it; `accuracy` only a full 1.0)."""
    env = make_env("reasoning_gym", dataset="word_sorting")
    task = env.tasks("test", n=1)[0]
    env.reset(task)
    right = env.step(f"Sorting them.\nFinal Answer: {task.answer}")
    assert right.done and right.info["correct"] and right.reward == 1.0 and right.info["final_answer"] == task.answer
    env.reset(task)
    wrong = env.step("Final Answer: zebra")
    assert not wrong.info["correct"] and 0.0 <= wrong.reward < 1.0 and wrong.reward == wrong.info["score"]
    env.reset(task)
    silent = env.step("I do not know.")
    assert (silent.info["finish"], silent.reward, silent.info["format_ok"]) == ("no_answer", 0.0, False)


def test_reasoning_gym_mix_draws_by_weight_and_grades_each_item_by_its_own_dataset():
    """Guards against a weighted mix that ignores weights, or grades an item with another dataset's verifier."""
    env = make_env("reasoning_gym", datasets=[{"name": "chain_sum"}, {"name": "word_sorting", "weight": 3}])
    tasks = env.tasks("test", n=200)
    sources = [t.meta["source_dataset"] for t in tasks]
    assert set(sources) == {"chain_sum", "word_sorting"} and 0.65 < sources.count("word_sorting") / 200 < 0.85
    for task in tasks[:6]:
        fresh = make_env("reasoning_gym", datasets=[{"name": "chain_sum"}, {"name": "word_sorting", "weight": 3}])
        fresh.reset(task)  # another instance grades a task it did not draw: it draws it again
        assert fresh.step(f"Final Answer: {task.answer}").info["correct"], task


def test_reasoning_gym_with_a_calculator_is_a_multi_turn_tool_env():
    """Guards against `tools:` being ignored by the bridge (one-turn episodes, no schema in the prompt)."""
    from agentic_rl.tools.parse import format_tool_call

    env = make_env("reasoning_gym", dataset="basic_arithmetic", tools=["calculator"], config={"min_terms": 2, "max_terms": 2})
    task = env.tasks("test", n=1)[0]
    messages = env.reset(task)
    assert "calculator" in messages[0]["content"] and env.tool_schemas[0]["function"]["name"] == "calculator"
    expression = task.question.removeprefix("Calculate ").rstrip(".")
    observed = env.step(format_tool_call("calculator", {"expression": expression}))
    assert not observed.done and observed.observation[0]["content"] == task.answer
    assert env.step(f"Final Answer: {task.answer}").info["correct"]


def test_reasoning_gym_keeps_the_prompt_a_model_was_trained_with_when_given_one():
    """Guards against GRPO on gsm_symbolic showing a GSM8K SFT model a system prompt it never saw
    (item 4 of issue 64 gives the gsm8k env's prompt; `{tool_names}` filled as the env fills it)."""
    gsm8k_prompt = make_env("gsm8k", tools=["calculator"]).system_prompt
    template = gsm8k_prompt.replace("calculator", "{tool_names}")
    env = make_env("reasoning_gym", dataset="gsm_symbolic", tools=["calculator"], system_prompt=template)
    messages = env.reset(env.tasks("test", n=1)[0])
    assert messages[0] == {"role": "system", "content": gsm8k_prompt}
    default = make_env("reasoning_gym", dataset="gsm_symbolic", tools=["calculator"])
    assert default.reset(default.tasks("test", n=1)[0])[0]["content"].startswith("Answer the question.")


def test_a_bad_reasoning_gym_dataset_or_config_stops_the_config_before_a_model_loads():
    """Guards against an unknown dataset or config key failing mid-run instead of at load time."""
    with pytest.raises(ConfigError, match="reasoning-gym cannot build no_such_set"):
        load_config(GRPOConfig, None, overrides=["env.name=reasoning_gym", "env.options={dataset: no_such_set}"])
    with pytest.raises(ConfigError, match="unexpected keyword argument 'max_turns_of_doom'"):
        load_config(GRPOConfig, None, overrides=["env.name=reasoning_gym", "env.options={config: {max_turns_of_doom: 3}}"])


# ---------------------------------------------------------------------- textarena


@pytest.mark.parametrize("game", ["GuessTheNumber-v0", "TowerOfHanoi-v0", "FrozenLake-v0"])
def test_textarena_oracles_win_every_game_through_the_games_own_rules(game):
    """Guards against oracles (SFT data) that lose games, or a bridge that mis-parses the game's moves."""
    summary = run_oracle("textarena", n=12, split="test", seed=0, game=game)
    assert summary["accuracy"] == 1.0, summary["failures"]


def test_a_textarena_episode_shows_the_games_words_and_survives_one_invalid_move_as_the_game_rules():
    """Guards against echoing the policy's own move back, ending on the first invalid move, or inventing rewards."""
    env = make_env("textarena", game="TowerOfHanoi-v0")
    messages = env.reset(env.tasks("test", n=1)[0])
    assert "Tower of Hanoi with 3 disks" in messages[1]["content"] and "A: [3, 2, 1]" in messages[1]["content"]
    moved = env.step("Smallest disk first: [A C]")
    assert not moved.done and moved.reward == 0.0
    assert "You moved disk 1 from A to C." in moved.observation[0]["content"] and "Smallest disk" not in moved.observation[0]["content"]
    warned = env.step("I am not sure.")
    assert not warned.done and "invalid move" in warned.observation[0]["content"] and warned.info["invalid_moves"] == 1
    ended = env.step("Still not sure.")  # textarena's error allowance is 1: a second invalid move in a row ends the game
    assert ended.done and ended.info["invalid_moves"] == 2 and not ended.info["correct"]
    assert ended.info["reason"].startswith("Invalid Move") and ended.info["finish"] == "lost"
    assert ended.reward == ended.info["game_reward"] == 0.0  # the game's own: disk 1 alone on C is no disk in place


def test_a_textarena_game_replays_exactly_by_seed_and_never_reseeds_the_process():
    """textarena seeds Python's global `random`; guards against a game that reseeds the trainer's
    other users of `random`, or against two episodes of one seed playing different games."""
    first, second = make_env("textarena", game="GuessTheNumber-v0"), make_env("textarena", game="GuessTheNumber-v0")
    task = first.tasks("train", n=5)[4]
    random.seed(1234)
    expected = [random.random() for _ in range(3)]
    random.seed(1234)
    first.reset(task)
    second.reset(task)
    trace = [first.step(f"[{n}]").observation for n in (1, 2)]
    assert trace == [second.step(f"[{n}]").observation for n in (1, 2)]
    assert [random.random() for _ in range(3)] == expected


def test_a_textarena_game_that_would_download_data_or_is_not_single_player_fails_when_the_config_loads(tmp_path):
    """Guards against a game that downloads at run time, or a two-player game, failing only after a model loaded."""
    with pytest.raises(ConfigError, match="is not a single-player game"):
        load_config(GRPOConfig, None, overrides=["env.name=textarena", "env.options={game: ConnectFour-v0}"])
    with pytest.raises(ConfigError, match="unknown textarena game 'Nope-v0'; single-player games: .*TowerOfHanoi-v0"):
        load_config(GRPOConfig, None, overrides=["env.name=textarena", "env.options={game: Nope-v0}"])
    # Hangman builds NLTK's word list when made: with no corpus on the search path it would download one.
    empty = tmp_path / "nltk_data"
    empty.mkdir()
    done = _cli("grpo", "--set", "env.name=textarena", "--set", "env.options={game: Hangman-v0}", "--set",
                f"train.output_dir={tmp_path / 'run'}", cwd=tmp_path, env={"NLTK_DATA": str(empty), "HOME": str(tmp_path)}, timeout=300)
    assert done.returncode != 0
    assert "textarena game 'Hangman-v0' needs data it would download at run time" in done.stderr
    assert "Resource 'words' not found" in done.stderr
    assert not (tmp_path / "run").exists()  # stopped at the config: no run folder, no model


def test_envs_list_shows_what_each_installed_library_offers(tmp_path):
    """Guards against bridges whose datasets and games a user cannot discover."""
    done = _cli("envs", "list", cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    lines = {line.split(":")[0]: line for line in done.stdout.splitlines()}
    assert "106 reasoning-gym datasets" in lines["reasoning_gym"] and "gsm_symbolic" in lines["reasoning_gym"]
    assert "TowerOfHanoi-v0" in lines["textarena"] and "ConnectFour-v0" not in lines["textarena"]


def test_a_bridge_whose_library_is_missing_says_which_extra_to_install(tmp_path):
    """Guards against a raw ImportError when an optional library is not installed."""
    code = ("import sys; sys.modules['reasoning_gym'] = None; sys.modules['textarena'] = None\n"
            "from agentic_rl.envs.base import make_env\n"
            "for name in ('reasoning_gym', 'textarena'):\n"
            "    try: make_env(name)\n"
            "    except ValueError as exc: print(exc)\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(REPO / "src")})
    assert done.stdout.splitlines() == [
        "the reasoning_gym bridge needs the optional package 'reasoning-gym', which is not installed: pip install "
        "'agentic-rl[reasoning-gym]' (or pip install reasoning-gym)",
        "the textarena bridge needs the optional package 'textarena', which is not installed: pip install "
        "'agentic-rl[textarena]' (or pip install textarena)"], done.stderr[-2000:]


# ---------------------------------------------------------------------- GRPO and evaluation through each bridge

TINY_GRPO = ["--set", "model.name=tiny-qwen3", "--set", "model.lora.r=4", "--set", "rollout.batch_size=4", "--set",
             "rollout.group_size=2", "--set", "rollout.max_turn_tokens=8", "--set", "rollout.max_episode_tokens=1024",
             "--set", "micro_batch_size=4", "--set", "train.steps=1", "--set", "train.progress=false", "--set", "env.task_pool=4"]


@pytest.mark.parametrize("env_name, options, turns", [
    ("reasoning_gym", "{dataset: chain_sum, config: {max_terms: 3}}", 1),
    ("textarena", "{game: GuessTheNumber-v0}", 3),
])
def test_a_short_grpo_runs_through_each_bridge_on_tiny_qwen3(tmp_path, env_name, options, turns):
    """Guards against a bridge that works in-process but not in a real GRPO run (spawned envs, rewards, metrics)."""
    done = _cli("grpo", *TINY_GRPO, "--set", f"env.name={env_name}", "--set", f"env.options={options}", "--set",
                f"rollout.max_turns={turns}", "--set", f"train.output_dir={tmp_path / 'run'}", cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    row = json.loads((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[0])
    assert row["step"] == 1 and "reward/env_steps/mean" in row
    assert (tmp_path / "run" / "final" / "adapter_model.safetensors").is_file()


@pytest.mark.slow
@pytest.mark.parametrize("env_name, options", [
    ("reasoning_gym", "{dataset: chain_sum, config: {min_terms: 2, max_terms: 2}}"),
    ("textarena", "{game: GuessTheNumber-v0}"),
])
def test_the_embedded_model_is_evaluated_through_each_bridge(tmp_path, env_name, options):
    """Guards against a bridge the evaluation command cannot drive on the real model."""
    done = _cli("eval", "--model", "smollm2-135m-instruct", "--env", env_name, "--set", f"env.options={options}", "--n", "4",
                "--max-turn-tokens", "48", "--max-turns", "3", "--json", cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.splitlines()[-1])
    assert result["n"] == 4 and 0.0 <= result["pass@1"] <= 1.0
