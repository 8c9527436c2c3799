"""The bridges to environment libraries others wrote: reasoning-gym's datasets, textarena's
single-player games and verifiers' environments as envs (the `[reasoning-gym]`, `[textarena]` and
`[verifiers]` extras, which `make test` installs). What a user relies on: the library's own
verifier, rules and rubric decide, splits never share a generator seed (or a dataset row), what
would need a download fails before a model loads, and a short GRPO runs through each on tiny-qwen3
(one evaluation through each on the embedded model is a slow test). The verifiers environments are
tests/vf_tiny_envs.py, loaded by module name as an installed environment package would be."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

from agentic_rl.config import ConfigError
from agentic_rl.validation import load_and_validate
from agentic_rl.envs.base import make_env
from agentic_rl.envs.oracle import run_oracle
from agentic_rl.training.grpo_config import GRPOConfig

REPO = Path(__file__).resolve().parent.parent


def _cli(*args: str, cwd: Path, env: dict[str, str] | None = None, timeout: int = 600) -> subprocess.CompletedProcess:
    environ = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "PYTHONPATH": os.pathsep.join([str(REPO / "src"), str(REPO / "tests")]),
        **(env or {}),
    }  # tests/: vf_tiny_envs
    return subprocess.run(
        [sys.executable, "-m", "agentic_rl.cli", *args],
        cwd=cwd,
        env=environ,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


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
    assert [t.question for t in test] == [
        t.question
        for t in make_env("reasoning_gym", dataset="chain_sum", config={"min_terms": 2, "max_terms": 3}).tasks(
            "test", n=3, seed=1
        )
    ]


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
    assert [t.id for t in small] == [t.id for t in large[:5]] and [t.question for t in small] != [
        t.question for t in large[:5]
    ]
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

    env = make_env(
        "reasoning_gym", dataset="basic_arithmetic", tools=["calculator"], config={"min_terms": 2, "max_terms": 2}
    )
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
        load_and_validate(GRPOConfig, None, overrides=["env.name=reasoning_gym", "env.options={dataset: no_such_set}"])
    with pytest.raises(ConfigError, match="unexpected keyword argument 'max_turns_of_doom'"):
        load_and_validate(
            GRPOConfig, None, overrides=["env.name=reasoning_gym", "env.options={config: {max_turns_of_doom: 3}}"]
        )


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
    assert (
        "You moved disk 1 from A to C." in moved.observation[0]["content"]
        and "Smallest disk" not in moved.observation[0]["content"]
    )
    warned = env.step("I am not sure.")
    assert not warned.done and "invalid move" in warned.observation[0]["content"] and warned.info["invalid_moves"] == 1
    ended = env.step(
        "Still not sure."
    )  # textarena's error allowance is 1: a second invalid move in a row ends the game
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
        load_and_validate(GRPOConfig, None, overrides=["env.name=textarena", "env.options={game: ConnectFour-v0}"])
    with pytest.raises(ConfigError, match="unknown textarena game 'Nope-v0'; single-player games: .*TowerOfHanoi-v0"):
        load_and_validate(GRPOConfig, None, overrides=["env.name=textarena", "env.options={game: Nope-v0}"])
    # Hangman builds NLTK's word list when made: with no corpus on the search path it would download one.
    empty = tmp_path / "nltk_data"
    empty.mkdir()
    done = _cli(
        "grpo",
        "--set",
        "env.name=textarena",
        "--set",
        "env.options={game: Hangman-v0}",
        "--set",
        f"train.output_dir={tmp_path / 'run'}",
        cwd=tmp_path,
        env={"NLTK_DATA": str(empty), "HOME": str(tmp_path)},
        timeout=300,
    )
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
    assert (
        "verifiers 0.3.1; environment packages installed:" in lines["verifiers"]
        and "JudgeRubric" not in lines["verifiers"]
    )
    assert "refuses judge rubrics, group rewards, CliAgentEnv" in lines["verifiers"]


def test_envs_list_names_an_installed_verifiers_environment_package(tmp_path, monkeypatch):
    """Guards against a verifiers catalogue that misses installed environment packages (a distribution
    requiring verifiers), or lists one that needs verifiers only for an optional extra."""
    from agentic_rl.envs.verifiers_env import environment_packages

    for name, requirement in (("vf-word-count", "verifiers>=0.1.3"), ("other-tool", 'verifiers; extra == "vf"')):
        info = tmp_path / f"{name.replace('-', '_')}-0.1.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(
            f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.1\nRequires-Dist: {requirement}\n"
        )
    monkeypatch.syspath_prepend(str(tmp_path))
    assert "vf_word_count" in environment_packages() and "other_tool" not in environment_packages()


def test_a_bridge_whose_library_is_missing_says_which_extra_to_install(tmp_path):
    """Guards against a raw ImportError when an optional library is not installed."""
    code = (
        "import sys; sys.modules['reasoning_gym'] = None; sys.modules['textarena'] = None; sys.modules['verifiers'] = None\n"
        "from agentic_rl.envs.base import make_env\n"
        "for name, options in (('reasoning_gym', {}), ('textarena', {}), ('verifiers', {'env_id': 'vf_tiny_envs'})):\n"
        "    try: make_env(name, **options)\n"
        "    except ValueError as exc: print(exc)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(REPO / "src")},
    )
    assert done.stdout.splitlines() == [
        "the reasoning_gym bridge needs the optional package 'reasoning-gym', which is not installed: pip install "
        "'agentic-rl[reasoning-gym]' (or pip install reasoning-gym)",
        "the textarena bridge needs the optional package 'textarena', which is not installed: pip install "
        "'agentic-rl[textarena]' (or pip install textarena)",
        "the verifiers bridge needs the optional package 'verifiers', which is not installed: pip install "
        "'agentic-rl[verifiers]' (or pip install verifiers)",
    ], done.stderr[-2000:]


# ---------------------------------------------------------------------- verifiers


def _vf(**env_args):
    return make_env("verifiers", env_id="vf_tiny_envs", env_args=env_args)


def test_verifiers_tasks_are_the_envs_own_rows_rendered_as_verifiers_renders_them():
    """Guards against a bridge that rebuilds the prompt (dropping the env's system prompt or few-shot
    turns), reads the eval set for training, or draws a seed's tasks unreproducibly."""
    import vf_tiny_envs

    env = _vf()
    train, test = env.tasks("train", n=12), env.tasks("test", n=50)
    assert [t.answer for t in train[:3]] == ["14", "20", "26"] and len(test) == 6  # the eval set has 6 rows
    assert not {t.question for t in train} & {t.question for t in test}
    messages = env.reset(train[0])
    assert messages == [
        {"role": "system", "content": vf_tiny_envs.SYSTEM_PROMPT},
        *vf_tiny_envs.FEW_SHOT,
        {"role": "user", "content": "What is 3 + 11?"},
    ]
    shuffled = env.tasks("train", n=12, seed=3)
    assert shuffled == _vf().tasks("train", n=12, seed=3) != train and sorted(t.id for t in shuffled) == sorted(
        t.id for t in train
    )
    assert env.max_turns == 1  # a SingleTurnEnv's own limit


