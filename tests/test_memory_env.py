"""The `memory` environment: an exact oracle at every difficulty, a bounded context that makes
memory necessary, write costs, disjoint splits, hostile turns that get observations, demonstrations
of several token sequences, and the whole thing through the rollout engine."""

import json

import pytest

from agentic_rl.envs.base import make_env
from agentic_rl.envs.memory import NEXT, SYSTEM_PROMPT, MemoryOptions, extract_values
from agentic_rl.envs.oracle import play_oracle, run_oracle
from agentic_rl.models.chat_format import ChatFormat
from agentic_rl.rollout.config import RolloutConfig
from agentic_rl.rollout.demos import demo_sequences, oracle_demos
from agentic_rl.tools.parse import format_tool_call

DIFFICULTIES = [
    {"facts": 1, "distractors": 0, "gap": 0, "window": 1},
    {"facts": 1, "distractors": 6, "gap": 3, "window": 1, "announce": False},
    {"facts": 2, "distractors": 10, "gap": 6, "window": 2, "updates": 1, "write_cost": 0.05},
    {"facts": 3, "distractors": 20, "gap": 10, "window": 4, "updates": 3, "memory_slots": 3},
    {"facts": 4, "distractors": 40, "gap": 40, "window": 16, "updates": 2},
    {"facts": 2, "distractors": 6, "gap": 3, "window": 2, "updates": 2, "oracle_stores": "all"},
]


@pytest.mark.parametrize("options", DIFFICULTIES, ids=lambda o: "-".join(f"{k}{v}" for k, v in o.items()))
def test_the_oracle_solves_every_task_at_every_difficulty(options):
    """Guards against memory tasks that cannot be solved at some difficulty (the fact never recallable, a tool
    error) or oracles longer than documented."""
    for split in ("train", "test"):
        summary = run_oracle("memory", n=20, split=split, **options)
        assert summary["accuracy"] == 1.0 and summary["tool_errors"] == 0, summary["failures"]
        assert summary["mean_turns"] == MemoryOptions(**options).oracle_turns


def test_a_needed_fact_has_left_the_context_when_the_question_comes():
    """Guards the task's point: with gap >= window the fact is out of view, so only memory can answer;
    and the visible conversation is exactly [system, task, the question once out of view] + the
    last `window` turns."""
    env = make_env("memory", facts=1, distractors=4, gap=4, window=1)
    task = env.tasks("test", n=1, seed=0)[0]
    fact = next(iter(task.meta["needed_at"].values()))
    head = env.reset(task)
    person, attribute = task.meta["asked"][0]
    assert [m["role"] for m in head] == ["system", "user"] and head[0]["content"] == SYSTEM_PROMPT
    assert f"the {attribute} of {person}" in head[1]["content"]
    # turns 1..5 read the 5 messages, turn 6 reads the question, turn 7 recalls, turn 8 answers
    actions, contexts, turns = env.oracle_actions(task), [], []
    assert len(actions) == 8 and '"recall"' in actions[6]
    for number, action in enumerate(actions, start=1):
        result = env.step(action)
        turns.append([{"role": "assistant", "content": action}, *(result.observation or [])])
        contexts.append(result.context)
        if number == 1:
            assert result.context is None, "the first turn extends the prompt: one sequence so far"
        elif number < 8:
            pinned = [{"role": "user", "content": task.meta["question"]}] if number == 7 else []
            assert result.context == head + pinned + turns[-1]
    assert turns[5][-1]["content"] == task.meta["question"] and turns[6][1]["content"] == task.meta["answers"][0]
    assert all(fact not in m["content"] for m in contexts[5])
    assert result.done and result.info["correct"] and result.reward == 1.0


