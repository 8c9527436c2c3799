"""The `plan` environment: an optimal oracle, a trap on the direct way, per-step rewards, disjoint
splits, and hostile turns that get observations instead of crashes."""

import collections
import json
import random

import pytest

from agentic_rl.envs.base import make_env
from agentic_rl.envs.oracle import run_oracle
from agentic_rl.envs.plan import _world_of, shortest_plan, world_split
from agentic_rl.models.chat_format import ChatFormat
from agentic_rl.rollout.demos import oracle_demos
from agentic_rl.tools.parse import format_tool_call


@pytest.mark.parametrize("difficulty", [1, 2, 3, 4])
@pytest.mark.parametrize("branching", [0, 3])
def test_the_oracle_solves_every_world(difficulty, branching):
    """Guards against plan worlds that cannot be solved (an unreachable goal, a key behind its own door) at any
    difficulty and branching."""
    for split in ("train", "test"):
        summary = run_oracle("plan", n=20, split=split, difficulty=difficulty, branching=branching)
        assert summary["accuracy"] == 1.0 and summary["tool_errors"] == 0, summary["failures"]


def _fewest_actions(world, room=None, held=frozenset()):
    """Independent reference: breadth-first over (room, keys held) by depth, no parent links."""
    key_at = {room: colour for colour, room in world.keys}
    doors = {frozenset(p): c for p, c in world.doors}
    frontier, seen, depth = {(room or world.start, frozenset(held))}, set(), 0
    while frontier:
        if any(room == world.goal for room, _ in frontier):
            return depth
        seen |= frontier
        nxt = set()
        for room, held in frontier:
            if room in key_at:
                nxt.add((room, held | {key_at[room]}))
            for a, b in world.passages:
                if room in (a, b):
                    other = b if room == a else a
                    if doors.get(frozenset((a, b))) in (None, *held):
                        nxt.add((other, held))
        frontier, depth = nxt - seen, depth + 1
    return None


def test_the_oracle_is_optimal_and_the_direct_way_is_a_trap():
    """Guards the task's point: the shortest way (ignoring locks) must be blocked, so a greedy agent
    loses; and the oracle must take the fewest actions that reach the goal."""
    env = make_env("plan", difficulty=2, branching=2)
    for task in env.tasks("test", n=30, seed=3):
        world = _world_of(task)
        assert len(env.oracle_actions(task)) == _fewest_actions(world) == task.meta["optimal_actions"]
        greedy = shortest_plan(world, through_doors=True)
        assert len(greedy) < task.meta["optimal_actions"]
        env.reset(task)
        for action, argument in greedy:
            result = env.step(format_tool_call(action, {"room": argument}))
            if any("locked" in m["content"] for m in result.observation or []):
                break
        else:
            raise AssertionError("the direct way reached the goal without a key")


def test_rewards_are_per_step_and_the_goal_pays_one():
    """Guards against step costs charged at the end or dropped: each step costs step_cost at its own step, and
    reaching the goal pays 1 less that step's cost."""
    env = make_env("plan", difficulty=1, step_cost=0.1)
    task = env.tasks("train", n=1, seed=0)[0]
    env.reset(task)
    rewards = [env.step(action).reward for action in env.oracle_actions(task)]
    assert rewards[:-1] == [pytest.approx(-0.1)] * (len(rewards) - 1) and rewards[-1] == pytest.approx(0.9)


def test_giving_up_never_pays_more_than_trying_and_failing():
    """Guards against the reward hack GRPO found (session 23): a turn without a call ended the episode
    at reward 0, above any failed attempt (−step_cost per action), so the policy learned to stop
    calling tools. Giving up at turn t now costs max_calls_per_turn actions for each of the turns left."""
    env = make_env("plan", difficulty=1, step_cost=0.05, max_turns=12, max_calls_per_turn=4)
    task = env.tasks("train", n=1, seed=0)[0]
    env.reset(task)
    quit_now = env.step("I give up.")
    assert quit_now.done and quit_now.info["finish"] == "no_action" and quit_now.reward == pytest.approx(-0.05 * 4 * 12)

    env.reset(task)
    stranger = next(r for r in _world_of(task).rooms if r not in _world_of(task).neighbours(_world_of(task).start))
    flood = format_tool_call("move", {"room": stranger}) * 4  # the most a turn may cost: 4 failing actions
    failing = [env.step(flood).reward for _ in range(11)]
    last = env.step(flood)
    assert last.done and last.info["finish"] == "max_turns" and not last.info["correct"]
    worst_failure = sum(failing) + last.reward
    assert worst_failure == pytest.approx(-0.05 * 4 * 12)
    env.reset(task)
    partial = [env.step(flood).reward for _ in range(5)]
    late_quit = env.step("Nothing more.")
    assert late_quit.reward == pytest.approx(-0.05 * 4 * 7)  # turns 6..12 left, as if each ran 4 failing actions
    assert sum(partial) + late_quit.reward == pytest.approx(worst_failure)