def test_the_verifiers_rubric_scores_an_episode_each_function_a_term_the_weighted_sum_the_reward():
    """Guards against a bridge that pays its own notion of correct instead of the rubric's weighted
    sum, drops a function's value from the logs, or ignores the env's pass_threshold."""
    env = _vf()
    task = env.tasks("train", n=1)[0]
    assert env.reward_terms == ("rubric.correct_answer", "rubric.short_answer", "rubric.length", "rubric.num_turns")
    env.reset(task)
    right = env.step("14")  # correct_answer 1 x 1.0 + short_answer 1 x 0.5 + length 2 x 0.0
    assert (right.done, right.reward, right.info["correct"]) == (True, 1.5, True)
    assert right.info["reward_terms"] == {
        "rubric.correct_answer": 1.0,
        "rubric.short_answer": 1.0,
        "rubric.length": 2.0,
        "rubric.num_turns": 1.0,
    }
    env.reset(task)
    long_right = env.step("The sum of 3 and 11 is 14")
    assert (long_right.reward, long_right.info["correct"]) == (1.0, True)
    env.reset(task)
    short_wrong = env.step("15")  # 0.5: below the env's pass_threshold 1.0 (verifiers' default, 0.5, would pass it)
    assert (
        short_wrong.reward,
        short_wrong.info["correct"],
        short_wrong.info["reward_terms"]["rubric.correct_answer"],
    ) == (0.5, False, 0.0)
    env.reset(task)
    assert env.step("I cannot say, sorry, it is hard").reward == 0.0