def test_write_costs_are_paid_by_a_right_answer_only():
    """Guards against the reward hack GRPO found when each write cost at its own step: a failed episode that
    stored 3 facts earned -0.3 and one that stored nothing 0, so storing less, then answering nothing, became
    the cheapest way to fail. Now a right answer pays 1 - write_cost per write (never below 0), at the
    answer; every other step and every failed episode, stored or not, answered or not, earns 0."""
    env = make_env("memory", facts=2, distractors=3, gap=1, window=2, updates=1, write_cost=0.1)
    task = env.tasks("train", n=1, seed=0)[0]
    actions = env.oracle_actions(task)
    assert sum('"remember"' in a for a in actions) == 3  # two facts and one update, each stored once

    def episode(steps):
        env.reset(task)
        return [env.step(action).reward for action in steps]

    right = episode(actions)
    assert right[:-1] == [0.0] * (len(actions) - 1) and right[-1] == pytest.approx(1.0 - 0.3)
    wrong = episode(actions[:-1] + ["Final Answer: nobody, nothing"])
    assert wrong == [0.0] * len(actions)  # stored 3 facts, answered wrong: 0, not -0.3
    env.reset(task)  # store nothing, answer nothing: `Next.` to every message and to the question
    steps = [env.step(NEXT)]
    while not steps[-1].done:
        steps.append(env.step(NEXT))
    assert steps[-1].info["finish"] == "no_answer" and steps[-1].info["memory_writes"] == 0
    assert sum(s.reward for s in steps) == sum(wrong) == 0.0  # never more than storing and failing
    greedy = make_env("memory", facts=2, distractors=3, gap=1, window=2, updates=1, write_cost=0.5)
    greedy.reset(task)
    assert [greedy.step(action).reward for action in actions][-1] == 0.0  # 1 - 3 x 0.5 is floored at 0


def test_a_wrong_or_partial_answer_earns_nothing_and_says_how_many_facts_were_right():
    """Guards against partial credit leaking into the reward: a half-right answer earns 0, its share of right
    facts is only reported."""
    env = make_env("memory", facts=2, distractors=2, gap=0, window=2)
    task = env.tasks("train", n=1, seed=0)[0]
    env.reset(task)
    for action in env.oracle_actions(task)[:-1]:
        env.step(action)
    first, second = task.meta["answers"]
    result = env.step(f"Final Answer: {first.upper()}, nonsense")
    assert result.done and result.reward == 0.0 and not result.info["correct"] and result.info["facts_correct"] == 0.5
    assert extract_values("x\nFinal Answer: Oslo , `4172`.\nmore") == ["oslo", "4172"]
    assert extract_values("no answer here") is None


def test_train_and_test_tasks_never_coincide():
    """Guards against test tasks that also appear in training (the same stream and question), which would
    inflate held-out accuracy."""
    env = make_env("memory", facts=1, distractors=2, gap=0, window=1)
    train = {json.dumps([t.meta["stream"], t.meta["question"]]) for t in env.tasks("train", n=200, seed=0)}
    test = {json.dumps([t.meta["stream"], t.meta["question"]]) for t in env.tasks("test", n=200, seed=0)}
    assert not train & test and len(test) > 150


