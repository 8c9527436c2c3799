"""Shared prompt prefixes are prefilled once and forked, with no change to any trajectory."""

import torch
from helpers_rollout import ToolLoopEnv, WindowEnv

from agentic_rl.envs.base import Task
from agentic_rl.models.chat_format import ChatFormat
from agentic_rl.rollout.backend import RunnerBackend
from agentic_rl.rollout.config import RolloutConfig
from agentic_rl.rollout.engine import RolloutEngine
from agentic_rl.rollout.fast_runner import FastRunner
from agentic_rl.rollout.sampling import SamplingParams


def test_fork_copies_exactly_the_cache_a_prefill_would_build(tiny_qwen3):
    """Guards against a fork that copies too little/too much of the cache, or into a used slot."""
    model, _ = tiny_qwen3
    runner = FastRunner(model, max_slots=4, max_len=64)
    prompt = list(range(100, 120))
    a, b, c = runner.alloc(), runner.alloc(), runner.alloc()
    runner.forward([a], [prompt[:15]])
    runner.fork(a, b, 12)
    assert runner.length(b) == 12
    forked = runner.forward([b], [prompt[12:]])
    direct = runner.forward([c], [prompt])
    assert torch.allclose(forked, direct, atol=1e-5)
    try:
        runner.fork(a, b, 3)
        raise AssertionError("fork into a non-empty slot must fail")
    except ValueError as exc:
        assert "must be empty" in str(exc)


class _Counting(RunnerBackend):
    def __init__(self, *args, share: bool, **kwargs):
        super().__init__(*args, **kwargs)
        if not share:
            self.min_shared_prefix = 10**9


def _run(tiny_qwen3, share: bool):
    model, tokenizer = tiny_qwen3
    chat_format = ChatFormat.for_tokenizer(tokenizer)
    runner = FastRunner(model, max_slots=8, max_len=512)
    sampling = SamplingParams(temperature=0.9, seed=5)
    backend = _Counting(runner, chat_format, share=share)
    engine = RolloutEngine(backend, chat_format, tokenizer, RolloutConfig(4, 512, 8), sampling)
    questions = ["What is 6*7?", "Add 2 and 3."]
    tasks = [Task(f"t{i}", questions[i // 3], "42") for i in range(6)]  # G = 3 episodes per question
    return engine.run([ToolLoopEnv(tool_turns=2, question=t.question) for t in tasks], tasks), backend


def test_prefix_sharing_changes_no_trajectory_and_saves_prefill(tiny_qwen3):
    """Guards against KV-cache sharing that leaks one episode's tokens into another's context."""
    shared, shared_backend = _run(tiny_qwen3, share=True)
    plain, plain_backend = _run(tiny_qwen3, share=False)
    assert [t.input_ids for t in shared] == [t.input_ids for t in plain]
    for a, b in zip(shared, plain):
        assert max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs)) < 1e-4
    assert shared_backend.forward_calls == plain_backend.forward_calls + 1  # one extra call: the shared prefix


class _TokenCounting(FastRunner):
    """FastRunner that counts the tokens it computes (prefill and decode alike)."""

    computed = 0

    def forward(self, slots, chunks):
        self.computed += sum(len(chunk) for chunk in chunks)
        return super().forward(slots, chunks)


def _run_window(tiny_qwen3, share: bool):
    model, tokenizer = tiny_qwen3
    chat_format = ChatFormat.for_tokenizer(tokenizer)
    runner = _TokenCounting(model, max_slots=2, max_len=1024)
    backend = _Counting(runner, chat_format, share=share)
    engine = RolloutEngine(
        backend, chat_format, tokenizer, RolloutConfig(4, 1024, 16), SamplingParams(temperature=0.9, seed=3)
    )
    # Every turn is cut at 4 tokens, so the schedule is fixed: the long episode (12 tool turns, a
    # window that never overflows) runs throughout; episode 0 (window 1) starts new sequences
    # after its turns 2 and 3 and ends after turn 4; episode 2 then takes its slot and does the same.
    envs = [WindowEnv(tool_turns=3, window=1), WindowEnv(tool_turns=12, window=99), WindowEnv(tool_turns=3, window=1)]
    head = chat_format.prompt_ids(envs[0].reset(Task("t", "What is 6*7?", "42")), envs[0].tool_schemas)
    return engine.run(envs, [Task(f"t{i}", "What is 6*7?", "42") for i in range(3)]), backend, runner, len(head)


def test_new_sequences_and_late_episodes_fork_the_prefix_a_running_episode_holds(tiny_qwen3):
    """Guards against a fork from a running episode that copies more or less than the tokens both
    share (a later sequence would still see the dropped context, or miss part of its prompt), and
    against re-prefilling the system prompt and tool schemas for every sequence of a non-prefix episode."""
    shared, shared_backend, shared_runner, head = _run_window(tiny_qwen3, share=True)
    plain, plain_backend, plain_runner, _ = _run_window(tiny_qwen3, share=False)
    assert [len(episode.sequences()) for episode in plain] == [3, 1, 3], "want non-prefix episodes"
    for a, b in zip(shared, plain):
        for seq_a, seq_b in zip(a.sequences(), b.sequences(), strict=True):
            assert seq_a.input_ids == seq_b.input_ids
            assert max(abs(x - y) for x, y in zip(seq_a.logprobs, seq_b.logprobs)) < 1e-4
    # forks from the long episode's cache: episode 0's two later sequences, episode 2's admission
    # and its two later sequences; each copies at least the rendered system prompt, tools and question
    assert (shared_backend.prefix_forks, plain_backend.prefix_forks) == (5, 0)
    assert plain_runner.computed - shared_runner.computed >= 5 * head