def test_a_verifiers_multi_turn_env_answers_with_its_env_response_and_ends_on_its_own_signal():
    """Guards against observations that are not the env's env_response, an episode that runs past
    the env's final_env_response, or a turn limit that leaves an episode unscored."""
    env = _vf(kind="guess")
    task = env.tasks("test", n=1)[0]  # secret 6
    assert env.reset(task) == [{"role": "user", "content": task.question}] and task.answer == "6"
    assert env.step("4").observation == [{"role": "user", "content": "higher"}]
    assert env.step("7").observation == [{"role": "user", "content": "lower"}]
    found = env.step("6")
    assert found.done and found.info["correct"] and found.reward == pytest.approx(1.0 - 0.1 * 3)
    assert found.info["finish"] == "has_final_env_response" and found.info["reward_terms"]["rubric.guesses"] == 3.0
    capped = make_env("verifiers", env_id="vf_tiny_envs", env_args={"kind": "guess"}, max_turns=2)
    capped.reset(task)
    capped.step("1")
    cut = capped.step("2")
    assert (
        cut.done and cut.info["finish"] == "max_turns" and cut.reward == pytest.approx(-0.2) and not cut.info["correct"]
    )


def test_a_verifiers_tool_env_runs_its_own_tools_from_the_policys_tool_call_blocks():
    """Guards against a ToolEnv whose tools never run (the policy's <tool_call> text not turned into
    the tool calls verifiers expects), or whose schema never reaches the prompt."""
    from agentic_rl.tools.parse import format_tool_call

    env = _vf(kind="tool")
    assert [schema["function"]["name"] for schema in env.tool_schemas] == ["add"]
    task = env.tasks("train", n=1)[0]
    env.reset(task)
    called = env.step("Let me add.\n" + format_tool_call("add", {"a": 17, "b": 25}))
    assert called.observation == [{"role": "tool", "name": "add", "content": "42"}] and called.info["tool_calls"] == 1
    answered = env.step("42")
    assert answered.done and answered.info["correct"] and answered.info["reward_terms"]["rubric.add_calls"] == 1.0


@pytest.mark.parametrize(
    "kind, turns",
    [
        ("guess", ["boom"]),  # its env_response calls int() on the turn and raises ValueError
        ("guess", ["\x00" * 50_000]),
        (
            "tool",
            [
                '<tool_call>{"name": "add", "arguments": {"a": 1}}</tool_call>',
                '<tool_call>{"name": "rm -rf"}</tool_call>',
                "7",
            ],
        ),
        ("tool", ["<tool_call>{not json</tool_call>"]),
        ("single", ["<tool_call>" * 1000]),
    ],
)
def test_hostile_output_ends_a_verifiers_episode_scored_and_never_raises(kind, turns):
    """Guards against model output that crashes the run through a verifiers env: an env_response that
    raises on it, a tool call with missing arguments or an unknown tool, a malformed block."""
    env = _vf(kind=kind)
    env.reset(env.tasks("train", n=1)[0])
    results = [env.step(turn) for turn in turns]
    assert results[-1].done and not any(r.done for r in results[:-1]) and not results[-1].info["correct"]
    assert results[-1].reward <= 0.0
    if kind == "guess":
        assert results[-1].info["error"].startswith("Error: ValueError: invalid literal for int()")
        assert results[-1].info["finish"] == "has_error" and results[-1].reward == pytest.approx(-0.1)
    if kind == "tool" and len(turns) == 3:
        assert [r.observation[0]["content"] for r in results[:2]] == [
            "add() missing 1 required positional argument: 'b'",
            "'rm -rf'",
        ]
        assert results[-1].info["tool_errors"] == 1  # the unknown tool