def test_hostile_turns_get_observations_and_never_crash():
    """Guards against a policy crashing the env or flooding memory: bad tools, keys, values, JSON, full memory
    and 50 calls in one turn each get an error observation."""
    env = make_env("memory", facts=1, distractors=30, gap=0, window=1, memory_slots=2, max_calls_per_turn=4)
    task = env.tasks("test", n=1, seed=0)[0]
    env.reset(task)
    turns = [
        ('<tool_call>{"name": "shout", "arguments": {}}</tool_call>', "unknown tool 'shout'"),
        (format_tool_call("remember", {"key": "", "value": "1"}), "a key must be 1..40 characters"),
        (format_tool_call("remember", {"key": "k" * 500, "value": "1"}), "a key must be 1..40 characters, got 500"),
        (format_tool_call("remember", {"key": "a", "value": "v" * 5000}), "value must be 1..100 characters, got 5000"),
        (format_tool_call("remember", {"key": "a", "value": 4172}), "must be string"),
        (format_tool_call("recall", {"key": "nothing"}), "nothing is stored under 'nothing'"),
        (format_tool_call("forget", {"key": "nothing"}), "nothing is stored under 'nothing'"),
        (format_tool_call("recall", {"name": "a"}), "unknown argument"),
        ("<tool_call>{not json</tool_call>", "Error"),
        ("<tool_call>" + "[" * 100000 + "</tool_call>", "Error"),
    ]
    for text, expected in turns:
        result = env.step(text)
        assert not result.done and expected in result.observation[0]["content"], (text, result.observation)
        assert result.observation[-1]["role"] == "user" and result.observation[-1]["content"].startswith("Message ")
    env.step(format_tool_call("remember", {"key": "One", "value": "1"}))
    env.step(format_tool_call("remember", {"key": "two", "value": "2"}))
    full = env.step(format_tool_call("remember", {"key": "three", "value": "3"}))
    assert "memory is full (2 keys: one, two); forget(key) one first" in full.observation[0]["content"]
    assert env.step(format_tool_call("recall", {"key": "  ONE "})).observation[0]["content"] == "1"
    assert env.step(format_tool_call("forget", {"key": "one"})).observation[0]["content"] == "Forgot 'one'."
    flood = env.step("".join(format_tool_call("recall", {"key": "two"}) for _ in range(50)))
    assert len(flood.observation) == 51 and sum("at most 4 calls" in m["content"] for m in flood.observation) == 46
    assert not flood.done and flood.info["tool_errors"] == 10 + 1 + 46
    done = env.step("Final Answer: 1")  # answering before the question is allowed, and graded
    assert done.done and done.info["finish"] == "answer" and not done.info["correct"]


def test_a_turn_without_a_call_after_the_question_is_the_answer():
    """Guards against an episode that never ends once the stream is read (no-call turns must be graded)."""
    env = make_env("memory", facts=1, distractors=0, gap=0, window=1)
    task = env.tasks("train", n=1, seed=0)[0]
    env.reset(task)
    env.step("Next.")
    env.step("Next.")  # reads the question
    result = env.step("I do not remember.")
    assert result.done and result.info["format_ok"] is False and result.info["finish"] == "no_answer"


def test_options_are_validated_with_the_fix_in_the_message():
    """Guards against memory options that cannot work (gap past the distractors, a window under the facts, too
    few turns) or typo'd ones being accepted."""
    with pytest.raises(ValueError, match="gap=5 must be in 0..distractors"):
        MemoryOptions(distractors=2, gap=5)
    with pytest.raises(ValueError, match="window must be in facts..16"):
        MemoryOptions(facts=3, window=2)
    with pytest.raises(ValueError, match="max_turns=3 is below the"):
        MemoryOptions(max_turns=3)
    with pytest.raises(ValueError, match="unknown option"):
        make_env("memory", slots=3)


def test_oracle_demonstrations_have_one_sequence_per_context(qwen3_tokenizer):
    """Guards against SFT examples that show the policy a context it never had: each sequence is
    rendered from its own context, and its masked tokens are exactly the oracle turns it holds."""
    env = make_env("memory", facts=2, distractors=4, gap=2, window=2)
    tasks = env.tasks("train", n=2, seed=0)
    chat_format = ChatFormat.for_tokenizer(qwen3_tokenizer)
    demos = oracle_demos(env, tasks, chat_format)
    for demo, task in zip(demos, tasks):
        episode = play_oracle(env, task)
        assert len(demo.sequences()) == len(episode.sequences) > 1
        actions = env.oracle_actions(task)
        decoded = []
        for seq, messages, prompt in zip(demo.sequences(), episode.sequences, episode.sequence_prompts):
            seq.check()
            assert seq.input_ids[: seq.prompt_length] == chat_format.prompt_ids(messages[:prompt], env.tool_schemas)
            decoded += [qwen3_tokenizer.decode(seq.input_ids[s.start : s.end]) for s in seq.policy_spans]
        assert decoded == [a if a.endswith("</tool_call>") else a + "<|im_end|>" for a in actions]
        assert demo.info["correct"] and demo.messages == episode.conversation
    rows = demo_sequences(demos)
    assert len(rows) == sum(len(d.sequences()) for d in demos)
    assert sum(r.num_policy_tokens for r in rows) == sum(d.num_policy_tokens for d in demos)


