"""Episodes whose history is not a prefix: an env drops old turns (StepResult.context), the engine
starts a new token sequence, and every sequence stays token-exact (docs/design.md invariants 1-2).

Scripted tests use ScriptedRunner and WindowEnv (tests/helpers_rollout.py: a fake model with
readable turns, an env that shows only its last turns); log-probs use tiny-qwen3.
"""

from __future__ import annotations

import torch
from helpers_rollout import WindowEnv, scripted_engine, task, tool_turn

from agentic_rl.rollout.backend import RunnerBackend
from agentic_rl.rollout.config import RolloutConfig
from agentic_rl.rollout.engine import RolloutEngine
from agentic_rl.rollout.hf_runner import HFRunner
from agentic_rl.rollout.sampling import SamplingParams
from agentic_rl.rollout.trajectory import collate

TURNS = [tool_turn("6*7"), "Let me check.\n" + tool_turn("42/1"), tool_turn("7*6"), "Final Answer: 42<|im_end|>"]
SCRIPTS = [TURNS[:2], TURNS[2:3], TURNS[3:]]
"""ScriptedRunner plays one script per slot (in allocation order), and each sequence has its own slot."""


def test_a_context_change_starts_a_new_sequence_whose_mask_decodes_to_exactly_its_turns(qwen3_tokenizer):
    """Guards against a mask that spans a dropped context, or a turn lost or duplicated between sequences."""
    from agentic_rl.models.chat_format import ChatFormat

    chat_format = ChatFormat.for_tokenizer(qwen3_tokenizer)
    engine, _ = scripted_engine(qwen3_tokenizer, chat_format, SCRIPTS)
    env = WindowEnv(tool_turns=3, window=1)
    (episode,) = engine.run([env], [task()])
    sequences = episode.sequences()
    # turn 1 -> observation appended (window 1 holds it); turns 2, 3 each overflow: new sequences
    assert len(sequences) == 3 and episode.finish_reason == "answered"
    turns_per_sequence = [
        [qwen3_tokenizer.decode(seq.input_ids[s.start : s.end]) for s in seq.policy_spans] for seq in sequences
    ]
    assert turns_per_sequence == [TURNS[:2], TURNS[2:3], TURNS[3:]]
    for seq, turns in zip(sequences, turns_per_sequence):
        seq.check()
        policy_ids = [t for t, m in zip(seq.input_ids, seq.loss_mask) if m]
        assert qwen3_tokenizer.decode(policy_ids) == "".join(turns)
        assert seq.spans[-1].kind == "policy", "a sequence ends on the policy turn that changed the context"
    # each later sequence starts with exactly the env's context rendered as a prompt (mask 0)
    for seq, context in zip(sequences[1:], env.contexts):
        prompt = chat_format.prompt_ids(context, env.tool_schemas)
        assert (
            seq.input_ids[: len(prompt)] == prompt and seq.spans[0].kind == "prompt" and seq.spans[0].end == len(prompt)
        )
    assert episode.turn_rewards == [0.125, 0.25, 0.375, 1.0]
    assert episode.turn_rewards_by_sequence() == [[0.125, 0.25], [0.375], [1.0]]
    assert [seq.turn_rewards for seq in episode.previous] == [[0.125, 0.25], [0.375]]
    assert episode.num_turns == 4 and episode.num_policy_tokens == sum(sum(s.loss_mask) for s in sequences)
    assert [m["role"] for m in episode.messages] == ["system", "user"] + ["assistant", "tool"] * 3 + ["assistant"]


def test_each_sequence_equals_the_template_render_of_its_own_conversation(qwen3_tokenizer):
    """Guards against observations of a later sequence rendered against the dropped history
    (the engine must render deltas against the sequence's own context, not the whole log)."""
    from agentic_rl.models.chat_format import ChatFormat

    chat_format = ChatFormat.for_tokenizer(qwen3_tokenizer)
    turns = [tool_turn("1+1"), tool_turn("2+2"), tool_turn("3+3"), tool_turn("4+4"), "Final Answer: 42<|im_end|>"]
    engine, _ = scripted_engine(qwen3_tokenizer, chat_format, [turns[:3], turns[3:4], turns[4:]])
    env = WindowEnv(tool_turns=4, window=2)
    (episode,) = engine.run([env], [task()])
    assert len(episode.previous) == 2
    for seq in episode.previous:  # messages of a previous sequence: its context, then its turns and observations
        head = chat_format.encode(chat_format.render(seq.messages[:-1], env.tool_schemas, add_generation_prompt=True))
        assert seq.input_ids == head + seq.input_ids[seq.policy_spans[-1].start :]


