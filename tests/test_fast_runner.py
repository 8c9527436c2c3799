"""FastRunner: logits equal a plain full forward of the HF model over each slot's history."""

from __future__ import annotations

import copy
import random

import pytest
import torch
from helpers_fast_runner import CheckedRunner, peft_llama, reference_logits, run_schedule, tiny_llama

from agentic_rl.models.precision import mkldnn_linear_works
from agentic_rl.rollout.fast_runner import FastRunner

TOL = 1e-4


@pytest.fixture(scope="module")
def qwen3(tiny_qwen3):
    """The shared tiny-qwen3 (eval mode, read-only): tests that change weights deep-copy it."""
    return tiny_qwen3[0]


MKLDNN = pytest.param(
    "mkldnn", marks=pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="no oneDNN in this torch")
)
MKLDNN_BF16 = pytest.param(  # oneDNN runs bf16 linears only on some CPUs (AVX512, AMX, ARM bf16), not on AVX2-only ones
    "mkldnn",
    marks=pytest.mark.skipif(not mkldnn_linear_works(torch.bfloat16), reason="this CPU's oneDNN has no bf16 linear"),
)


@pytest.mark.parametrize("linear", ["mm", MKLDNN])
def test_qwen3_ragged_schedule_matches_full_forward(qwen3, linear):
    """Guards against KV-cache, padding or position bugs in FastRunner on Qwen3: a ragged prefill/decode
    schedule matches plain full forwards."""
    runner = FastRunner(qwen3, max_slots=8, max_len=96, linear=linear)
    assert runner.linear == linear
    assert run_schedule(qwen3, runner, seed=1) < TOL


@pytest.mark.parametrize("linear", ["mm", MKLDNN])
@pytest.mark.parametrize("bias", [False, True])
def test_llama_ragged_schedule_matches_full_forward(bias, linear):
    """Guards against a wrong fused projection (with and without biases, either linear backend):
    the runner's logits must equal a full forward of the HF model over random ragged schedules."""
    model = tiny_llama(attention_bias=bias, mlp_bias=bias)
    runner = FastRunner(model, max_slots=8, max_len=96, linear=linear)
    assert run_schedule(model, runner, seed=2) < TOL


def test_default_linear_backend():
    """Guards against a default linear backend that oneDNN cannot run (picked by probe, per dtype) and against a
    typo'd backend being accepted."""
    model = tiny_llama()
    expected = "mkldnn" if torch.backends.mkldnn.is_available() else "mm"
    assert FastRunner(model, max_slots=1, max_len=8).linear == expected
    expected_bf16 = "mkldnn" if mkldnn_linear_works(torch.bfloat16) else "mm"
    assert FastRunner(model, max_slots=1, max_len=8, dtype=torch.bfloat16).linear == expected_bf16
    with pytest.raises(ValueError, match="linear must be"):
        FastRunner(model, max_slots=1, max_len=8, linear="blas")


def test_auto_falls_back_to_mm_where_the_onednn_probe_fails(monkeypatch):
    """Guards against crashing or wrong logits on CPUs where the oneDNN probe fails: the default falls back to
    mm and still matches."""
    from agentic_rl.rollout import fast_weights

    monkeypatch.setattr(fast_weights, "mkldnn_linear_works", lambda dtype: False)
    model = tiny_llama()
    runner = FastRunner(model, max_slots=8, max_len=96)
    assert runner.linear == "mm"
    assert run_schedule(model, runner, seed=2) < TOL


def test_llama_tied_embeddings_and_n_layout():
    """Guards against tied embeddings copied (twice the memory, stale after an update) or mis-read in
    nn.Linear's (out, in) layout."""
    model = tiny_llama(seed=3, tie_word_embeddings=True)
    runner = FastRunner(model, max_slots=8, max_len=96, linear="mm")
    assert runner.weights.lm_head.data_ptr() == model.model.embed_tokens.weight.data_ptr()  # reused, not copied
    assert run_schedule(model, runner, seed=3) < TOL


