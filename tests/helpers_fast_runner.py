"""FastRunner test helpers: tiny Llama models and a ragged-schedule check against full forwards."""

from __future__ import annotations

import random

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from agentic_rl.rollout.fast_runner import FastRunner


def tiny_llama(seed: int = 0, **overrides) -> LlamaForCausalLM:
    kwargs = dict(
        vocab_size=300,
        hidden_size=96,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=6,
        num_key_value_heads=2,
        max_position_embeddings=256,
        rms_norm_eps=1e-5,
        rope_theta=10_000.0,
        tie_word_embeddings=False,
        initializer_range=0.1,  # large enough that wrong histories change logits by >> 1e-4
    )
    kwargs.update(overrides)
    torch.manual_seed(seed)
    return LlamaForCausalLM(LlamaConfig(**kwargs)).eval()


def reference_logits(model, history: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return model(torch.tensor([history]), logits_to_keep=1).logits[0, -1].float()


class CheckedRunner:
    """Runs forward calls and tracks the worst logit error against full forwards of each history."""

    def __init__(self, model, runner: FastRunner):
        self.model, self.runner, self.hist, self.worst = model, runner, {}, 0.0

    def forward(self, slots, chunks) -> None:
        out = self.runner.forward(slots, chunks)
        assert out.dtype == torch.float32 and out.shape == (len(slots), self.model.config.vocab_size)
        for i, (s, c) in enumerate(zip(slots, chunks)):
            self.hist[s] = self.hist.get(s, []) + list(c)
            assert self.runner.length(s) == len(self.hist[s])
            self.worst = max(self.worst, (out[i] - reference_logits(self.model, self.hist[s])).abs().max().item())

    def fork(self, source: int, target: int, length: int) -> None:
        self.runner.fork(source, target, length)
        self.hist[target] = self.hist[source][:length]

    def free(self, slot: int) -> None:
        self.runner.free(slot)
        del self.hist[slot]


def run_schedule(model, runner: FastRunner, seed: int) -> float:
    """Random ragged schedule: multi-slot prefill, partial decodes, free/realloc, appends, holes.
    Returns the max abs error against full forwards."""
    vocab = model.config.vocab_size
    rng = random.Random(seed)
    check = CheckedRunner(model, runner)
    step = check.forward

    def toks(n):
        return [rng.randrange(vocab) for _ in range(n)]

    slots = [runner.alloc() for _ in range(4)]
    step(slots, [toks(rng.randint(5, 20)) for _ in slots])  # ragged prefill
    step(slots, [toks(1) for _ in slots])  # batched decode, contiguous range (fast path)
    step([slots[2], slots[0]], [toks(1), toks(1)])  # decode a subset, caller order != slot order
    step([slots[3]], [toks(7)])  # observation appended to one slot
    check.free(slots[1])
    new = runner.alloc()  # reuses the freed row (stale cache contents must be invisible)
    assert new == slots[1]
    step([slots[3], new, slots[0]], [toks(2), toks(9), toks(1)])
    far = [runner.alloc() for _ in range(runner.max_slots - 4)]
    step([slots[0], far[-1]], [toks(1), toks(3)])  # sparse set: gathered rows
    step([far[-1], slots[0]], [toks(1), toks(1)])
    for _ in range(3):  # mixed decode + chunk on a range with holes (dummy rows)
        live = sorted(check.hist)
        pick = rng.sample(live, k=rng.randint(1, len(live)))
        step(pick, [toks(rng.choice([1, 1, 4])) for _ in pick])
    return check.worst


def peft_llama():
    """tiny_llama(seed=5) with LoRA (r=4) on every projection and non-zero B: the adapters change the outputs."""
    peft = pytest.importorskip("peft")
    model = tiny_llama(seed=5)
    config = peft.LoraConfig(
        r=4,
        lora_alpha=8,
        lora_dropout=0.1,
        target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
    )
    pmodel = peft.get_peft_model(model, config).eval()
    torch.manual_seed(6)
    with torch.no_grad():
        for name, p in pmodel.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.2)  # non-zero B: the adapters change the outputs
    return pmodel
