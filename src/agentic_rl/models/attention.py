"""The trainers' attention: on CPU, reduced-precision queries, keys and values attend in float32.

PyTorch's CPU flash-attention kernel (`_scaled_dot_product_flash_attention_for_cpu`), which
transformers' `sdpa` implementation runs, is slower on bf16 inputs than on float32 ones, its
backward above all. At one GRPO micro-batch of the demo (8 rows, 610 tokens, a 430-token prefix
shared through the KV cache) on a 2-core AVX512-BF16 EPYC under bf16 autocast, attention took
~39% of forward + backward: 2.0 s of backward kernel against 0.73 s with the same inputs in float32
(`benchmarks/training_attention.py`, BENCHMARKS.md). So the models the trainers train attend
through `ATTENTION`: where the CPU kernel would attend in bf16/fp16 (reduced inputs, or bf16
autocast, which casts them down inside the op), it upcasts queries, keys and values to float32,
runs the same kernel there with autocast off, and rounds the output to the reduced dtype once.
That is faster and at least as precise: the kernel accumulates in float32 either way, and float32
inputs skip its bf16 roundings. Anything else (float32 outside autocast, and every accelerator,
whose bf16 kernels are fast) goes to transformers' `sdpa` as it is, so fp32 runs are bit for bit
what they were.

`attend_in_float32_on_cpu(model)` switches a transformers model from `sdpa` to it; a model on
another implementation (eager, flash_attention_2) is left alone. The name is registered with
transformers' attention and mask interfaces on import (the masks are sdpa's), and is not written
into a saved model's config.
"""

from __future__ import annotations

import torch
from torch import nn
from transformers import AttentionInterface, AttentionMaskInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import sdpa_mask

ATTENTION = "agentic_rl_sdpa"


REDUCED = (torch.bfloat16, torch.float16)


def attention_dtype(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor) -> torch.dtype | None:
    """The reduced precision (bf16/fp16) the CPU kernel would attend in, or None: off CPU, and for
    float32 inputs outside autocast. Under CPU autocast it is autocast's dtype, whatever the inputs
    (transformers' RoPE makes queries and keys float32 even under bf16 autocast; the kernel still
    gets them in bf16, cast by autocast)."""
    if query.device.type != "cpu":
        return None
    if torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu") in REDUCED:
        return torch.get_autocast_dtype("cpu")
    return next((t.dtype for t in (query, key, value) if t.dtype in REDUCED), None)


def sdpa_float32_on_cpu(module: nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                        attention_mask: torch.Tensor | None, **kwargs) -> tuple[torch.Tensor, None]:
    """transformers' sdpa attention, attended in float32 where the CPU kernel would run bf16/fp16.

    query (B, heads, Lq, hd), key/value (B, kv_heads, Lk, hd), attention_mask a bool or additive
    mask (B, 1, Lq, Lk) or None; returns (output (B, Lq, heads, hd), None), in the dtype sdpa would
    return (the reduced one), rounded once from float32.
    """
    reduced = attention_dtype(query, key, value)
    if reduced is None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)
    if attention_mask is not None and attention_mask.is_floating_point():
        attention_mask = attention_mask.float()  # an additive mask must match the queries' dtype
    with torch.autocast("cpu", enabled=False):  # autocast would cast the inputs back down
        out, _ = sdpa_attention_forward(module, query.float(), key.float(), value.float(), attention_mask, **kwargs)
    return out.to(reduced), None


AttentionInterface.register(ATTENTION, sdpa_float32_on_cpu)
AttentionMaskInterface.register(ATTENTION, sdpa_mask)


def attend_in_float32_on_cpu(model: nn.Module) -> None:
    """Switch a transformers model (a causal LM, a classifier or a bare decoder) from `sdpa` to
    `ATTENTION`, in place; other implementations, and modules without a config, are left alone."""
    config = getattr(model, "config", None)
    if getattr(config, "_attn_implementation", None) == "sdpa":
        model.set_attn_implementation(ATTENTION)