def test_long_sequence_crosses_zeroing_blocks(qwen3):
    """Guards against uninitialised (possibly NaN) cache memory being read once a slot grows past its first
    lazily zeroed block: its logits must still match a full forward."""
    runner = FastRunner(qwen3, max_slots=2, max_len=600)
    a, b = runner.alloc(), runner.alloc()
    rng = random.Random(4)
    ha = [rng.randrange(1000) for _ in range(300)]
    hb = [rng.randrange(1000) for _ in range(2)]
    runner.forward([a, b], [ha, hb])
    extra = [rng.randrange(1000) for _ in range(290)]
    out = runner.forward([b], [extra])  # b now reads positions beyond a's first block
    assert (out[0] - reference_logits(qwen3, hb + extra)).abs().max().item() < TOL


@pytest.mark.parametrize("linear", ["mm", MKLDNN_BF16])
def test_bf16_mode_is_close(qwen3, linear):
    """Guards against a bf16 FastRunner far from float32 (beyond bf16 rounding) or returning bf16 logits to the
    sampler."""
    r32 = FastRunner(qwen3, max_slots=2, max_len=64, linear="mm")
    r16 = FastRunner(qwen3, max_slots=2, max_len=64, dtype=torch.bfloat16, linear=linear)
    prompt = list(range(100, 130))
    for r in (r32, r16):
        r.alloc()
    o32, o16 = r32.forward([0], [prompt]), r16.forward([0], [prompt])
    assert o16.dtype == torch.float32
    assert (o32 - o16).abs().max().item() < 0.05 * o32.abs().max().item() + 0.02


@pytest.mark.skipif(not mkldnn_linear_works(torch.bfloat16), reason="this CPU's oneDNN has no bf16 linear")
def test_bf16_backends_agree_to_rounding(qwen3):
    """Prepacking reorders the weights, not the arithmetic: in bf16 both backends round alike."""
    rng = random.Random(7)
    prompts = [[rng.randrange(1000) for _ in range(n)] for n in (23, 9, 31)]
    outs = []
    for linear in ("mm", "mkldnn"):
        runner = FastRunner(qwen3, max_slots=3, max_len=64, dtype=torch.bfloat16, linear=linear)
        slots = [runner.alloc() for _ in prompts]
        runner.forward(slots, prompts)
        outs.append(runner.forward(slots, [[5], [6], [7]]))
    assert outs[0].abs().max().item() < 2  # logits near 1, where one bf16 ulp is 2**-7
    assert (outs[0] - outs[1]).abs().max().item() <= 4 * 2**-7  # measured: one ulp


def test_lora_merge_matches_peft_forward_and_staleness_is_detected():
    """Guards against stale rollout weights (invariant 3): merged LoRA matches PEFT, an in-place update is
    detected, and refresh bumps the version."""
    pmodel = peft_llama()
    runner = FastRunner(pmodel, max_slots=4, max_len=64)
    prompt = [3, 14, 15, 92, 65, 35, 89, 79]
    with pmodel.disable_adapter():
        base_ref = reference_logits(pmodel, prompt)
    ref = reference_logits(pmodel, prompt)
    assert (ref - base_ref).abs().max().item() > 1e-2  # the adapters matter
    s = runner.alloc()
    assert (runner.forward([s], [prompt])[0] - ref).abs().max().item() < TOL

    # A training step changes the LoRA parameters in place.
    with torch.no_grad():
        for name, p in pmodel.named_parameters():
            if "lora_A" in name:
                p.add_(0.05)
    new_ref = reference_logits(pmodel, prompt)
    assert runner.is_stale()
    runner.free(s)
    s = runner.alloc()
    with pytest.raises(RuntimeError, match="sync_weights"):
        runner.forward([s], [prompt])
    # Without the check, stale copies silently give the old policy's logits: the contract is
    # that the trainer calls sync_weights() after every optimizer step.
    runner.check_weights = False
    stale = runner.forward([s], [prompt])[0]
    assert (stale - new_ref).abs().max().item() > 1e-3
    assert (stale - ref).abs().max().item() < TOL

    runner.sync_weights()
    assert not runner.is_stale()
    runner.free(s)
    s = runner.alloc()
    assert (runner.forward([s], [prompt])[0] - new_ref).abs().max().item() < TOL

    # The adapter state is captured at refresh time: disabled adapters -> the base model.
    with pmodel.disable_adapter():
        runner.sync_weights()
        base_now = reference_logits(pmodel, prompt)
    runner.free(s)
    s = runner.alloc()
    assert (runner.forward([s], [prompt])[0] - base_now).abs().max().item() < TOL


