"""The trainers' attention (models/attention.py): on CPU, bf16 inputs attend in float32.

The specification: with bf16 queries, keys and values on CPU the output is the float32 kernel's
result on the same (bf16-valued) inputs, rounded to bf16 once, so it sits within one bf16 rounding
of a float64 reference, and its gradients are the float32 kernel's; float32 inputs take transformers'
sdpa unchanged, bit for bit; every model a trainer trains attends through it, with sdpa's masks.
"""

from __future__ import annotations

import copy
import types

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from agentic_rl.models.attention import ATTENTION, attend_in_float32_on_cpu, sdpa_float32_on_cpu
from agentic_rl.models.backbone import backbone_hidden, backbone_of
from agentic_rl.models.lora import LoraConfig
from agentic_rl.models.policy import ModelConfig, make_trainable

MODULE = types.SimpleNamespace(num_key_value_groups=2, is_causal=True, training=False)


def _inputs(dtype: torch.dtype):
    """q (2, 4, 5, 8), k/v (2, 2, 9, 8) (two query heads per key head), and a bool mask (2, 1, 5, 9):
    the 5 queries sit at positions 4..8 (a 4-token prefix before them), causal; row 1 is right-padded
    after 7 tokens."""
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, h, n, 8, generator=g).to(dtype).requires_grad_() for h, n in ((4, 5), (2, 9), (2, 9)))
    mask = torch.ones(5, 9, dtype=torch.bool).tril(4)[None, None].repeat(2, 1, 1, 1)  # (2, 1, 5, 9)
    mask[1, :, :, 7:] = False
    mask[1, :, 3:, :] = mask[1, :, 2:3, :]  # padded queries attend like the last real one (finite rows)
    return q, k, v, mask


def _reference(q, k, v, mask):
    """float64 attention of the same values: softmax(q kᵀ / √d + mask) v, per query head."""
    q, k, v = (t.detach().double().requires_grad_() for t in (q, k, v))
    keys, values = k.repeat_interleave(2, dim=1), v.repeat_interleave(2, dim=1)  # (2, 4, 9, 8)
    scores = q @ keys.transpose(-1, -2) / 8 ** 0.5 + torch.where(mask, 0.0, float("-inf")).double()
    out = (scores.softmax(-1) @ values).transpose(1, 2)  # (2, 5, 4, 8)
    return out, (q, k, v)


