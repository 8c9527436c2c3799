"""env.mix, a task mix for GRPO and PPO (training/episode_config.py): the pool is split by share,
each part's tasks come from its own options, each episode runs in its part's env, and a mix that
cannot work is refused at load time with the part it names."""

from __future__ import annotations

import pytest
from helpers_training import first_batch, grpo_cfg

from agentic_rl.config import load_config
from agentic_rl.envs.base import make_env
from agentic_rl.training.episode_config import EnvConfig, EnvMixPart
from agentic_rl.training.grpo_config import GRPOConfig

HOUSES = [
    EnvMixPart({"difficulty": 1, "max_turns": 12}, share=1.0),
    EnvMixPart({"difficulty": 2, "max_turns": 16}, share=1.0),
]


def test_the_pool_is_split_by_share_with_the_remainders_to_the_largest_fractions():
    """Guards against a split that drops or adds tasks (10 · 1/3 = 3.33 and 10 · 2/3 = 6.67 must
    give 3 + 7, not 3 + 6) or hands the remainder to the wrong part."""

    def sizes(pool, shares):
        return EnvConfig(
            "arith", task_pool=pool, mix=[EnvMixPart({"difficulty": 1}, share=s) for s in shares]
        ).part_sizes()

    assert sizes(10, [1, 2]) == [3, 7]
    assert sizes(10, [1, 1, 1]) == [4, 3, 3]  # equal fractions: the first part takes the one left over
    assert sizes(7, [0.5, 0.25, 0.25]) == [3, 2, 2]  # 3.5, 1.75, 1.75: floors 3 + 1 + 1, the two left go to the .75s
    assert sizes(2000, [0.3, 0.7]) == [600, 1400]


def test_each_part_draws_its_own_tasks_and_runs_them_in_its_own_env():
    """Guards against a mix whose tasks all come from env.options, whose ids collide between parts
    (plan numbers its tasks alike at every difficulty), or whose episodes run in the base env (a
    two-door house in a 12-turn env)."""
    cfg = EnvConfig("plan", options={"branching": 1, "progress_reward": 0.1}, task_pool=6, mix=HOUSES)
    tasks = cfg.train_tasks(seed=3)
    assert [t.id.split(":")[0] for t in tasks] == ["mix0"] * 3 + ["mix1"] * 3
    assert len({t.id for t in tasks}) == 6
    for part, difficulty in [(0, 1), (1, 2)]:
        alone = make_env("plan", branching=1, progress_reward=0.1, difficulty=difficulty).tasks("train", n=3, seed=3)
        mine = tasks[3 * part : 3 * part + 3]
        assert [t.question for t in mine] == [t.question for t in alone]
        assert [t.id for t in mine] == [f"mix{part}:{t.id}" for t in alone]
        assert all(t.meta == {**a.meta, "mix_part": part} for t, a in zip(mine, alone))
    one, two = cfg.env_for(tasks[0]).options, cfg.env_for(tasks[3]).options
    assert (one.difficulty, one.max_turns, one.progress_reward) == (1, 12, 0.1)
    assert (two.difficulty, two.max_turns, two.progress_reward) == (2, 16, 0.1)


def test_without_a_mix_the_pool_and_env_are_env_options():
    """Guards against the mix path changing runs that do not use it: same tasks, same ids."""
    cfg = EnvConfig("arith", options={"difficulty": 2}, task_pool=5)
    assert cfg.train_tasks(seed=1) == make_env("arith", difficulty=2).tasks("train", n=5, seed=1)
    assert cfg.env_for(cfg.train_tasks(seed=1)[0]).options.difficulty == (2,)


@pytest.mark.parametrize(
    "cfg, message",
    [
        (
            dict(name="arith", mix=[EnvMixPart(), EnvMixPart({"doors": 2})]),
            r"env\.mix\[1\]: unknown option\(s\) \['doors'\]",
        ),
        (dict(name="arith", mix=[EnvMixPart({"difficulty": 9})]), r"env\.mix\[0\]: .*difficulty"),
        (
            dict(name="gsm8k", mix=[EnvMixPart(), EnvMixPart({"tools": ["calculator", "python"]})]),
            r"env\.mix\[1\] offers other tools",
        ),
        (
            dict(name="arith", task_pool=2, mix=[EnvMixPart(), EnvMixPart(), EnvMixPart()]),
            r"parts of \[1, 1, 0\] tasks",
        ),
    ],
)
def test_a_mix_that_cannot_work_is_refused_naming_its_part(cfg, message):
    """Guards against a bad part failing mid-run (or never, if no prompt of it is drawn), and
    against a mix of envs with different tools, whose episodes would see another system prompt."""
    with pytest.raises(ValueError, match=message):
        EnvConfig(**cfg).check()  # shares and sizes when built, each part's env in the validation step


def test_a_part_whose_share_is_not_positive_is_refused_where_it_is_built():
    """Guards against a part that would get no tasks (share 0) or a negative count: the share's
    marker refuses it in Python and in a config file alike, naming the part's key."""
    with pytest.raises(ValueError, match=r"EnvMixPart: 'share' must be > 0, got 0\.0"):
        EnvMixPart(share=0.0)
    with pytest.raises(ValueError, match=r"'env\.mix\[1\]\.share' must be > 0, got -1"):
        load_config(GRPOConfig, overrides=["env.name=arith", "env.mix=[{share: 1}, {share: -1}]"])


def test_a_config_file_mix_is_checked_key_by_key(tmp_path):
    """Guards against a misspelt key inside a part being ignored (a silently uniform mix)."""
    path = tmp_path / "grpo.yaml"
    path.write_text(
        "env:\n  name: arith\n  mix:\n    - {options: {difficulty: 1}, share: 1}\n    - {option: {difficulty: 3}}\n"
    )
    with pytest.raises(ValueError, match=r"option"):
        load_config(GRPOConfig, path)
    path.write_text(
        "env:\n  name: arith\n  task_pool: 8\n  mix:\n    - {options: {difficulty: 1}, share: 3}\n    - {options: {difficulty: 3}}\n"
    )
    cfg = load_config(GRPOConfig, path)
    assert cfg.env.part_sizes() == [6, 2]


def test_grpo_rolls_out_each_task_in_its_parts_env_and_logs_each_parts_accuracy(tmp_path, monkeypatch):
    """Guards against the trainer building every episode's env from env.options (the mix would only
    change the prompts) and against per-part diagnostics that miss a drawn part."""
    made = []
    env_for = EnvConfig.env_for

    def recording(self, task):
        env = env_for(self, task)
        made.append((task, env.options.difficulty))
        return env

    monkeypatch.setattr(EnvConfig, "env_for", recording)
    cfg = grpo_cfg(
        tmp_path,
        "env.task_pool=8",
        "rollout.batch_size=8",
        "rollout.group_size=2",
        "env.mix=[{options: {difficulty: 1}}, {options: {difficulty: 3}}]",
    )
    _, objective, batch = first_batch(cfg)
    rolled = [(task, difficulty) for task, difficulty in made if task in objective.sampler.task_pool]
    assert len(rolled) >= 8  # the batch's episodes, each through env_for (the start audit may add one)
    assert all(difficulty == ((1,), (3,))[task.meta["mix_part"]] for task, difficulty in rolled)
    parts = {t.task_id.split(":")[0] for t in batch.trajectories}
    for part in (0, 1):
        key = f"rollout/mix{part}/accuracy"
        assert (key in batch.metrics) == (f"mix{part}" in parts)
        assert (f"rollout/mix{part}/groups_with_variance" in batch.metrics) == (f"mix{part}" in parts)