def test_base_weight_change_is_detected(qwen3):
    """Guards against a full fine-tune's in-place weight update going unnoticed by FastRunner's copies (stale
    rollouts, invariant 3)."""
    model = copy.deepcopy(qwen3)
    runner = FastRunner(model, max_slots=2, max_len=32)
    s = runner.alloc()
    runner.forward([s], [[1, 2, 3]])
    with torch.no_grad():
        model.model.layers[0].mlp.down_proj.weight.mul_(1.5)
    with pytest.raises(RuntimeError, match="sync_weights"):
        runner.forward([s], [[4]])
    runner.sync_weights()
    runner.forward([s], [[4]])


def test_slot_errors(qwen3):
    """Guards against slot misuse corrupting the cache: too many slots, over-long, empty or duplicate chunks and
    freed slots raise, and a failed call changes nothing."""
    runner = FastRunner(qwen3, max_slots=2, max_len=8)
    a, b = runner.alloc(), runner.alloc()
    assert (a, b) == (0, 1)
    with pytest.raises(RuntimeError, match="max_slots"):
        runner.alloc()
    with pytest.raises(ValueError, match="max_len"):
        runner.forward([a], [list(range(9))])
    assert runner.length(a) == 0  # a failed call changes nothing
    runner.forward([a], [list(range(6))])
    with pytest.raises(ValueError, match="max_len"):
        runner.forward([a, b], [[1, 2, 3], [1]])
    assert runner.length(a) == 6 and runner.length(b) == 0
    runner.forward([a], [[1, 2]])  # exactly max_len is fine
    assert runner.length(a) == 8
    with pytest.raises(ValueError, match="empty"):
        runner.forward([b], [[]])
    with pytest.raises(ValueError, match="duplicate"):
        runner.forward([b, b], [[1], [2]])
    runner.free(b)
    with pytest.raises(KeyError):
        runner.forward([b], [[1]])
    with pytest.raises(KeyError):
        runner.length(b)
    with pytest.raises(KeyError):
        runner.free(5)
    assert runner.alloc() == b


def test_unsupported_rope_is_rejected():
    """Guards against a rope scaling FastRunner does not implement decoding silently wrong logits instead of
    refusing the model."""
    model = tiny_llama(rope_scaling={"rope_type": "linear", "factor": 2.0})
    with pytest.raises(NotImplementedError, match="rope_type"):
        FastRunner(model, max_slots=1, max_len=16)


