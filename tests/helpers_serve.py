"""The OpenAI-compatible server over a scripted model, shared by tests/test_serve.py and
tests/test_serve_abuse.py: the real app, worker, engine and chat format, in process under uvicorn,
with `ScriptRunner` (a fake model writing fixed turns) in place of the network."""

from __future__ import annotations

import contextlib
import socket
import threading
import time

import openai
import torch
import uvicorn

from agentic_rl.models.chat_format import ChatFormat
from agentic_rl.rollout.backend import RunnerBackend
from agentic_rl.rollout.config import RolloutConfig
from agentic_rl.rollout.engine import RolloutEngine
from agentic_rl.rollout.runner import Runner
from agentic_rl.rollout.sampling import SamplingParams
from agentic_rl.serving.batcher import EngineWorker
from agentic_rl.serving.config import HTTPLimits
from agentic_rl.serving.connections import uvicorn_options
from agentic_rl.serving.server import ServedModel, build_app

LIMITS = RolloutConfig(max_turn_tokens=64, max_episode_tokens=1024, max_turns=4)


class ScriptRunner(Runner):
    """A fake model: the k-th allocated slot writes `scripts[k % len(scripts)]` one token per forward."""

    def __init__(self, scripts, vocab_size, max_slots=16, max_len=1024, received=None, forward_s=0.0):
        self.scripts, self.vocab_size, self.max_slots, self.max_len = scripts, vocab_size, max_slots, max_len
        self.forward_s = forward_s
        """Seconds each forward takes (a model's pace, for tests of what runs while it decodes)."""
        self.allocations, self.emitted, self.lengths = 0, {}, {}
        self.received = {} if received is None else received
        """slot -> every token id the model read in it, in order (the prompt, then its own tokens fed back)."""

    def alloc(self):
        slot, self.allocations = self.allocations, self.allocations + 1
        self.emitted[slot], self.lengths[slot] = 0, 0
        return slot

    def free(self, slot):
        self.emitted.pop(slot, None)

    def length(self, slot):
        return self.lengths[slot]

    def sync_weights(self):
        pass

    def forward(self, slots, chunks):
        time.sleep(self.forward_s)
        logits = torch.full((len(slots), self.vocab_size), -1e4)  # (B, V)
        for row, (slot, chunk) in enumerate(zip(slots, chunks)):
            script = self.scripts[slot % len(self.scripts)]
            logits[row, script[min(self.emitted[slot], len(script) - 1)]] = 0.0
            self.emitted[slot] += 1
            self.lengths[slot] += len(chunk)
            self.received.setdefault(slot, []).extend(chunk)
        return logits


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextlib.contextmanager
def scripted_server(tokenizer, turns_per_request, agent_tools=None, http=HTTPLimits(), received=None, forward_s=0.0):
    """The real app (routes, worker, engine, chat format, tools, connection limits) over a model that
    writes `turns_per_request`, one token per forward of `forward_s` seconds; `received` (a dict) gets
    each slot's token ids as the model read them."""
    chat_format = ChatFormat.for_tokenizer(tokenizer)
    scripts = [
        sum((tokenizer(t, add_special_tokens=False)["input_ids"] for t in turns), []) for turns in turns_per_request
    ]
    runner = ScriptRunner(scripts, len(tokenizer), received=received, forward_s=forward_s)
    engine = RolloutEngine(
        RunnerBackend(runner, chat_format), chat_format, tokenizer, LIMITS, SamplingParams(temperature=1.0)
    )
    worker = EngineWorker(engine, max_concurrent=16, batch_window_s=0.01)
    port = free_port()
    app = build_app(ServedModel("scripted", LIMITS, worker, agent_tools, http=http))
    server = uvicorn.Server(uvicorn.Config(app, port=port, log_level="warning", **uvicorn_options(http)))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.01)
    try:
        yield openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0), chat_format
    finally:
        server.should_exit = True
        thread.join()
        worker.stop()
