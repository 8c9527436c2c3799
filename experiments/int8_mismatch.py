"""How far int8 rollout copies move SmolLM2's next-token distribution from float32 (issue 35 item 3).

    PYTHONPATH=<a worktree at 2dd22f6>/src .venv/bin/python experiments/int8_mismatch.py

Needs FastRunner's `linear="int8"` backend (torch's dynamic int8 linear on per-channel int8
weights, activations quantized per call with one scale per tensor), which lived at 2dd22f6 and was
removed from main after this measurement; on main the script stops at the first int8 runner.

Four arith test prompts (system prompt, tool schema, question) are decoded greedily for 30 tokens
by float32 copies (`linear="mkldnn"`); every variant is then teacher-forced on the same tokens, so
each position's distributions are comparable. Printed per variant: KL(float32 ‖ variant) per
token (mean and max over the 124 positions) and how often the two argmaxes agree. Variants: every
projection and the LM head in int8, with 7-bit (reduce_range, torch's default for fbgemm) and
8-bit activations; then 7-bit with some projections kept in float32, to find where it breaks.
"""

from __future__ import annotations

import torch

from agentic_rl.envs.base import make_env
from agentic_rl.models.chat_format import ChatFormat
from agentic_rl.models.loader import load_model
from agentic_rl.rollout import fast_weights
from agentic_rl.rollout.fast_runner import FastRunner

SHAPES = {"qkv": (960, 576), "o": (576, 576), "gate_up": (3072, 576), "down": (576, 1536), "lm_head": (49152, 576)}
"""SmolLM2-135M's fused projections as (out, in) weights: how a variant picks the ones to keep."""


def teacher_forced_logits(runner: FastRunner, prompts: list[list[int]], tokens: list[torch.Tensor]) -> torch.Tensor:
    slots = [runner.alloc() for _ in prompts]
    out = [runner.forward(slots, prompts)] + [runner.forward(slots, [[int(t)] for t in step]) for step in tokens]
    return torch.cat(out)  # (4 · 31, V)


def keep_in_float32(keep: list[str], quantize) -> None:
    """Patch the int8 backend so the projections named in `keep` stay float32 (torch.mm); the rest
    go through `quantize`, the backend's own int8_operand."""
    shapes = [SHAPES[name] for name in keep]

    def operand(w: torch.Tensor):
        return w.detach().float().contiguous().t() if tuple(w.shape) in shapes else quantize(w)

    def project(h, w, b):
        plain = isinstance(w, torch.Tensor) and not w.is_quantized and w.dtype == torch.float32
        out = torch.mm(h, w) if plain else torch.ops.quantized.linear_dynamic(h, w, fast_weights.INT8_REDUCE_RANGE)
        return out if b is None else out.add_(b)

    fast_weights.int8_operand = operand
    fast_weights.PROJECTIONS["int8"] = (project, lambda x, h, w, b: x.add_(project(h, w, b)))


def main() -> None:
    model, tokenizer = load_model("smollm2-135m-instruct")
    env = make_env("arith", difficulty=2)
    chat = ChatFormat.for_tokenizer(tokenizer)
    prompts = [chat.prompt_ids(env.reset(task), env.tool_schemas) for task in env.tasks("test", n=4, seed=0)]
    reference = FastRunner(model, max_slots=4, max_len=1024, linear="mkldnn")
    slots = [reference.alloc() for _ in prompts]
    outs, tokens = [reference.forward(slots, prompts)], []
    for _ in range(30):
        tokens.append(outs[-1].argmax(-1))
        outs.append(reference.forward(slots, [[int(t)] for t in tokens[-1]]))
    log_p = torch.cat(outs).log_softmax(-1)
    variants = [
        ("every projection and the LM head, 7-bit activations", True, []),
        ("every projection and the LM head, 8-bit activations", False, []),
        ("all but down_proj", True, ["down"]),
        ("all but the LM head", True, ["lm_head"]),
        ("all but down_proj and the LM head", True, ["down", "lm_head"]),
        ("down_proj only", True, ["qkv", "o", "gate_up", "lm_head"]),
    ]
    quantize = fast_weights.int8_operand  # the backend's own, before any variant patches it
    print("| int8 | KL per token, mean | max | argmax agrees |\n|---|---|---|---|")
    for name, reduce_range, keep in variants:
        fast_weights.INT8_REDUCE_RANGE = reduce_range
        keep_in_float32(keep, quantize)
        log_q = teacher_forced_logits(
            FastRunner(model, max_slots=4, max_len=1024, linear="int8"), prompts, tokens
        ).log_softmax(-1)
        kl = (log_p.exp() * (log_p - log_q)).sum(-1)
        agree = (log_p.argmax(-1) == log_q.argmax(-1)).float().mean()
        print(f"| {name} | {kl.mean():.3f} | {kl.max():.2f} | {agree:.1%} |", flush=True)


if __name__ == "__main__":
    main()