@pytest.mark.parametrize("linear", ["mm", MKLDNN])
def test_forked_slots_attend_their_shared_prefix_once_and_match_full_forwards(qwen3, linear):
    """Guards against shared-prefix attention bugs: forked slots (partial forks, subsets, gathered rows, reused
    slots) match full forwards."""
    runner = FastRunner(qwen3, max_slots=8, max_len=96, linear=linear, shared_prefix=8)
    check, rng = CheckedRunner(qwen3, runner), random.Random(11)

    def toks(n):
        return [rng.randrange(1000) for _ in range(n)]

    a = runner.alloc()
    check.forward([a], [toks(20)])
    group = [a] + [runner.alloc() for _ in range(3)]
    for s, length in zip(group[1:], (20, 20, 12)):  # one fork takes only 12 of the 20 tokens
        check.fork(a, s, length)
    calls = runner.shared_prefix_calls
    check.forward(group, [toks(n) for n in (3, 1, 5, 2)])  # ragged chunks: padded queries
    check.forward(group, [toks(1) for _ in group])  # batched decode
    check.forward([group[2], group[0]], [toks(1), toks(1)])  # a subset, caller order != slot order
    check.forward([group[3]], [toks(6)])  # an observation for one slot
    far = [runner.alloc() for _ in range(3)]
    check.fork(a, far[-1], 20)
    check.forward([group[0], far[-1]], [toks(1), toks(2)])  # rows 0 and 6 of 8: gathered, not a range
    assert runner.shared_prefix_calls == calls + 5
    assert check.worst < TOL

    check.forward([far[0], group[1]], [toks(9), toks(1)])  # far[0] never forked: the whole cache per row
    check.free(group[2])
    again = runner.alloc()  # a reused slot starts unshared
    check.forward([again, group[0]], [toks(4), toks(1)])
    assert runner.shared_prefix_calls == calls + 5
    assert check.worst < TOL


def test_a_new_forked_prefix_replaces_the_store_and_earlier_forks_fall_back(qwen3):
    """Guards against slots attending another group's shared prefix after the store is replaced: earlier forks
    fall back to their own copies."""
    runner = FastRunner(qwen3, max_slots=6, max_len=96, shared_prefix=8)
    check, rng = CheckedRunner(qwen3, runner), random.Random(12)
    old = [runner.alloc() for _ in range(2)]
    check.forward(old[:1], [[rng.randrange(1000) for _ in range(16)]])
    check.fork(old[0], old[1], 16)
    new = [runner.alloc() for _ in range(2)]
    check.forward(new[:1], [[rng.randrange(1000) for _ in range(18)]])
    check.fork(new[0], new[1], 18)  # overwrites the shared store
    calls = runner.shared_prefix_calls
    check.forward(old, [[5], [6]])  # still correct: each slot keeps its own copy of the prefix
    assert runner.shared_prefix_calls == calls
    check.forward(new, [[7], [8]])
    assert runner.shared_prefix_calls == calls + 1
    check.forward(new + old, [[1], [2], [3], [4]])  # mixed prefixes: no shared part
    assert runner.shared_prefix_calls == calls + 1
    check.free(old[0])
    check.free(old[1])
    late = [runner.alloc() for _ in range(2)]  # admitted later, with the same prompt prefix as `new`
    check.forward(late[:1], [check.hist[new[0]][:18]])  # the same prefill as new[0]'s: equal K/V
    check.forward(late[:1], [[9]])
    check.fork(late[0], late[1], 19)  # joins the store for its first 18 positions
    check.forward(new + late, [[1], [2], [3], [4]])
    assert runner.shared_prefix_calls == calls + 2
    assert check.worst < TOL


def test_shared_prefix_threshold_and_bf16_agreement(qwen3):
    """Guards against shared_prefix used below its threshold or changing bf16 logits beyond a few ulps, and
    against a negative threshold being accepted."""
    rng = random.Random(13)
    prefix = [rng.randrange(1000) for _ in range(24)]
    outs = []
    for shared in (0, 8, 25):  # off; on; on but longer than the prefix
        runner = FastRunner(qwen3, max_slots=3, max_len=64, dtype=torch.bfloat16, shared_prefix=shared)
        slots = [runner.alloc() for _ in range(3)]
        runner.forward(slots[:1], [prefix])
        for s in slots[1:]:
            runner.fork(slots[0], s, 24)
        runner.forward(slots, [[1, 2], [3], [4, 5, 6]])
        outs.append(runner.forward(slots, [[5], [6], [7]]))
        assert runner.shared_prefix_calls == (2 if shared == 8 else 0)
    assert outs[0].abs().max().item() < 2  # logits near 1, where one bf16 ulp is 2**-7
    assert (outs[0] - outs[1]).abs().max().item() <= 4 * 2**-7
    assert torch.equal(outs[0], outs[2])
    with pytest.raises(ValueError, match="shared_prefix must be >= 0"):
        FastRunner(qwen3, max_slots=1, max_len=8, shared_prefix=-1)