@pytest.mark.parametrize("kind", ["single", "guess", "tool"])
def test_verifiers_reference_completions_are_oracle_demos_that_its_rubric_passes(kind):
    """Guards against SFT demonstrations that are not the dataset's own reference completions, or
    that the env's rubric would not pass (replayed through env_response, they must win)."""
    summary = run_oracle("verifiers", n=4, split="train", env_id="vf_tiny_envs", env_args={"kind": kind})
    assert summary["accuracy"] == 1.0 and summary["n"] == 4, summary["failures"]
    env = _vf()
    with pytest.raises(NotImplementedError, match="has no reference completion"):
        env.oracle_actions(env.tasks("test", n=1)[0])  # the eval rows carry none


@pytest.mark.parametrize(
    "kind, reason",
    [
        ("judge", "is refused: its rubric holds a JudgeRubric, which asks a judge model through an OpenAI client"),
        ("group", r"is refused: rubric function\(s\) \['relative_length'\] score a group of rollouts together"),
        (
            "own_model",
            "is refused: AskingEnv overrides get_model_response, so it calls the model through its own client",
        ),
        ("group_env", "is refused: EnvGroup is of kind EnvGroup, which routes each task to one of its member envs"),
    ],
)
def test_verifiers_kinds_that_need_their_own_client_are_refused_by_name_when_the_config_loads(kind, reason):
    """Guards against a verifiers env that would ask a model or a service through its own client
    being run anyway, or failing only after a model loaded."""
    with pytest.raises(
        ConfigError, match=f"verifiers environment 'vf_tiny_envs' \\(env_args {{'kind': '{kind}'}}\\) {reason}"
    ):
        load_and_validate(
            GRPOConfig,
            None,
            overrides=["env.name=verifiers", f"env.options={{env_id: vf_tiny_envs, env_args: {{kind: {kind}}}}}"],
        )


def test_a_verifiers_env_that_would_download_or_is_not_installed_fails_before_a_model_loads(tmp_path):
    """Guards against a verifiers env that fetches its dataset at run time, or a missing module,
    failing only after a model loaded, or without naming what is missing."""
    done = _cli(
        "grpo",
        "--set",
        "env.name=verifiers",
        "--set",
        "env.options={env_id: vf_tiny_envs, env_args: {kind: download}}",
        "--set",
        f"train.output_dir={tmp_path / 'run'}",
        cwd=tmp_path,
        env={"HF_HUB_OFFLINE": "0", "HF_HOME": str(tmp_path / "hf")},
    )
    assert done.returncode != 0
    assert (
        "verifiers environment 'vf_tiny_envs' (env_args {'kind': 'download'}) needs data it would download at run time"
        in done.stderr
    )
    assert "agentic-rl-tests/no-such-dataset" in done.stderr
    assert not (tmp_path / "run").exists()  # stopped at the config: no run folder, no model
    with pytest.raises(
        ConfigError, match="cannot import verifiers environment 'vf_no_such_env'.*No module named 'vf_no_such_env'"
    ):
        load_and_validate(GRPOConfig, None, overrides=["env.name=verifiers", "env.options={env_id: vf_no_such_env}"])


