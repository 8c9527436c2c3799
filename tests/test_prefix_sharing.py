"""Shared prompt prefixes are prefilled once and forked, with no change to any trajectory."""

import torch

from agentic_rl.envs.base import Task
from agentic_rl.models.chat_format import ChatFormat
from agentic_rl.rollout.backend import RunnerBackend
from agentic_rl.rollout.config import RolloutConfig
from agentic_rl.rollout.engine import RolloutEngine
from agentic_rl.rollout.fast_runner import FastRunner
from agentic_rl.rollout.sampling import SamplingParams
from test_rollout_engine import ToolLoopEnv


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
