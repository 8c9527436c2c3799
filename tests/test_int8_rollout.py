"""int8 rollout weights (`rollout.dtype: int8`, FastRunner's linear="int8"; issue 35 item 3).

The specification: every projection and the LM head become symmetric per-output-channel int8
copies (scale = max |row| / 127, each weight off by at most half a scale step), multiplied by torch's
dynamic int8 linear; logits stay within int8's error of float32 on ragged schedules, the copies
are rebuilt after every update like any other, and the setting is refused where it cannot run.
"""

from __future__ import annotations

import random
import warnings

import pytest
import torch
from helpers_fast_runner import peft_llama, reference_logits, run_schedule, tiny_llama

from agentic_rl.models.precision import int8_linear_works, resolve_rollout_dtype
from agentic_rl.rollout.factory import build_runner
from agentic_rl.rollout.fast_runner import FastRunner
from agentic_rl.rollout.fast_weights import choose_linear, int8_operand, int8_project

pytestmark = pytest.mark.skipif(not int8_linear_works(), reason="this torch has no dynamic int8 linear")

INT8_TOL = 0.5
"""Largest |logit − float32 logit| allowed on the tiny Llamas of helpers_fast_runner (random weights
of std 0.1, logits up to ~4): int8 measured 0.16-0.38 there (7-bit activations on heavy-tailed
random features); a wrong row order in a fused copy measured 5.0. A wrong scale or a dropped bias
is caught exactly by the two tests of the operand and the projection below."""


def _dequantized(packed: torch.Tensor) -> torch.Tensor:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        weight, _ = torch.ops.quantized.linear_unpack(packed)
        return weight.dequantize()  # (out, in)


def test_weights_are_symmetric_per_channel_int8_within_half_a_step():
    """Guards against one scale for the whole matrix (small rows lose every digit), against an
    asymmetric or off-by-one scale, and against an all-zero row dividing by zero."""
    w = torch.tensor([[0.5, -1.27, 0.0, 0.01], [1e-3, 2e-3, -4e-3, 0.0], [0.0, 0.0, 0.0, 0.0]])
    scale = torch.tensor([1.27 / 127, 4e-3 / 127, 1.0])  # (out,): max |row| / 127; zero row: 1
    expected = torch.round(w / scale[:, None]).clamp(-127, 127) * scale[:, None]
    got = _dequantized(int8_operand(w))
    assert torch.allclose(got, expected, atol=1e-7)
    assert ((got - w).abs() <= scale[:, None] / 2 + 1e-7).all()
    assert got[0, 1] == pytest.approx(-1.27) and got[2].abs().max() == 0


def test_the_projection_is_the_dequantized_weights_product_plus_bias():
    """Guards against a dropped bias and a transposed weight: int8_project(h, W, b) ≈ h·deq(W)ᵀ + b,
    off only by the 7-bit quantization of the activations."""
    g = torch.Generator().manual_seed(0)
    h, w, b = torch.randn(5, 16, generator=g), torch.randn(24, 16, generator=g) * 0.1, torch.randn(24, generator=g)
    packed = int8_operand(w)
    expected = h @ _dequantized(packed).t() + b  # (5, 24)
    got = int8_project(h, packed, b)
    assert got.shape == (5, 24) and got.dtype == torch.float32
    assert (got - expected).abs().max() < 0.02 * expected.abs().max()
    assert (got - (h @ w.t() + b)).abs().max() < 0.02 * expected.abs().max()


@pytest.mark.parametrize("bias", [False, True])
def test_ragged_schedules_stay_within_int8_error_of_the_model(bias):
    """Guards against KV-cache, position or fusion bugs specific to the int8 copies (fused qkv and
    gate/up, folded norms, rope-permuted rows, biases, the LM head): a random ragged schedule of
    prefills, decodes and slot reuse stays within INT8_TOL of full float32 forwards."""
    model = tiny_llama(attention_bias=bias, mlp_bias=bias)
    runner = FastRunner(model, max_slots=8, max_len=96, linear="int8")
    assert runner.linear == "int8" and runner.dtype == torch.float32
    worst = run_schedule(model, runner, seed=2)
    assert 1e-3 < worst < INT8_TOL  # approximate (not float32's 1e-4), and close