def test_sft_trains_on_a_verifiers_envs_reference_completions(tmp_path):
    """Guards against SFT that cannot read a verifiers env's demonstrations (`kind: oracle`) in a real run."""
    source = "[{kind: oracle, env: {name: verifiers, options: {env_id: vf_tiny_envs, env_args: {kind: guess}}}, n: 4}]"
    done = _cli(
        "sft",
        "--set",
        "model.name=tiny-qwen3",
        "--set",
        "model.lora.r=4",
        "--set",
        f"sources={source}",
        "--set",
        "batch_size=4",
        "--set",
        "micro_batch_size=4",
        "--set",
        "train.steps=1",
        "--set",
        "train.progress=false",
        "--set",
        f"train.output_dir={tmp_path / 'sft'}",
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert (tmp_path / "sft" / "final" / "adapter_model.safetensors").is_file()


# ---------------------------------------------------------------------- GRPO and evaluation through each bridge

TINY_GRPO = [
    "--set",
    "model.name=tiny-qwen3",
    "--set",
    "model.lora.r=4",
    "--set",
    "rollout.batch_size=4",
    "--set",
    "rollout.group_size=2",
    "--set",
    "rollout.max_turn_tokens=8",
    "--set",
    "rollout.max_episode_tokens=1024",
    "--set",
    "micro_batch_size=4",
    "--set",
    "train.steps=1",
    "--set",
    "train.progress=false",
    "--set",
    "env.task_pool=4",
]


@pytest.mark.parametrize(
    "env_name, options, turns",
    [
        ("reasoning_gym", "{dataset: chain_sum, config: {max_terms: 3}}", 1),
        ("textarena", "{game: GuessTheNumber-v0}", 3),
        ("verifiers", "{env_id: vf_tiny_envs, env_args: {kind: guess, lenient: true}}", 6),
    ],
)
def test_a_short_grpo_runs_through_each_bridge_on_tiny_qwen3(tmp_path, env_name, options, turns):
    """Guards against a bridge that works in-process but not in a real GRPO run (spawned envs, rewards, metrics)."""
    done = _cli(
        "grpo",
        *TINY_GRPO,
        "--set",
        f"env.name={env_name}",
        "--set",
        f"env.options={options}",
        "--set",
        f"rollout.max_turns={turns}",
        "--set",
        f"train.output_dir={tmp_path / 'run'}",
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    row = json.loads((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[0])
    assert row["step"] == 1 and "reward/env_steps/mean" in row
    assert (tmp_path / "run" / "final" / "adapter_model.safetensors").is_file()
    if env_name == "verifiers":  # each rubric function logged, at weight 0: the total is the env's return alone
        assert {"reward/rubric.found_secret/mean", "reward/rubric.guesses/mean", "reward/rubric.num_turns/mean"} <= set(
            row
        )
        assert row["rollout/turns/mean"] > 1.0  # its env_response asked again: multi-turn episodes through the engine
        assert row["reward/total/mean"] == pytest.approx(row["reward/env_steps/mean"])
        assert row["reward/env_steps/mean"] == pytest.approx(
            row["reward/rubric.found_secret/mean"] - 0.1 * row["reward/rubric.guesses/mean"]
        )


@pytest.mark.slow
@pytest.mark.parametrize(
    "env_name, options",
    [
        ("reasoning_gym", "{dataset: chain_sum, config: {min_terms: 2, max_terms: 2}}"),
        ("textarena", "{game: GuessTheNumber-v0}"),
        ("verifiers", "{env_id: vf_tiny_envs}"),
    ],
)
def test_the_embedded_model_is_evaluated_through_each_bridge(tmp_path, env_name, options):
    """Guards against a bridge the evaluation command cannot drive on the real model."""
    done = _cli(
        "eval",
        "--model",
        "smollm2-135m-instruct",
        "--env",
        env_name,
        "--set",
        f"env.options={options}",
        "--n",
        "4",
        "--max-turn-tokens",
        "48",
        "--max-turns",
        "3",
        "--json",
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.splitlines()[-1])
    assert result["n"] == 4 and 0.0 <= result["pass@1"] <= 1.0
    if env_name == "verifiers":
        assert set(result["reward_terms"]) == {
            "rubric.correct_answer",
            "rubric.short_answer",
            "rubric.length",
            "rubric.num_turns",
        }