def test_the_runner_gets_a_fresh_slot_per_sequence_fed_exactly_that_sequence(qwen3_tokenizer):
    """Guards against a KV cache that keeps the dropped context (the policy would still see it)."""
    from agentic_rl.models.chat_format import ChatFormat

    chat_format = ChatFormat.for_tokenizer(qwen3_tokenizer)
    engine, runner = scripted_engine(qwen3_tokenizer, chat_format, SCRIPTS)
    (episode,) = engine.run([WindowEnv(tool_turns=3, window=1)], [task()])
    assert runner.allocations == 3 and not runner.emitted, "one slot per sequence, all freed"
    for slot, seq in enumerate(episode.sequences()):
        assert runner.fed[slot] == seq.input_ids[:-1]


def test_a_context_with_no_room_left_ends_the_episode_after_the_turn(qwen3_tokenizer):
    """Guards against a new sequence longer than the backend's context (max_episode_tokens bounds each sequence)."""
    from agentic_rl.models.chat_format import ChatFormat

    chat_format = ChatFormat.for_tokenizer(qwen3_tokenizer)
    env = WindowEnv(tool_turns=3, window=1, note=" Remember this." * 60)
    prompt = len(chat_format.prompt_ids(env.reset(task()), env.tool_schemas))
    engine, _ = scripted_engine(qwen3_tokenizer, chat_format, SCRIPTS, RolloutConfig(64, prompt + 100, 8))
    (episode,) = engine.run([env], [task()])  # the context after turn 2 carries ~180 more tokens than the prompt
    assert episode.finish_reason == "max_episode_tokens"
    assert len(episode.previous) == 1 and episode.num_policy_tokens == sum(episode.previous[0].loss_mask)
    assert [s.kind for s in episode.spans] == ["prompt"] and episode.num_turns == 2 == len(episode.turn_rewards)


def test_sampling_logprobs_of_every_sequence_match_a_plain_forward(tiny_qwen3):
    """Guards against π_old of a later sequence that a forward over that sequence cannot reproduce
    (a cache that still held the dropped context, or log-probs shifted at a sequence start)."""
    from agentic_rl.models.chat_format import ChatFormat

    model, tokenizer = tiny_qwen3
    chat_format = ChatFormat.for_tokenizer(tokenizer)
    temperature = 0.8
    runner = HFRunner(model, max_slots=3, max_len=1024)
    engine = RolloutEngine(
        RunnerBackend(runner, chat_format),
        chat_format,
        tokenizer,
        RolloutConfig(4, 1024, 8),
        SamplingParams(temperature=temperature, top_p=0.9, seed=5),
    )
    questions = ["What is 6*7?", "Add 2 and 3.", "Hi", "Compute 1+1 please."]
    envs = [WindowEnv(tool_turns=3, window=1, question=q) for q in questions]
    episodes = engine.run(envs, [task(i, q) for i, q in enumerate(questions)])
    rows = [seq for episode in episodes for seq in episode.sequences()]
    assert all(len(episode.sequences()) == 3 for episode in episodes), "want non-prefix episodes"
    batch = collate(rows, pad_id=0)  # (R, T)
    with torch.no_grad():
        hidden = model.model(batch.input_ids, attention_mask=batch.attention_mask).last_hidden_state  # (R, T, H)
        mask = batch.loss_mask[:, 1:].bool()  # (R, T-1): position t predicts token t+1
        logits = model.lm_head(hidden[:, :-1][mask]).float()  # (N, V)
    recomputed = (
        torch.log_softmax(logits / temperature, dim=-1).gather(1, batch.input_ids[:, 1:][mask][:, None]).squeeze(1)
    )
    assert mask.sum() > 0 and (recomputed - batch.logprobs[:, 1:][mask]).abs().max() < 1e-4
    assert all(seq.weights_version == 0 for seq in rows)


def test_same_seed_gives_the_same_non_prefix_episodes(tiny_qwen3):
    """Guards against sequence keys that collide across episodes or depend on the schedule (invariant 7)."""
    from agentic_rl.models.chat_format import ChatFormat

    model, tokenizer = tiny_qwen3
    chat_format = ChatFormat.for_tokenizer(tokenizer)

    def run(slots: int):
        engine = RolloutEngine(
            RunnerBackend(HFRunner(model, max_slots=slots, max_len=1024), chat_format),
            chat_format,
            tokenizer,
            RolloutConfig(4, 1024, 8),
            SamplingParams(temperature=1.0, seed=9),
        )
        episodes = engine.run([WindowEnv(3, 1) for _ in range(3)], [task(i) for i in range(3)])
        return [[seq.input_ids for seq in episode.sequences()] for episode in episodes]

    first = run(3)
    assert first == run(3)
    later = [ids for episode in first for ids in episode[1:]]
    assert len({tuple(ids) for ids in later}) > 1, "sequences of different episodes draw from their own generators"