def test_progress_reward_pays_each_action_for_the_distance_it_closes():
    """Guards the shaping's definition: an action pays progress_reward for each action it takes off the
    optimal plan (its new state's fewest actions to the goal, by the independent BFS above), the same
    charged when it adds one, 0 when refused; so an episode's rewards sum to −step_cost × actions +
    progress_reward × (actions left at the start − at the end) (+1 at the goal), and the oracle's
    plan earns −0.05 + 0.1 on every action."""
    env = make_env(
        "plan", difficulty=2, branching=2, step_cost=0.05, progress_reward=0.1, max_turns=40, max_calls_per_turn=1
    )
    task = env.tasks("train", n=1, seed=0)[0]
    world = _world_of(task)
    env.reset(task)
    rewards = [env.step(action).reward for action in env.oracle_actions(task)]
    assert rewards == [pytest.approx(0.05)] * (len(rewards) - 1) + [pytest.approx(1.05)]

    rng = random.Random(0)
    for _ in range(20):  # random walks: moves to any room (mostly refused), takes of any key
        env.reset(task)
        room, held, start_left = world.start, set(), _fewest_actions(world)
        total, result = 0.0, None
        for _ in range(40):
            if rng.random() < 0.2:
                colour = rng.choice(world.keys)[0]
                result = env.step(format_tool_call("take", {"key": colour}))
                took = dict(world.keys)[colour] == room and colour not in held
                before, held = _fewest_actions(world, room, held), held | ({colour} if took else set())
                expected = -0.05 + (0.1 * (before - _fewest_actions(world, room, held)) if took else 0.0)
            else:
                target = rng.choice(world.rooms)
                result = env.step(format_tool_call("move", {"room": target}))
                door = dict((frozenset(p), c) for p, c in world.doors).get(frozenset((room, target)))
                moved = target in world.neighbours(room) and door in (None, *held)
                before, room = _fewest_actions(world, room, held), target if moved else room
                expected = -0.05 + (0.1 * (before - _fewest_actions(world, room, held)) if moved else 0.0)
            total += result.reward
            if result.done:
                break
            assert result.reward == pytest.approx(expected)
        left = _fewest_actions(world, room, held)
        assert result.info["actions_left"] == left
        actions = result.info["tool_calls"]
        assert total == pytest.approx(-0.05 * actions + 0.1 * (start_left - left) + (1.0 if left == 0 else 0.0))


def test_giving_up_with_progress_reward_costs_the_worst_action_of_every_turn_left():
    """Guards against the give-up hack coming back with shaping on: an action can now cost step_cost +
    progress_reward (a step away from the goal), so giving up at turn 0 must cost that for every action
    of every turn, −(0.05 + 0.1) × 2 × 10 = −3.0, below any walk that tries."""
    env = make_env("plan", difficulty=1, step_cost=0.05, progress_reward=0.1, max_turns=10, max_calls_per_turn=2)
    task = env.tasks("train", n=1, seed=0)[0]
    env.reset(task)
    assert env.step("I give up.").reward == pytest.approx(-3.0)
    world, rng = _world_of(task), random.Random(1)
    for _ in range(30):
        env.reset(task)
        total, done = 0.0, False
        while not done:
            moves = [format_tool_call("move", {"room": rng.choice(world.rooms)}) for _ in range(2)]
            result = env.step("".join(moves))
            total, done = total + result.reward, result.done
        assert total > -3.0


def test_train_and_test_worlds_never_coincide():
    """Guards against test worlds that also appear in training, which would turn held-out evaluation into recall."""
    env = make_env("plan", difficulty=1, branching=1)
    train = {json.dumps(t.meta["world"], sort_keys=True) for t in env.tasks("train", n=150, seed=0)}
    test = {json.dumps(t.meta["world"], sort_keys=True) for t in env.tasks("test", n=150, seed=0)}
    assert not train & test and len(test) > 100
    assert {world_split(_world_of(t)) for t in env.tasks("test", n=5, seed=1)} == {"test"}