@pytest.mark.parametrize("linear", ["mm", MKLDNN])
@pytest.mark.parametrize("split_mixed", [True, False])
def test_mixed_calls_run_one_token_chunks_apart_and_match_full_forwards(qwen3, linear, split_mixed):
    """Guards against a split mixed call that hands a slot another slot's logits (the caller's order
    is not the slots'), that drops a chunk's tokens from the cache, or that splits where the padding
    would not pay: decoding slots next to observations match full forwards, split or not."""
    runner = FastRunner(qwen3, max_slots=8, max_len=96, linear=linear, split_mixed=split_mixed)
    check, rng = CheckedRunner(qwen3, runner), random.Random(14)

    def toks(n):
        return [rng.randrange(1000) for _ in range(n)]

    slots = [runner.alloc() for _ in range(6)]
    check.forward(slots, [toks(n) for n in (5, 9, 3, 7, 4, 6)])  # prompts: no one-token chunk
    assert runner.split_calls == 0
    # four slots decode while two take observations of 12 and 10 tokens: 4 × 11 padded queries > 26 tokens
    order = [slots[3], slots[0], slots[5], slots[1], slots[4], slots[2]]
    check.forward(order, [toks(1), toks(12), toks(1), toks(1), toks(10), toks(1)])
    assert runner.split_calls == (1 if split_mixed else 0)
    check.forward(slots, [toks(1) for _ in slots])  # every slot decodes on from the caches the split call wrote
    check.forward([slots[4], slots[2]], [toks(1), toks(3)])  # 2 padded queries < 4 tokens: one call
    assert runner.split_calls == (1 if split_mixed else 0)
    assert check.worst < TOL


def test_a_cache_bigger_than_the_machine_is_refused_naming_its_size_and_the_settings(qwen3, monkeypatch):
    """Guards against `rollout.batch_size=100000000` ending in the allocator's raw "can't allocate memory":
    the cache's size (layers × 2 × kv heads × head dim × bytes, per position) is checked against all the
    device's memory before anything is allocated, and the engine names the settings that sized it."""
    from agentic_rl.rollout.config import RolloutConfig
    from agentic_rl.rollout.factory import build_engine
    from agentic_rl.rollout.fast_kv_cache import CacheMemoryError
    from agentic_rl.models.loader import load_tokenizer, TINY_QWEN3

    config = qwen3.config
    per_position = config.num_hidden_layers * 2 * config.num_key_value_heads * config.head_dim * 4  # fp32
    monkeypatch.setattr("agentic_rl.rollout.fast_kv_cache.device_memory", lambda device: 2**30)
    slots = 2**30 // (per_position * 1024) + 1  # one slot past 1 GiB at 1,024 positions
    allocations = []
    monkeypatch.setattr("agentic_rl.rollout.fast_kv_cache.torch.empty", lambda *a, **k: allocations.append(a))
    with pytest.raises(CacheMemoryError) as caught:
        build_engine(
            qwen3, load_tokenizer(TINY_QWEN3), RolloutConfig(max_episode_tokens=1024), seed=0, max_concurrent=slots
        )
    need = per_position * slots * 1024 / 2**30
    assert str(caught.value).startswith(
        f"the KV cache of {slots:,} sequences × 1,024 positions needs {need:,.1f} GiB "
        f"({per_position / 1024:,.1f} KiB a position), more than all of cpu's memory (1.0 GiB): "
        f"it holds the {slots:,} episodes that decode at once (rollout.batch_size in training"
    )
    assert "rollout.max_episode_tokens=1,024 tokens each. Lower either" in str(caught.value)
    assert not any(
        isinstance(shape, tuple) and len(shape) == 6 for (shape, *_) in allocations
    )  # no cache was asked for