def test_qwen3_int8_sampling_distribution_is_close(tiny_qwen3):
    """Guards against a distribution far from float32's: the KL per token stays tiny and the greedy
    token is the same (qk-norm and the tied or untied LM head included)."""
    model = tiny_qwen3[0]
    rng = random.Random(3)
    prompts = [[rng.randrange(1000) for _ in range(n)] for n in (23, 9, 31)]
    outs = []
    for linear in ("mm", "int8"):
        runner = FastRunner(model, max_slots=3, max_len=64, linear=linear)
        slots = [runner.alloc() for _ in prompts]
        runner.forward(slots, prompts)
        outs.append(runner.forward(slots, [[5], [6], [7]]))
    p32, p8 = outs[0].log_softmax(-1), outs[1].log_softmax(-1)
    kl = (p32.exp() * (p32 - p8)).sum(-1)  # (3,) nats
    assert (kl < 1e-4).all() and torch.equal(outs[0].argmax(-1), outs[1].argmax(-1))
    assert (outs[0] - outs[1]).abs().max() > 1e-4  # int8 ran: not float32's logits


def test_int8_copies_are_rebuilt_after_an_update():
    """Guards against int8 copies that miss the update (invariant 3): an in-place LoRA step makes
    the runner stale, and after sync_weights its logits follow the updated model."""
    pmodel = peft_llama()
    runner = FastRunner(pmodel, max_slots=2, max_len=64, linear="int8")
    prompt = [3, 14, 15, 92, 65, 35, 89, 79]
    before = runner.forward([runner.alloc()], [prompt])[0]
    with torch.no_grad():
        for name, p in pmodel.named_parameters():
            if "lora_A" in name:
                p.add_(0.05)
    updated = reference_logits(pmodel, prompt)
    assert runner.is_stale() and (before - updated).abs().max() > 3 * INT8_TOL  # measured 1.9
    runner.sync_weights()
    after = runner.forward([runner.alloc()], [prompt])[0]
    assert (after - updated).abs().max() < INT8_TOL  # measured 0.29


def test_int8_is_chosen_by_rollout_dtype_and_refused_where_it_cannot_run():
    """Guards against rollout.dtype=int8 silently decoding in float32, and against int8 asked of
    bf16 activations or a GPU run getting an obscure kernel error instead of the fix."""
    model = tiny_llama()
    runner = build_runner(model, "auto", max_slots=1, max_len=8, dtype="int8")
    assert isinstance(runner, FastRunner) and runner.linear == "int8"
    assert resolve_rollout_dtype("int8", "cpu") == "int8"
    with pytest.raises(ValueError, match=r"rollout\.dtype=int8 .*on cuda.*use auto, float32 or bfloat16"):
        resolve_rollout_dtype("int8", "cuda")
    with pytest.raises(ValueError, match=r"linear='int8' needs float32 activations.*torch\.bfloat16"):
        choose_linear("int8", torch.device("cpu"), torch.bfloat16)
    with pytest.raises(ValueError, match="needs the fast runner"):
        build_runner(model, "hf", max_slots=1, max_len=8, dtype="int8")


def test_a_grpo_run_on_int8_rollouts_measures_and_corrects_the_mismatch(tmp_path):
    """int8 decoding against a float32 trainer (π_old from the first update's forward): the run
    trains, logs a mismatch well above float32's ~1e-13, and the TIS weights differ from 1. Guards
    against int8 reaching the config but not the sampler, and against its log-probs taken as π_old."""
    from helpers_training import grpo_cfg

    from agentic_rl.training.grpo import train_grpo

    cfg = grpo_cfg(tmp_path / "run", "train.steps=1", "rollout.dtype=int8", "old_logprobs=recompute",
                   "rollout_correction.mode=tis", "loss.beta=0.0")
    row = train_grpo(cfg)["history"][0]
    assert 1e-9 < row["rollout/mismatch_kl"] < 1e-2
    assert row["rollout/is_weight_max"] > 1.0 and row["rollout/is_weight_mean"] != 1.0
    with pytest.raises(ValueError, match=r"rollout\.dtype=int8 samples with other weights"):
        grpo_cfg(tmp_path / "other", "rollout.dtype=int8", "old_logprobs=sampling")