def test_hostile_turns_get_observations_and_never_crash():
    """Guards against a policy crashing the plan env: unknown tools, rooms, keys, arguments, bad JSON and a
    50-call flood each get an error observation."""
    env = make_env("plan", difficulty=2, max_calls_per_turn=4)
    task = env.tasks("test", n=1, seed=0)[0]
    world = _world_of(task)
    env.reset(task)
    stranger = next(r for r in world.rooms if r not in world.neighbours(world.start) and r != world.start)
    turns = [
        ('<tool_call>{"name": "fly", "arguments": {"room": "x"}}</tool_call>', "unknown tool 'fly'"),
        (format_tool_call("move", {"room": "moon"}), "there is no room 'moon'"),
        (format_tool_call("move", {"room": stranger}), "no passage"),
        (format_tool_call("take", {"key": "purple"}), "there is no 'purple' key"),
        (format_tool_call("move", {"floor": 2}), "unknown argument"),
        ("<tool_call>{not json</tool_call>", "Error"),
    ]
    for text, expected in turns:
        result = env.step(text)
        assert not result.done and expected in result.observation[0]["content"], (text, result.observation)
    flood = env.step("".join(format_tool_call("move", {"room": "moon"}) for _ in range(50)))
    assert len(flood.observation) == 50 and sum("at most 4 actions" in m["content"] for m in flood.observation) == 46
    done = env.step("I will just think.")
    assert done.done and done.info["format_ok"] is False and done.info["tool_errors"] == 6 + 50


def test_oracle_demonstrations_become_sft_trajectories(qwen3_tokenizer):
    """Guards against SFT demonstrations of the plan env that drop or merge turns: one policy span per optimal
    action, one tool result between each."""
    env = make_env("plan", difficulty=1)
    demos = oracle_demos(env, env.tasks("train", n=3, seed=0), ChatFormat.for_tokenizer(qwen3_tokenizer))
    assert [len(d.policy_spans) for d in demos] == [t.meta["optimal_actions"] for t in env.tasks("train", n=3, seed=0)]
    assert collections.Counter(m["role"] for m in demos[0].messages)["tool"] == len(demos[0].policy_spans) - 1


def test_the_plan_config_stages_run(tmp_path):
    """configs/plan.yaml's SFT and GRPO sections, on tiny-qwen3 for one step each."""
    import dataclasses

    from agentic_rl.config import load_config
    from agentic_rl.pipeline import PipelineConfig
    from agentic_rl.training.grpo import train_grpo
    from agentic_rl.training.sft import train_sft

    cfg = load_config(PipelineConfig, "configs/plan.yaml")
    sft = dataclasses.replace(
        cfg.sft,
        model=dataclasses.replace(cfg.sft.model, name="tiny-qwen3"),
        train=dataclasses.replace(cfg.sft.train, steps=1, output_dir=str(tmp_path / "sft"), progress=False),
    )
    out = train_sft(sft)
    grpo = dataclasses.replace(
        cfg.grpo,
        model=dataclasses.replace(cfg.grpo.model, name=out["final"]),
        rollout=dataclasses.replace(cfg.grpo.rollout, batch_size=4, group_size=2, max_turn_tokens=8, max_turns=2),
        env=dataclasses.replace(cfg.grpo.env, task_pool=8),
        train=dataclasses.replace(cfg.grpo.train, steps=1, output_dir=str(tmp_path / "grpo"), progress=False),
    )
    history = train_grpo(grpo)["history"]
    assert len(history) == 1 and "reward/env_steps/mean" in history[0]


def test_the_plan_config_gives_every_episode_room_for_all_its_turns():
    """Guards against the first plan run's mistake: the default max_episode_tokens (1024) cut every
    two-door episode before the goal (the optimal plan alone needs ~1100 tokens), so GRPO learned
    from step costs only. Each rollout section must fit its longest prompt plus max_turns turns of
    max_turn_tokens, each followed by the longest observation, over 100 oracle worlds, in the
    embedded model's own template."""
    from agentic_rl.config import load_config
    from agentic_rl.models.chat_format import ChatFormat
    from agentic_rl.models.loader import load_tokenizer
    from agentic_rl.pipeline import PipelineConfig

    cfg = load_config(PipelineConfig, "configs/plan.yaml")
    chat_format = ChatFormat.for_tokenizer(load_tokenizer(cfg.model))
    sections = [(e.name, e.env, e.rollout) for e in cfg.evals] + [("grpo", cfg.grpo.env, cfg.grpo.rollout)]
    for name, env_cfg, rollout in sections:
        env = env_cfg.make()
        demos = oracle_demos(env, env.tasks("test", n=100, seed=0), chat_format)
        prompt = max(d.prompt_length for d in demos)
        observation = max(s.end - s.start for d in demos for s in d.spans if s.kind == "observation")
        needed = prompt + rollout.max_turns * (rollout.max_turn_tokens + observation)
        assert needed <= rollout.max_episode_tokens, (name, needed, rollout.max_episode_tokens)