def test_the_oracle_through_the_rollout_engine_is_answered_and_correct(qwen3_tokenizer):
    """The env and the engine together: a scripted model that writes the oracle's turns gets an
    answered, correct episode whose sequences start with exactly the env's contexts and whose
    masked tokens are exactly the oracle's turns, sequence by sequence."""
    from helpers_rollout import scripted_engine

    options = {"facts": 2, "distractors": 3, "gap": 2, "window": 2, "updates": 1}
    env = make_env("memory", **options)
    task = env.tasks("test", n=1, seed=1)[0]
    actions, contexts, scripts = env.oracle_actions(task), [], [[]]
    env.reset(task)
    for action in actions:  # a sequence holds the turns up to (and including) the one that changed the context
        result = env.step(action)
        scripts[-1].append(action if action.endswith("</tool_call>") else action + "<|im_end|>")
        if result.context is not None:
            contexts.append(result.context)
            scripts.append([])
    chat_format = ChatFormat.for_tokenizer(qwen3_tokenizer)
    engine, _ = scripted_engine(qwen3_tokenizer, chat_format, scripts, RolloutConfig(128, 4096, 64))
    (trajectory,) = engine.run([make_env("memory", **options)], [task])
    assert trajectory.finish_reason == "answered" and trajectory.info["correct"] and trajectory.turn_rewards[-1] == 1.0
    sequences = trajectory.sequences()
    assert len(sequences) == len(scripts) == len(contexts) + 1 > 3 and trajectory.num_turns == len(actions)
    for seq, script in zip(sequences, scripts):
        assert [qwen3_tokenizer.decode(seq.input_ids[s.start : s.end]) for s in seq.policy_spans] == script
    for seq, context in zip(sequences[1:], contexts):
        assert seq.input_ids[: seq.prompt_length] == chat_format.prompt_ids(context, env.tool_schemas)


def test_the_memory_config_stages_run(tmp_path):
    """configs/memory.yaml's SFT and GRPO sections, on tiny-qwen3 for one step each (non-prefix
    episodes through the whole pipeline: several-sequence demonstrations, then several-row episodes)."""
    import dataclasses

    from agentic_rl.config import load_config
    from agentic_rl.pipeline import PipelineConfig
    from agentic_rl.training.grpo import train_grpo
    from agentic_rl.training.sft import build_demos, train_sft

    cfg = load_config(PipelineConfig, "configs/memory.yaml")
    for source in cfg.sft.sources:
        env = source.env.make()
        assert (
            run_oracle("memory", n=10, split=source.split, **source.env.options)["accuracy"] == 1.0
            and env.name == "memory"
        )
    sft = dataclasses.replace(
        cfg.sft,
        model=dataclasses.replace(cfg.sft.model, name="tiny-qwen3"),
        sources=[dataclasses.replace(s, n=4) for s in cfg.sft.sources],
        train=dataclasses.replace(cfg.sft.train, steps=1, output_dir=str(tmp_path / "sft"), progress=False),
    )
    from agentic_rl.models.loader import load_tokenizer

    assert len(build_demos(sft.sources, load_tokenizer("tiny-qwen3"), 0)) > 8  # one example per token sequence
    out = train_sft(sft)
    grpo = dataclasses.replace(
        cfg.grpo,
        model=dataclasses.replace(cfg.grpo.model, name=out["final"]),
        rollout=dataclasses.replace(cfg.grpo.rollout, batch_size=4, group_size=2, max_turn_tokens=8, max_turns=4),
        env=dataclasses.replace(cfg.grpo.env, task_pool=8),
        train=dataclasses.replace(cfg.grpo.train, steps=1, output_dir=str(tmp_path / "grpo"), progress=False),
    )
    history = train_grpo(grpo)["history"]
    assert (
        len(history) == 1 and history[0]["rollout/sequences_per_episode"] > 1 and "reward/env_steps/mean" in history[0]
    )