def test_bf16_inputs_get_the_float32_kernel_rounded_once():
    """Guards against attending bf16 inputs in the bf16 kernel (slower, and rounded inside), against
    an output left in float32, and against gradients that do not reach q, k and v."""
    q, k, v, mask = _inputs(torch.bfloat16)
    out, weights = sdpa_float32_on_cpu(MODULE, q, k, v, mask)
    assert weights is None and out.dtype == torch.bfloat16 and out.shape == (2, 5, 4, 8)
    float32_kernel, _ = sdpa_attention_forward(MODULE, q.float(), k.float(), v.float(), mask)
    assert torch.equal(out, float32_kernel.to(torch.bfloat16))  # the float32 result, rounded once
    reference, leaves = _reference(q, k, v, mask)
    assert (out.double() - reference).abs().max() <= 2 ** -8 * reference.abs().max()  # one bf16 rounding
    bf16_kernel, _ = sdpa_attention_forward(MODULE, q, k, v, mask)
    assert not torch.equal(out, bf16_kernel)  # the bf16 kernel rounds differently: the test sees which ran
    cotangent = torch.randn(out.shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    (out.double() * cotangent).sum().backward()
    (reference * cotangent).sum().backward()
    for ours, exact in zip((q, k, v), leaves):
        assert ours.grad is not None and ours.grad.dtype == torch.bfloat16
        assert (ours.grad.double() - exact.grad).abs().max() <= 2 ** -6 * exact.grad.abs().max()


def test_float32_inputs_under_bf16_autocast_attend_in_float32():
    """Guards against checking only the inputs' dtype: under bf16 autocast transformers hands the
    kernel float32 queries and keys (its RoPE runs in float32), which autocast then casts to bf16."""
    q, k, v, mask = _inputs(torch.float32)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out, _ = sdpa_float32_on_cpu(MODULE, q, k, v, mask)
        bf16_kernel, _ = sdpa_attention_forward(MODULE, q, k, v, mask)
    float32_kernel, _ = sdpa_attention_forward(MODULE, q, k, v, mask)
    assert out.dtype == bf16_kernel.dtype == torch.bfloat16  # the dtype sdpa gives under autocast
    assert torch.equal(out, float32_kernel.to(torch.bfloat16)) and not torch.equal(out, bf16_kernel)


def test_float32_inputs_take_sdpa_unchanged():
    """Guards against the float32 path (fp32 training, every AVX2-only CPU) changing by a single bit."""
    q, k, v, mask = _inputs(torch.float32)
    ours, _ = sdpa_float32_on_cpu(MODULE, q, k, v, mask)
    theirs, _ = sdpa_attention_forward(MODULE, q, k, v, mask)
    assert torch.equal(ours, theirs)
    reference, _ = _reference(q, k, v, mask)
    assert torch.allclose(ours.double(), reference, atol=1e-6)


class _KernelDtypes(TorchDispatchMode):
    """Records the dtype of the queries every CPU attention kernel call receives (below autocast,
    so what the kernel really runs in)."""

    def __init__(self):
        super().__init__()
        self.seen: list[torch.dtype] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if "scaled_dot_product" in func.name():
            self.seen.append(args[0].dtype)
        return func(*args, **(kwargs or {}))


def test_trained_models_attend_through_it_with_sdpas_masks(tiny_qwen3):
    """Guards against a trainer's model left on the bf16 kernel, against bf16 autocast casting the
    upcast inputs back down, and against the implementation registered without sdpa's masks (then
    transformers builds no mask: a shared-prefix pass attends causally from the wrong corner, and
    padded rows see their padding)."""
    base, _ = tiny_qwen3
    plain = copy.deepcopy(base)
    trained = make_trainable(copy.deepcopy(base), ModelConfig(lora=LoraConfig(enabled=False)), log=lambda *_: None)
    assert trained.config._attn_implementation == ATTENTION and plain.config._attn_implementation == "sdpa"
    ids = torch.randint(10, 5000, (3, 24), generator=torch.Generator().manual_seed(0))  # (B, T)
    ids[:, :16] = ids[0, :16]  # a 16-token prefix every row shares
    attention = torch.ones_like(ids)
    attention[2, 20:] = 0  # row 2 right-padded
    with torch.no_grad():
        expected = backbone_of(plain)(input_ids=ids, attention_mask=attention, use_cache=False).last_hidden_state[:, 16:]
        shared = backbone_hidden(backbone_of(trained), ids, attention, prefix=16)  # (B, 8, H) on the prefix's cache
    real = attention[:, 16:].bool()
    assert torch.allclose(shared[real], expected[real], atol=1e-5)
    for model, kernel_dtype in ((trained, torch.float32), (plain, torch.bfloat16)):  # plain: what it replaces
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16), _KernelDtypes() as spy:
            backbone_of(model)(input_ids=ids, attention_mask=attention, use_cache=False)
        assert len(spy.seen) == model.config.num_hidden_layers and set(spy.seen) == {kernel_dtype}


def test_other_implementations_are_left_alone(tiny_qwen3):
    """Guards against overriding an attention implementation a user chose (eager, flash_attention_2)."""
    model = copy.deepcopy(tiny_qwen3[0])
    model.set_attn_implementation("eager")
    attend_in_float32_on_cpu(model)
    assert model.config._attn_implementation == "eager"
    attend_in_float32_on_cpu(torch.nn.Linear(2, 2))  # no config: nothing to switch