def test_max_repeats_keeps_that_many_next_only_demonstrations_and_every_other_one(qwen3_tokenizer):
    """sft.sources[].max_repeats: memory's oracle replies `Next.` to most messages, so most of its
    demonstrations train exactly `Next.<|im_end|>`; the cap keeps `max_repeats` of those (drawn by
    the seed), every other demonstration in order, and logs what it dropped."""
    from agentic_rl.envs.base import EnvSpec
    from agentic_rl.rollout.demos import cap_repeats
    from agentic_rl.training.sft import DemoSource, build_demos

    options = {"facts": 1, "distractors": 4, "gap": 2, "window": 2}
    env = make_env("memory", **options)
    everything = demo_sequences(
        oracle_demos(env, env.tasks("train", n=6, seed=0), ChatFormat.for_tokenizer(qwen3_tokenizer))
    )

    def trained(seq):
        return qwen3_tokenizer.decode([t for t, m in zip(seq.input_ids, seq.loss_mask) if m])

    next_only = [i for i, seq in enumerate(everything) if trained(seq) == "Next.<|im_end|>"]
    assert len(next_only) >= 12 and len(everything) - len(next_only) >= 12  # both kinds are many

    logged = []
    kept = build_demos(
        [DemoSource(env=EnvSpec("memory", options), n=6, max_repeats=3)], qwen3_tokenizer, 0, log=logged.append
    )
    assert [trained(seq) for seq in kept].count("Next.<|im_end|>") == 3
    others = [seq for i, seq in enumerate(everything) if i not in next_only]
    assert [s.input_ids for s in kept if trained(s) != "Next.<|im_end|>"] == [s.input_ids for s in others]
    assert logged == [
        f"sft.sources[0]: dropped {len(next_only) - 3} of {len(next_only)} demonstrations training exactly "
        f"'Next.<|im_end|>' (max_repeats=3)"
    ]

    # the kept copies are drawn by the seed, the same for the same seed
    def chosen(seed):
        return [everything.index(s) for s in cap_repeats(everything, 3, seed)[0] if trained(s) == "Next.<|im_end|>"]

    assert chosen(0) == chosen(0) and len({tuple(chosen(seed)) for seed in range(5)}) > 1
    assert cap_repeats(everything, len(everything), 0) == (everything, {})  # a cap nothing reaches drops nothing
    with pytest.raises(ValueError, match=r"DemoSource: 'max_repeats' must be > 0, got 0"):
        DemoSource(env=EnvSpec("memory", options), max_repeats=0)


def test_the_store_everything_oracle_writes_every_fact_and_needs_the_slots_for_them():
    """oracle_stores=all: one remember per message (an update rewrites its key), the same turns as
    the selective oracle, every task solved; refused when the memory cannot hold every fact."""
    options = {"facts": 2, "distractors": 6, "gap": 3, "window": 2, "updates": 1}
    for stores, writes in (("asked", 3), ("all", 9)):
        env = make_env("memory", oracle_stores=stores, **options)
        for task in env.tasks("train", n=5, seed=0):
            actions = env.oracle_actions(task)
            assert sum('"remember"' in a for a in actions) == writes and len(actions) == env.options.oracle_turns
            episode = play_oracle(env, task)
            assert episode.result.info["correct"]
    with pytest.raises(ValueError, match="oracle_stores=all keeps every one of the 8 facts, but memory_slots is 7"):
        MemoryOptions(oracle_stores="all", memory_slots=7, **{k: v for k, v in options.items() if k != "updates"})
